//! Scenario tests: each problem apm exists for (failover on both sides, the re-arm race,
//! user-level events: docs/iba-facts.md §2) on the simulated fabric, end to end through
//! the real engine, plus the baselines' failure modes, software migration, determinism,
//! the example scenario files, and a run through `apm_core::Manager` on tokio's paused
//! clock.

use apm_core::{ConnId, MigState, Time};
use provider_sim::{ConnState, Fault, PolicyKind, RunConfig, Scenario, Sim};

/// Four dual-rail hosts, LMC 1, a dozen connections whose traffic is slow enough
/// (one message per second) that only notices and port events can explain a fast
/// failover on the side that did not see the failure. The QPs are apm's own (it may
/// post its arming write on them), so it moves them at once: the application's it
/// leaves to the HCA (`Policy::fast_moves`).
fn small(faults: Vec<Fault>) -> Scenario {
    let mut s = Scenario {
        name: "test".into(),
        duration_ms: 3000,
        faults,
        ..Scenario::default()
    };
    s.topology.hosts = 4;
    s.workload.connections = 12;
    s.workload.message_interval_ms = 1000;
    s.workload.apm_may_post = true;
    s
}

/// `s` with the standby SM polling the master every 200 ms and giving up after one
/// failed retry (OpenSM's `sminfo_polling_timeout` and `polling_retry_number` tuned
/// down): it takes over 600-800 ms after the master dies instead of 50-60 s.
fn fast_sm_polling(mut s: Scenario) -> Scenario {
    s.fabric.sminfo_polling_timeout_ms = 200;
    s.fabric.polling_retry_number = 1;
    s
}

fn sim(s: &Scenario, policy: PolicyKind) -> Sim {
    let mut cfg = RunConfig::new(policy, 7);
    cfg.check = true;
    Sim::new(s, cfg).expect("valid scenario")
}

fn run_to(sim: &mut Sim, ms: u64) {
    sim.run_until(Time::from_millis(ms));
}

/// Connections with a side on `host` whose primary uses port `port` there.
fn conns_via(sim: &Sim, host: usize, port: u8) -> Vec<usize> {
    (0..sim.num_conns())
        .filter(|&i| {
            let (a, b) = sim.conn_hosts(i).unwrap();
            let (pa, pb) = sim.conn_ports(i).unwrap();
            (a == host && pa == port) || (b == host && pb == port)
        })
        .collect()
}

fn stats(sim: &Sim, host: usize) -> apm_core::Stats {
    sim.controller(host).engine().expect("apm").stats().clone()
}

#[test]
fn failover_on_both_sides_local_port_err_and_remote_trap65_both_force_migration() {
    let s = small(vec![Fault::PortDown {
        at_ms: 1500,
        port: "h1:1".into(),
    }]);
    let mut sim = sim(&s, PolicyKind::Apm);
    run_to(&mut sim, 1400);
    let hit = conns_via(&sim, 1, 1);
    assert!(!hit.is_empty());
    assert!(hit
        .iter()
        .all(|&i| sim.conn_state(i) == Some(ConnState::Armed)));
    let peers: Vec<usize> = hit
        .iter()
        .map(|&i| {
            let (a, b) = sim.conn_hosts(i).unwrap();
            if a == 1 {
                b
            } else {
                a
            }
        })
        .collect();
    let before: u64 = peers
        .iter()
        .map(|&h| stats(&sim, h).migrations_forced)
        .sum();
    // 20 ms: well inside the next message (1 s away), so neither side can have learnt
    // from traffic: h1 from its PORT_ERR, the peers from trap 65 after the heavy sweep.
    run_to(&mut sim, 1520);
    for &i in &hit {
        assert_ne!(sim.conn_state(i), Some(ConnState::Migrating), "conn{i}");
        assert_eq!(sim.conn_ports(i), Some((2, 2)), "conn{i} moved to rail B");
    }
    assert!(stats(&sim, 1).migrations_forced >= hit.len() as u64);
    let after: u64 = peers
        .iter()
        .map(|&h| stats(&sim, h).migrations_forced)
        .sum();
    assert!(
        after > before,
        "the passive peers forced their own migrations"
    );
    let r = sim.finish();
    assert_eq!((r.lost, r.messages_lost), (0, 0));
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn after_a_migration_both_sides_arm_the_path_they_left_at_once() {
    let s = small(vec![
        Fault::PortDown {
            at_ms: 1000,
            port: "h2:1".into(),
        },
        Fault::PortUp {
            at_ms: 1500,
            port: "h2:1".into(),
        },
    ]);
    let mut sim = sim(&s, PolicyKind::Apm);
    run_to(&mut sim, 990);
    // With one message a second, only connections whose QPs have seen their peer's
    // packets are ARMED (REARM turns ARMED on the first one): those can move at once.
    let armed = (MigState::Armed, MigState::Armed);
    let hit: Vec<usize> = conns_via(&sim, 2, 1)
        .into_iter()
        .filter(|&i| sim.conn_mig(i) == Some(armed))
        .collect();
    assert!(!hit.is_empty());
    let laps_before: u64 = (0..4).map(|h| stats(&sim, h).laps_sent).sum();
    // The re-arm race of hardware APM: the next alternate must be loaded between
    // MIGRATED and the migrated path's COMM_EST. Both sides load the path they left
    // within milliseconds, with no message to wait for.
    run_to(&mut sim, 1005);
    for &i in &hit {
        let (a, b) = sim.conn_hosts(i).unwrap();
        for h in [a, b] {
            let st = sim
                .controller(h)
                .engine()
                .unwrap()
                .connection(ConnId(i as u64))
                .unwrap();
            assert_eq!(st.primary.port.port, 2, "conn{i} on h{h} moved to rail B");
            let alt = st.alternate.expect("the path left is the alternate");
            assert_eq!(alt.port.port, 1, "conn{i} on h{h}: {alt}");
        }
    }
    // Dead while h2:1 is down; protecting once it is back, still with no LAP.
    run_to(&mut sim, 2500);
    for &i in &hit {
        assert_eq!(
            sim.conn_state(i),
            Some(ConnState::Armed),
            "conn{i} armed again"
        );
        assert!(sim.conn_armed_disjoint(i), "conn{i}: port-disjoint");
    }
    let laps: u64 = (0..4).map(|h| stats(&sim, h).laps_sent).sum();
    assert_eq!(laps, laps_before, "no LAP was needed");
    let r = sim.finish();
    assert_eq!((r.lost, r.messages_lost), (0, 0));
}

#[test]
fn port_active_and_trap64_rearm_through_the_returning_rail() {
    let s = small(vec![
        Fault::PortDown {
            at_ms: 500,
            port: "h3:1".into(),
        },
        Fault::PortUp {
            at_ms: 1000,
            port: "h3:1".into(),
        },
    ]);
    let mut sim = sim(&s, PolicyKind::Apm);
    run_to(&mut sim, 450);
    let hit = conns_via(&sim, 3, 1);
    assert!(!hit.is_empty());
    run_to(&mut sim, 2500);
    for &i in &hit {
        assert_eq!(sim.conn_state(i), Some(ConnState::Armed), "conn{i}");
        let (a, _) = sim.conn_hosts(i).unwrap();
        let st = sim
            .controller(a)
            .engine()
            .unwrap()
            .connection(ConnId(i as u64))
            .unwrap();
        let alt = st.alternate.unwrap();
        assert_ne!(
            alt.port, st.primary.port,
            "conn{i} re-armed across the rails"
        );
    }
}

#[test]
fn user_level_events_short_outage_between_sweeps_is_not_missed() {
    // 30 ms down, sweeps every second: only the local PORT_ERR/PORT_ACTIVE tell.
    let mut s = small(vec![
        Fault::PortDown {
            at_ms: 1200,
            port: "h0:2".into(),
        },
        Fault::PortUp {
            at_ms: 1230,
            port: "h0:2".into(),
        },
    ]);
    s.fabric.sweep_interval_ms = 1000;
    let mut sim = sim(&s, PolicyKind::Apm);
    run_to(&mut sim, 1100);
    let hit = conns_via(&sim, 0, 2);
    assert!(!hit.is_empty());
    run_to(&mut sim, 2900);
    assert!(stats(&sim, 0).migrations_forced >= hit.len() as u64);
    for &i in &hit {
        assert_eq!(sim.conn_state(i), Some(ConnState::Armed), "conn{i}");
    }
    let r = sim.finish();
    assert_eq!(r.lost, 0);
    // Far below the 537 ms a dead path takes to error out without apm.
    assert!(r.restore_ms.max < 100.0, "{:?}", r.restore_ms);
}

#[test]
fn sm_failover_client_reregister_and_notices_flow_again() {
    let s = fast_sm_polling(small(vec![
        Fault::SmFailover {
            at_ms: 100,
            subnet: 1,
        },
        Fault::PortDown {
            at_ms: 1500,
            port: "h2:2".into(),
        },
    ]));
    let mut sim = sim(&s, PolicyKind::Apm);
    run_to(&mut sim, 50);
    let subs_before: u64 = (0..4).map(|h| stats(&sim, h).subscriptions).sum();
    run_to(&mut sim, 1400);
    let subs_after: u64 = (0..4).map(|h| stats(&sim, h).subscriptions).sum();
    assert!(
        subs_after >= subs_before + 4,
        "every host subscribed again on rail B after ClientReregister"
    );
    let hit = conns_via(&sim, 2, 2);
    run_to(&mut sim, 1520);
    for &i in &hit {
        assert_ne!(
            sim.conn_state(i),
            Some(ConnState::Migrating),
            "conn{i}: the new SM's trap 65 reached the peer"
        );
    }
}

#[test]
fn hw_only_loses_an_unarmed_connection_on_the_second_failure() {
    let s = small(vec![
        Fault::SwitchDown {
            at_ms: 300,
            switch: "A".into(),
        },
        Fault::SwitchUp {
            at_ms: 1200,
            switch: "A".into(),
        },
        Fault::PortDown {
            at_ms: 1800,
            port: "h1:2".into(),
        },
    ]);
    let mut s = s;
    s.workload.message_interval_ms = 10;
    let hw = sim(&s, PolicyKind::HwOnly).run();
    let apm = sim(&s, PolicyKind::Apm).run();
    assert!(hw.lost > 0, "hw-only: migrated once, never re-armed");
    assert!(hw.messages_lost > 0);
    assert_eq!((apm.lost, apm.messages_lost), (0, 0));
    assert!(apm.violations.is_empty(), "{:?}", apm.violations);
}

#[test]
fn reload_local_arms_a_dead_path_and_gets_path_mig_err() {
    // Rail A dies; reload-local re-arms onto it blindly; then rail B's port of h1 dies
    // while rail A is still down: the migration fails (PATH_MIG_ERR) and the QP dies.
    let mut s = small(vec![
        Fault::SwitchDown {
            at_ms: 300,
            switch: "A".into(),
        },
        Fault::PortDown {
            at_ms: 1500,
            port: "h1:2".into(),
        },
    ]);
    s.workload.message_interval_ms = 10;
    let rl = sim(&s, PolicyKind::ReloadLocal).run();
    assert!(rl.lost > 0);
    assert!(rl.failovers > 0);
}

#[test]
fn software_migration_for_roce_style_qps() {
    let mut s = small(vec![Fault::PortDown {
        at_ms: 800,
        port: "h0:1".into(),
    }]);
    s.workload.mode = provider_sim::config::Mode::Software;
    s.workload.message_interval_ms = 10;
    let r = sim(&s, PolicyKind::Apm).run();
    assert!(r.failovers > 0, "moved in software");
    assert_eq!((r.lost, r.messages_lost), (0, 0));
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn default_scenario_expected_results() {
    let mut s = Scenario::demo();
    s.workload.connections = 600;
    let run = |p| provider_sim::run(&s, p, 1).unwrap();
    let apm = run(PolicyKind::Apm);
    assert_eq!(apm.lost, 0);
    assert_eq!(apm.messages_lost, 0);
    assert_eq!(apm.messages_duplicated, 0);
    for base in [run(PolicyKind::HwOnly), run(PolicyKind::ReloadLocal)] {
        let who = &base.policy;
        assert!(apm.lost <= base.lost, "{who}");
        assert!(apm.messages_lost <= base.messages_lost, "{who}");
        assert!(apm.messages_duplicated <= base.messages_duplicated, "{who}");
        assert!(apm.restore_ms.p50 <= base.restore_ms.p50, "{who}");
        assert!(apm.restore_ms.p99 <= base.restore_ms.p99, "{who}");
        assert!(apm.restore_ms.max <= base.restore_ms.max, "{who}");
        assert!(
            apm.unprotected_ms_total <= base.unprotected_ms_total,
            "{who}"
        );
        assert!(apm.end_state[0] >= base.end_state[0], "{who}");
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let mut s = Scenario::demo();
    s.workload.connections = 200;
    s.duration_ms = 4000;
    let j = |seed| {
        serde_json::to_string(&provider_sim::run(&s, PolicyKind::Apm, seed).unwrap()).unwrap()
    };
    assert_eq!(j(5), j(5));
    assert_ne!(j(5), j(6));
}

#[test]
fn the_builtin_scenario_is_dual_rail_toml() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/dual-rail.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(Scenario::from_toml(&text).unwrap(), Scenario::demo());
}

#[test]
fn example_scenario_files_parse_and_run() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut s =
            Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        s.workload.connections = s.workload.count(s.topology.hosts).min(100);
        s.workload.connections_per_host = None;
        let r = provider_sim::run(&s, PolicyKind::Apm, 1).unwrap();
        assert!(r.connections > 0, "{}", path.display());
        n += 1;
    }
    assert!(n >= 3, "the examples are there");
}

#[test]
fn manager_end_to_end_on_tokio_paused_clock() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = small(vec![
            Fault::PortDown {
                at_ms: 1000,
                port: "h0:1".into(),
            },
            Fault::PortUp {
                at_ms: 1800,
                port: "h0:1".into(),
            },
        ]);
        s.workload.message_interval_ms = 10;
        s.duration_ms = 2500;
        let mut cfg = RunConfig::new(PolicyKind::Apm, 3);
        cfg.external_hosts = (0..4).collect();
        cfg.check = true;
        let sim = Sim::new(&s, cfg).unwrap();
        let shared = provider_sim::SimProvider::share(sim);
        let mut handles = Vec::new();
        let mut notes = Vec::new();
        for h in 0..4 {
            let p = std::sync::Arc::new(shared.for_host(h).stack());
            let (mgr, handle) = apm_core::Manager::new(p, apm_core::Policy::default()).unwrap();
            notes.push(handle.notifications());
            tokio::spawn(mgr.run());
            handles.push(handle);
        }
        // Each manager answers only once it runs with its host's ports taken.
        for handle in &handles {
            handle.stats().await.unwrap();
        }
        for (h, handle) in handles.iter().enumerate() {
            for spec in shared.with_sim(|sim| sim.external_specs(h)) {
                handle.protect(spec).await.unwrap();
            }
        }
        shared.drive(Time::from_millis(2400)).await;
        let (states, hit) = shared.with_sim(|sim| {
            let states: Vec<_> = (0..sim.num_conns())
                .map(|i| sim.conn_state(i).unwrap())
                .collect();
            (states, sim.violations().to_vec())
        });
        assert!(hit.is_empty(), "{hit:?}");
        assert!(
            states.iter().all(|s| *s == ConnState::Armed),
            "every connection armed again: {states:?}"
        );
        let mut migrated = 0;
        for rx in &mut notes {
            while let Ok(n) = rx.try_recv() {
                if matches!(n.kind, apm_core::NotificationKind::Migrated { .. }) {
                    migrated += 1;
                }
            }
        }
        assert!(migrated > 0, "the Manager reported migrations");
        for h in &handles {
            h.shutdown();
        }
    });
}

#[test]
fn manager_end_to_end_sm_failover_then_remote_failure() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        // One message a second: the far side of h3:2 can only learn from trap 65, which
        // the new SM sends only to those who subscribed again after ClientReregister.
        let s = fast_sm_polling(small(vec![
            Fault::SmFailover {
                at_ms: 100,
                subnet: 1,
            },
            Fault::PortDown {
                at_ms: 1500,
                port: "h3:2".into(),
            },
        ]));
        let mut cfg = RunConfig::new(PolicyKind::Apm, 11);
        cfg.external_hosts = (0..4).collect();
        cfg.check = true;
        let shared = provider_sim::SimProvider::share(Sim::new(&s, cfg).unwrap());
        let mut handles = Vec::new();
        for h in 0..4 {
            let p = std::sync::Arc::new(shared.for_host(h).stack());
            let (mgr, handle) = apm_core::Manager::new(p, apm_core::Policy::default()).unwrap();
            tokio::spawn(mgr.run());
            handles.push(handle);
        }
        // Each manager answers only once it runs with its host's ports taken.
        for handle in &handles {
            handle.stats().await.unwrap();
        }
        for (h, handle) in handles.iter().enumerate() {
            for spec in shared.with_sim(|sim| sim.external_specs(h)) {
                handle.protect(spec).await.unwrap();
            }
        }
        shared.drive(Time::from_millis(1400)).await;
        let mut subs = 0;
        for h in &handles {
            subs += h.stats().await.unwrap().subscriptions;
        }
        assert!(
            subs >= 8 + 4,
            "every port subscribed, rail B again after failover"
        );
        let hit = shared.with_sim(|sim| conns_via(sim, 3, 2));
        assert!(!hit.is_empty());
        shared.drive(Time::from_millis(1530)).await;
        shared.with_sim(|sim| {
            for &i in &hit {
                assert_ne!(sim.conn_state(i), Some(ConnState::Migrating), "conn{i}");
                assert_ne!(sim.conn_state(i), Some(ConnState::Lost), "conn{i}");
            }
            assert!(sim.violations().is_empty(), "{:?}", sim.violations());
        });
        for h in &handles {
            h.shutdown();
        }
    });
}

/// The baselines: `port-err-move` forces its QPs off a port that goes down (the peer's
/// ARMED QP follows the first packet with MigReq=1) and restores them in milliseconds;
/// `reload-local` waits out the retry budget; both re-arm the path left at once. After
/// a forced migration that re-arm can strand the peer: a QP in REARM sends MigReq=0, so
/// a peer that had no packet of the moved side's before it still runs on the dead path
/// and drops what arrives on its alternate, and both run out of retries (why apm keeps
/// a QP it moved MIGRATED until its peer says it followed).
#[test]
fn port_err_move_forces_its_migrations_and_reload_local_waits_the_budget() {
    let mut s = small(vec![Fault::PortDown {
        at_ms: 1500,
        port: "h1:1".into(),
    }]);
    s.workload.message_interval_ms = 10;
    let run = |p| provider_sim::run(&s, p, 1).unwrap();
    let fast = run(PolicyKind::PortErrMove);
    let slow = run(PolicyKind::ReloadLocal);
    assert!(fast.failovers > 0);
    assert!(fast.restore_ms.p50 < 50.0, "{:?}", fast.restore_ms);
    assert!(slow.restore_ms.p50 > 500.0, "{:?}", slow.restore_ms);
    assert_eq!(slow.lost, 0);
    assert!(fast.lost > 0, "a peer stranded by the re-arm");
}
