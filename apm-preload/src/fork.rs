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
//! release them after it. The child then sets itself up: the parent's apm, if it had
//! started, is never touched again (its QPs are refused with the reason, its threads
//! being the parent's), the tees are dropped (the child's own contexts get their own)
//! and the report starts empty under the child's process id, so the parent's is kept.
//! A child that execs loads apm afresh and protects its QPs as any program.
//!
//! Not covered: locks of the libraries apm uses that only apm's runtime takes (the
//! child never runs it), and locks the program's own threads hold (a fork in a threaded
//! program has that problem without apm).

use std::any::Any;
use std::cell::RefCell;

thread_local! {
    /// The locks the forking thread holds across the fork.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Before the fork, in the forking thread.
pub fn prepare() {
    let mut held = Vec::new();
    crate::protect::before_fork(&mut held);
    crate::tee::before_fork(&mut held);
    crate::report::before_fork(&mut held);
    held.push(Box::new(std::io::stderr().lock()));
    HELD.with(|h| *h.borrow_mut() = held);
}

/// After the fork, in the parent.
pub fn parent() {
    release();
}

/// After the fork, in the child (its only thread).
pub fn child() {
    release();
    crate::protect::in_forked_child();
    crate::tee::in_forked_child();
    crate::report::in_forked_child();
}

fn release() {
    HELD.with(|h| drop(std::mem::take(&mut *h.borrow_mut())));
}
