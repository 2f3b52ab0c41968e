//! LAP receiver validation: whatever a LAP says, only the connection's peer can change
//! the QP, and every refusal carries the right APStatus.

use super::harness::*;
use crate::io::*;
use crate::types::*;
use crate::Protection;

fn lap_from_a(alt: Path) -> Lap {
    Lap {
        sender_comm_id: 0x101,
        receiver_comm_id: 0x201,
        receiver_qpn: Qpn::new(0x201).expect("24-bit"),
        alt,
    }
}

fn deliver(p: &mut Pair, from_gid: Gid, lap: Lap) {
    p.input(
        'b',
        Input::PeerMessage {
            from: PeerAddr {
                gid: from_gid,
                lid: lid('a', 1),
            },
            port: PortKey::new(DEV, 1),
            msg: PeerMsg::Lap(lap),
        },
    );
}

fn apr_statuses(n: &Node) -> Vec<ApStatus> {
    n.sent()
        .iter()
        .filter_map(|m| match m {
            PeerMsg::Apr(a) => Some(a.status),
            _ => None,
        })
        .collect()
}

fn qp_ops(n: &Node) -> Vec<&'static str> {
    n.op_names()
        .into_iter()
        .filter(|o| *o != "send_peer")
        .collect()
}

#[test]
fn unknown_comm_id_gets_invalid_comm_id() {
    let mut p = armed_pair();
    let mut lap = lap_from_a(path('a', 1, 2));
    lap.receiver_comm_id = 0xdead;
    deliver(&mut p, gid('a', 1), lap);
    assert_eq!(apr_statuses(&p.b), [ApStatus::InvalidCommId]);
    assert!(qp_ops(&p.b).is_empty());
}

#[test]
fn lap_from_a_stranger_is_rejected_and_the_qp_untouched() {
    let mut p = armed_pair();
    let before = p.b.status(1);
    // Right comm ids, wrong source GID.
    deliver(&mut p, Gid::from_guid(0xbad), lap_from_a(path('a', 1, 2)));
    // Right source, wrong sender comm id.
    let mut lap = lap_from_a(path('a', 1, 2));
    lap.sender_comm_id = 0x999;
    deliver(&mut p, gid('a', 1), lap);
    assert_eq!(apr_statuses(&p.b), [ApStatus::Rejected, ApStatus::Rejected]);
    assert!(qp_ops(&p.b).is_empty(), "{:?}", p.b.op_names());
    assert_eq!(p.b.status(1), before);
    assert_eq!(p.b.engine.stats().laps_from_strangers, 2);
}

#[test]
fn stranger_lap_is_ignored_when_policy_says_so() {
    let policy = crate::Policy {
        unexpected_lap: crate::UnexpectedLap::Ignore,
        ..crate::Policy::default()
    };
    let mut p = Pair::with_policy(policy);
    p.protect(1);
    p.run_for(1000);
    p.b.clear_log();
    deliver(&mut p, Gid::from_guid(0xbad), lap_from_a(path('a', 1, 2)));
    assert!(p.b.log.is_empty());
}

#[test]
fn wrong_qpn_gid_lid_get_their_statuses() {
    let mut p = armed_pair();
    let mut lap = lap_from_a(path('a', 1, 2));
    lap.receiver_qpn = Qpn::new(0x777).expect("24-bit");
    deliver(&mut p, gid('a', 1), lap);
    // A path whose far end is not one of B's ports.
    let mut alt = path('a', 1, 2);
    alt.dgid = Gid::from_guid(0xc0ffee);
    deliver(&mut p, gid('a', 1), lap_from_a(alt));
    // B's GID but a LID outside B's port range.
    let mut alt = path('a', 1, 2);
    alt.dlid = Lid::new(999).expect("unicast");
    deliver(&mut p, gid('a', 1), lap_from_a(alt));
    // The remote end is not a port of the peer (a third node): refused, never loaded.
    let mut alt = path('a', 1, 2);
    alt.sgid = Gid::from_guid(0xe1);
    deliver(&mut p, gid('a', 1), lap_from_a(alt));
    assert_eq!(
        apr_statuses(&p.b),
        [
            ApStatus::InvalidQpn,
            ApStatus::InvalidGid,
            ApStatus::InvalidLid,
            ApStatus::InvalidGid
        ]
    );
    assert!(qp_ops(&p.b).is_empty());
}

#[test]
fn lap_repeating_the_primary_is_current_after_the_deferral() {
    let mut p = armed_pair();
    deliver(&mut p, gid('a', 1), lap_from_a(path('a', 1, 1)));
    assert!(
        apr_statuses(&p.b).is_empty(),
        "deferred: a PATH_MIG may be on its way"
    );
    p.run_for(100);
    assert_eq!(apr_statuses(&p.b), [ApStatus::IsCurrent]);
    assert!(qp_ops(&p.b).is_empty());
}

#[test]
fn rearm_race_a_lap_that_arrives_before_our_own_path_mig_is_answered_after_it() {
    let mut p = armed_pair();
    // A migrated to A2->B2 and proposes A1->B1 (the old primary) before B's PATH_MIG
    // event was read: B must not answer "is current".
    deliver(&mut p, gid('a', 2), lap_from_a(path('a', 1, 1)));
    p.input(
        'b',
        Input::QpEvent {
            conn: ConnId(1),
            event: QpEvent::PathMigrated,
        },
    );
    p.run_for(100);
    assert_eq!(apr_statuses(&p.b), [ApStatus::Success]);
    let b = p.b.status(1);
    assert!(b.primary.same_route(&path('b', 2, 2)), "{}", b.primary);
    assert!(b.alternate.is_some_and(|a| a.same_route(&path('b', 1, 1))));
}

#[test]
fn duplicate_lap_gets_the_same_apr_and_no_second_modify() {
    let mut p = armed_pair();
    let lap = lap_from_a(path('a', 1, 2));
    deliver(&mut p, gid('a', 1), lap);
    p.run_for(10);
    let loads = qp_ops(&p.b).len();
    deliver(&mut p, gid('a', 1), lap);
    p.run_for(10);
    assert_eq!(qp_ops(&p.b).len(), loads, "no second load for a duplicate");
    assert_eq!(apr_statuses(&p.b), [ApStatus::Success, ApStatus::Success]);
}

#[test]
fn lap_for_a_dead_path_is_accepted_it_is_only_an_alternate() {
    let mut p = armed_pair();
    p.input(
        'b',
        Input::PortEvent {
            port: PortKey::new(DEV, 2),
            event: PortEvent::Down,
        },
    );
    p.b.clear_log();
    // The sender chose it (nothing working ranked as high): armed, it gives the QP a
    // second retry budget; nothing moves onto it while it is dead.
    deliver(&mut p, gid('a', 1), lap_from_a(path('a', 1, 2)));
    p.run_for(10);
    assert_eq!(apr_statuses(&p.b), [ApStatus::Success]);
    assert!(p.b.op_names().contains(&"load_alternate"));
    assert!(!p.b.op_names().contains(&"force_migrate"));
}

#[test]
fn simultaneous_laps_resolve_to_the_active_sides() {
    let policy = crate::Policy {
        passive_initiate_delay_ms: 0,
        ..crate::Policy::default()
    };
    let mut p = Pair::with_policy(policy);
    p.protect(1);
    p.run_for(1000);
    // A (active) rejected B's LAP; B (passive) dropped its own and accepted A's.
    assert_eq!(apr_statuses(&p.a), [ApStatus::Rejected]);
    assert_eq!(apr_statuses(&p.b), [ApStatus::Success]);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
    assert_eq!(p.b.status(1).protection, Protection::Armed);
}

#[test]
fn apr_from_a_stranger_is_dropped() {
    let mut p = Pair::new();
    p.drop = Box::new(|to, _| to == 'b');
    p.protect_spec('a', spec('a', 1, MigrationMode::Hardware));
    p.run_for(10);
    p.input(
        'a',
        Input::PeerMessage {
            from: PeerAddr {
                gid: Gid::from_guid(0xbad),
                lid: lid('b', 1),
            },
            port: PortKey::new(DEV, 1),
            msg: PeerMsg::Apr(Apr {
                sender_comm_id: 0x201,
                receiver_comm_id: 0x101,
                status: ApStatus::Success,
            }),
        },
    );
    assert!(!p.a.op_names().contains(&"load_alternate"));
}

#[test]
fn api_misuse_is_an_error_not_a_panic() {
    let mut e = crate::Engine::new(crate::Policy::default()).expect("default policy");
    let s = spec('a', 1, MigrationMode::Hardware);
    e.protect(Time::ZERO, s.clone()).expect("first protect");
    assert!(e.protect(Time::ZERO, s.clone()).is_err());
    let mut s2 = s.clone();
    s2.id = ConnId(2);
    assert!(e.protect(Time::ZERO, s2).is_err(), "duplicate comm id");
    assert!(e.unprotect(Time::ZERO, ConnId(9)).is_err());
    // A stall reported for a connection never protected is a misuse of the API; the
    // same QP event from the world (one racing an unprotect, say) is ignored.
    assert!(e.report_stall(Time::ZERO, ConnId(9)).is_err());
    e.handle_input(
        Time::ZERO,
        Input::QpEvent {
            conn: ConnId(9),
            event: QpEvent::Fatal,
        },
    );
    // A result for a command never issued is ignored.
    e.handle_input(
        Time::ZERO,
        Input::CommandDone {
            id: CommandId(12345),
            result: Ok(CommandOutcome::Done),
        },
    );
}
