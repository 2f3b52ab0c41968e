//! Liveness probes cost what they cost: on InfiniBand each is one of apm's vendor MADs
//! on QP1, counted with the MADs, lost with MAD loss and queued at the receiving
//! host's MAD agent; on RoCE a datagram on the rail. A probe lost or late can take a
//! healthy path down, and the connections over it move for nothing: the report counts
//! those moves (`false_failovers`).

use provider_sim::config::Mode;
use provider_sim::controller::sim_policy;
use provider_sim::{Fault, PolicyKind, RunConfig, RunReport, Scenario, Sim};

/// 16 dual-rail hosts, 200 connections, no failure at all but, from 1 s, 2 s of MAD
/// loss at `rate`; apm with probes on every path.
fn quiet_fabric(mode: Mode, rate: f64) -> Scenario {
    let mut s = Scenario {
        duration_ms: 4000,
        ..Scenario::default()
    };
    s.workload.connections = 200;
    s.workload.mode = mode;
    if rate > 0.0 {
        s.faults.push(Fault::MadLoss {
            at_ms: 1000,
            duration_ms: 2000,
            rate,
        });
    }
    s
}

fn apm(s: &Scenario, seed: u64) -> RunReport {
    apm_with(s, seed, apm_core::FastMoves::Always)
}

/// apm with probes on every path and `fast_moves`.
fn apm_with(s: &Scenario, seed: u64, fast_moves: apm_core::FastMoves) -> RunReport {
    let mut cfg = RunConfig::new(PolicyKind::Apm, seed);
    cfg.engine_policy = sim_policy();
    cfg.engine_policy.fast_moves = fast_moves;
    cfg.check = true;
    let r = Sim::new(s, cfg).expect("scenario runs").run();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    r
}

#[test]
fn probes_on_infiniband_are_mads_and_are_counted_per_host_and_second() {
    let r = apm(&quiet_fabric(Mode::Hardware, 0.0), 1);
    assert!(r.probes_sent > 0);
    assert!(
        r.mads_sent >= r.probes_sent,
        "{} MADs, {} of them probes",
        r.mads_sent,
        r.probes_sent
    );
    let per_host_s = r.probes_sent as f64 / 16.0 / 4.0;
    assert!(
        (r.probes_per_host_per_s - per_host_s).abs() < 1e-6,
        "{} against {per_host_s}",
        r.probes_per_host_per_s
    );
    // Each host probes every peer it has a connection with, on both rails, every
    // 15 ms or so (0-25% jitter): at most 15 x 2 x 1000 / 15 a second.
    assert!(
        r.probes_per_host_per_s <= 2000.0,
        "{}",
        r.probes_per_host_per_s
    );
    assert!(
        r.probes_per_host_per_s > 100.0,
        "{}",
        r.probes_per_host_per_s
    );
    assert_eq!((r.lost, r.false_failovers), (0, 0));
}

/// With every move at once (`fast_moves = "always"`), half the probes lost take healthy
/// paths down and connections move for nothing; apm's default leaves the moves of the
/// application's QPs (which only their traffic arms again) to the HCA, whose retries
/// never run out on a healthy path.
#[test]
fn mad_loss_takes_infiniband_probes_down_and_moves_connections_for_nothing() {
    let mut false_ib = 0;
    for seed in 1..=3 {
        let ib = apm(&quiet_fabric(Mode::Hardware, 0.5), seed);
        assert_eq!(ib.lost, 0, "seed {seed}: nothing failed");
        false_ib += ib.false_failovers;
        let default = apm_with(
            &quiet_fabric(Mode::Hardware, 0.5),
            seed,
            apm_core::FastMoves::default(),
        );
        assert_eq!(
            (default.lost, default.false_failovers),
            (0, 0),
            "seed {seed}"
        );
        // RoCE's probes are datagrams on the rails: MAD loss never touches them.
        let roce = apm(&quiet_fabric(Mode::Software, 0.5), seed);
        assert_eq!(roce.false_failovers, 0, "seed {seed}");
        assert_eq!(roce.failovers, 0, "seed {seed}");
    }
    assert!(false_ib > 0, "half the probes lost, no session went down");
}
