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
    n.op_count("force_migrate")
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
    // The load is answered (its result is ignored: the migration overrode it, but it
    // replaced the QP's alternate, which is loaded back); only then does the forced
    // migration go out, and the connection moves.
    p.b.unanswered.clear();
    p.release('b');
    assert_eq!(forced(&p.b), 0, "{:?}", p.b.op_names());
    p.run_for(0);
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
                reason: UnprotectedReason::ModifyFailed,
                cause: None
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

/// What B's QP would do with the QP commands B's engine emitted since `armed_pair`,
/// in the order they were emitted (one in flight at a time: the order they run in):
/// every load that was answered "done" replaced the QP's alternate, and a forced
/// migration moves onto the alternate the QP holds, whatever the engine believes.
/// The primary the QP ends on.
fn qp_primary_after(n: &Node, armed_alt: Path, refused: &[CommandId]) -> Option<Path> {
    let mut alt = armed_alt;
    let mut primary = None;
    for o in &n.log {
        let Output::Command(c) = o else { continue };
        match c.op {
            CommandOp::LoadAlternate { path, .. } if !refused.contains(&c.id) => alt = path,
            CommandOp::ForceMigrate { .. } => primary = Some(alt),
            _ => {}
        }
    }
    primary
}

#[test]
fn a_load_abandoned_while_armed_then_a_forced_migration_moves_where_the_engine_thinks() {
    // B is armed on b2 -> a2 and loads A's proposed b2 -> a1 (the load goes through: the
    // QP's alternate is now b2 -> a1, still ARMED); A then asks B to move to b2 -> a2,
    // the alternate B's engine had armed. The forced migration must not carry the QP
    // onto the abandoned load's path.
    let mut p = armed_pair();
    let armed = p.b.status(1).alternate.expect("B is armed");
    assert!(armed.same_route(&path('b', 2, 2)), "{armed}");
    override_while_loading(&mut p);
    p.run_for(0);
    p.b.unanswered.clear();
    p.release('b');
    p.run_for(100);
    let on = qp_primary_after(&p.b, armed, &[]).expect("B forced a migration");
    let believed = p.b.status(1).primary;
    assert!(
        on.same_route(&believed),
        "the QP moved onto {on}, the engine believes {believed}: {:?}",
        p.b.op_names()
    );
    assert!(on.same_route(&path('b', 2, 2)), "{on}");
}

#[test]
fn a_load_refused_while_armed_leaves_the_armed_alternate_to_migrate_onto() {
    // The same interleaving, the abandoned load refused: the QP kept b2 -> a2, and the
    // forced migration goes out at once with no second load.
    let mut p = armed_pair();
    let armed = p.b.status(1).alternate.expect("B is armed");
    override_while_loading(&mut p);
    p.run_for(0);
    let abandoned = p.b.held[0].id;
    p.b.unanswered.clear();
    p.b.held.clear();
    p.input(
        'b',
        Input::CommandDone {
            id: abandoned,
            result: Err(ProviderError::refused(
                Operation::LoadAlternate,
                Reason::Because("test says no"),
            )),
        },
    );
    p.run_for(100);
    let on = qp_primary_after(&p.b, armed, &[abandoned]).expect("B forced a migration");
    assert!(on.same_route(&path('b', 2, 2)), "{on}");
    assert!(on.same_route(&p.b.status(1).primary));
    let names = p.b.op_names();
    let before_move = names.iter().take_while(|o| **o != "force_migrate");
    let loads = before_move.filter(|o| **o == "load_alternate").count();
    assert_eq!(loads, 1, "{names:?}");
}
