//! The runtime apm's control work runs on, apart from the application's: the Manager,
//! its provider tasks (device events, the rail watcher, the peer channel, the probes)
//! and the moves themselves.
//!
//! Why a runtime of its own: a failover is a chain of short steps (an event read, the
//! engine's decision, a QP modify, a message to the peer, its answer), each a task that
//! waits for a worker; on the application's runtime each waits behind the
//! application's own tasks. With `realtime` the runtime's threads (its blocking pool's
//! too) also run in the kernel's `SCHED_FIFO` class, ahead of every ordinary thread
//! (why, and what that asks of them: `provider_verbs::ffi::sched`).

use std::sync::{Arc, Mutex, PoisonError};

/// Worker threads: two, so that a verb that waits in the kernel on one (a RoCE modify
/// resolving a neighbour) leaves the peer channel and the probes running on the other.
const WORKERS: usize = 2;

/// A started control runtime, and what became of the priority it was asked for.
#[derive(Debug)]
pub struct ControlRuntime {
    /// The runtime; dropped (its tasks with it) with this value, outside any async
    /// context.
    pub runtime: tokio::runtime::Runtime,
    /// Why the threads run at ordinary priority although `realtime` asked otherwise
    /// (the first refusal seen by the time `start` returned: `EPERM` without
    /// `CAP_SYS_NICE`; the kernel refuses every thread alike), if they do.
    pub priority_refused: Option<String>,
}

/// Start the control runtime; `realtime` is the `SCHED_FIFO` priority of its threads (1
/// to 99), `None` for ordinary ones. A priority the kernel refuses is not an error: the
/// runtime runs at ordinary priority and says why in `priority_refused`. Call it
/// outside any async context: it blocks until a worker has run.
pub fn start(realtime: Option<u8>) -> std::io::Result<ControlRuntime> {
    let refused: Arc<Mutex<Option<String>>> = Arc::default();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(WORKERS)
        .thread_name("apm-control")
        .enable_all();
    if let Some(priority) = realtime {
        let refused = Arc::clone(&refused);
        builder.on_thread_start(move || {
            if let Err(e) = provider_verbs::ffi::sched::set_thread_fifo(priority) {
                let mut first = refused.lock().unwrap_or_else(PoisonError::into_inner);
                first.get_or_insert_with(|| format!("SCHED_FIFO {priority}: {e}"));
            }
        });
    }
    let runtime = builder.build()?;
    // The workers start with the runtime; wait until one has run a task, so that its
    // start hook has run (and recorded any refusal) before this returns.
    runtime.block_on(runtime.spawn(async {})).ok();
    let priority_refused = refused
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    Ok(ControlRuntime {
        runtime,
        priority_refused,
    })
}
