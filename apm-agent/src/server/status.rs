//! The agent's side of `apm status`: keeping what each process says of itself
//! ([`ToAgent::Report`](crate::wire::ToAgent::Report)) and answering a status request
//! within what the caller may see.
//!
//! An operator sees every process, every probe session and the peer datagrams dropped;
//! anybody else the processes of their own user and the sessions of those processes'
//! paths. The answer is bounded ([`ANSWER_BUDGET`], [`MAX_SESSIONS`]) well below the
//! client's outbox budget, so that asking never gets the asker dropped; what is left
//! out is counted.

use super::{lock, ClientId, Shared, State};
use crate::access::Caller;
use crate::status::{AgentInfo, AgentStatus, PeerDrops, ProcessEntry, ProcessStatus};
use crate::wire::FromAgent;
use std::collections::BTreeSet;

/// Bytes of process entries an answer carries, at most.
pub(super) const ANSWER_BUDGET: usize = 128 << 10;
/// Probe sessions an answer lists, at most.
pub(super) const MAX_SESSIONS: usize = 512;

/// Keep what client `id` says of itself, when it is within bounds.
pub(super) fn keep(state: &Shared, id: ClientId, status: Box<ProcessStatus>) -> Result<(), String> {
    status.check()?;
    if let Some(c) = lock(state).clients.get_mut(&id) {
        c.status = Some(status);
    }
    Ok(())
}

/// A client left: its counters join those of the processes that left before.
pub(super) fn retire(s: &mut State, status: Option<&ProcessStatus>) {
    if let Some(st) = status {
        s.retired.add(st);
    }
}

/// Answer client `id`'s status request (`pid`: only that process).
pub(super) fn answer(state: &Shared, id: ClientId, caller: Caller, req: u64, pid: Option<u32>) {
    let s = lock(state);
    let status = build(&s, caller, pid);
    let line = FromAgent::Status {
        req,
        status: Box::new(status),
    };
    s.tell(id, &line);
}

fn build(s: &State, caller: Caller, pid: Option<u32>) -> AgentStatus {
    let visible = |c: &super::Client| {
        !c.watcher
            && c.status.is_some()
            && (caller.operator || c.caller.uid == caller.uid)
            && pid.is_none_or(|p| c.caller.pid == Some(p))
    };
    let mut processes = Vec::new();
    let mut omitted = 0;
    let mut used = 0;
    let mut mine = BTreeSet::new();
    for (id, c) in s.clients.iter().filter(|(_, c)| visible(c)) {
        mine.insert(*id);
        let entry = ProcessEntry {
            pid: c.caller.pid,
            uid: c.caller.uid,
            registered: s.routes.of_client(*id) as u64,
            status: c.status.as_deref().cloned(),
        };
        let size = serde_json::to_vec(&entry).map_or(usize::MAX, |v| v.len());
        if used + size > ANSWER_BUDGET {
            omitted += 1;
            continue;
        }
        used += size;
        processes.push(entry);
    }
    let paths = (!caller.operator).then(|| s.routes.paths_of(&mine));
    let sessions = s
        .probes
        .as_ref()
        .map(|p| p.sessions())
        .unwrap_or_default()
        .into_iter()
        .filter(|(ends, _)| paths.as_ref().is_none_or(|p| p.contains(ends)))
        .take(MAX_SESSIONS)
        .collect();
    AgentStatus {
        agent: AgentInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            port: s.config.peer_port,
            probing: s.probes.is_some(),
            metrics: s
                .metrics
                .as_ref()
                .map(|(a, _)| format!("http://{a}/metrics")),
        },
        all_processes: caller.operator,
        processes,
        omitted,
        sessions,
        peer_drops: caller.operator.then(|| peer_drops(s)),
    }
}

/// The peer datagrams the agent dropped so far.
pub(super) fn peer_drops(s: &State) -> PeerDrops {
    s.auth.counters().get().into()
}
