//! The engine's timer queue: deadlines ordered by time, deleted lazily.
//!
//! Setting a new deadline for a key does not remove the old entry; when an entry comes
//! due, the owner checks whether it is still the key's current deadline. That keeps
//! re-scheduling O(log n) and `next()` O(log n) with 100k connections. The prober
//! ([`crate::probe`]) keeps its sessions' deadlines in one too, keyed by path.

use crate::probe::PathEnds;
use crate::types::{ConnId, Gid, PortKey, Time};
use std::collections::BTreeSet;

/// What a deadline is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerKey {
    /// A connection's phase deadline (LAP retransmit, backoff, passive wait, deferral).
    Conn(ConnId),
    /// A local port's hold-down ends.
    PortHold(PortKey),
    /// A remote GID's hold-down ends.
    RemoteHold(Gid),
    /// A probed path's hold for flapping ends.
    PathHold(PathEnds),
    /// Retry a subscription through a port.
    Subscribe(PortKey),
    /// Ask the SA whether a remote GID held out of service is reachable again.
    RemoteRecheck(Gid),
    /// The jitter before a burst of SA requests ends (`sa_gate.rs`).
    SaRelease,
}

#[derive(Debug)]
pub(crate) struct Timers<K = TimerKey> {
    queue: BTreeSet<(Time, K)>,
}

impl<K> Default for Timers<K> {
    fn default() -> Timers<K> {
        Timers {
            queue: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Copy> Timers<K> {
    pub(crate) fn schedule(&mut self, at: Time, key: K) {
        self.queue.insert((at, key));
    }

    /// The earliest deadline, stale or not (a stale one only costs a no-op wake-up).
    pub(crate) fn next(&self) -> Option<Time> {
        self.queue.first().map(|(t, _)| *t)
    }

    /// Remove and return the earliest entry due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<(Time, K)> {
        match self.queue.first() {
            Some(&(t, _)) if t <= now => self.queue.pop_first(),
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Drop entries no owner wants any more, when stale ones pile up.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(Time, K) -> bool) {
        self.queue.retain(|&(t, k)| keep(t, k));
    }
}
