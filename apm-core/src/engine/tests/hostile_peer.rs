//! A peer message never changes a QP it has no right to change: forged (a stranger's
//! GID, another connection's comm ids, a path that is not this node's), replayed and
//! out-of-turn messages of every kind leave the QP, the engine's view of the fabric and
//! what the application was told as they were. (Truncated and bit-flipped datagrams
//! never become messages: cm-lap's decoders and authentication refuse them, and its
//! tests show it.)

use super::harness::*;
use crate::io::*;
use crate::types::*;
use proptest::prelude::*;

fn from(gid: Gid) -> PeerAddr {
    PeerAddr {
        gid,
        lid: lid('a', 1),
    }
}

fn deliver_to_b(p: &mut Pair, sender: PeerAddr, msg: PeerMsg) {
    p.input(
        'b',
        Input::PeerMessage {
            from: sender,
            port: PortKey::new(DEV, 1),
            msg,
        },
    );
}

/// What B did besides answering: QP commands and path queries.
fn b_acted(p: &Pair) -> Vec<&'static str> {
    p.b.op_names()
        .into_iter()
        .filter(|o| *o != "send_peer")
        .collect()
}

/// A's real comm ids for connection 1, as B knows them.
const A_COMM: u32 = 0x101;
const B_COMM: u32 = 0x201;

fn migrate(sender: u32, receiver: u32, path: Path) -> PeerMsg {
    PeerMsg::Migrate(Migrate {
        sender_comm_id: sender,
        receiver_comm_id: receiver,
        path,
        intent: MigrateIntent::Probe,
    })
}

#[test]
fn a_forged_migrate_moves_nothing() {
    let mut p = armed_pair();
    let before = p.b.status(1);
    let alt = path('a', 2, 2);
    for (what, sender, msg) in [
        // Right comm ids, a stranger's GID.
        (
            "stranger GID",
            from(Gid::from_guid(0xbad)),
            migrate(A_COMM, B_COMM, alt),
        ),
        // The peer's GID, another sender comm id.
        (
            "sender comm id",
            from(gid('a', 1)),
            migrate(0x999, B_COMM, alt),
        ),
        // A receiver comm id no connection has.
        (
            "receiver comm id",
            from(gid('a', 1)),
            migrate(A_COMM, 0xdead, alt),
        ),
    ] {
        deliver_to_b(&mut p, sender, msg);
        p.run_for(100);
        assert!(b_acted(&p).is_empty(), "{what}: {:?}", p.b.op_names());
        assert_eq!(p.b.status(1), before, "{what}");
    }
    assert_eq!(p.b.engine.stats().laps_from_strangers, 3);
}

#[test]
fn a_migrate_onto_a_path_that_is_not_this_nodes_is_refused() {
    let mut p = armed_pair();
    let before = p.b.status(1);
    let mut foreign = path('a', 2, 2);
    foreign.dgid = Gid::from_guid(0xc0ffee); // not one of B's ports
    let mut third = path('a', 2, 2);
    third.sgid = Gid::from_guid(0xe1); // not one of A's ports
    for path in [foreign, third] {
        deliver_to_b(&mut p, from(gid('a', 1)), migrate(A_COMM, B_COMM, path));
        p.run_for(100);
    }
    assert!(b_acted(&p).is_empty(), "{:?}", p.b.op_names());
    assert_eq!(p.b.status(1), before);
    let refusals =
        p.b.sent()
            .iter()
            .filter(|m| matches!(m, PeerMsg::MigrateAck(MigrateAck { ok: false, .. })))
            .count();
    assert_eq!(refusals, 2, "{:?}", p.b.sent());
}

#[test]
fn a_replayed_migrate_moves_once() {
    let mut p = armed_pair();
    // A's own request, as A would send it after its port 1 failed.
    let msg = migrate(A_COMM, B_COMM, path('a', 2, 2));
    deliver_to_b(&mut p, from(gid('a', 2)), msg);
    p.run_for(100);
    let moves = |p: &Pair| {
        p.b.ops()
            .iter()
            .filter(|o| matches!(o, CommandOp::ForceMigrate { .. }))
            .count()
    };
    assert_eq!(moves(&p), 1, "{:?}", p.b.op_names());
    let primary = p.b.status(1).primary;
    // The same datagram again, later: B is there already and says so; no second move.
    for _ in 0..3 {
        deliver_to_b(&mut p, from(gid('a', 2)), msg);
        p.run_for(100);
    }
    assert_eq!(moves(&p), 1, "{:?}", p.b.op_names());
    assert_eq!(p.b.status(1).primary, primary);
}

#[test]
fn out_of_turn_answers_change_nothing() {
    let mut p = armed_pair();
    let before = p.b.status(1);
    for msg in [
        PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: A_COMM,
            receiver_comm_id: B_COMM,
            ok: true,
        }),
        PeerMsg::Apr(Apr {
            sender_comm_id: A_COMM,
            receiver_comm_id: B_COMM,
            status: ApStatus::Success,
        }),
        PeerMsg::Mra(Mra {
            sender_comm_id: A_COMM,
            receiver_comm_id: B_COMM,
            service_timeout: 31,
        }),
    ] {
        deliver_to_b(&mut p, from(gid('a', 1)), msg);
        p.run_for(100);
    }
    assert!(b_acted(&p).is_empty(), "{:?}", p.b.op_names());
    assert!(p.b.sent().is_empty(), "{:?}", p.b.sent());
    assert_eq!(p.b.status(1), before);
}

#[test]
fn a_strangers_message_does_not_bring_a_dead_gid_back() {
    let mut p = armed_pair();
    // A's port 2 dies, then its port 1: B hears both through trap 65 and, its primary
    // and alternate dead, cannot move. Nothing of A's reaches B any more, and the SA
    // finds no path to either port.
    p.drop = Box::new(|_, _| true);
    p.b.unreachable = vec![gid('a', 1), gid('a', 2)];
    for port in [2, 1] {
        p.input(
            'b',
            Input::RemoteGid {
                gid: gid('a', port),
                service: GidService::OutOfService,
            },
        );
        p.run_for(10);
    }
    p.b.clear_log();
    let dead_alt = path('b', 2, 2);
    assert!(!p.b.engine.path_up(&dead_alt));
    // Anyone can put A's port 2 in a datagram's source: a message that is not from a
    // connection's peer proves nothing, and B must not move onto a dead path for it.
    for msg in [
        migrate(0x999, 0x888, path('a', 2, 2)),
        PeerMsg::Lap(Lap {
            sender_comm_id: 0x999,
            receiver_comm_id: 0x888,
            receiver_qpn: Qpn::new(0x201).expect("24-bit"),
            alt: path('a', 2, 2),
        }),
    ] {
        deliver_to_b(&mut p, from(gid('a', 2)), msg);
        p.run_for(100);
    }
    assert!(!p.b.engine.path_up(&dead_alt), "a stranger revived a2");
    assert!(b_acted(&p).is_empty(), "{:?}", p.b.op_names());
    let probes =
        p.b.sent()
            .iter()
            .filter(|m| matches!(m, PeerMsg::Migrate(_) | PeerMsg::Lap(_)))
            .count();
    assert_eq!(probes, 0, "{:?}", p.b.sent());
}

fn any_msg() -> impl Strategy<Value = PeerMsg> {
    let ids = (
        prop_oneof![Just(A_COMM), any::<u32>()],
        prop_oneof![Just(B_COMM), any::<u32>()],
    );
    let paths = prop_oneof![
        Just(path('a', 1, 1)),
        Just(path('a', 2, 2)),
        Just(path('a', 1, 2)),
        (any::<u64>(), any::<u64>()).prop_map(|(s, d)| {
            let mut p = path('a', 2, 2);
            p.sgid = Gid::from_guid(s);
            p.dgid = Gid::from_guid(d);
            p
        }),
    ];
    (ids, paths, 0u8..6, any::<bool>()).prop_map(|((s, r), path, kind, flag)| match kind {
        0 => migrate(s, r, path),
        1 => PeerMsg::Migrate(Migrate {
            sender_comm_id: s,
            receiver_comm_id: r,
            path,
            intent: MigrateIntent::Moved,
        }),
        2 => PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: s,
            receiver_comm_id: r,
            ok: flag,
        }),
        3 => PeerMsg::Lap(Lap {
            sender_comm_id: s,
            receiver_comm_id: r,
            receiver_qpn: Qpn::new(0x201).expect("24-bit"),
            alt: path,
        }),
        4 => PeerMsg::Apr(Apr {
            sender_comm_id: s,
            receiver_comm_id: r,
            status: if flag {
                ApStatus::Success
            } else {
                ApStatus::Rejected
            },
        }),
        _ => PeerMsg::Mra(Mra {
            sender_comm_id: s,
            receiver_comm_id: r,
            service_timeout: 31,
        }),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Messages from GIDs that are not the peer's, whatever they say, never make B
    /// touch its QP or change what it believes about the connection.
    #[test]
    fn strangers_never_touch_the_qp(
        msgs in proptest::collection::vec((any::<u64>(), any_msg()), 1..20),
    ) {
        let mut p = armed_pair();
        let before = p.b.status(1);
        for (guid, msg) in msgs {
            let stranger = Gid::from_guid(0x1_0000 | (guid & 0xffff));
            deliver_to_b(&mut p, from(stranger), msg);
            p.run_for(50);
        }
        prop_assert!(b_acted(&p).is_empty(), "{:?}", p.b.op_names());
        prop_assert_eq!(p.b.status(1), before);
    }
}
