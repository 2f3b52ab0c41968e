//! Silent failures: what nothing reports (a black-holing switch, a cut between two
//! switches, a far end's port on RoCE), the retry budget the baselines pay for them,
//! apm's probes finding them in tens of milliseconds, and the application told which
//! kind of failure each move was for.

use apm_core::{Cause, NotificationKind, Time};
use provider_sim::compare::{failures, run_all};
use provider_sim::controller::probe_seed;
use provider_sim::{Family, PolicyKind, RunConfig, RunReport, Scenario, Sim, SimProvider, Size};

fn nccl() -> Scenario {
    let text = include_str!("../scenarios/nccl-silent.toml");
    let mut s = Scenario::from_toml(text).expect("the shipped scenario parses");
    s.workload.connections = 60;
    s
}

/// `s`'s engine policy with probes on every path, InfiniBand's too.
fn probing(s: &Scenario) -> apm_core::Policy {
    let mut p = s.engine_policy();
    p.probe.enabled = true;
    p.probe.infiniband = true;
    p
}

fn run(s: &Scenario, kind: PolicyKind, probes: bool) -> RunReport {
    let mut cfg = RunConfig::new(kind, 5);
    cfg.engine_policy = probing(s);
    cfg.engine_policy.probe.enabled = probes;
    cfg.check = true;
    let r = Sim::new(s, cfg).expect("scenario runs").run();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    r
}

/// ACK timeout 20, retry count 7: (7 + 1) x 4.096 us x 2^20 = 34.36 s.
const BUDGET_MS: f64 = 8.0 * 4.096e-3 * (1u64 << 20) as f64;

#[test]
fn the_baselines_wait_out_the_retry_budget_of_a_silent_rail() {
    let s = nccl();
    for kind in [PolicyKind::HwOnly, PolicyKind::ReloadLocal] {
        let r = run(&s, kind, false);
        assert_eq!(
            r.lost, 0,
            "{kind:?}: the HCA migrates at the end of the budget"
        );
        // Each restore is the budget from the QP's first unanswered message (at most
        // one message interval after the fault) to the migration.
        assert!(
            r.restore_ms.p50 >= BUDGET_MS - 10.0 && r.restore_ms.max <= BUDGET_MS + 20.0,
            "{kind:?}: {:?}, budget {BUDGET_MS} ms",
            r.restore_ms
        );
    }
}

#[test]
fn apm_without_probes_learns_nothing_sooner_and_with_them_moves_in_tens_of_ms() {
    let s = nccl();
    let blind = run(&s, PolicyKind::Apm, false);
    assert!(
        blind.restore_ms.p50 >= BUDGET_MS - 10.0,
        "no port event, no trap: {:?}",
        blind.restore_ms
    );
    assert_eq!(blind.probes_sent, 0);
    let probed = run(&s, PolicyKind::Apm, true);
    assert_eq!(probed.lost, 0);
    // Detection is 3 x 15 ms after the last probe heard, then one exchange with the peer.
    assert!(probed.restore_ms.max < 100.0, "{:?}", probed.restore_ms);
    assert!(probed.probes_sent > 0);
}

#[test]
fn probes_cost_paths_not_connections() {
    let mut few = nccl();
    few.workload.connections = 20;
    few.duration_ms = 2000;
    let mut many = few.clone();
    many.workload.connections = 400;
    let a = run(&few, PolicyKind::Apm, true).probes_sent;
    let b = run(&many, PolicyKind::Apm, true).probes_sent;
    // 20 connections among 16 hosts leave some pairs without a connection; 400 cover
    // them all: never more than the 16 x 15 x 2 sessions allow.
    let ceiling = 16 * 15 * 2 * 2000 / 15;
    assert!(b <= ceiling, "{b} probes, at most {ceiling}");
    assert!(a <= b && b < 20 * a, "{a} then {b}");
}

#[test]
fn roce_has_no_sa_and_probes_keep_what_the_baselines_lose() {
    for seed in 0..6 {
        let s = Family::SilentRoce.scenario(seed, Size::Small);
        let reports = run_all(&s, seed, &s.engine_policy()).expect("runs");
        let apm = &reports[0];
        assert_eq!(apm.policy, "apm");
        assert_eq!(apm.sa_queries, 0, "seed {seed}: RoCE has no SA to ask");
        assert!(
            failures(&reports).is_empty(),
            "seed {seed}: {:?}",
            failures(&reports)
        );
    }
}

#[test]
fn silent_families_dominate_and_replay_byte_for_byte() {
    for family in [Family::SilentSplitRail, Family::SilentRoce] {
        for seed in 10..16 {
            let s = family.scenario(seed, Size::Small);
            let reports = run_all(&s, seed, &s.engine_policy()).expect("runs");
            let v = failures(&reports);
            assert!(v.is_empty(), "{} seed {seed}: {v:?}", family.name());
            let again = run_all(&s, seed, &s.engine_policy()).expect("runs");
            assert_eq!(
                serde_json::to_string(&reports).expect("json"),
                serde_json::to_string(&again).expect("json"),
                "{} seed {seed}",
                family.name()
            );
        }
    }
}

#[test]
fn a_black_hole_naming_no_switch_is_refused_at_its_line() {
    let text = "[[faults]]\nkind = \"switch_black_hole\"\nat_ms = 5\nswitch = \"Q\"\n";
    let e = Scenario::from_toml(text).unwrap_err();
    assert!(e.to_string().contains("line 4"), "{e}");
    let ok = "[[faults]]\nkind = \"switch_black_hole\"\nat_ms = 5\nswitch = \"A\"\n\
              [[faults]]\nkind = \"switch_black_hole_end\"\nat_ms = 9\nswitch = \"A\"\n";
    Scenario::from_toml(ok).expect("valid");
}

/// Hosts `0..managed` of `s` run by `apm_core::Manager`s (`s`'s policy, probes on)
/// until `until_ms`: the causes of every move each host's application was
/// told of, by host.
fn move_causes(s: &Scenario, managed: usize, until_ms: u64) -> Vec<Vec<Option<Cause>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let seed = 5;
        let mut cfg = RunConfig::new(PolicyKind::Apm, seed);
        cfg.external_hosts = (0..managed).collect();
        cfg.check = true;
        cfg.sample_ms = 0;
        let shared = SimProvider::share(Sim::new(s, cfg).expect("scenario runs"));
        let mut handles = Vec::new();
        let mut notes = Vec::new();
        for h in 0..managed {
            let p = std::sync::Arc::new(shared.for_host(h).stack());
            let (mgr, handle) = apm_core::Manager::new(p, probing(s)).expect("policy");
            notes.push(handle.notifications());
            tokio::spawn(mgr.with_probe_seed(probe_seed(seed, h)).run());
            handles.push(handle);
        }
        for handle in &handles {
            handle.stats().await.expect("running");
        }
        for (h, handle) in handles.iter().enumerate() {
            for spec in shared.with_sim(|sim| sim.external_specs(h)) {
                handle.protect(spec).await.expect("protected");
            }
        }
        shared.drive(Time::from_millis(until_ms)).await;
        let hit = shared.with_sim(|sim| sim.violations().to_vec());
        assert!(hit.is_empty(), "{hit:?}");
        for h in &handles {
            h.shutdown();
        }
        notes
            .iter_mut()
            .map(|rx| {
                let mut causes = Vec::new();
                while let Ok(n) = rx.try_recv() {
                    if let NotificationKind::Migrated { cause, .. } = n.kind {
                        causes.push(cause);
                    }
                }
                causes
            })
            .collect()
    })
}

#[test]
fn a_black_holing_switch_moves_connections_for_the_fabric() {
    let s = nccl();
    // The black hole starts at 1 s; probes find it within 45 ms.
    let causes: Vec<Option<Cause>> = move_causes(&s, 4, 1_500).concat();
    let fabric = causes.iter().filter(|c| **c == Some(Cause::Fabric)).count();
    assert!(fabric > 0, "{causes:?}");
    // Both ports are up: no move says a port, and the others were asked by their peer.
    assert!(
        causes
            .iter()
            .all(|c| matches!(c, Some(Cause::Fabric) | None)),
        "{causes:?}"
    );
}

#[test]
fn a_far_end_port_down_on_roce_is_the_peer_port_to_the_other_side() {
    let text = include_str!("../scenarios/roce.toml");
    let mut s = Scenario::from_toml(text).expect("the shipped scenario parses");
    s.workload.connections = 60;
    // h2:1 goes down at 0.5 s: PORT_ERR on h2, nothing at all on its peers (no SA on
    // RoCE) but h2's probes on its other rail, which name the dead port.
    let by_host = move_causes(&s, 4, 1_000);
    assert!(
        by_host[2].contains(&Some(Cause::LocalPort)),
        "h2 saw its own port die: {:?}",
        by_host[2]
    );
    let peers: Vec<Option<Cause>> = [0, 1, 3].iter().flat_map(|h| by_host[*h].clone()).collect();
    assert!(peers.contains(&Some(Cause::PeerPort)), "{peers:?}");
    assert!(
        peers
            .iter()
            .all(|c| matches!(c, Some(Cause::PeerPort) | None)),
        "{peers:?}"
    );
}
