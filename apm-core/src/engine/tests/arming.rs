//! What arms a hardware QP after a move decides whether the engine moves it at once
//! (`Policy::fast_moves`): a QP whose REARM comes back ARMED, or one apm arms with its
//! own zero-length write, is moved at once; one that only the application's traffic
//! arms is left to the HCA's own migration when its retries run out, since a move at
//! once would leave it unarmed for as long as that traffic pauses.

use super::harness::*;
use crate::io::*;
use crate::policy::{FastMoves, Policy};

/// A pair whose devices answer REARM with REARM, apm posting its arming write or
/// not, protected and idle.
fn pair(arming: BenchArming, policy: Policy) -> Pair {
    let mut p = Pair::with_policy(policy);
    p.a.arming = arming;
    p.b.arming = arming;
    p.protect(1);
    p.run_for(1000);
    p
}

#[test]
fn a_qp_set_to_rearm_gets_apms_arming_write_and_moves_at_once() {
    let mut p = pair(BenchArming::ApmPosts, Policy::default());
    // Each side wrote once, after its REARM.
    assert_eq!(p.a.op_count("arming_write"), 1);
    assert_eq!(p.b.op_count("arming_write"), 1);
    p.a.clear_log();
    p.b.clear_log();
    port_event(&mut p, 'a', 1, PortEvent::Down);
    assert_eq!(p.a.op_names(), ["send_peer"], "asked the peer at once");
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
    // Re-arming the path left writes again, so that it arms without the traffic.
    assert_eq!(p.a.op_count("arming_write"), 1);
    assert_eq!(p.b.op_count("arming_write"), 1);
}

#[test]
fn a_qp_only_traffic_arms_is_left_to_the_hca_and_never_written_to_again() {
    let mut p = pair(BenchArming::ByTraffic, Policy::default());
    p.a.clear_log();
    p.b.clear_log();
    port_event(&mut p, 'a', 1, PortEvent::Down);
    p.run_for(1000);
    // No word to the peer, no forced migration: the HCA moves it on retry exhaustion.
    assert!(p.a.sent().is_empty(), "{:?}", p.a.sent());
    assert_eq!(p.a.op_count("force_migrate"), 0);
    assert_eq!(p.b.op_count("force_migrate"), 0);
    // It does, and both sides arm the path they left, with no write this time.
    qp_event(&mut p, 'a', 1, QpEvent::PathMigrated);
    qp_event(&mut p, 'b', 1, QpEvent::PathMigrated);
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
    assert_eq!(p.a.op_count("set_rearm"), 1);
    assert_eq!(p.a.op_count("arming_write"), 0);
    assert!(p.a.dead_moves.is_empty() && p.b.dead_moves.is_empty());
}

#[test]
fn a_reported_stall_moves_a_qp_only_traffic_arms_at_once() {
    // The application (or, under apm run, the operator's rail-down verdict) says the
    // traffic stopped: packets wait on the dead path, and once moved they arm the QP.
    let mut p = pair(BenchArming::ByTraffic, Policy::default());
    p.a.clear_log();
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    assert_eq!(p.a.op_names(), ["send_peer"], "asked the peer at once");
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
    assert_eq!(p.a.op_count("force_migrate"), 1);
}

#[test]
fn fast_moves_always_moves_a_qp_only_traffic_arms() {
    let policy = Policy {
        fast_moves: FastMoves::Always,
        ..Policy::default()
    };
    let mut p = pair(BenchArming::ByTraffic, policy);
    p.a.clear_log();
    port_event(&mut p, 'a', 1, PortEvent::Down);
    assert_eq!(p.a.op_names(), ["send_peer"]);
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
}

#[test]
fn a_software_connection_moves_at_once_whatever_arms_it() {
    let mut p = Pair::new();
    p.a.arming = BenchArming::ByTraffic;
    p.b.arming = BenchArming::ByTraffic;
    p.protect_mode(1, crate::types::MigrationMode::Software);
    p.run_for(1000);
    assert_eq!(p.a.op_count("arming_write"), 0, "nothing to arm on RoCE");
    p.a.clear_log();
    port_event(&mut p, 'a', 1, PortEvent::Down);
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
}

#[test]
fn fast_moves_never_leaves_even_a_self_armed_qp_to_the_hca() {
    let policy = Policy {
        fast_moves: FastMoves::Never,
        ..Policy::default()
    };
    let mut p = pair(BenchArming::ApmPosts, policy);
    p.a.clear_log();
    port_event(&mut p, 'a', 1, PortEvent::Down);
    p.run_for(1000);
    assert!(p.a.sent().is_empty());
    assert_eq!(p.a.op_count("force_migrate"), 0);
}
