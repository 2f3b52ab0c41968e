//! Generated fat trees, connection patterns, and what a failure costs the SMs and SAs
//! at scale: the SA's queue of requests, Reports and ReportResps, its overflow, and the
//! per-event figures.

use provider_sim::{PolicyKind, RunConfig, Scenario, Sim};

/// A 64-host, two-rail, three-level fat tree of radix 8 (4 hosts a leaf), jobs of 16
/// hosts all-to-all, leaf `A.L3` (hosts 12-15) failing at 500 ms and returning at
/// 1500 ms.
fn leaf_failure(extra_fabric: &str) -> Scenario {
    let text = format!(
        "name = \"leaf failure\"\nduration_ms = 2500\n\
         [topology]\nhosts = 64\nports = 2\nlmc = 0\n\
         [topology.fat_tree]\nlevels = 3\nradix = 8\n\
         [fabric]\n{extra_fabric}\n\
         [workload]\nconnections_per_host = 8\n\
         pattern = {{ kind = \"all_to_all\", group = 16 }}\n\
         [[faults]]\nkind = \"switch_down\"\nat_ms = 500\nswitch = \"A.L3\"\n\
         [[faults]]\nkind = \"switch_up\"\nat_ms = 1500\nswitch = \"A.L3\"\n"
    );
    Scenario::from_toml(&text).expect("scenario")
}

fn run(s: &Scenario, policy: PolicyKind) -> provider_sim::RunReport {
    let mut cfg = RunConfig::new(policy, 1);
    cfg.check = true;
    Sim::new(s, cfg).expect("sim").run()
}

#[test]
fn a_leaf_failure_costs_one_report_per_subscriber_for_each_of_its_ports() {
    let r = run(&leaf_failure(""), PolicyKind::Apm);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let start = &r.failure_events[0];
    assert_eq!(start.event, "start");
    // Every host subscribes on both ports: 128 InformInfo Sets, each answered.
    assert!(start.sa_requests >= 128, "{start:?}");
    let leaf = &r.failure_events[1];
    assert_eq!(leaf.event, "switch A.L3 fails");
    // Trap 65 for each of the leaf's 4 host ports goes to each of rail A's 64
    // subscribers (the 4 dead ones' Reports are resent and given up on).
    assert!(leaf.reports >= 4 * 64, "{leaf:?}");
    assert!(leaf.sa_mads_in >= 4 * 60, "ReportResps: {leaf:?}");
    // A trap's Reports wait in the SA's queue together.
    assert!(leaf.peak_sa_queue >= 64, "{leaf:?}");
    assert_eq!(leaf.sa_dropped, 0);
    // The leaf's hosts' connections move to rail B, with nothing to arm there.
    assert_eq!(leaf.last_rearm_ms, None, "{leaf:?}");
    // Back: trap 64 the same way, and every connection armed again on rail A.
    let back = &r.failure_events[2];
    assert_eq!(back.event, "switch A.L3 returns");
    assert!(back.reports >= 4 * 64, "{back:?}");
    assert!(back.last_rearm_ms.is_some_and(|t| t < 500.0), "{back:?}");
    assert_eq!(r.end_state[0], r.connections);
    // The baselines ask the SA nothing.
    let hw = run(&leaf_failure(""), PolicyKind::HwOnly);
    assert!(hw
        .failure_events
        .iter()
        .all(|e| e.sa_mads_in == 0 && e.reports == 0));
}

#[test]
fn an_sa_that_cannot_keep_up_drops_what_waits_too_long_and_its_clients_retry() {
    // 200 MADs a second: the 128 subscriptions at start queue for 640 ms, beyond the
    // 50 ms the SA lets a request wait and the 100 ms a client waits.
    let s = leaf_failure("sa_rate_per_s = 200\nsa_fifo_timeout_ms = 50");
    let r = run(&s, PolicyKind::Apm);
    let start = &r.failure_events[0];
    assert!(start.sa_dropped > 0, "{start:?}");
    assert!(start.sa_request_timeouts > 0, "{start:?}");
    assert!(start.sa_requests > 128, "retries: {start:?}");
    // Requests never wait longer than the 50 ms it keeps (10 MADs) plus the one
    // served; Reports are not dropped (the SM sends every one).
    assert!(start.peak_sa_queue <= 11, "{start:?}");
    // The same fabric with OpenSM's rate drops nothing.
    let fast = run(&leaf_failure(""), PolicyKind::Apm);
    assert!(fast.failure_events.iter().all(|e| e.sa_dropped == 0));
}

/// The leaf failure with apm's policy for a large fabric: no trap subscriptions, SA
/// requests paced.
fn leaf_failure_at_scale() -> Scenario {
    let mut s = leaf_failure("");
    s.policy = Some(apm_core::Policy {
        subscribe: false,
        sa_max_outstanding: 8,
        sa_jitter_ms: 20,
        ..apm_core::Policy::default()
    });
    s
}

#[test]
fn apm_at_scale_costs_the_sa_a_tenth_of_the_naive_schemes_and_protects_as_well() {
    let s = leaf_failure_at_scale();
    let runs: Vec<_> = [
        PolicyKind::Apm,
        PolicyKind::ApmWildcard,
        PolicyKind::PerConnSa,
    ]
    .into_iter()
    .map(|k| {
        let mut cfg = RunConfig::for_scenario(&s, k, 1);
        cfg.check = true;
        Sim::new(&s, cfg).expect("sim").run()
    })
    .collect();
    let (apm, wildcard, naive) = (&runs[0], &runs[1], &runs[2]);
    for r in &runs {
        assert!(r.violations.is_empty(), "{}: {:?}", r.policy, r.violations);
        assert_eq!(r.lost, 0, "{}", r.policy);
        assert_eq!(
            r.end_state[0], r.connections,
            "{}: all armed at the end",
            r.policy
        );
    }
    let mads = |r: &provider_sim::RunReport| -> u64 {
        r.failure_events[1..]
            .iter()
            .map(|e| e.sa_mads_in + e.sa_mads_out)
            .sum()
    };
    assert!(
        10 * mads(apm) <= mads(naive) && 10 * mads(apm) <= mads(wildcard),
        "apm {} wildcard {} per-conn {}",
        mads(apm),
        mads(wildcard),
        mads(naive)
    );
    // Without the traps apm protects exactly as with them: the peers tell it what a
    // trap would.
    assert_eq!(apm.restore_ms, wildcard.restore_ms);
    assert_eq!(
        apm.armed_disjoint_ms_total,
        wildcard.armed_disjoint_ms_total
    );
    // The naive scheme asks per connection: more requests than connections touched.
    let leaf = &naive.failure_events[1];
    assert!(leaf.sa_requests > 16 * 8, "{leaf:?}");
}

#[test]
fn named_policies_and_the_engine_policy_come_from_the_scenario() {
    let text = "policies = [\"apm\", \"per-conn-sa\"]\n[policy]\nsubscribe = false\n";
    let s = Scenario::from_toml(text).expect("scenario");
    assert_eq!(
        s.run_policies().unwrap(),
        [PolicyKind::Apm, PolicyKind::PerConnSa]
    );
    assert!(!s.engine_policy().subscribe);
    assert!(
        !s.engine_policy().probe.enabled,
        "apm's own defaults: no probes"
    );
    let e = Scenario::from_toml("policies = [\"apm\", \"magic\"]\n").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("line 1, column 20: policies[2]: \"magic\" is not a policy"),
        "{e}"
    );
    // Every setting out of its range, each at its line and key, in file order.
    let e = Scenario::from_toml(
        "name = \"n\"\n[policy]\nsa_jitter_ms = 99999\nlap_timeout_ms = 0\n\
         [policy.probe]\nmultiplier = 0\n",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 3, column 16: policy.sa_jitter_ms: 99999: at most 60000: a minute's delay \
         before asking the SA helps nobody\n\
         line 4, column 18: policy.lap_timeout_ms: 0: must be at least 1\n\
         line 6, column 14: policy.probe.multiplier: 0: must be 1..=50"
    );
    let e = Scenario::from_toml("[policy]\nsubscrib = false\n").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("line 2, column 1: policy.subscrib: unknown field"),
        "{e}"
    );
    // A scenario built in code names the key too.
    let s = Scenario {
        policies: vec!["magic".into()],
        ..Scenario::default()
    };
    let e = s.run_policies().unwrap_err();
    assert!(e.to_string().starts_with("policies[1]: \"magic\""), "{e}");
}
