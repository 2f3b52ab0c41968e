//! A slab: the large payloads of events (an input for a host's controller, a MAD on
//! its way) wait here while their event, which names them by index, waits in the
//! queue of events. Keeps every queued event small (the queue moves its entries on
//! every push and pop) without an allocation per event (freed slots are reused).

/// Values by index, freed slots reused.
#[derive(Debug)]
pub(super) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Slab<T> {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Keep `v`; its index.
    pub(super) fn put(&mut self, v: T) -> u32 {
        match self.free.pop() {
            Some(k) => {
                self.items[k as usize] = Some(v);
                k
            }
            None => {
                self.items.push(Some(v));
                (self.items.len() - 1) as u32
            }
        }
    }

    /// Take back what `put` kept at `k`.
    pub(super) fn take(&mut self, k: u32) -> Option<T> {
        let v = self.items.get_mut(k as usize)?.take();
        if v.is_some() {
            self.free.push(k);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_taken_once() {
        let mut s = Slab::default();
        let (a, b) = (s.put("a"), s.put("b"));
        assert_eq!(s.take(a), Some("a"));
        assert_eq!(s.take(a), None);
        assert_eq!(s.put("c"), a, "the freed slot");
        assert_eq!(s.take(b), Some("b"));
        assert_eq!(s.take(a), Some("c"));
        assert_eq!(s.take(7), None);
    }
}
