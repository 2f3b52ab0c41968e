//! The seeds' behaviours, end to end between two engines: protect, fail over on either
//! side, re-arm through LAP/APR, come back, flap, storms.

use super::harness::*;
use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Protection;

fn port_event(p: &mut Pair, node: char, port: u8, event: PortEvent) {
    p.input(
        node,
        Input::PortEvent {
            port: PortKey::new(DEV, port),
            event,
        },
    );
}

fn qp_event(p: &mut Pair, node: char, n: u64, event: QpEvent) {
    p.input(
        node,
        Input::QpEvent {
            conn: ConnId(n),
            event,
        },
    );
}

/// Both sides armed on `alt_port` (local port number of A's alternate).
fn assert_armed(p: &Pair, n: u64, a_alt: Path) {
    let a = p.a.status(n);
    let b = p.b.status(n);
    assert_eq!(a.protection, Protection::Armed, "A: {a:?}");
    assert_eq!(b.protection, Protection::Armed, "B: {b:?}");
    // The route, not the timeout: an alternate carries its own, longer one.
    assert!(
        a.alternate.is_some_and(|x| x.same_route(&a_alt)),
        "A's alternate {:?}, expected {a_alt}",
        a.alternate
    );
    let b_alt = b.alternate.expect("B has an alternate");
    assert_eq!(
        (b_alt.sgid, b_alt.dgid),
        (a_alt.dgid, a_alt.sgid),
        "both ends agree"
    );
}

#[test]
fn protect_picks_port_disjoint_alternate_and_follows_seed_001_order() {
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
    p.input('a', Input::Protect(s));
    p.run_for(10);
    assert!(p.a.sent().is_empty());
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn local_port_err_asks_the_peer_first_then_both_move_and_arm_the_path_left() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    p.b.clear_log();
    // Active side: PORT_ERR on the primary's port. A asks B over the alternate first.
    port_event(&mut p, 'a', 1, PortEvent::Down);
    assert_eq!(p.a.op_names(), ["send_peer"], "a probe, nothing forced yet");
    assert!(matches!(
        p.a.sent()[..],
        [PeerMsg::Migrate(Migrate {
            intent: MigrateIntent::Probe,
            ..
        })]
    ));
    // B moves (which proves the alternate works), answers, and A follows.
    p.run_for(0);
    assert!(p.b.op_names().contains(&"force_migrate"));
    assert!(p.a.op_names().contains(&"force_migrate"));
    p.run_for(1000);
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
    assert!(p.b.status(1).primary.same_route(&path('b', 2, 2)));
    // Both arm the path they left, with no LAP: dead from A's view (its port 1), so A
    // is unprotected; it gives the QP a second retry budget all the same.
    let a = p.a.status(1);
    assert!(a.alternate.is_some_and(|x| x.same_route(&path('a', 1, 1))));
    assert_eq!(a.protection, Protection::Unprotected);
    assert!(!p.a.sent().iter().any(|m| matches!(m, PeerMsg::Lap(_))));
    let kinds = p.a.notifications();
    assert!(
        matches!(kinds[0], NotificationKind::Migrated { forced: true, .. }),
        "{kinds:?}"
    );
    // Port 1 returns: protected again, still with no LAP.
    port_event(&mut p, 'a', 1, PortEvent::Active);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 1, 1));
    assert!(matches!(
        p.a.notifications().last(),
        Some(NotificationKind::Rearmed { .. })
    ));
    assert!(!p.a.sent().iter().any(|m| matches!(m, PeerMsg::Lap(_))));
}

#[test]
fn no_move_when_the_peer_does_not_answer_over_the_alternate() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    // The alternate looks healthy but carries nothing: no answer, no forced move (the
    // HCA migrates on retry exhaustion as it would without apm).
    p.drop = Box::new(|_, _| true);
    port_event(&mut p, 'a', 1, PortEvent::Down);
    p.run_for(3000);
    assert!(!p.a.op_names().contains(&"force_migrate"));
    assert_eq!(p.a.status(1).primary, path('a', 1, 1));
}

#[test]
fn remote_gid_out_of_service_moves_the_passive_side() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.b.clear_log();
    // Passive side: it cannot see A's port die; the SA tells it (trap 65). It asks A
    // over the alternate, A moves and answers, B follows.
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 1),
            in_service: false,
        },
    );
    assert_eq!(p.b.op_names(), ["send_peer"]);
    p.run_for(0);
    assert!(p.b.op_names().contains(&"force_migrate"));
    assert!(p.b.status(1).primary.same_route(&path('b', 2, 2)));
    assert!(p.a.status(1).primary.same_route(&path('a', 2, 2)));
    // Trap 65 about a GID of another connection's alternate only: no migration.
    let mut q = Pair::new();
    q.protect(1);
    q.run_for(1000);
    q.b.clear_log();
    q.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 2),
            in_service: false,
        },
    );
    assert!(!q.b.op_names().contains(&"force_migrate"));
    assert!(matches!(
        q.b.notifications()[..],
        [NotificationKind::Unprotected {
            reason: UnprotectedReason::AlternateDown
        }]
    ));
}

#[test]
fn hardware_migration_arms_the_old_primary_which_protects_when_good_again() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    // The primary link A1-B1 dies; each side hears of the other's port (trap 65).
    p.input(
        'a',
        Input::RemoteGid {
            gid: gid('b', 1),
            in_service: false,
        },
    );
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 1),
            in_service: false,
        },
    );
    p.run_for(0);
    // The PATH_MIG events of the forced migrations arrive late, after the path left was
    // armed again: they are the same migrations, not new ones.
    qp_event(&mut p, 'a', 1, QpEvent::PathMigrated);
    qp_event(&mut p, 'b', 1, QpEvent::PathMigrated);
    p.run_for(2000);
    // The old primary is armed again although its ends are out of service.
    let a = p.a.status(1);
    assert!(a.primary.same_route(&path('a', 2, 2)), "{}", a.primary);
    assert!(a
        .alternate
        .is_some_and(|alt| alt.same_route(&path('a', 1, 1))));
    assert_eq!(a.protection, Protection::Unprotected);
    // Trap 64: good again, and protecting.
    p.input(
        'a',
        Input::RemoteGid {
            gid: gid('b', 1),
            in_service: true,
        },
    );
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 1),
            in_service: true,
        },
    );
    p.run_for(2000);
    assert_armed(&p, 1, path('a', 1, 1));
}

#[test]
fn port_active_protects_what_was_armed_on_a_dead_path() {
    let mut p = Pair::new();
    // A's port 2 and B's port 2 are down before protection: every alternate crosses a
    // dead port. The port-disjoint one is armed all the same (it ranks highest), and
    // the connection is unprotected until the ports come back.
    port_event(&mut p, 'a', 2, PortEvent::Down);
    port_event(&mut p, 'b', 2, PortEvent::Down);
    p.protect(1);
    p.run_for(500);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    assert!(p
        .a
        .status(1)
        .alternate
        .is_some_and(|a| a.same_route(&path('a', 2, 2))));
    assert!(p
        .a
        .notifications()
        .contains(&NotificationKind::Unprotected {
            reason: UnprotectedReason::AlternateDown
        }));
    port_event(&mut p, 'a', 2, PortEvent::Active);
    port_event(&mut p, 'b', 2, PortEvent::Active);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
}

#[test]
fn path_mig_err_marks_alternate_bad_and_tries_next() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    qp_event(&mut p, 'a', 1, QpEvent::PathMigrationError);
    p.run_for(1000);
    let a = p.a.status(1);
    assert_eq!(a.protection, Protection::Armed);
    let alt = a.alternate.expect("re-armed");
    assert!(
        !alt.same_route(&path('a', 2, 2)),
        "the failed alternate is not reused at once"
    );
    assert!(p
        .a
        .notifications()
        .contains(&NotificationKind::Unprotected {
            reason: UnprotectedReason::AlternateFailed
        }));
}

#[test]
fn client_reregister_and_sm_change_resubscribe_lid_change_rebases() {
    let mut p = Pair::new();
    let subs = |p: &Pair| p.a.op_names().iter().filter(|n| **n == "subscribe").count();
    assert_eq!(subs(&p), 2, "one subscription per IB port at start");
    p.run_for(10);
    port_event(&mut p, 'a', 1, PortEvent::ClientReregister);
    port_event(&mut p, 'a', 2, PortEvent::SmChange);
    assert_eq!(subs(&p), 4);
    // LID change on port 2 where the alternate lives: resubscribe and re-agree with the peer.
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    port_event(&mut p, 'a', 2, PortEvent::LidChange);
    let mut info = port_info('a', 2);
    info.lid = Lid::new(40).expect("unicast");
    p.input('a', Input::PortInfo(info));
    assert!(p.a.op_names().contains(&"subscribe"));
    p.run_for(1000);
    let a = p.a.status(1);
    assert_eq!(a.protection, Protection::Armed);
    assert_eq!(
        a.alternate.map(|x| x.slid.get()),
        Some(40),
        "alternate rebased on the new LID"
    );
    assert!(
        p.a.sent().iter().any(|m| matches!(m, PeerMsg::Lap(_))),
        "peer told of the new LID"
    );
}

#[test]
fn lap_lost_is_retransmitted_with_backoff_then_given_up_and_retried_later() {
    let policy = Policy {
        passive_initiate_delay_ms: 10_000,
        ..Policy::default()
    };
    let mut p = Pair::with_policy(policy);
    p.drop = Box::new(|to, _| to == 'b');
    p.protect(1);
    p.run_for(1499);
    let laps = |p: &Pair| {
        p.a.sent()
            .iter()
            .filter(|m| matches!(m, PeerMsg::Lap(_)))
            .count()
    };
    // 100 ms, +200, +400: 4 sends by 700 ms, the 4th times out at 1500 ms.
    assert_eq!(laps(&p), 4);
    assert_eq!(p.a.engine.stats().lap_retransmits, 3);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    p.run_for(2);
    assert!(p
        .a
        .notifications()
        .contains(&NotificationKind::Unprotected {
            reason: UnprotectedReason::PeerUnresponsive
        }));
    // Retried after rearm_retry_ms; with the wire healed it arms.
    p.drop = Box::new(|_, _| false);
    p.run_for(3000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn apr_rejection_moves_to_next_candidate() {
    let mut p = Pair::new();
    // B refuses to load anything: every APR is "rejected".
    p.b.fail_ops.push("load_alternate");
    p.protect(1);
    p.run_for(300);
    let statuses: Vec<_> =
        p.b.sent()
            .iter()
            .filter_map(|m| match m {
                PeerMsg::Apr(a) => Some(a.status),
                _ => None,
            })
            .collect();
    assert!(
        statuses.len() >= 2,
        "A tried more than one candidate: {statuses:?}"
    );
    assert!(statuses.iter().all(|s| *s == ApStatus::Rejected));
    let proposed: Vec<_> =
        p.a.sent()
            .iter()
            .filter_map(|m| match m {
                PeerMsg::Lap(l) => Some(l.alt),
                _ => None,
            })
            .collect();
    assert_ne!(proposed[0], proposed[1]);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    // B recovers; A's backoff retry arms.
    p.b.fail_ops.clear();
    p.run_for(30_000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn modify_failure_on_sender_reports_unprotected_and_recovers() {
    let mut p = Pair::new();
    p.a.fail_ops.push("set_rearm");
    p.protect(1);
    p.run_for(100);
    assert!(
        p.a.notifications()
            .contains(&NotificationKind::Unprotected {
                reason: UnprotectedReason::ModifyFailed
            })
            || p.a
                .notifications()
                .contains(&NotificationKind::Unprotected {
                    reason: UnprotectedReason::NoCandidate
                })
    );
    p.a.fail_ops.clear();
    p.run_for(60_000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
}

#[test]
fn both_paths_down_is_unprotected_and_lost_on_fatal() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    port_event(&mut p, 'a', 2, PortEvent::Down);
    port_event(&mut p, 'a', 1, PortEvent::Down);
    p.run_for(100);
    assert!(
        !p.a.op_names().contains(&"force_migrate"),
        "never migrate onto a dead port"
    );
    assert!(p
        .a
        .notifications()
        .contains(&NotificationKind::Unprotected {
            reason: UnprotectedReason::PrimaryDownUnarmed
        }));
    qp_event(&mut p, 'a', 1, QpEvent::Fatal);
    assert_eq!(p.a.status(1).protection, Protection::Lost);
    assert!(matches!(
        p.a.notifications().last(),
        Some(NotificationKind::Lost {
            reason: LostReason::QpFatal
        })
    ));
}

#[test]
fn port_back_while_lap_outstanding_is_not_disturbed() {
    let mut p = Pair::new();
    let mut held = true;
    p.drop = Box::new(move |to, m| {
        // Hold B's first APR back: A's LAP stays outstanding meanwhile.
        let drop = held && to == 'a' && matches!(m, PeerMsg::Apr(_));
        if drop {
            held = false;
        }
        drop
    });
    p.protect(1);
    p.run_for(50);
    port_event(&mut p, 'a', 2, PortEvent::Down);
    port_event(&mut p, 'a', 2, PortEvent::Active);
    p.run_for(3000);
    assert_armed(&p, 1, p.a.status(1).alternate.expect("armed"));
}

#[test]
fn flapping_port_is_held_down_with_exponential_backoff() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    // Port 2 (the alternate's) flaps three times quickly.
    for _ in 0..3 {
        port_event(&mut p, 'a', 2, PortEvent::Down);
        p.run_for(10);
        port_event(&mut p, 'a', 2, PortEvent::Active);
        p.run_for(10);
    }
    // Third failure: held 2 * 500 ms. Until then port 2 is not used for an alternate.
    let a = p.a.status(1);
    assert!(a.alternate.is_none_or(|x| x.port.port != 2) || a.protection != Protection::Armed);
    p.run_for(1500);
    assert_armed(&p, 1, path('a', 2, 2));
}

#[test]
fn rearm_storm_is_paced_by_the_concurrency_limit() {
    let policy = Policy {
        max_concurrent_rearms: 3,
        ..Policy::default()
    };
    let mut p = Pair::with_policy(policy);
    for n in 1..=10 {
        p.protect(n);
    }
    // Before any answer, only three LAPs are out.
    let laps =
        p.a.sent()
            .iter()
            .filter(|m| matches!(m, PeerMsg::Lap(_)))
            .count();
    assert_eq!(laps, 3);
    p.run_for(2000);
    for n in 1..=10 {
        assert_eq!(p.a.status(n).protection, Protection::Armed, "conn {n}");
    }
}

#[test]
fn software_migration_moves_both_sides() {
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
    assert!(
        !p.a.op_names().contains(&"load_alternate"),
        "no hardware alternate on RoCE"
    );
    p.a.clear_log();
    p.b.clear_log();
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(1000);
    assert!(p.a.op_names().contains(&"software_migrate"));
    assert!(
        p.b.op_names().contains(&"software_migrate"),
        "peer followed"
    );
    assert_eq!(p.a.status(1).primary, path('a', 2, 2));
    assert_eq!(p.b.status(1).primary, path('b', 2, 2));
    assert_eq!(
        p.a.status(1).protection,
        Protection::Armed,
        "re-armed after the move"
    );
}

#[test]
fn a_failed_software_migration_is_lost_if_the_qp_failed_and_rearmed_if_not() {
    // Refused move, QP still working: unprotected, then armed again.
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    p.a.fail_ops.push("software_migrate");
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(100);
    assert!(p.a.op_names().contains(&"query_qp"), "{:?}", p.a.op_names());
    assert!(p
        .a
        .notifications()
        .contains(&NotificationKind::Unprotected {
            reason: UnprotectedReason::ModifyFailed
        }));
    p.a.fail_ops.clear();
    p.run_for(60_000);
    assert_ne!(p.a.status(1).protection, Protection::Lost);
    assert_eq!(p.a.status(1).protection, Protection::Armed);

    // Refused move with the QP in ERR (an application's QP apm cannot re-initialise):
    // the connection is reported lost, not re-armed forever.
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    p.a.fail_ops.push("software_migrate");
    p.a.dead_qps.push(ConnId(1));
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(1000);
    assert_eq!(p.a.status(1).protection, Protection::Lost);
    assert!(matches!(
        p.a.notifications().last(),
        Some(NotificationKind::Lost {
            reason: LostReason::QpFatal
        })
    ));
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
    e.handle_input(Time::ZERO, Input::Protect(s))
        .expect("accepted");
    assert_eq!(
        e.connection(ConnId(1)).map(|c| c.protection),
        Some(Protection::Unprotected)
    );
    for port in [1, 2] {
        e.handle_input(Time::from_millis(1), Input::PortInfo(port_info('a', port)))
            .expect("accepted");
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

#[test]
fn a_rearm_storm_asks_the_sa_once_per_destination_even_when_it_knows_no_path() {
    let mut p = Pair::new();
    // Connections whose only known path is the primary: the engine must ask the SA.
    for n in 1..=20 {
        let mut s = spec('a', n, MigrationMode::Hardware);
        s.candidates = vec![];
        p.input('a', Input::Protect(s));
    }
    // The bench's SA knows paths to b's ports from each of a's ports: 2 ports x 1 GID.
    let queries = |p: &Pair| {
        p.a.op_names()
            .iter()
            .filter(|o| **o == "resolve_paths")
            .count()
    };
    assert_eq!(queries(&p), 2);
    p.run_for(0);
    // A destination with no paths at all is asked once too, not once per connection.
    let mut q = Pair::new();
    for n in 1..=20 {
        let mut s = spec('a', n, MigrationMode::Hardware);
        s.primary.dgid = Gid::from_guid(0xdead);
        s.candidates = vec![];
        q.input('a', Input::Protect(s));
        q.run_for(0);
    }
    assert_eq!(
        queries(&q),
        2,
        "one query per (port, destination), answered empty or not"
    );
}

#[test]
fn an_alternate_that_dies_stays_armed_and_protects_again_when_it_returns() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    p.b.clear_log();
    // A's port 2 (the alternate's) goes down; B hears of it through trap 65. Nothing
    // working ranks as high as the port-disjoint alternate: both keep it armed.
    port_event(&mut p, 'a', 2, PortEvent::Down);
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 2),
            in_service: false,
        },
    );
    p.run_for(1000);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    assert_eq!(p.b.status(1).protection, Protection::Unprotected);
    assert!(p.a.sent().is_empty() && p.b.sent().is_empty(), "no LAP");
    // A's port comes back (and trap 64 at B): protected again, with no exchange.
    port_event(&mut p, 'a', 2, PortEvent::Active);
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 2),
            in_service: true,
        },
    );
    p.run_for(1);
    assert_armed(&p, 1, path('a', 2, 2));
    assert!(p.a.sent().is_empty() && p.b.sent().is_empty());
}

#[test]
fn a_lost_trap_64_is_made_good_by_asking_the_sa() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    // B's port 2 goes out of service (trap 65 at A); the trap 64 that should follow its
    // return is lost, and meanwhile the SA cannot route there either.
    p.a.unreachable.push(gid('b', 2));
    p.input(
        'a',
        Input::RemoteGid {
            gid: gid('b', 2),
            in_service: false,
        },
    );
    p.run_for(6000);
    let queries = |p: &Pair| {
        p.a.op_names()
            .iter()
            .filter(|o| **o == "resolve_paths")
            .count()
    };
    let after_first = queries(&p);
    assert!(after_first >= 1, "the SA was asked after remote_recheck_ms");
    let a = p.a.status(1);
    assert!(a.alternate.is_none_or(|x| x.dgid != gid('b', 2)) || a.protection != Protection::Armed);
    // Still unreachable: the next check comes a doubled interval later, not at once.
    p.run_for(5000);
    assert_eq!(queries(&p), after_first, "no new check before 10 s");
    // The port is back but its trap 64 never comes; the next check finds paths.
    p.a.unreachable.clear();
    p.run_for(6000);
    assert!(queries(&p) > after_first);
    assert_armed(&p, 1, path('a', 2, 2));
}

#[test]
fn an_sa_recheck_answer_older_than_the_last_notice_is_ignored() {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    let dead = gid('b', 2);
    p.input(
        'a',
        Input::RemoteGid {
            gid: dead,
            in_service: false,
        },
    );
    p.run_for(100);
    // The recheck's question leaves and is held (not answered by the bench).
    let t = p.now.plus(std::time::Duration::from_millis(
        Policy::default().remote_recheck_ms,
    ));
    p.a.engine.handle_timeout(t);
    let mut question = None;
    while let Some(out) = p.a.engine.poll_output() {
        if let Output::Command(Command {
            id,
            op: CommandOp::ResolvePaths { dgid, .. },
        }) = out
        {
            if dgid == dead {
                question = Some(id);
            }
        }
    }
    let id = question.expect("the SA recheck asked about the GID");
    // Meanwhile the port came back and died again: trap 64, then trap 65.
    let ms = |k: u64| t.plus(std::time::Duration::from_millis(k));
    for (k, in_service) in [(1, true), (2, false)] {
        p.a.engine
            .handle_input(
                ms(k),
                Input::RemoteGid {
                    gid: dead,
                    in_service,
                },
            )
            .expect("notice");
    }
    // The answer describes the port's short life in between: paths. It is stale.
    p.a.engine
        .handle_input(
            ms(3),
            Input::CommandDone {
                id,
                result: Ok(CommandOutcome::Paths(vec![path('a', 2, 2)])),
            },
        )
        .expect("answer");
    // Past any flap hold-down, with nothing else said about the GID (questions the
    // engine asks now go unanswered), the last notice still stands: out of service.
    let later = ms(Policy::default().hold_down_max_ms + 1000);
    while let Some(next) = p.a.engine.poll_timeout().filter(|n| *n <= later) {
        p.a.engine.handle_timeout(next);
        while p.a.engine.poll_output().is_some() {}
    }
    p.a.engine.handle_timeout(later);
    assert!(
        !p.a.engine.path_usable(&path('a', 2, 2)),
        "a stale SA answer revived a GID the SM has since said is out of service"
    );
}
