//! Failing over, between two engines: a local port or a remote GID dies, the peer
//! is asked over the alternate first, both sides move and arm the path they left.

use super::harness::*;
use crate::io::*;
use crate::types::GidService;
use crate::Protection;

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
        matches!(
            kinds[0],
            NotificationKind::Migrated {
                forced: true,
                cause: Some(Cause::LocalPort),
                ..
            }
        ),
        "A saw its port die: {kinds:?}"
    );
    // B saw nothing die: it moved because A asked.
    let kinds = p.b.notifications();
    assert!(
        kinds
            .iter()
            .any(|k| matches!(k, NotificationKind::Migrated { cause: None, .. })),
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
            service: GidService::OutOfService,
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
            service: GidService::OutOfService,
        },
    );
    assert!(!q.b.op_names().contains(&"force_migrate"));
    assert!(matches!(
        q.b.notifications()[..],
        [NotificationKind::Unprotected {
            reason: UnprotectedReason::AlternateDown,
            cause: None
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
            service: GidService::OutOfService,
        },
    );
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 1),
            service: GidService::OutOfService,
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
            service: GidService::InService,
        },
    );
    p.input(
        'b',
        Input::RemoteGid {
            gid: gid('a', 1),
            service: GidService::InService,
        },
    );
    p.run_for(2000);
    assert_armed(&p, 1, path('a', 1, 1));
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
            reason: UnprotectedReason::AlternateFailed,
            cause: None
        }));
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
            reason: UnprotectedReason::PrimaryDownUnarmed,
            cause: Some(Cause::LocalPort)
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
