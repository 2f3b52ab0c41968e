//! The bookkeeping of the async event tee ([`crate::tee`]): what an event is about, the
//! events apm took from a context's queue for a program that was not reading it, and
//! the objects being destroyed. Pure: no IO, no FFI.
//!
//! libibverbs counts, per QP, CQ, SRQ and WQ, the async events the kernel handed out
//! (`events_reported`, counted in the kernel when an event is *read* from the async
//! fd) and the events acked (`ibv_ack_async_event`); `ibv_destroy_qp` and its kin wait
//! until the two are equal. Without apm an event the program never read is not counted
//! and vanishes with its object. An event apm took and keeps for the program
//! ([`Held`]) is counted: when the program destroys its object first, the tee removes it
//! from the queue ([`Held::purge`]) and acks it on the program's behalf, which is
//! "not counted, vanished" again. An event apm reads while its object is being
//! destroyed ([`Dying`]) is acked at once and kept for nobody.
//!
//! What it must never do: let the program see an event of an object it destroyed, or
//! leave a destroy one ack short or one over (either way libibverbs waits for ever: it
//! waits for equality).

use provider_verbs::ffi::sys;
use std::collections::{BTreeSet, VecDeque};

/// The kind of object an event is about, as `ibv_ack_async_event` tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// A QP (`element.qp`).
    Qp,
    /// A CQ (`element.cq`).
    Cq,
    /// An SRQ (`element.srq`).
    Srq,
    /// A WQ (`element.wq`).
    Wq,
}

/// What an async event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// An object of the program's, by its address (the user handle libibverbs gives the
    /// kernel for an object is the object's pointer).
    Object(Object, usize),
    /// A port or the device: nobody acks these, nothing to count.
    Unaffiliated,
}

/// The object an event of type `event_type` (`enum ibv_event_type`, rdma-core's
/// `verbs.h`) is about, or `None` for ports, the device and unknown types: the grouping
/// `ibv_get_async_event` and `ibv_ack_async_event` make.
pub fn object_of(event_type: u32) -> Option<Object> {
    match event_type {
        sys::IBV_EVENT_CQ_ERR => Some(Object::Cq),
        sys::IBV_EVENT_QP_FATAL..=sys::IBV_EVENT_PATH_MIG_ERR
        | sys::IBV_EVENT_QP_LAST_WQE_REACHED => Some(Object::Qp),
        sys::IBV_EVENT_SRQ_ERR | sys::IBV_EVENT_SRQ_LIMIT_REACHED => Some(Object::Srq),
        sys::IBV_EVENT_WQ_FATAL => Some(Object::Wq),
        _ => None,
    }
}

/// One event as the kernel delivers it: its type and its element (an object's address,
/// or a port number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `enum ibv_event_type`.
    pub event_type: u32,
    /// The element as the kernel gives it (`ib_uverbs_async_event_desc.element`).
    pub element: u64,
}

impl Event {
    /// What the event is about.
    pub fn about(&self) -> Element {
        match (object_of(self.event_type), usize::try_from(self.element)) {
            (Some(object), Ok(addr)) if addr != 0 => Element::Object(object, addr),
            _ => Element::Unaffiliated,
        }
    }
}

/// Events apm took from a context's queue while the program was not reading it, kept in
/// order for the program's first `ibv_get_async_event` (bounded: beyond [`Held::CAP`]
/// the newest is refused and the caller acks it).
#[derive(Debug, Default)]
pub struct Held {
    events: VecDeque<Event>,
}

impl Held {
    /// At most this many events wait for a program that does not read them (one day of
    /// a flapping port is far less).
    pub const CAP: usize = 65_536;

    /// Keep `ev` for the program; `false` when full.
    pub fn push(&mut self, ev: Event) -> bool {
        if self.events.len() >= Self::CAP {
            return false;
        }
        self.events.push_back(ev);
        true
    }

    /// The oldest event kept.
    pub fn pop(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Remove every event about the object at `addr` (it is being destroyed); returns
    /// them, for the caller to ack on the program's behalf.
    pub fn purge(&mut self, addr: usize) -> Vec<Event> {
        let (gone, kept): (Vec<Event>, Vec<Event>) = self
            .events
            .drain(..)
            .partition(|e| matches!(e.about(), Element::Object(_, a) if a == addr));
        self.events = kept.into();
        gone
    }

    /// How many events are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.events.len()
    }
}

/// Objects whose destroy is in progress: an event about one is acked as it is read.
#[derive(Debug, Default)]
pub struct Dying {
    addrs: BTreeSet<usize>,
}

impl Dying {
    /// An empty set (const: it lives in a static).
    pub const fn new() -> Dying {
        Dying {
            addrs: BTreeSet::new(),
        }
    }

    /// The destroy of the object at `addr` begins.
    pub fn begin(&mut self, addr: usize) {
        self.addrs.insert(addr);
    }

    /// The destroy of the object at `addr` returned (whatever its result).
    pub fn end(&mut self, addr: usize) {
        self.addrs.remove(&addr);
    }

    /// Whether `ev` is about an object being destroyed.
    pub fn hits(&self, ev: &Event) -> bool {
        matches!(ev.about(), Element::Object(_, a) if self.addrs.contains(&a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH_MIG: u32 = 6;
    const PORT_ERR: u32 = 10;

    fn ev(event_type: u32, element: u64) -> Event {
        Event {
            event_type,
            element,
        }
    }

    #[test]
    fn events_name_the_objects_libibverbs_acks() {
        // The numbers of rdma-core's `enum ibv_event_type`, written out: the grouping
        // is libibverbs' `ibv_get_async_event`.
        assert_eq!(ev(0, 8).about(), Element::Object(Object::Cq, 8));
        for t in [1, 2, 3, 4, 5, 6, 7, 16] {
            assert_eq!(ev(t, 8).about(), Element::Object(Object::Qp, 8), "type {t}");
        }
        assert_eq!(ev(14, 8).about(), Element::Object(Object::Srq, 8));
        assert_eq!(ev(15, 8).about(), Element::Object(Object::Srq, 8));
        assert_eq!(ev(19, 8).about(), Element::Object(Object::Wq, 8));
        // Ports (the element is their number: CLIENT_REREGISTER and GID_CHANGE among
        // them), the device, and unknown types.
        for t in [8, 9, PORT_ERR, 11, 12, 13, 17, 18, 20, 99] {
            assert_eq!(ev(t, 1).about(), Element::Unaffiliated, "type {t}");
        }
        // A QP event without a QP is nobody's to ack.
        assert_eq!(ev(PATH_MIG, 0).about(), Element::Unaffiliated);
    }

    #[test]
    fn held_events_keep_their_order_and_a_destroy_takes_only_its_own() {
        let mut h = Held::default();
        for e in [
            ev(PATH_MIG, 0x10),
            ev(PORT_ERR, 1),
            ev(PATH_MIG, 0x20),
            ev(4, 0x10),
        ] {
            assert!(h.push(e));
        }
        let gone = h.purge(0x10);
        assert_eq!(gone, vec![ev(PATH_MIG, 0x10), ev(4, 0x10)]);
        // A port event whose number equals an address is no object's.
        assert!(h.purge(1).is_empty());
        assert_eq!(h.pop(), Some(ev(PORT_ERR, 1)));
        assert_eq!(h.pop(), Some(ev(PATH_MIG, 0x20)));
        assert_eq!(h.pop(), None);
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn held_events_are_bounded() {
        let mut h = Held::default();
        for _ in 0..Held::CAP {
            assert!(h.push(ev(PORT_ERR, 1)));
        }
        assert!(!h.push(ev(PATH_MIG, 0x10)), "full: the caller acks it");
        assert_eq!(h.len(), Held::CAP);
    }

    #[test]
    fn an_object_is_dying_from_the_begin_to_the_end_of_its_destroy() {
        let mut d = Dying::new();
        assert!(!d.hits(&ev(PATH_MIG, 0x10)));
        d.begin(0x10);
        assert!(d.hits(&ev(PATH_MIG, 0x10)));
        assert!(!d.hits(&ev(PATH_MIG, 0x20)));
        assert!(!d.hits(&ev(PORT_ERR, 0x10)), "a port event names no object");
        d.end(0x10);
        assert!(!d.hits(&ev(PATH_MIG, 0x10)));
    }
}
