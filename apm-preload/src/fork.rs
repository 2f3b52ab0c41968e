//! `fork()` in a program under apm: the child gets no lock an apm thread held, and a
//! report of its own.
//!
//! A child forked without exec is a copy of the parent with one thread: apm's threads
//! (its runtime, the event tees' pumps) are not in it, and a lock one of them held at
//! the fork would stay held for ever. So, as `pthread_atfork` handlers (registered by
//! `ffi` when the library is loaded): before the fork the forking thread takes every
//! lock of apm's that a child may take (the QP bookkeeping of `protect`, the tees'
//! state, the report, standard error, which apm's logs write to), in the order apm's
//! own code nests them, after any start of apm in progress has finished; both sides
//! release them after it.
//!
//! The handlers touch no heap memory: a program that called `ibv_fork_init` has its
//! registered memory left out of the child (`MADV_DONTFORK`), and with it whatever else
//! shared those pages, apm's state among it. So the child handler only releases the
//! locks and counts a new generation ([`generation`]); apm's per-process state is
//! [`PerProcess`], which a child finds stale on first use and starts over, the
//! parent's contents forgotten unread. An apm that had started in the parent is never
//! touched again (its QPs' slots, runtime and agent are the parent's): the child's QPs
//! are refused with that reason. Its report starts empty under its own process id, so
//! the parent's is kept. A child that execs loads apm afresh and protects its QPs as any
//! program.
//!
//! Not covered: locks of the libraries apm uses that only apm's runtime takes (the
//! child never runs it), and locks the program's own threads hold (a fork in a threaded
//! program has that problem without apm). The tees' stop eventfds stay open, unused,
//! in the child.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Forks (without exec) between the first process and this one.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

/// How many forks separate this process from the one that loaded apm.
pub fn generation() -> usize {
    GENERATION.load(Ordering::Relaxed)
}

/// State that belongs to the process that made it: in a child forked without exec it
/// starts over on first use, its old contents forgotten unread (they may sit in pages
/// the child does not have).
#[derive(Debug)]
pub struct PerProcess<T> {
    generation: usize,
    value: T,
}

impl<T> PerProcess<T> {
    /// `value`, this process's.
    pub const fn new(value: T) -> PerProcess<T> {
        PerProcess {
            generation: 0,
            value,
        }
    }

    /// Whether the value is the parent's (this process was forked since).
    pub fn stale(&self) -> bool {
        self.generation != generation()
    }

    /// The value, started over with `fresh` if it is the parent's.
    pub fn get(&mut self, fresh: impl FnOnce() -> T) -> &mut T {
        if self.stale() {
            std::mem::forget(std::mem::replace(&mut self.value, fresh()));
            self.generation = generation();
        }
        &mut self.value
    }
}

/// The locks the forking thread holds across the fork (no heap: see the module docs).
struct Held {
    _protect: crate::protect::ForkHold,
    _tee: crate::tee::ForkHold,
    _report: crate::report::ForkHold,
    _stderr: std::io::StderrLock<'static>,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Before the fork, in the forking thread.
pub fn prepare() {
    let held = Held {
        _protect: crate::protect::before_fork(),
        _tee: crate::tee::before_fork(),
        _report: crate::report::before_fork(),
        _stderr: std::io::stderr().lock(),
    };
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

/// After the fork, in the parent.
pub fn parent() {
    HELD.with(|h| drop(h.borrow_mut().take()));
}

/// After the fork, in the child (its only thread).
pub fn child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    HELD.with(|h| drop(h.borrow_mut().take()));
    crate::protect::in_forked_child();
}

/// A locked [`PerProcess`] value, this process's (started over first if it was the
/// parent's).
pub struct Mine<T: 'static>(MutexGuard<'static, PerProcess<T>>);

impl<T> std::ops::Deref for Mine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T> std::ops::DerefMut for Mine<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0.value
    }
}

/// Lock `m` and make its value this process's (`fresh` in a child that has not used
/// it yet). Whole updates only: a poisoned value is still consistent.
pub fn lock<T>(m: &'static Mutex<PerProcess<T>>, fresh: impl FnOnce() -> T) -> Mine<T> {
    let mut g = m.lock().unwrap_or_else(PoisonError::into_inner);
    g.get(fresh);
    Mine(g)
}

/// Lock `m` as it is (for the fork handlers, which must not start it over).
pub fn hold<T>(m: &'static Mutex<PerProcess<T>>) -> MutexGuard<'static, PerProcess<T>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
