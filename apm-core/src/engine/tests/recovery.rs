//! Paths coming back, between two engines: ports returning, flapping and held down,
//! subscriptions renewed, lost notices made good by asking the SA.

use super::harness::*;
use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Protection;

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
            reason: UnprotectedReason::AlternateDown,
            cause: None
        }));
    port_event(&mut p, 'a', 2, PortEvent::Active);
    port_event(&mut p, 'b', 2, PortEvent::Active);
    p.run_for(1000);
    assert_armed(&p, 1, path('a', 2, 2));
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
            service: GidService::OutOfService,
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
            service: GidService::InService,
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
            service: GidService::OutOfService,
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
            service: GidService::OutOfService,
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
    for (k, service) in [(1, GidService::InService), (2, GidService::OutOfService)] {
        p.a.engine
            .handle_input(ms(k), Input::RemoteGid { gid: dead, service });
    }
    // The answer describes the port's short life in between: paths. It is stale.
    p.a.engine.handle_input(
        ms(3),
        Input::CommandDone {
            id,
            result: Ok(CommandOutcome::Paths(vec![path('a', 2, 2)])),
        },
    );
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
