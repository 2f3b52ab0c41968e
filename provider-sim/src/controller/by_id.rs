//! The controllers' per-connection state, by connection id: the ids in a vector kept
//! sorted, the values beside them. The simulator protects a host's connections in id
//! order, so every insertion is an append; a B-tree filled in order leaves its nodes
//! half empty, which at a million connections costs hundreds of megabytes per policy.
//! The ids apart from the values keep a lookup's binary search within a few cache
//! lines.

use apm_core::{CommandId, ConnId};
use std::collections::VecDeque;

/// Values by connection id, in id order.
#[derive(Debug)]
pub(crate) struct ById<T> {
    ids: Vec<ConnId>,
    values: Vec<T>,
}

impl<T> Default for ById<T> {
    fn default() -> ById<T> {
        ById {
            ids: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl<T> ById<T> {
    /// Set `id`'s value (replacing any).
    pub(crate) fn insert(&mut self, id: ConnId, value: T) {
        match self.ids.last() {
            Some(last) if *last >= id => match self.ids.binary_search(&id) {
                Ok(k) => self.values[k] = value,
                Err(k) => {
                    self.ids.insert(k, id);
                    self.values.insert(k, value);
                }
            },
            _ => {
                self.ids.push(id);
                self.values.push(value);
            }
        }
    }

    /// `id`'s value.
    pub(crate) fn get(&self, id: &ConnId) -> Option<&T> {
        let k = self.ids.binary_search(id).ok()?;
        self.values.get(k)
    }

    /// `id`'s value, to change.
    pub(crate) fn get_mut(&mut self, id: &ConnId) -> Option<&mut T> {
        let k = self.ids.binary_search(id).ok()?;
        self.values.get_mut(k)
    }

    /// Every entry, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ConnId, &T)> {
        self.ids.iter().zip(&self.values)
    }
}

/// What each outstanding command of a controller is for, by command id. Ids are
/// issued in increasing order and answered mostly in order, so a window from the
/// oldest unanswered id does (a B-tree of a million outstanding commands is most of a
/// baseline's time at a connection's start).
#[derive(Debug)]
pub(crate) struct Outstanding<T> {
    /// The id of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<T>>,
}

impl<T> Default for Outstanding<T> {
    fn default() -> Outstanding<T> {
        Outstanding {
            base: 1,
            slots: VecDeque::new(),
        }
    }
}

impl<T> Outstanding<T> {
    /// A new command for `why`: its id.
    pub(crate) fn issue(&mut self, why: T) -> CommandId {
        let id = CommandId(self.base + self.slots.len() as u64);
        self.slots.push_back(Some(why));
        id
    }

    /// What `id` was for, once.
    pub(crate) fn complete(&mut self, id: CommandId) -> Option<T> {
        let k = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        let why = self.slots.get_mut(k)?.take()?;
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
    fn keeps_id_order_whatever_the_insertion_order() {
        let mut m = ById::default();
        for id in [1, 5, 3, 9, 5] {
            m.insert(ConnId(id), id * 10);
        }
        let ids: Vec<u64> = m.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, [1, 3, 5, 9]);
        assert_eq!(m.get(&ConnId(3)), Some(&30));
        *m.get_mut(&ConnId(9)).unwrap() += 1;
        assert_eq!(m.get(&ConnId(9)), Some(&91));
        assert_eq!(m.get(&ConnId(4)), None);
    }

    #[test]
    fn outstanding_commands_complete_once_in_any_order() {
        let mut o = Outstanding::default();
        let (a, b, c) = (o.issue('a'), o.issue('b'), o.issue('c'));
        assert_eq!(a, CommandId(1));
        assert_eq!(o.complete(b), Some('b'));
        assert_eq!(o.complete(b), None);
        assert_eq!(o.complete(a), Some('a'));
        assert_eq!(o.complete(CommandId(0)), None);
        assert_eq!(o.complete(c), Some('c'));
        assert_eq!(o.issue('d'), CommandId(4));
    }
}
