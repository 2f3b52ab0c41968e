//! Outstanding commands: what each was issued for, found by id in O(1).
//!
//! Command ids are issued in increasing order and (by the provider contract: every
//! command gets exactly one `CommandDone`) eventually answered, so a sliding window over
//! the ids replaces a map: issuing pushes at the back, answering clears a slot, and
//! answered slots at the front are dropped. A result for an id outside the window or
//! already answered is reported as unknown.
//!
//! Every command sent to the provider also has a deadline ([`Deadlines`]): one it has
//! not answered by then is treated as failed, so a provider call that never returns
//! can neither wedge its connection nor pin the window.

use crate::io::CommandId;
use crate::types::Time;
use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct PendingTable<T> {
    /// Id of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<T>>,
}

impl<T> PendingTable<T> {
    pub(crate) fn new(first_id: u64) -> Self {
        PendingTable {
            base: first_id,
            slots: VecDeque::new(),
        }
    }

    /// Record a new command; returns its id.
    pub(crate) fn issue(&mut self, why: T) -> CommandId {
        let id = self.base + self.slots.len() as u64;
        self.slots.push_back(Some(why));
        CommandId(id)
    }

    /// Take what `id` was for, if it is outstanding.
    pub(crate) fn complete(&mut self, id: CommandId) -> Option<T> {
        let index = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        let why = self.slots.get_mut(index)?.take()?;
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(why)
    }

    /// True while `id` was issued and not answered (nor timed out, nor dropped).
    pub(crate) fn is_outstanding(&self, id: CommandId) -> bool {
        id.0.checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.slots.get(i))
            .is_some_and(Option::is_some)
    }
}

/// The deadlines of the commands handed to the provider, in the order they were handed
/// over. Every command gets the same timeout and the engine's time never goes back, so
/// that order is also the order of the deadlines: a FIFO queue is a priority queue here.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    queue: VecDeque<(Time, CommandId)>,
}

impl Deadlines {
    /// `id` was handed to the provider; it must be answered by `at`.
    pub(crate) fn push(&mut self, at: Time, id: CommandId) {
        debug_assert!(self.queue.back().is_none_or(|(t, _)| *t <= at));
        self.queue.push_back((at, id));
    }

    /// Forget the deadlines at the front whose commands were answered, so that
    /// [`Deadlines::next`] names a command still outstanding.
    pub(crate) fn prune(&mut self, outstanding: impl Fn(CommandId) -> bool) {
        while self.queue.front().is_some_and(|(_, id)| !outstanding(*id)) {
            self.queue.pop_front();
        }
    }

    /// The earliest deadline (of an outstanding command once pruned).
    pub(crate) fn next(&self) -> Option<Time> {
        self.queue.front().map(|(t, _)| *t)
    }

    /// Remove and return the first command whose deadline is at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<CommandId> {
        match self.queue.front() {
            Some(&(t, id)) if t <= now => {
                self.queue.pop_front();
                Some(id)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_answers_and_unknown_ids() {
        let mut t = PendingTable::new(1);
        let a = t.issue('a');
        let b = t.issue('b');
        let c = t.issue('c');
        assert_eq!(t.complete(b), Some('b'));
        assert_eq!(t.complete(b), None, "answered twice");
        assert_eq!(t.complete(CommandId(0)), None, "before the window");
        assert_eq!(t.complete(CommandId(99)), None, "never issued");
        assert_eq!(t.complete(a), Some('a'));
        assert_eq!(t.slots.len(), 1, "answered front slots are dropped");
        assert_eq!(t.complete(c), Some('c'));
        assert_eq!(t.slots.iter().flatten().count(), 0);
        assert_eq!(t.issue('d'), CommandId(4));
        assert!(t.is_outstanding(CommandId(4)));
        assert!(!t.is_outstanding(c), "answered");
        assert!(!t.is_outstanding(CommandId(0)), "before the window");
        assert!(!t.is_outstanding(CommandId(5)), "not issued yet");
    }

    #[test]
    fn deadlines_come_due_in_order_and_answered_ones_are_pruned() {
        let mut d = Deadlines::default();
        d.push(Time(10), CommandId(1));
        d.push(Time(20), CommandId(2));
        d.push(Time(20), CommandId(3));
        d.prune(|id| id != CommandId(1));
        assert_eq!(d.next(), Some(Time(20)));
        assert_eq!(d.pop_due(Time(19)), None);
        assert_eq!(d.pop_due(Time(20)), Some(CommandId(2)));
        assert_eq!(d.pop_due(Time(25)), Some(CommandId(3)));
        assert_eq!(d.next(), None);
    }
}
