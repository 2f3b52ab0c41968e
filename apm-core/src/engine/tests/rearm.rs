//! Re-arming through LAP/APR, between two engines: retransmission and backoff,
//! rejections, failed modifies, storms paced by the concurrency limit.

use super::harness::*;
use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Protection;

#[test]
fn lap_lost_is_retransmitted_with_backoff_then_given_up_and_retried_later() {
    let policy = Policy {
        passive_initiate_delay_ms: 10_000,
        ..Policy::default()
    };
    let mut p = Pair::with_policy(policy);
    p.drop = Box::new(|to, _| to == 'b');
    p.protect(1);
    p.run_for(1499);
    let laps = |p: &Pair| {
        p.a.sent()
            .iter()
            .filter(|m| matches!(m, PeerMsg::Lap(_)))
            .count()
    };
    // 100 ms, +200, +400: 4 sends by 700 ms, the 4th times out at 1500 ms.
    assert_eq!(laps(&p), 4);
    assert_eq!(p.a.engine.stats().lap_retransmits, 3);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    p.run_for(2);
    assert!(p
        .a
        .notifications()
        .contains(&NotificationKind::Unprotected {
            reason: UnprotectedReason::PeerUnresponsive,
            cause: None
        }));
    // Retried after rearm_retry_ms; with the wire healed it arms.
    p.drop = Box::new(|_, _| false);
    p.run_for(3000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn apr_rejection_moves_to_next_candidate() {
    let mut p = Pair::new();
    // B refuses to load anything: every APR is "rejected".
    p.b.fail_ops.push("load_alternate");
    p.protect(1);
    p.run_for(300);
    let statuses: Vec<_> =
        p.b.sent()
            .iter()
            .filter_map(|m| match m {
                PeerMsg::Apr(a) => Some(a.status),
                _ => None,
            })
            .collect();
    assert!(
        statuses.len() >= 2,
        "A tried more than one candidate: {statuses:?}"
    );
    assert!(statuses.iter().all(|s| *s == ApStatus::Rejected));
    let proposed: Vec<_> =
        p.a.sent()
            .iter()
            .filter_map(|m| match m {
                PeerMsg::Lap(l) => Some(l.alt),
                _ => None,
            })
            .collect();
    assert_ne!(proposed[0], proposed[1]);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    // B recovers; A's backoff retry arms.
    p.b.fail_ops.clear();
    p.run_for(30_000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn modify_failure_on_sender_reports_unprotected_and_recovers() {
    let mut p = Pair::new();
    p.a.fail_ops.push("set_rearm");
    p.protect(1);
    p.run_for(100);
    assert!(
        p.a.notifications()
            .contains(&NotificationKind::Unprotected {
                reason: UnprotectedReason::ModifyFailed,
                cause: None
            })
            || p.a
                .notifications()
                .contains(&NotificationKind::Unprotected {
                    reason: UnprotectedReason::NoCandidate,
                    cause: None
                })
    );
    p.a.fail_ops.clear();
    p.run_for(60_000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn port_back_while_lap_outstanding_is_not_disturbed() {
    let mut p = Pair::new();
    let mut held = true;
    p.drop = Box::new(move |to, m| {
        // Hold B's first APR back: A's LAP stays outstanding meanwhile.
        let drop = held && to == 'a' && matches!(m, PeerMsg::Apr(_));
        if drop {
            held = false;
        }
        drop
    });
    p.protect(1);
    p.run_for(50);
    port_event(&mut p, 'a', 2, PortEvent::Down);
    port_event(&mut p, 'a', 2, PortEvent::Active);
    p.run_for(3000);
    assert_armed(&p, 1, p.a.status(1).alternate.expect("armed"));
}

#[test]
fn rearm_storm_is_paced_by_the_concurrency_limit() {
    let policy = Policy {
        max_concurrent_rearms: 3,
        ..Policy::default()
    };
    let mut p = Pair::with_policy(policy);
    for n in 1..=10 {
        p.protect(n);
    }
    // Before any answer, only three LAPs are out.
    let laps =
        p.a.sent()
            .iter()
            .filter(|m| matches!(m, PeerMsg::Lap(_)))
            .count();
    assert_eq!(laps, 3);
    p.run_for(2000);
    for n in 1..=10 {
        assert_eq!(p.a.status(n).protection, Protection::Armed, "conn {n}");
    }
}

#[test]
fn a_rearm_storm_asks_the_sa_once_per_destination_even_when_it_knows_no_path() {
    let mut p = Pair::new();
    // Connections whose only known path is the primary: the engine must ask the SA.
    for n in 1..=20 {
        let mut s = spec('a', n, MigrationMode::Hardware);
        s.candidates = vec![];
        p.protect_spec('a', s);
    }
    // The bench's SA knows paths to b's ports from each of a's ports: 2 ports x 1 GID.
    let queries = |p: &Pair| {
        p.a.op_names()
            .iter()
            .filter(|o| **o == "resolve_paths")
            .count()
    };
    assert_eq!(queries(&p), 2);
    p.run_for(0);
    // A destination with no paths at all is asked once too, not once per connection.
    let mut q = Pair::new();
    for n in 1..=20 {
        let mut s = spec('a', n, MigrationMode::Hardware);
        s.primary.dgid = Gid::from_guid(0xdead);
        s.candidates = vec![];
        q.protect_spec('a', s);
        q.run_for(0);
    }
    assert_eq!(
        queries(&q),
        2,
        "one query per (port, destination), answered empty or not"
    );
}
