//! The re-arm concurrency limit: at most `Policy::max_concurrent_rearms` connections
//! negotiate a new alternate at once; the others wait in a queue, in order. Paces
//! re-arm storms (a rail coming back re-arms every connection that left it).
//!
//! It only counts and queues; what a connection does when its turn comes is the
//! engine's (`Engine::pump_queue`).

use crate::types::ConnId;
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug, Default)]
pub(crate) struct RearmLimiter {
    /// The connections holding a slot.
    holders: BTreeSet<ConnId>,
    /// Connections waiting for a slot, first come first served. A connection that left
    /// the queue's phase meanwhile is skipped when its turn comes.
    queue: VecDeque<ConnId>,
}

impl RearmLimiter {
    /// True when `id` holds a slot.
    pub(crate) fn holds(&self, id: ConnId) -> bool {
        self.holders.contains(&id)
    }

    /// True when every one of `max` slots is taken.
    pub(crate) fn full(&self, max: usize) -> bool {
        self.holders.len() >= max
    }

    /// `id` takes a slot (no-op when it holds one).
    pub(crate) fn take(&mut self, id: ConnId) {
        self.holders.insert(id);
    }

    /// `id` gives its slot back; true when it held one (a queued connection may go).
    pub(crate) fn release(&mut self, id: ConnId) -> bool {
        self.holders.remove(&id)
    }

    /// `id` waits for a slot.
    pub(crate) fn enqueue(&mut self, id: ConnId) {
        self.queue.push_back(id);
    }

    /// `id` no longer waits.
    pub(crate) fn dequeue(&mut self, id: ConnId) {
        self.queue.retain(|q| *q != id);
    }

    /// The next connection in the queue, if any.
    pub(crate) fn next_waiting(&mut self) -> Option<ConnId> {
        self.queue.pop_front()
    }
}
