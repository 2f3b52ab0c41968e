//! Protection from start to end, between two engines: the alternate chosen and
//! armed at protect, what the application is told, determinism, ports reported late.

use super::harness::*;
use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Protection;

#[test]
fn protect_picks_a_port_disjoint_alternate_and_asks_the_peer_before_loading_and_arming() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
    // A (active): LAP first, then load, then REARM.
    let names: Vec<_> =
        p.a.op_names()
            .into_iter()
            .filter(|n| *n != "subscribe")
            .collect();
    assert_eq!(names, ["send_peer", "load_alternate", "set_rearm"]);
    // B (passive): load, REARM, then APR.
    let names: Vec<_> =
        p.b.op_names()
            .into_iter()
            .filter(|n| *n != "subscribe")
            .collect();
    assert_eq!(names, ["load_alternate", "set_rearm", "send_peer"]);
    assert!(matches!(
        p.b.sent()[..],
        [PeerMsg::Apr(Apr {
            status: ApStatus::Success,
            ..
        })]
    ));
    assert!(matches!(
        p.a.notifications()[..],
        [NotificationKind::Protected { .. }]
    ));
    assert!(matches!(
        p.b.notifications()[..],
        [NotificationKind::Protected { .. }]
    ));
}

#[test]
fn agreed_alternate_is_armed_without_a_lap() {
    let mut p = Pair::new();
    let mut s = spec('a', 1, MigrationMode::Hardware);
    s.agreed_alternate = Some(path('a', 2, 2));
    p.protect_spec('a', s);
    p.run_for(10);
    assert!(p.a.sent().is_empty());
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn notifications_tell_the_protection_story() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    port_event(&mut p, 'a', 1, PortEvent::Down);
    p.run_for(1000);
    let kinds: Vec<&'static str> =
        p.a.notifications()
            .iter()
            .map(|k| match k {
                NotificationKind::Protected { .. } => "protected",
                NotificationKind::Rearmed { .. } => "rearmed",
                NotificationKind::Migrated { .. } => "migrated",
                NotificationKind::Unprotected { .. } => "unprotected",
                NotificationKind::Lost { .. } => "lost",
            })
            .collect();
    // Moved, then armed on the path left, which is dead (A's port 1): unprotected.
    assert_eq!(kinds, ["protected", "migrated", "unprotected"]);
    port_event(&mut p, 'a', 1, PortEvent::Active);
    p.run_for(1000);
    assert!(matches!(
        p.a.notifications().last(),
        Some(NotificationKind::Rearmed { .. })
    ));
}

#[test]
fn same_inputs_same_outputs() {
    let run = || {
        let mut p = Pair::new();
        for n in 1..=5 {
            p.protect(n);
        }
        p.run_for(1000);
        port_event(&mut p, 'a', 1, PortEvent::Down);
        p.run_for(3000);
        format!("{:?}{:?}", p.a.log, p.b.log)
    };
    assert_eq!(run(), run());
}

#[test]
fn a_port_reported_after_protect_is_used() {
    let mut e = crate::Engine::new(Policy::default()).expect("default policy");
    let mut s = spec('a', 1, MigrationMode::Hardware);
    s.agreed_alternate = Some(path('a', 2, 2));
    e.protect(Time::ZERO, s).expect("accepted");
    assert_eq!(
        e.connection(ConnId(1)).map(|c| c.protection),
        Some(Protection::Unprotected)
    );
    for port in [1, 2] {
        e.handle_input(Time::from_millis(1), Input::PortInfo(port_info('a', port)));
    }
    let laps = std::iter::from_fn(|| e.poll_output())
        .filter(|o| {
            matches!(
                o,
                Output::Command(Command {
                    op: CommandOp::SendPeer { .. },
                    ..
                })
            )
        })
        .count();
    assert_eq!(
        laps, 1,
        "the new ports made a candidate usable: a LAP goes out"
    );
}
