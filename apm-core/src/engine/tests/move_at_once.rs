//! Moving before the peer answers: a software connection whose primary's local port or
//! rail went down and whose alternate's probe session is up moves at once and tells its
//! peer in the same breath; without that evidence, for a probe verdict or for a stall,
//! it asks first.

use super::harness::{ends, path, qp_event, software_pair, spec, Pair};
use crate::io::{CommandOp, Input, Migrate, MigrateIntent, PeerMsg, QpEvent};
use crate::probe::FailureKind;
use crate::types::{ConnId, MigrationMode};

fn rail_1_dies_at_a(p: &mut Pair, kind: FailureKind) {
    p.input(
        'a',
        Input::PathDown {
            ends: ends('a', 1, 1),
            kind,
        },
    );
}

/// What A did before any message of B's reached it: its software moves, and how it
/// told B of rail 2 (`Probe`: move first; `Moving`: A moves now), if it did.
fn before_an_answer(p: &Pair) -> (usize, Option<MigrateIntent>) {
    let rail_2 = path('a', 2, 2);
    let ops = p.a.ops();
    let moves = ops
        .iter()
        .filter(
            |o| matches!(o, CommandOp::SoftwareMigrate { path: to, .. } if to.same_route(&rail_2)),
        )
        .count();
    let asked = ops.iter().find_map(|o| match o {
        CommandOp::SendPeer {
            msg: PeerMsg::Migrate(Migrate {
                path: to, intent, ..
            }),
            ..
        } if to.same_route(&rail_2) && *intent != MigrateIntent::Moved => Some(*intent),
        _ => None,
    });
    (moves, asked)
}

fn both_on_rail_2(p: &Pair) -> bool {
    p.a.status(1).primary.same_route(&path('a', 2, 2))
        && p.b.status(1).primary.same_route(&path('b', 2, 2))
}

#[test]
fn a_dead_local_rail_with_a_probed_alternate_moves_at_once_and_the_peer_follows() {
    let mut p = software_pair(true);
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    assert_eq!(
        before_an_answer(&p),
        (1, Some(MigrateIntent::Moving)),
        "{:?}",
        p.a.op_names()
    );
    p.run_for(1000);
    assert!(both_on_rail_2(&p));
    assert_eq!(p.a.op_count("software_migrate"), 1, "A moved once");
    assert_eq!(p.b.op_count("software_migrate"), 1, "B followed once");
    assert!(p.a.dead_moves.is_empty() && p.b.dead_moves.is_empty());
}

#[test]
fn both_sides_finding_the_failure_together_each_move_once() {
    let mut p = software_pair(true);
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    p.input(
        'b',
        Input::PathDown {
            ends: ends('b', 1, 1),
            kind: FailureKind::Fabric,
        },
    );
    p.run_for(1000);
    assert!(both_on_rail_2(&p));
    for n in [&p.a, &p.b] {
        assert_eq!(n.op_count("software_migrate"), 1, "{:?}", n.op_names());
    }
}

#[test]
fn without_probe_evidence_or_for_a_stall_the_peer_is_asked_first() {
    // No session up on rail 2: ask, move when B answers.
    let mut p = software_pair(false);
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    assert_eq!(before_an_answer(&p), (0, Some(MigrateIntent::Probe)));
    p.run_for(1000);
    assert!(both_on_rail_2(&p));
    // A stall proves nothing about the primary, and a probe verdict may be a starved
    // host's mistake: ask first even with rail 2 probed.
    let mut p = software_pair(true);
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    assert_eq!(before_an_answer(&p), (0, Some(MigrateIntent::Probe)));
    p.run_for(1000);
    assert!(both_on_rail_2(&p));
    for kind in [FailureKind::Fabric, FailureKind::PeerPort] {
        let mut p = software_pair(true);
        rail_1_dies_at_a(&mut p, kind);
        assert_eq!(
            before_an_answer(&p),
            (0, Some(MigrateIntent::Probe)),
            "{kind:?}"
        );
        p.run_for(1000);
        assert!(both_on_rail_2(&p), "{kind:?}");
    }
    // Hardware mode asks first: the peer's HCA follows a forced migration itself.
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Hardware);
    p.run_for(1000);
    p.input(
        'a',
        Input::PathUp {
            ends: ends('a', 2, 2),
        },
    );
    p.a.clear_log();
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    assert!(
        !p.a.op_names().contains(&"force_migrate"),
        "{:?}",
        p.a.op_names()
    );
}

#[test]
fn a_session_the_prober_stopped_watching_is_no_evidence() {
    let mut p = software_pair(true);
    // The only connection goes, and the prober follows the engine's paths: none.
    let now = p.now;
    p.a.engine.unprotect(now, ConnId(1)).expect("unprotect");
    assert!(p.a.engine.follow_probe_paths().is_empty());
    p.b.engine.unprotect(now, ConnId(1)).expect("unprotect");
    p.run_for(1000);
    // Protected again over the same rails: rail 2's new session has not come up.
    p.protect_spec('a', spec('a', 2, MigrationMode::Software));
    p.protect_spec('b', spec('b', 2, MigrationMode::Software));
    p.run_for(1000);
    assert!(!p.a.engine.follow_probe_paths().is_empty());
    p.a.clear_log();
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    assert_eq!(p.a.op_count("software_migrate"), 0, "{:?}", p.a.op_names());
}

#[test]
fn a_second_move_within_a_second_and_a_held_alternate_wait_for_the_peer() {
    let mut p = software_pair(true);
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    p.run_for(200);
    assert!(both_on_rail_2(&p));
    // Rail 1 back and probed alive, then rail 2 dies within the second: ask first.
    p.input(
        'a',
        Input::PathUp {
            ends: ends('a', 1, 1),
        },
    );
    p.run_for(500);
    p.a.clear_log();
    p.input(
        'a',
        Input::PathDown {
            ends: ends('a', 2, 2),
            kind: FailureKind::LocalPort,
        },
    );
    assert_eq!(p.a.op_count("software_migrate"), 0, "{:?}", p.a.op_names());
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 1, 1)));
    // Held for flapping: up enough to move onto when the primary dies, but asked first.
    let mut p = software_pair(true);
    let until = p.now.plus(std::time::Duration::from_secs(5));
    p.input(
        'a',
        Input::PathHeld {
            ends: ends('a', 2, 2),
            until,
        },
    );
    p.a.clear_log();
    rail_1_dies_at_a(&mut p, FailureKind::LocalPort);
    assert_eq!(p.a.op_count("software_migrate"), 0, "{:?}", p.a.op_names());
}
