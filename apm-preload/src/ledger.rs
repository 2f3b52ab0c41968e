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
//! Some events are apm's doing, and the program would not get them without apm
//! ([`Caused`]): rxe raises `SQ_DRAINED` after every RTS -> SQD of a QP, whatever
//! `en_sqd_async_notify` says, and apm's software move drains the program's QP; a QP
//! apm arms migrates by itself and raises `PATH_MIG` or `PATH_MIG_ERR` (hardware APM),
//! which a QP without an alternate never does. The device raises one `SQ_DRAINED` per
//! drain, in the order the drains were asked for (each needs the QP back in RTS, so the
//! one before it ended), so the drains asked for, apm's and the program's, kept in that
//! order per QP, say whose each event is.
//!
//! What it must never do: let the program see an event of an object it destroyed, or
//! leave a destroy one ack short or one over (either way libibverbs waits for ever: it
//! waits for equality); keep from the program an event it asked for.

use provider_verbs::ffi::sys;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

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

/// Who took a QP from RTS to SQD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drainer {
    /// The program (its own `ibv_modify_qp`): the event is its.
    Program,
    /// apm's software move: the event is apm's.
    Apm,
}

/// The events of the program's QPs that apm caused, to be kept from the program.
#[derive(Debug, Default)]
pub struct Caused {
    /// Per QP (by address), the drains asked for whose `SQ_DRAINED` has not been read
    /// yet, oldest first.
    drains: BTreeMap<usize, VecDeque<Drainer>>,
    /// QPs whose alternate path apm loads (hardware APM): their path migration events.
    armed: BTreeSet<usize>,
}

impl Caused {
    /// At most this many drains wait for their event per QP: beyond it the oldest is
    /// forgotten (a program that drains a QP thousands of times and reads none of the
    /// events).
    pub const CAP: usize = 4096;

    /// An empty record (const: it lives in a static).
    pub const fn new() -> Caused {
        Caused {
            drains: BTreeMap::new(),
            armed: BTreeSet::new(),
        }
    }

    /// `who` is about to take QP `qp` from RTS to SQD.
    pub fn drain(&mut self, qp: usize, who: Drainer) {
        let q = self.drains.entry(qp).or_default();
        if q.len() >= Self::CAP {
            q.pop_front();
        }
        q.push_back(who);
    }

    /// `who`'s last drain of `qp` raises nothing after all (the modify was refused, or
    /// the QP failed while draining).
    pub fn withdraw(&mut self, qp: usize, who: Drainer) {
        let Some(q) = self.drains.get_mut(&qp) else {
            return;
        };
        if let Some(i) = q.iter().rposition(|d| *d == who) {
            q.remove(i);
        }
        if q.is_empty() {
            self.drains.remove(&qp);
        }
    }

    /// apm loads QP `qp`'s alternate paths from now on.
    pub fn arm(&mut self, qp: usize) {
        self.armed.insert(qp);
    }

    /// QP `qp` is gone (destroyed) or starts over (RESET): nothing it raised before
    /// says anything of what it raises next.
    pub fn forget(&mut self, qp: usize) {
        self.drains.remove(&qp);
        self.armed.remove(&qp);
    }

    /// Whether `ev`, just read from the kernel's queue, is apm's doing (the program is
    /// not to see it). Each `SQ_DRAINED` read ends the oldest drain of its QP.
    pub fn is_apms(&mut self, ev: &Event) -> bool {
        let Element::Object(Object::Qp, qp) = ev.about() else {
            return false;
        };
        match ev.event_type {
            sys::IBV_EVENT_SQ_DRAINED => {
                let Some(q) = self.drains.get_mut(&qp) else {
                    return false;
                };
                let who = q.pop_front();
                if q.is_empty() {
                    self.drains.remove(&qp);
                }
                who == Some(Drainer::Apm)
            }
            sys::IBV_EVENT_PATH_MIG | sys::IBV_EVENT_PATH_MIG_ERR => self.armed.contains(&qp),
            _ => false,
        }
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

    const SQ_DRAINED: u32 = 5;
    const COMM_EST: u32 = 4;

    #[test]
    fn each_drained_event_goes_to_whoever_asked_for_that_drain() {
        let mut c = Caused::new();
        // Never drained through apm's eyes: the program's.
        assert!(!c.is_apms(&ev(SQ_DRAINED, 0x10)));
        c.drain(0x10, Drainer::Program);
        c.drain(0x10, Drainer::Apm);
        c.drain(0x20, Drainer::Apm);
        c.drain(0x10, Drainer::Apm);
        c.drain(0x10, Drainer::Program);
        assert!(
            !c.is_apms(&ev(COMM_EST, 0x10)),
            "other events are not counted"
        );
        assert!(
            !c.is_apms(&ev(SQ_DRAINED, 0x10)),
            "the program's, asked first"
        );
        assert!(
            c.is_apms(&ev(SQ_DRAINED, 0x20)),
            "another QP's order is its own"
        );
        assert!(c.is_apms(&ev(SQ_DRAINED, 0x10)));
        assert!(c.is_apms(&ev(SQ_DRAINED, 0x10)));
        assert!(!c.is_apms(&ev(SQ_DRAINED, 0x10)), "the program's own, last");
        assert!(
            !c.is_apms(&ev(SQ_DRAINED, 0x10)),
            "nothing owed: the program's"
        );
        assert!(c.drains.is_empty());
    }

    #[test]
    fn a_withdrawn_drain_takes_nothing_from_the_program() {
        let mut c = Caused::new();
        c.drain(0x10, Drainer::Apm);
        c.drain(0x10, Drainer::Program);
        c.drain(0x10, Drainer::Apm);
        c.withdraw(0x10, Drainer::Apm);
        assert!(c.is_apms(&ev(SQ_DRAINED, 0x10)));
        assert!(!c.is_apms(&ev(SQ_DRAINED, 0x10)));
        assert!(!c.is_apms(&ev(SQ_DRAINED, 0x10)));
        c.withdraw(0x10, Drainer::Program);
        assert!(c.drains.is_empty());
        // A QP that starts over owes nothing.
        c.drain(0x30, Drainer::Apm);
        c.forget(0x30);
        assert!(!c.is_apms(&ev(SQ_DRAINED, 0x30)));
    }

    #[test]
    fn path_migration_events_of_a_qp_apm_arms_are_apms() {
        let mut c = Caused::new();
        assert!(!c.is_apms(&ev(PATH_MIG, 0x10)), "the program's own APM");
        c.arm(0x10);
        assert!(c.is_apms(&ev(PATH_MIG, 0x10)));
        assert!(c.is_apms(&ev(7, 0x10)), "PATH_MIG_ERR");
        assert!(!c.is_apms(&ev(PATH_MIG, 0x20)));
        assert!(!c.is_apms(&ev(PORT_ERR, 0x10)), "a port event names no QP");
        c.forget(0x10);
        assert!(!c.is_apms(&ev(PATH_MIG, 0x10)));
    }

    #[test]
    fn drains_per_qp_are_bounded() {
        let mut c = Caused::new();
        c.drain(0x10, Drainer::Program);
        for _ in 0..Caused::CAP {
            c.drain(0x10, Drainer::Apm);
        }
        assert_eq!(c.drains[&0x10].len(), Caused::CAP);
        assert!(c.is_apms(&ev(SQ_DRAINED, 0x10)), "the oldest was forgotten");
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
