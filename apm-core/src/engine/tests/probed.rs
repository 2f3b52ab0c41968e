//! Probe verdicts: a path held for flapping is up but not usable until its hold ends,
//! a failure during the hold makes it dead again, and a move a verdict caused tells the
//! application the verdict's kind.

use super::harness::{ends, path, port_event, port_info, qp_event, Pair};
use crate::io::{
    Cause, Input, Migrate, MigrateIntent, NotificationKind, PeerMsg, QpEvent, UnprotectedReason,
};
use crate::policy::Policy;
use crate::probe::{FailureKind, PathEnds};
use crate::types::{MigrationMode, PeerAddr, Time};
use crate::Engine;
use std::time::Duration;

fn engine() -> Engine {
    let mut e = Engine::new(Policy::default()).expect("default policy");
    for port in [1, 2] {
        e.handle_input(Time::ZERO, Input::PortInfo(port_info('a', port)));
    }
    e
}

#[test]
fn a_held_path_is_up_but_unused_until_its_hold_ends() {
    let mut e = engine();
    let p = path('a', 1, 1);
    let ends = PathEnds {
        local: p.sgid,
        remote: p.dgid,
    };
    let t0 = Time::from_millis(100);
    let kind = FailureKind::Fabric;
    e.handle_input(t0, Input::PathDown { ends, kind });
    assert!(!e.path_up(&p) && !e.path_usable(&p));
    let until = t0.plus(Duration::from_secs(6));
    let t1 = t0.plus(Duration::from_millis(50));
    e.handle_input(t1, Input::PathHeld { ends, until });
    assert!(
        e.path_up(&p),
        "a connection with a dead primary may still move onto it"
    );
    assert!(!e.path_usable(&p), "nothing is armed onto it while held");
    assert_eq!(e.poll_timeout(), Some(until));
    e.handle_timeout(until);
    assert!(e.path_usable(&p));
    // Held again, then down during the hold: dead, and the hold's end changes nothing.
    let until = until.plus(Duration::from_secs(6));
    e.handle_input(until, Input::PathDown { ends, kind });
    let t2 = until.plus(Duration::from_millis(10));
    e.handle_input(
        t2,
        Input::PathHeld {
            ends,
            until: t2.plus(Duration::from_secs(8)),
        },
    );
    e.handle_input(
        t2.plus(Duration::from_secs(1)),
        Input::PathDown { ends, kind },
    );
    e.handle_timeout(t2.plus(Duration::from_secs(9)));
    assert!(!e.path_up(&p));
    // A plain Up ends everything.
    e.handle_input(t2.plus(Duration::from_secs(10)), Input::PathUp { ends });
    assert!(e.path_usable(&p));
}

/// The causes of the `Migrated` notifications `node` gave.
fn move_causes(p: &Pair, node: char) -> Vec<Option<Cause>> {
    let n = if node == 'a' { &p.a } else { &p.b };
    n.notifications()
        .into_iter()
        .filter_map(|k| match k {
            NotificationKind::Migrated { cause, .. } => Some(cause),
            _ => None,
        })
        .collect()
}

#[test]
fn a_move_a_verdict_caused_says_its_kind_and_the_side_asked_says_none() {
    for kind in [
        FailureKind::Fabric,
        FailureKind::PeerPort,
        FailureKind::LocalPort,
    ] {
        let mut p = Pair::new();
        p.protect(1);
        p.run_for(1000);
        p.a.clear_log();
        p.b.clear_log();
        p.input(
            'a',
            Input::PathDown {
                ends: ends('a', 1, 1),
                kind,
            },
        );
        p.run_for(1000);
        assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
        assert_eq!(move_causes(&p, 'a'), [Some(Cause::from(kind))], "{kind:?}");
        // B heard of nothing itself: it moved because A asked.
        assert_eq!(move_causes(&p, 'b'), [None], "{kind:?}");
    }
}

#[test]
fn a_stall_moves_with_cause_stall_and_a_later_move_says_what_first_killed_the_primary() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(1000);
    assert_eq!(move_causes(&p, 'a'), [Some(Cause::Stall)]);
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    // Both rails die by the probes' word, rail 1 first: nothing to move to, and the
    // application hears what killed the primary.
    let fabric = FailureKind::Fabric;
    p.input(
        'a',
        Input::PathDown {
            ends: ends('a', 2, 2),
            kind: fabric,
        },
    );
    p.input(
        'a',
        Input::PathDown {
            ends: ends('a', 1, 1),
            kind: FailureKind::PeerPort,
        },
    );
    p.run_for(100);
    assert!(
        p.a.notifications()
            .contains(&NotificationKind::Unprotected {
                reason: UnprotectedReason::PrimaryDownUnarmed,
                cause: Some(Cause::PeerPort),
            }),
        "{:?}",
        p.a.notifications()
    );
    // The primary's own port going down too changes nothing: the first cause stands.
    port_event(&mut p, 'a', 1, crate::io::PortEvent::Down);
    // Rail 2 returns: the connection moves there, for the reason its primary died.
    p.input(
        'a',
        Input::PathUp {
            ends: ends('a', 2, 2),
        },
    );
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
    assert_eq!(move_causes(&p, 'a'), [Some(Cause::PeerPort)]);
}

#[test]
fn a_primary_that_works_again_forgets_what_killed_it() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    // The alternate is dead, then the primary dies and comes back: no move.
    for (e, kind) in [
        (ends('a', 2, 2), FailureKind::Fabric),
        (ends('a', 1, 1), FailureKind::LocalPort),
    ] {
        p.input('a', Input::PathDown { ends: e, kind });
    }
    p.input(
        'a',
        Input::PathUp {
            ends: ends('a', 1, 1),
        },
    );
    p.input(
        'a',
        Input::PathUp {
            ends: ends('a', 2, 2),
        },
    );
    p.run_for(1000);
    assert!(move_causes(&p, 'a').is_empty());
    // The next move is for its own reason.
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(1000);
    assert_eq!(move_causes(&p, 'a'), [Some(Cause::Stall)]);
}

/// A pair protected in `mode` whose B side's probe session on rail 2 has expired
/// although rail 2 works (both hosts starved for three intervals): on its own word B
/// would refuse to move there.
fn pair_with_b_rail_2_probe_dead(mode: MigrationMode) -> Pair {
    let mut p = Pair::new();
    p.protect_mode(1, mode);
    p.run_for(1000);
    p.input(
        'b',
        Input::PathDown {
            ends: ends('b', 2, 2),
            kind: FailureKind::Fabric,
        },
    );
    assert!(!p.b.engine.path_up(&path('b', 2, 2)));
    p
}

#[test]
fn a_request_over_a_path_the_probes_call_dead_moves_the_connection_there() {
    for mode in [MigrationMode::Software, MigrationMode::Hardware] {
        let mut p = pair_with_b_rail_2_probe_dead(mode);
        // Rail 1 dies as A sees it; A asks B over rail 2, and B's request came over it.
        p.input(
            'a',
            Input::PathDown {
                ends: ends('a', 1, 1),
                kind: FailureKind::Fabric,
            },
        );
        p.run_for(1000);
        assert!(
            p.a.status(1).primary.same_route(&path('a', 2, 2)),
            "{mode:?}"
        );
        assert!(
            p.b.status(1).primary.same_route(&path('b', 2, 2)),
            "{mode:?}"
        );
        // The word lasts one detection time: B's own view is the probes' again.
        assert!(!p.b.engine.path_up(&path('b', 2, 2)), "{mode:?}");
    }
}

#[test]
fn a_request_from_another_address_overrides_no_probe_verdict() {
    let mut p = pair_with_b_rail_2_probe_dead(MigrationMode::Software);
    // A's request names rail 2 but comes from A's rail-1 address (a control channel,
    // say): no word about rail 2, and B refuses.
    let msg = PeerMsg::Migrate(Migrate {
        sender_comm_id: 0x101,
        receiver_comm_id: 0x201,
        path: path('a', 2, 2),
        intent: MigrateIntent::Probe,
    });
    p.input(
        'b',
        Input::PeerMessage {
            from: PeerAddr {
                gid: path('b', 1, 1).dgid,
                lid: path('a', 1, 1).slid,
            },
            port: path('b', 1, 1).port,
            msg,
        },
    );
    p.run_for(1000);
    assert!(p.b.status(1).primary.same_route(&path('b', 1, 1)));
}
