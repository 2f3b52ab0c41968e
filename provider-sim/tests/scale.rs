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
