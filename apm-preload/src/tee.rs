//! The async event tee: apm sees a program's async events, and the program still gets
//! every one of them.
//!
//! Hardware APM needs the QP-affiliated events of the program's QPs (`PATH_MIG`,
//! `PATH_MIG_ERR`, `QP_FATAL`), which the kernel queues only on the context that created
//! the QP: the program's, whose one queue (the uverbs async fd in `ctx->async_fd`) gives
//! each event to whoever reads it first. The fd itself cannot be replaced: libibverbs
//! hands it to the kernel whenever it creates a QP, CQ or SRQ (the `*_EVENT_FD`
//! attribute, which must be a uverbs async event file). So the tee works around the
//! program's reads instead:
//!
//! - A program that reads its events (it calls `ibv_get_async_event` on the context:
//!   [`get_event`], interposed) reads them from the kernel as without apm; apm is handed
//!   a copy of each ([`set_hook`]). Its fd, its blocking mode, its `poll`/`epoll` on the
//!   fd are untouched, and apm never reads the fd again ([`Tee::reader`]).
//! - A program that does not (most verbs programs never call it) leaves its events in
//!   the queue. The tee's thread ([`pump`]) sees the fd readable, gives the program
//!   [`GRACE`] to read it itself, then takes every pending event (non-blocking reads,
//!   the fd's mode put back after), hands apm a copy and keeps the events for the
//!   program ([`crate::ledger::Held`]), which gets them first, in order, if it ever
//!   calls `ibv_get_async_event`. [`destroy`] keeps libibverbs' destroy counts exact
//!   (see [`crate::ledger`]).
//!
//! Events apm caused ([`crate::ledger::Caused`]: the `SQ_DRAINED` of its software
//! moves, the `PATH_MIG` of a QP it arms) are kept from the program on every context,
//! tee or not: the pump acks them as it takes them, and the program's own read
//! ([`get_event`]) acks them and reads on, so that a program blocked in
//! `ibv_get_async_event` stays blocked until an event of its own comes, and one whose
//! fd is non-blocking is told there is none (EAGAIN), as without the event. A program
//! that polls the fd wakes once for such an event and then finds nothing: the kernel
//! queued it, and only the program's own read can take it before it looks.
//!
//! What it must never do: lose, reorder or duplicate an event the program would have
//! read without apm; make a destroy wait; block a program's call on apm's work (the hook
//! runs after the event is the program's, inside `catch_unwind`); read the fd once the
//! program reads it. It is attached only to soft-RoCE contexts, where libibverbs'
//! per-event provider hook (`ops->async_event`, which a kept event skips) does nothing.
// The FFI boundary: poll/read/fcntl on the context's async fd, eventfd, and libibverbs'
// `ibv_ack_async_event` called on the program's behalf. Every block carries a SAFETY
// comment.
#![allow(unsafe_code)]

use crate::fork::{self, Mine, PerProcess};
use crate::ledger::{object_of, Caused, Drainer, Dying, Element, Event, Held, Object};
use provider_verbs::ffi::sys;
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// How long an event waits for the program to read it before apm takes it (a program
/// polling the fd reads within microseconds; apm's re-arm after a migration can wait
/// this long).
pub const GRACE: std::time::Duration = std::time::Duration::from_millis(10);

/// One event as the uverbs async fd delivers it (`struct ib_uverbs_async_event_desc`
/// of the kernel's `rdma/ib_user_verbs.h`: element, event type, reserved).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RawEvent {
    element: u64,
    event_type: u32,
    reserved: u32,
}

/// The kernel's ABI: 16 bytes, read whole.
const EVENT_SIZE: usize = 16;
const _: () = assert!(std::mem::size_of::<RawEvent>() == EVENT_SIZE);

/// What apm is handed for each of a program's events: the context's address and the
/// event.
pub type Hook = Box<dyn Fn(usize, Event) + Send + Sync>;

/// One context's tee.
struct Tee {
    /// The context's async fd (the program's; apm only polls it, and reads it while the
    /// program does not).
    async_fd: RawFd,
    /// Written to stop the pump.
    stop: RawFd,
    /// The program called `ibv_get_async_event` on the context: it reads its own events.
    reader: bool,
    /// Events apm took for a program that did not read them.
    held: Held,
}

struct State {
    tees: BTreeMap<usize, Tee>,
    dying: Dying,
    /// Events of the program's QPs that apm caused, on every context.
    caused: Caused,
}

impl State {
    const fn new() -> State {
        State {
            tees: BTreeMap::new(),
            dying: Dying::new(),
            caused: Caused::new(),
        }
    }
}

type Threads = BTreeMap<usize, std::thread::JoinHandle<()>>;

/// The tees of this process (a forked child's start empty: the parent's threads are
/// not in it).
static STATE: Mutex<PerProcess<State>> = Mutex::new(PerProcess::new(State::new()));
static THREADS: Mutex<PerProcess<Threads>> = Mutex::new(PerProcess::new(BTreeMap::new()));
static HOOK: OnceLock<Hook> = OnceLock::new();

fn state() -> Mine<State> {
    fork::lock(&STATE, State::new)
}

fn threads() -> Mine<Threads> {
    fork::lock(&THREADS, BTreeMap::new)
}

/// Give apm the program's events (once per process; later calls are ignored).
pub fn set_hook(hook: Hook) {
    let _ = HOOK.set(hook);
}

fn hand_over(ctx: usize, events: impl IntoIterator<Item = Event>) {
    if let Some(hook) = HOOK.get() {
        for ev in events {
            let _ = catch_unwind(AssertUnwindSafe(|| hook(ctx, ev)));
        }
    }
}

/// Whether `ctx` has a tee (its QPs' events reach apm).
pub fn attached(ctx: usize) -> bool {
    state().tees.contains_key(&ctx)
}

/// The tee's locks, held across a fork (see `crate::fork`).
pub(crate) struct ForkHold {
    _state: MutexGuard<'static, PerProcess<State>>,
    _threads: MutexGuard<'static, PerProcess<Threads>>,
}

/// Before a fork: hold the tee's locks, so that no thread of apm's holds one in the
/// child.
pub(crate) fn before_fork() -> ForkHold {
    ForkHold {
        _state: fork::hold(&STATE),
        _threads: fork::hold(&THREADS),
    }
}

/// `who` is about to take QP `qp` from RTS to SQD (its `SQ_DRAINED` is `who`'s).
pub fn drain_asked(qp: usize, who: Drainer) {
    state().caused.drain(qp, who);
}

/// `who`'s last drain of QP `qp` will raise nothing.
pub fn drain_withdrawn(qp: usize, who: Drainer) {
    state().caused.withdraw(qp, who);
}

/// apm loads QP `qp`'s alternate paths (its path migration events are apm's).
pub fn armed_by_apm(qp: usize) {
    state().caused.arm(qp);
}

/// QP `qp` was reset by the program: what apm did to it before is over.
pub fn starts_over(qp: usize) {
    state().caused.forget(qp);
}

/// Put a tee on `ctx`, just opened by the program. On failure nothing changed and the
/// reason is returned.
///
/// # Safety
/// `ctx` is a live context returned by libibverbs' `ibv_open_device`.
pub unsafe fn attach(ctx: *mut sys::ibv_context) -> Result<(), String> {
    // SAFETY: a live context per the contract.
    let async_fd = unsafe { (*ctx).async_fd };
    // SAFETY: eventfd with flags only.
    let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if stop < 0 {
        return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
    }
    let at = ctx as usize;
    state().tees.insert(
        at,
        Tee {
            async_fd,
            stop,
            reader: false,
            held: Held::default(),
        },
    );
    let thread = std::thread::Builder::new()
        .name("apm-events".into())
        .spawn(move || pump(at, async_fd, stop));
    match thread {
        Ok(t) => {
            threads().insert(at, t);
            Ok(())
        }
        Err(e) => {
            state().tees.remove(&at);
            // SAFETY: our own eventfd, used by nobody else.
            unsafe { libc::close(stop) };
            Err(format!("cannot start apm's event thread: {e}"))
        }
    }
}

/// Take the tee off `ctx` before the program's real `ibv_close_device`. Events kept for
/// the program vanish with the context, as unread ones do without apm.
pub fn detach(ctx: usize) {
    let Some(tee) = state().tees.remove(&ctx) else {
        return;
    };
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to our eventfd.
    unsafe { libc::write(tee.stop, (&one as *const u64).cast(), 8) };
    // The pump never blocks but in poll, which the eventfd ends.
    if let Some(t) = threads().remove(&ctx) {
        let _ = t.join();
    }
    // SAFETY: our own eventfd; the pump is gone.
    unsafe { libc::close(tee.stop) };
}

/// Wait until `fd` is readable or `stop` is written (or `timeout_ms` passes); `None`
/// when stopped or on an error other than an interruption.
fn wait(fd: Option<RawFd>, stop: RawFd, timeout_ms: c_int) -> Option<bool> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd structs (a negative fd is ignored by poll).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return None;
        }
        if fds[0].revents != 0 {
            return None;
        }
        return Some(fds[1].revents != 0);
    }
}

/// The tee's thread for one context: while the program does not read its events, take
/// each one it left for [`GRACE`], for apm and kept for the program.
fn pump(ctx: usize, async_fd: RawFd, stop: RawFd) {
    let grace = c_int::try_from(GRACE.as_millis()).unwrap_or(10);
    loop {
        if wait(Some(async_fd), stop, -1) != Some(true) {
            return;
        }
        if wait(None, stop, grace).is_none() {
            return;
        }
        let taken = {
            let mut state = state();
            let State {
                tees,
                dying,
                caused,
            } = &mut *state;
            let Some(tee) = tees.get_mut(&ctx) else {
                return;
            };
            if tee.reader {
                // The program reads its own events now: apm gets a copy of each.
                return;
            }
            take_pending(tee, dying, caused)
        };
        hand_over(ctx, taken);
    }
}

/// Read every event pending on the tee's fd (non-blocking, the fd's mode put back
/// after), keep each for the program (but those apm caused, acked at once), and return
/// them for apm. Runs under the state's lock: the program's first `ibv_get_async_event`
/// and every destroy wait for it.
fn take_pending(tee: &mut Tee, dying: &Dying, caused: &mut Caused) -> Vec<Event> {
    let fd = tee.async_fd;
    // SAFETY: fcntl on the context's fd, which stays open while the tee exists.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Vec::new();
    }
    let flip = flags & libc::O_NONBLOCK == 0;
    // SAFETY: as above; the program is not reading the fd (it never called
    // ibv_get_async_event on it, and its first call waits for this lock).
    if flip && unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Vec::new();
    }
    let mut taken = Vec::new();
    loop {
        let mut raw = RawEvent::default();
        // SAFETY: reading at most 16 bytes into a 16-byte struct; non-blocking now.
        let n = unsafe { libc::read(fd, (&mut raw as *mut RawEvent).cast(), EVENT_SIZE) };
        if n != EVENT_SIZE as isize {
            break;
        }
        let ev = Event {
            event_type: raw.event_type,
            element: raw.element,
        };
        if dying.hits(&ev) {
            ack_for_program(ev.about());
        } else if caused.is_apms(&ev) {
            ack_for_program(ev.about());
            taken.push(ev);
        } else if tee.held.push(ev) {
            taken.push(ev);
        } else {
            ack_for_program(ev.about());
            crate::report::note(
                "the program does not read its async events: apm drops the ones beyond \
                 65,536 it keeps for it",
            );
        }
    }
    if flip {
        // SAFETY: putting back the flags read above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    }
    taken
}

/// Ack one event about `el` as the program would have (`ibv_ack_async_event`), so that
/// libibverbs' destroy of that object finds its counts equal. The object is live: a
/// destroy of it is in progress and waits for this ack, or the event was never the
/// program's to see.
fn ack_for_program(el: Element) {
    let Element::Object(object, addr) = el else {
        return;
    };
    let Some(ack) = crate::ffi::real_ack() else {
        return;
    };
    let mut ev = sys::ibv_async_event {
        element: element_union(object, addr),
        // Any event type of the object's group picks the same counter.
        event_type: match object {
            Object::Cq => sys::IBV_EVENT_CQ_ERR,
            Object::Qp => sys::IBV_EVENT_COMM_EST,
            Object::Srq => sys::IBV_EVENT_SRQ_ERR,
            Object::Wq => sys::IBV_EVENT_WQ_FATAL,
        },
    };
    // SAFETY: the object is live (see above) and the event names it with a type of its
    // group, which is all ibv_ack_async_event reads.
    unsafe { ack(&mut ev) };
}

/// The element union of an event about `object` at `addr`.
fn element_union(object: Object, addr: usize) -> sys::ibv_async_event__bindgen_ty_1 {
    match object {
        Object::Cq => sys::ibv_async_event__bindgen_ty_1 {
            cq: addr as *mut sys::ibv_cq,
        },
        Object::Qp => sys::ibv_async_event__bindgen_ty_1 {
            qp: addr as *mut sys::ibv_qp,
        },
        Object::Srq => sys::ibv_async_event__bindgen_ty_1 {
            srq: addr as *mut sys::ibv_srq,
        },
        Object::Wq => sys::ibv_async_event__bindgen_ty_1 {
            wq: addr as *mut sys::ibv_wq,
        },
    }
}

/// The program's `ibv_get_async_event`: on a context with a tee, events apm kept for it
/// come first (filled in as libibverbs fills them); then libibverbs' own (`real`) reads
/// the kernel's queue as without apm, apm gets a copy of each event, and those apm
/// caused are acked and passed over (the read goes on, blocking or not as the fd is).
///
/// # Safety
/// The caller's contract of `ibv_get_async_event`; `real` is libibverbs' function.
pub unsafe fn get_event(
    ctx: *mut sys::ibv_context,
    event: *mut sys::ibv_async_event,
    real: unsafe extern "C" fn(*mut sys::ibv_context, *mut sys::ibv_async_event) -> c_int,
) -> c_int {
    let kept = {
        let mut state = state();
        match state.tees.get_mut(&(ctx as usize)) {
            Some(tee) => {
                tee.reader = true;
                tee.held.pop()
            }
            None => None,
        }
    };
    if let (Some(ev), false) = (kept, event.is_null()) {
        let element = match object_of(ev.event_type) {
            Some(object) => element_union(object, usize::try_from(ev.element).unwrap_or(0)),
            None => sys::ibv_async_event__bindgen_ty_1 {
                port_num: c_int::try_from(ev.element).unwrap_or(0),
            },
        };
        // SAFETY: a writable event per the contract.
        unsafe {
            (*event).element = element;
            (*event).event_type = ev.event_type;
        }
        return 0;
    }
    loop {
        // SAFETY: the caller's arguments.
        let rc = unsafe { real(ctx, event) };
        if rc != 0 || event.is_null() {
            return rc;
        }
        // SAFETY: filled in by the successful call; the pointer member is read only for
        // the types whose element is an object (the others carry a number).
        let ev = unsafe {
            let t = (*event).event_type;
            Event {
                event_type: t,
                element: match object_of(t) {
                    Some(_) => (*event).element.qp as usize as u64,
                    None => u64::try_from((*event).element.port_num).unwrap_or(0),
                },
            }
        };
        hand_over(ctx as usize, [ev]);
        if !state().caused.is_apms(&ev) {
            return 0;
        }
        // libibverbs counted it as read: acked as the program would have, then the
        // read goes on as if it had never been queued.
        if let Some(ack) = crate::ffi::real_ack() {
            // SAFETY: the event libibverbs just filled in; its object is live (its
            // destroy, if one runs, waits for this ack).
            unsafe { ack(event) };
        }
    }
}

/// The program destroys the object at `addr` with `real` (its `ibv_destroy_*`): events
/// about it that apm keeps for the program are removed and acked on its behalf first,
/// and those read during the destroy are acked as they come.
/// What apm caused of the object is forgotten after it (its address may be reused).
pub fn destroy(addr: usize, real: impl FnOnce() -> c_int) -> c_int {
    let gone = {
        let mut s = state();
        if s.tees.is_empty() {
            drop(s);
            let rc = real();
            state().caused.forget(addr);
            return rc;
        }
        s.dying.begin(addr);
        let mut gone = Vec::new();
        for tee in s.tees.values_mut() {
            gone.extend(tee.held.purge(addr));
        }
        gone
    };
    for ev in gone {
        ack_for_program(ev.about());
    }
    let rc = real();
    let mut s = state();
    s.dying.end(addr);
    s.caused.forget(addr);
    rc
}

#[cfg(test)]
mod fork_tests {
    use super::*;

    #[test]
    fn a_forked_child_drops_the_parents_tees() {
        let mut fds = [0; 2];
        // SAFETY: a pipe for the fake context's async fd.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: a zeroed context is a valid value of the plain C struct.
        let mut ctx: sys::ibv_context = unsafe { std::mem::zeroed() };
        ctx.async_fd = fds[0];
        // SAFETY: the context lives for the test.
        unsafe { attach(&mut ctx) }.expect("attach");
        // SAFETY: fork (the library's own handlers run around it, registered when it
        // was loaded); the child reads one map and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let n = state().tees.len();
            // SAFETY: leaving the child at once.
            unsafe { libc::_exit(n as i32) };
        }
        let mut status = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        detach(&mut ctx as *mut _ as usize);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
