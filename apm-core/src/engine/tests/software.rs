//! Software migration (RoCE: no alternate in the QP), between two engines.

use super::harness::*;
use crate::io::*;
use crate::types::*;
use crate::Protection;

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
            reason: UnprotectedReason::ModifyFailed,
            cause: None
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
fn a_roce_gid_that_leaves_its_port_is_a_dead_rail_and_its_return_a_rail_back() {
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
    // Port 1 of A as RoCE reports it: the rail's address is a GID of the port.
    let roce = |gids: Vec<Gid>| PortInfo {
        link_layer: LinkLayer::Ethernet,
        gids,
        ..port_info('a', 1)
    };
    p.input('a', Input::PortInfo(roce(vec![gid('a', 1)])));
    p.run_for(10);
    p.a.clear_log();
    p.b.clear_log();
    // The rail's interface goes down: its GID leaves the table, the port stays up (a
    // GID_CHANGE, no PORT_ERR). Both sides move off it.
    let port = PortKey::new(DEV, 1);
    p.input(
        'a',
        Input::PortEvent {
            port,
            event: PortEvent::GidChange,
        },
    );
    p.input('a', Input::PortInfo(roce(vec![])));
    p.input('a', Input::PortInfo(roce(vec![])));
    p.run_for(1000);
    let moves = |n: &Node| n.op_count("software_migrate");
    assert_eq!(
        moves(&p.a),
        1,
        "one move, not one per report: {:?}",
        p.a.op_names()
    );
    assert_eq!(moves(&p.b), 1, "the peer followed");
    assert_eq!(p.a.status(1).primary, path('a', 2, 2));
    assert_eq!(p.b.status(1).primary, path('b', 2, 2));
    // The rail it left is kept as its alternate (both sides know it), but a dead rail
    // protects nothing.
    assert_eq!(
        p.a.status(1).protection,
        Protection::Unprotected,
        "{:?}",
        p.a.status(1)
    );
    // The rail is back: its GID returns and the connection is armed through it again.
    p.input('a', Input::PortInfo(roce(vec![gid('a', 1)])));
    p.run_for(5000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
    assert_eq!(p.a.status(1).alternate.map(|a| a.sgid), Some(gid('a', 1)));
}

#[test]
fn a_rails_link_down_moves_its_connections_and_a_gid_table_report_does_not_undo_it() {
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
    let port = PortKey::new(DEV, 1);
    let roce = |gids: Vec<Gid>| PortInfo {
        link_layer: LinkLayer::Ethernet,
        gids,
        ..port_info('a', 1)
    };
    p.input('a', Input::PortInfo(roce(vec![gid('a', 1)])));
    p.run_for(10);
    p.a.clear_log();
    p.b.clear_log();
    // The rail's interface loses its link; its (IPv4) GID stays in the table.
    let link = |link| Input::RailLink {
        port,
        gid: gid('a', 1),
        link,
    };
    p.input('a', link(Link::Down));
    p.input('a', link(Link::Down));
    p.run_for(1000);
    let moves = |n: &Node| n.op_count("software_migrate");
    assert_eq!(moves(&p.a), 1, "{:?}", p.a.op_names());
    assert_eq!(moves(&p.b), 1, "the peer followed");
    assert_eq!(p.a.status(1).primary, path('a', 2, 2));
    // A GID table report while the link is down (another GID changed) brings nothing
    // back: the rail is still without a link.
    p.input('a', Input::PortInfo(roce(vec![gid('a', 1), gid('a', 3)])));
    p.run_for(1000);
    assert_eq!(p.a.status(1).protection, Protection::Unprotected);
    // The link is back: the connection is armed through the rail again.
    p.input('a', link(Link::Up));
    p.run_for(5000);
    assert_eq!(p.a.status(1).protection, Protection::Armed);
    assert_eq!(p.a.status(1).alternate.map(|a| a.sgid), Some(gid('a', 1)));
}

/// RoCE: the alternate's rail is down when the primary stalls (its far end's port died,
/// which nothing tells this side), so nothing moves; when the alternate's rail returns,
/// the stalled connection moves onto it at once rather than wait for its QP to give up
/// on the primary. Before, only a primary known dead (a port, a notice, a probe) moved
/// it then, and the QP ran out of retries on a dead rail with a working one back.
#[test]
fn a_stalled_primary_moves_onto_its_alternate_as_soon_as_that_returns() {
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
    port_event(&mut p, 'a', 2, PortEvent::Down);
    p.run_for(100);
    p.a.clear_log();
    p.b.clear_log();
    qp_event(&mut p, 'a', 1, QpEvent::PrimaryStalled);
    p.run_for(100);
    assert!(!p.a.op_names().contains(&"software_migrate"));
    assert_eq!(p.a.status(1).primary, path('a', 1, 1));
    port_event(&mut p, 'a', 2, PortEvent::Active);
    p.run_for(100);
    assert!(
        p.a.op_names().contains(&"software_migrate"),
        "{:?}",
        p.a.op_names()
    );
    assert_eq!(p.a.status(1).primary, path('a', 2, 2));
    assert_eq!(p.b.status(1).primary, path('b', 2, 2));
}
