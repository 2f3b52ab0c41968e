//! The word that the peer is there: a software move made before the peer has followed
//! (`SoftwareMigrate` with `peer` `After` or `Alongside`: the provider may hold its
//! replay) is always followed by `PeerThere` once the engine hears that the peer runs
//! on the path; a move made after the peer's needs no word, and hardware QPs get none.
//! A move made alongside the peer's ("moving", `Alongside`) holds on both sides, and
//! both sides hear.

use super::harness::{ends, qp_event, software_pair, Node, Pair};
use crate::io::{CommandOp, Input, PeerMove, QpEvent};
use crate::probe::FailureKind;
use crate::types::MigrationMode;

/// The `peer` of each software move of `n`, in order, and whether a `PeerThere` came
/// after the last move made before the peer.
fn moves(n: &Node) -> (Vec<PeerMove>, bool) {
    let ops = n.ops();
    let flags = ops
        .iter()
        .filter_map(|o| match o {
            CommandOp::SoftwareMigrate { peer, .. } => Some(*peer),
            _ => None,
        })
        .collect();
    let last_early = ops.iter().rposition(|o| {
        matches!(
            o,
            CommandOp::SoftwareMigrate {
                peer: PeerMove::After | PeerMove::Alongside,
                ..
            }
        )
    });
    let told = last_early.is_none_or(|i| {
        ops[i..]
            .iter()
            .any(|o| matches!(o, CommandOp::PeerThere { .. }))
    });
    (flags, told)
}

/// `side` finds its path over rail 1 dead (`kind`).
fn rail_1_dies(p: &mut Pair, side: char, kind: FailureKind) {
    p.input(
        side,
        Input::PathDown {
            ends: ends(side, 1, 1),
            kind,
        },
    );
}

/// Both sides find rail 1 dead at once (`kind`): each side moves once, alongside the
/// other, and hears that the other is there.
fn both_sides_see_rail_1_die(kind: FailureKind) {
    let mut p = software_pair(true);
    for side in ['a', 'b'] {
        rail_1_dies(&mut p, side, kind);
    }
    p.run_for(1000);
    for n in [&p.a, &p.b] {
        assert_eq!(
            moves(n),
            (vec![PeerMove::Alongside], true),
            "{:?}",
            n.op_names()
        );
    }
}

#[test]
fn the_side_asked_to_move_first_holds_and_hears_when_the_asker_followed() {
    // A stall asks first: B moves on A's request, A follows B's answer.
    let mut p = software_pair(true);
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(1000);
    assert_eq!(
        moves(&p.b),
        (vec![PeerMove::After], true),
        "{:?}",
        p.b.op_names()
    );
    assert_eq!(
        moves(&p.a),
        (vec![PeerMove::Done], true),
        "{:?}",
        p.a.op_names()
    );
}

#[test]
fn a_side_moving_at_once_and_its_peer_both_hear() {
    // A's own rail died with rail 2 probed alive: A moves at once and tells B in the
    // same breath ("moving"), so neither is on rail 2 when the other's move starts, and
    // either may finish first: both hold their replay until told the other is there.
    let mut p = software_pair(true);
    rail_1_dies(&mut p, 'a', FailureKind::LocalPort);
    p.run_for(1000);
    for n in [&p.a, &p.b] {
        let (flags, told) = moves(n);
        assert_eq!(flags.len(), 1, "{:?}", n.op_names());
        assert!(told, "{:?}", n.op_names());
    }
    assert_eq!(moves(&p.a).0, vec![PeerMove::Alongside]);
    assert_eq!(moves(&p.b).0, vec![PeerMove::Alongside]);
}

#[test]
fn both_sides_seeing_their_rail_die_move_once_and_both_hear() {
    // A link down seen at both ends (one cable): each moves at once and says "moving";
    // the other's "moving" is no sign that it is there, its "moved" or answer is.
    both_sides_see_rail_1_die(FailureKind::LocalPort);
}

#[test]
fn hardware_connections_get_no_word() {
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Hardware);
    p.run_for(1000);
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(1000);
    assert!(p.a.op_count("force_migrate") > 0, "{:?}", p.a.op_names());
    for n in [&p.a, &p.b] {
        assert_eq!(n.op_count("peer_there"), 0, "{:?}", n.op_names());
    }
}

#[test]
fn a_word_that_comes_while_the_move_runs_is_passed_on_at_once_and_again_after() {
    // A's rail dies and A moves alongside B; A's provider is slow, so B's answer
    // ("there") comes while A's move still runs. The provider hears it at once (it may
    // then replay as soon as the move is done, not hold for a word already come), and
    // again once the move is done (a provider that heard it before its move began).
    let mut p = software_pair(true);
    p.node('a').unanswered.push("software_migrate");
    rail_1_dies(&mut p, 'a', FailureKind::LocalPort);
    p.run_for(1000);
    let before: Vec<&str> = p.a.op_names();
    let move_at = before.iter().position(|o| *o == "software_migrate");
    let told_at = before.iter().rposition(|o| *o == "peer_there");
    assert!(
        move_at.is_some() && told_at > move_at,
        "told while the move runs: {before:?}"
    );
    assert_eq!(p.a.held.len(), 1, "the move is still in flight");
    // The word names the path the move goes to: a provider moving elsewhere by the time
    // it arrives releases nothing.
    let ops = p.a.ops();
    let to = ops.iter().find_map(|o| match o {
        CommandOp::SoftwareMigrate { path, .. } => Some(*path),
        _ => None,
    });
    let told = ops.iter().rev().find_map(|o| match o {
        CommandOp::PeerThere { path, .. } => Some(*path),
        _ => None,
    });
    assert!(to.is_some() && told == to, "{told:?} against {to:?}");
    let told_during = p.a.op_count("peer_there");
    p.release('a');
    p.run_for(1000);
    assert!(
        p.a.op_count("peer_there") > told_during,
        "and again once the move is done: {:?}",
        p.a.op_names()
    );
}

#[test]
fn requests_that_cross_are_moves_alongside_and_both_hear() {
    // Both sides' probes find the path dead at once: each asks the other to move, and
    // each request reaches a side waiting for the answer to its own. Each moves on the
    // other's request while the other moves on its own: alongside, each holding its
    // replay until the other's answer says it is there.
    both_sides_see_rail_1_die(FailureKind::Fabric);
}
