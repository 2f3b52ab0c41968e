//! Pacing of SA requests: a window of outstanding requests that halves on a timeout
//! and grows back with answers, and a per-host jitter before a burst; and none of it
//! unless the policy asks (every request out at once by default).

use super::harness::*;
use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Engine;
use std::time::Duration;

/// An engine with port 1 and a connection to each of 6 remote GIDs (which is what
/// makes their notices matter), told that all 6 went out of service, at the moment
/// their SA rechecks are due.
fn rechecking(policy: Policy) -> (Engine, Time) {
    let mut e = Engine::new(Policy {
        subscribe: false,
        ..policy
    })
    .expect("policy");
    let t0 = Time::from_millis(10);
    e.handle_input(t0, Input::PortInfo(port_info('a', 1)));
    let gids: Vec<Gid> = (0..6).map(|k| Gid::from_guid(0x1000 + k)).collect();
    for (n, gid) in (1..).zip(&gids) {
        let mut conn = spec('a', n, MigrationMode::Hardware);
        conn.primary.dgid = *gid;
        conn.candidates = vec![conn.primary];
        e.protect(t0, conn).expect("protect");
    }
    // The engine asks the SA for alternates (after its jitter, if any), and again when
    // the primaries die: no path, so the pacing window is empty when the rechecks are due.
    let t1 = t0.plus(Duration::from_millis(200));
    answer_until(&mut e, t0, t1);
    for gid in gids {
        let service = GidService::OutOfService;
        e.handle_input(t1, Input::RemoteGid { gid, service });
    }
    let t2 = t1.plus(Duration::from_millis(200));
    answer_until(&mut e, t1, t2);
    let due = t1.plus(Duration::from_millis(e.policy().remote_recheck_ms));
    (e, due)
}

/// Run `e` from `now` to `until`, answering every PathRecord query with no path.
fn answer_until(e: &mut Engine, mut now: Time, until: Time) {
    loop {
        for id in queries(e) {
            let result = Ok(CommandOutcome::Paths(Vec::new()));
            e.handle_input(now, Input::CommandDone { id, result });
        }
        match e.poll_timeout() {
            Some(t) if t <= until => {
                now = t;
                e.handle_timeout(t);
            }
            _ => break,
        }
    }
}

/// The PathRecord queries the engine issued since last asked.
fn queries(e: &mut Engine) -> Vec<CommandId> {
    let mut ids = Vec::new();
    while let Some(out) = e.poll_output() {
        if let Output::Command(Command {
            id,
            op: CommandOp::ResolvePaths { .. },
        }) = out
        {
            ids.push(id);
        }
    }
    ids
}

#[test]
fn by_default_every_sa_request_goes_out_at_once() {
    let (mut e, due) = rechecking(Policy::default());
    e.handle_timeout(due);
    assert_eq!(queries(&mut e).len(), 6);
}

#[test]
fn a_window_holds_requests_back_and_halves_when_one_times_out() {
    let (mut e, due) = rechecking(Policy {
        sa_max_outstanding: 4,
        ..Policy::default()
    });
    e.handle_timeout(due);
    let first = queries(&mut e);
    assert_eq!(first.len(), 4, "four out, two waiting");
    // One times out: the window halves to 2, with 3 still out: nothing more goes.
    let timeout = || {
        Err(ProviderError::Timeout {
            operation: Operation::ResolvePaths,
        })
    };
    e.handle_input(
        due,
        Input::CommandDone {
            id: first[0],
            result: timeout(),
        },
    );
    assert!(queries(&mut e).is_empty());
    // Answers free slots and grow the window by one each: 2 out -> room for 1, then 2.
    let answer = |id| Input::CommandDone {
        id,
        result: Ok(CommandOutcome::Paths(Vec::new())),
    };
    e.handle_input(due, answer(first[1]));
    let next = queries(&mut e);
    assert_eq!(next.len(), 1, "window 3, two out");
    e.handle_input(due, answer(first[2]));
    assert_eq!(queries(&mut e).len(), 1, "window 4, the last one");
}

#[test]
fn a_burst_waits_a_jitter_of_its_own_host() {
    let policy = Policy {
        sa_max_outstanding: 8,
        sa_jitter_ms: 50,
        ..Policy::default()
    };
    let (mut e, due) = rechecking(policy.clone());
    e.handle_timeout(due);
    assert!(queries(&mut e).is_empty(), "held back");
    let release = e.poll_timeout().expect("a release timer");
    assert!(release > due && release <= due.plus(Duration::from_millis(50)));
    e.handle_timeout(release);
    assert_eq!(queries(&mut e).len(), 6);
    // Another host (another port GUID) waits another time; the same host the same.
    let (mut same, _) = rechecking(policy.clone());
    same.handle_timeout(due);
    assert_eq!(same.poll_timeout(), Some(release));
    let mut other = Engine::new(Policy {
        subscribe: false,
        ..policy
    })
    .expect("policy");
    let t0 = Time::from_millis(10);
    other.handle_input(t0, Input::PortInfo(port_info('b', 1)));
    let gid = Gid::from_guid(0x1000);
    let mut conn = spec('b', 1, MigrationMode::Hardware);
    conn.primary.dgid = gid;
    conn.candidates = vec![conn.primary];
    other.protect(t0, conn).expect("protect");
    let service = GidService::OutOfService;
    other.handle_input(t0, Input::RemoteGid { gid, service });
    other.handle_timeout(due);
    assert_ne!(other.poll_timeout(), Some(release));
}

#[test]
fn a_notice_about_a_gid_no_connection_uses_costs_no_sa_query() {
    let mut e = Engine::new(Policy {
        subscribe: false,
        ..Policy::default()
    })
    .expect("policy");
    let t0 = Time::from_millis(10);
    e.handle_input(t0, Input::PortInfo(port_info('a', 1)));
    let gid = Gid::from_guid(0x1000);
    let service = GidService::OutOfService;
    e.handle_input(t0, Input::RemoteGid { gid, service });
    let later = t0.plus(Duration::from_millis(10 * e.policy().remote_recheck_ms));
    answer_until(&mut e, t0, later);
    assert_eq!(
        e.stats().path_queries,
        0,
        "nothing asked about a GID nobody uses"
    );
}

#[test]
fn a_recheck_of_a_gid_whose_connections_are_gone_is_not_asked_and_forgets_it() {
    let (mut e, due) = rechecking(Policy::default());
    for n in 1..=6 {
        e.unprotect(due, ConnId(n)).expect("unprotect");
    }
    let _ = queries(&mut e);
    let asked = e.stats().path_queries;
    let later = due.plus(Duration::from_millis(4 * e.policy().remote_recheck_max_ms));
    answer_until(&mut e, due, later);
    assert_eq!(
        e.stats().path_queries,
        asked,
        "no recheck for GIDs nobody uses"
    );
    // Forgotten: a connection made to one later starts from "up".
    let mut conn = spec('a', 7, MigrationMode::Hardware);
    conn.primary.dgid = Gid::from_guid(0x1000);
    assert!(e.path_up(&conn.primary));
}
