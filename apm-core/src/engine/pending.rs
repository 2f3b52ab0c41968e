//! Outstanding commands: what each was issued for, found by id in O(1).
//!
//! Command ids are issued in increasing order and (by the provider contract: every
//! command gets exactly one `CommandDone`) eventually answered, so a sliding window over
//! the ids replaces a map: issuing pushes at the back, answering clears a slot, and
//! answered slots at the front are dropped. A result for an id outside the window or
//! already answered is reported as unknown.

use crate::io::CommandId;
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
    }
}
