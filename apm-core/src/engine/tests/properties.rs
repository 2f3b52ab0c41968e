//! Property: for any sequence of events (port and QP events, SM notices, probe verdicts,
//! lost messages, failing loads), the engine never panics and never moves a
//! connection onto a path it knows to be dead (arming one is allowed: see `select`).
//! Every move (forced migration, software migration, probe) is checked against the
//! engine's view when the command is emitted (`Node::check_move`), not when it runs.

use super::harness::*;
use crate::io::*;
use crate::types::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Ev {
    PortDown(char, u8),
    PortUp(char, u8),
    Trap(char, char, u8, bool),
    PathMig(char, u64),
    PathMigErr(char, u64),
    Fatal(char, u64),
    Stall(char, u64),
    Wait(u16),
    DropAll(bool),
    FailLoad(char, bool),
    /// A probe verdict at node `.0` about its path from port `.1` to node `.2`'s
    /// port `.3`: down, up, or up but held for flapping for `.4` ms.
    Probe(char, u8, char, u8, Verdict),
}

#[derive(Clone, Copy, Debug)]
enum Verdict {
    Down,
    Up,
    Held(u16),
}

fn node() -> impl Strategy<Value = char> {
    prop_oneof![Just('a'), Just('b')]
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (node(), 1u8..=2).prop_map(|(n, p)| Ev::PortDown(n, p)),
        (node(), 1u8..=2).prop_map(|(n, p)| Ev::PortUp(n, p)),
        (node(), node(), 1u8..=2, any::<bool>()).prop_map(|(n, o, p, up)| Ev::Trap(n, o, p, up)),
        (node(), 1u64..=3).prop_map(|(n, c)| Ev::PathMig(n, c)),
        (node(), 1u64..=3).prop_map(|(n, c)| Ev::PathMigErr(n, c)),
        (node(), 1u64..=3).prop_map(|(n, c)| Ev::Fatal(n, c)),
        (node(), 1u64..=3).prop_map(|(n, c)| Ev::Stall(n, c)),
        (0u16..3000).prop_map(Ev::Wait),
        any::<bool>().prop_map(Ev::DropAll),
        (node(), any::<bool>()).prop_map(|(n, f)| Ev::FailLoad(n, f)),
        (node(), 1u8..=2, node(), 1u8..=2, verdict())
            .prop_map(|(n, p, o, q, v)| Ev::Probe(n, p, o, q, v)),
    ]
}

fn verdict() -> impl Strategy<Value = Verdict> {
    prop_oneof![
        Just(Verdict::Down),
        Just(Verdict::Up),
        (1u16..3000).prop_map(Verdict::Held),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn never_a_dead_path_never_a_panic(events in proptest::collection::vec(ev(), 1..40), software in any::<bool>()) {
        let mut p = Pair::new();
        let mode = if software { MigrationMode::Software } else { MigrationMode::Hardware };
        for c in 1..=3 {
            p.protect_mode(c, mode);
        }
        p.run_for(500);
        let mut fail_load = (false, false);
        for e in events {
            match e {
                Ev::PortDown(n, port) => p.input(n, Input::PortEvent { port: PortKey::new(DEV, port), event: PortEvent::Down }),
                Ev::PortUp(n, port) => p.input(n, Input::PortEvent { port: PortKey::new(DEV, port), event: PortEvent::Active }),
                Ev::Trap(n, o, port, up) => p.input(n, Input::RemoteGid { gid: gid(o, port), service: if up { GidService::InService } else { GidService::OutOfService } }),
                Ev::PathMig(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::PathMigrated }),
                Ev::PathMigErr(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::PathMigrationError }),
                Ev::Fatal(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::Fatal }),
                Ev::Stall(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::PrimaryStalled }),
                Ev::Wait(ms) => p.run_for(u64::from(ms)),
                Ev::DropAll(d) => p.drop = Box::new(move |_, _| d),
                Ev::Probe(n, port, o, oport, v) => {
                    let ends = crate::probe::PathEnds { local: gid(n, port), remote: gid(o, oport) };
                    let input = match v {
                        Verdict::Down => Input::PathDown { ends, kind: crate::probe::FailureKind::Fabric },
                        Verdict::Up => Input::PathUp { ends },
                        Verdict::Held(ms) => Input::PathHeld { ends, until: p.now.plus(std::time::Duration::from_millis(u64::from(ms))) },
                    };
                    p.input(n, input);
                }
                Ev::FailLoad(n, f) => {
                    if n == 'a' { fail_load.0 = f } else { fail_load.1 = f }
                    for (node, on) in [(&mut p.a, fail_load.0), (&mut p.b, fail_load.1)] {
                        node.fail_ops = if on { vec!["load_alternate"] } else { vec![] };
                    }
                }
            }
            // Commands issued while carrying out the queue are checked too.
            p.run_for(0);
            prop_assert!(p.a.dead_moves.is_empty(), "{:?}", p.a.dead_moves);
            prop_assert!(p.b.dead_moves.is_empty(), "{:?}", p.b.dead_moves);
        }
    }
}
