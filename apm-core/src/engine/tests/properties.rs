//! Property: for any sequence of events, the engine never panics and never moves a
//! connection onto a path it knows to be dead (arming one is allowed: see `select`).

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
    ]
}

/// Every move of a connection in `n`'s log since `from` (a forced migration, by the
/// notification that says where it went; a software migration; a probe asking the peer
/// to move),
/// checked against the engine's own view when it was emitted: the log is checked right
/// after the input that produced it, before anything else happens.
fn check_no_dead_moves(n: &Node, from: usize) -> Result<(), TestCaseError> {
    for out in &n.log[from..] {
        let op = match out {
            Output::Command(c) => &c.op,
            // Where a forced migration went (the QP's alternate at the time).
            Output::Notify(Notification {
                kind:
                    NotificationKind::Migrated {
                        primary,
                        forced: true,
                    },
                ..
            }) => {
                prop_assert!(
                    n.engine.path_up(primary),
                    "{} was forced onto dead path {primary}",
                    n.name
                );
                continue;
            }
            Output::Notify(_) => continue,
        };
        let target = match op {
            CommandOp::SoftwareMigrate { path, .. } => Some(*path),
            CommandOp::SendPeer {
                msg:
                    PeerMsg::Migrate(Migrate {
                        path,
                        intent: MigrateIntent::Probe,
                        ..
                    }),
                ..
            } => Some(*path),
            _ => None,
        };
        if let Some(path) = target {
            prop_assert!(
                n.engine.path_up(&path),
                "{} moved onto dead path {path}",
                n.name
            );
        }
    }
    Ok(())
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
            let (la, lb) = (p.a.log.len(), p.b.log.len());
            match e {
                Ev::PortDown(n, port) => p.input(n, Input::PortEvent { port: PortKey::new(DEV, port), event: PortEvent::Down }),
                Ev::PortUp(n, port) => p.input(n, Input::PortEvent { port: PortKey::new(DEV, port), event: PortEvent::Active }),
                Ev::Trap(n, o, port, up) => p.input(n, Input::RemoteGid { gid: gid(o, port), in_service: up }),
                Ev::PathMig(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::PathMigrated }),
                Ev::PathMigErr(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::PathMigrationError }),
                Ev::Fatal(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::Fatal }),
                Ev::Stall(n, c) => p.input(n, Input::QpEvent { conn: ConnId(c), event: QpEvent::PrimaryStalled }),
                Ev::Wait(ms) => p.run_for(u64::from(ms)),
                Ev::DropAll(d) => p.drop = Box::new(move |_, _| d),
                Ev::FailLoad(n, f) => {
                    if n == 'a' { fail_load.0 = f } else { fail_load.1 = f }
                    for (node, on) in [(&mut p.a, fail_load.0), (&mut p.b, fail_load.1)] {
                        node.fail_ops = if on { vec!["load_alternate"] } else { vec![] };
                    }
                }
            }
            check_no_dead_moves(&p.a, la)?;
            check_no_dead_moves(&p.b, lb)?;
            // Commands issued while carrying out the queue are checked too.
            let (la, lb) = (p.a.log.len(), p.b.log.len());
            p.run_for(0);
            check_no_dead_moves(&p.a, la)?;
            check_no_dead_moves(&p.b, lb)?;
        }
    }
}
