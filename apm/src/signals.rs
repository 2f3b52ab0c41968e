//! The signals that end a process by default and can be caught: what `apm watch` and
//! `apm run` listen for, so that whichever of them ends apm, apm ends what it started
//! first (a watch's `--exec` hooks, a run's program and its process group).
//!
//! SIGPIPE is not among them: a closed standard output ends apm as it ends any filter
//! (`out.rs`), and a program's own broken pipes are its own.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// Every catchable signal whose default action ends the process (`signal(7)`), but
/// SIGPIPE.
pub const ENDING: [Signal; 11] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
];

/// Listen for `signals` (inside a runtime with IO enabled): each arrives on the
/// receiver, in order, for as long as it is kept.
pub fn listen(signals: &[Signal]) -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
    let (tx, rx) = mpsc::unbounded_channel();
    for &sig in signals {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}
