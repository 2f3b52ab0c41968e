//! The command contract: at most one QP command in flight per connection (an override
//! waits for the answer to the one in flight), and every command bounded by a deadline
//! after which it counts as failed.

use super::harness::*;
use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Protection;

/// Both sides armed on connection 1, logs cleared.
fn armed_pair() -> Pair {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    assert_eq!(p.b.status(1).protection, Protection::Armed);
    p.a.clear_log();
    p.b.clear_log();
    p
}

/// A message from A's port 1 to B.
fn from_a(p: &mut Pair, msg: PeerMsg) {
    p.input(
        'b',
        Input::PeerMessage {
            from: PeerAddr {
                gid: gid('a', 1),
                lid: lid('a', 1),
            },
            port: PortKey::new(DEV, 1),
            msg,
        },
    );
}

/// B starts loading another alternate (A's LAP for a1 -> b2) and its provider does not
/// answer the load; then A asks B to move to B's armed alternate (b2 -> a2), which
/// overrides the re-arm with a forced migration.
fn override_while_loading(p: &mut Pair) {
    p.b.unanswered = vec!["load_alternate"];
    from_a(
        p,
        PeerMsg::Lap(Lap {
            sender_comm_id: 0x101,
            receiver_comm_id: 0x201,
            receiver_qpn: Qpn::new(0x201).expect("24-bit"),
            alt: path('a', 1, 2),
        }),
    );
    p.run_for(0);
    assert_eq!(
        p.b.held.len(),
        1,
        "the load is in flight: {:?}",
        p.b.op_names()
    );
    from_a(
        p,
        PeerMsg::Migrate(Migrate {
            sender_comm_id: 0x101,
            receiver_comm_id: 0x201,
            path: path('a', 2, 2),
            intent: MigrateIntent::Probe,
        }),
    );
}

fn forced(n: &Node) -> usize {
    n.op_names()
        .iter()
        .filter(|o| **o == "force_migrate")
        .count()
}

#[test]
fn an_override_waits_for_the_command_in_flight() {
    let mut p = armed_pair();
    override_while_loading(&mut p);
    p.run_for(0);
    assert_eq!(
        forced(&p.b),
        0,
        "two commands on one QP: {:?}",
        p.b.op_names()
    );
    // The load is answered (its result is ignored: the migration overrode it); only
    // then does the forced migration go out, and the connection moves.
    p.b.unanswered.clear();
    p.release('b');
    assert_eq!(forced(&p.b), 1, "{:?}", p.b.op_names());
    p.run_for(100);
    assert!(p.b.status(1).primary.same_route(&path('b', 2, 2)));
    assert!(p
        .b
        .notifications()
        .iter()
        .any(|n| matches!(n, NotificationKind::Migrated { forced: true, .. })));
}

#[test]
fn a_command_never_answered_fails_at_its_deadline_and_the_override_goes_out() {
    let mut p = armed_pair();
    let start = p.now;
    override_while_loading(&mut p);
    let stale = p.b.held[0].id;
    let deadline = start.plus(Policy::ms(Policy::default().command_timeout_ms));
    assert_eq!(p.b.engine.poll_timeout(), Some(deadline));
    p.run_for(Policy::default().command_timeout_ms - 1);
    assert_eq!(forced(&p.b), 0, "{:?}", p.b.op_names());
    p.run_for(1);
    assert_eq!(forced(&p.b), 1, "the load failed at its deadline");
    p.run_for(100);
    assert!(p.b.status(1).primary.same_route(&path('b', 2, 2)));
    // The provider's late answer changes nothing.
    let before = p.b.log.len();
    p.input(
        'b',
        Input::CommandDone {
            id: stale,
            result: Ok(CommandOutcome::Done),
        },
    );
    assert_eq!(p.b.log.len(), before);
}

#[test]
fn a_provider_that_never_answers_leaves_the_connection_unprotected_not_wedged() {
    let mut p = Pair::new();
    p.a.unanswered = vec!["load_alternate"];
    p.protect(1);
    p.run_for(Policy::default().command_timeout_ms - 1);
    assert!(p.a.notifications().is_empty(), "{:?}", p.a.notifications());
    p.run_for(1);
    let told: Vec<(Time, NotificationKind)> =
        p.a.log
            .iter()
            .filter_map(|o| match o {
                Output::Notify(n) => Some((n.time, n.kind.clone())),
                _ => None,
            })
            .collect();
    assert_eq!(
        told,
        [(
            Time::from_millis(Policy::default().command_timeout_ms),
            NotificationKind::Unprotected {
                reason: UnprotectedReason::ModifyFailed
            }
        )]
    );
    // The engine goes on: the next candidate is negotiated and loaded (and that load
    // is not answered either).
    p.run_for(1000);
    let loads =
        p.a.op_names()
            .iter()
            .filter(|o| **o == "load_alternate")
            .count();
    assert_eq!(loads, 2, "{:?}", p.a.op_names());
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
}

#[test]
fn a_waiting_command_whose_phase_ended_never_goes_out() {
    let mut p = armed_pair();
    override_while_loading(&mut p);
    // The QP dies while the forced migration waits for the load: nothing more goes to
    // the QP, and the held command leaves no trace in the command window.
    p.input(
        'b',
        Input::QpEvent {
            conn: ConnId(1),
            event: QpEvent::Fatal,
        },
    );
    assert_eq!(p.b.status(1).protection, Protection::Lost);
    p.b.unanswered.clear();
    p.release('b');
    p.run_for(100);
    assert_eq!(forced(&p.b), 0, "{:?}", p.b.op_names());
    // Only the load's deadline was ever pending, and it was answered.
    assert_eq!(p.b.engine.poll_timeout(), None);
}
