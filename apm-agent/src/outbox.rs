//! A client's outgoing lines, bounded in bytes: a client that stops reading is dropped,
//! not buffered for.
//!
//! Each connected process and watcher has one [`Outbox`]; the agent puts lines in
//! without waiting (it must never block on one client), and a writer task drains it
//! into the socket. Once more than the budget waits, the outbox closes: the writer
//! ends, the connection is shut, and the agent says so once. A healthy client reads
//! what it is sent within milliseconds, so the budget is never near for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Bytes a protected process may leave unread before it is dropped (about 1,000 peer
/// messages or verdicts).
pub const PROCESS_BUDGET: usize = 256 << 10;
/// Bytes a watcher may leave unread (it gets verdicts only).
pub const WATCHER_BUDGET: usize = 64 << 10;

/// The sending half (cloned wherever the agent tells the client something).
#[derive(Clone, Debug)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    queued: AtomicUsize,
    budget: AtomicUsize,
    closed: AtomicBool,
    /// Woken once when the outbox closes over budget (the writer may be stuck writing
    /// to a client that does not read).
    closing: tokio::sync::Notify,
}

/// The draining half, for the writer task.
#[derive(Debug)]
pub struct Drain {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    shared: Arc<Shared>,
}

/// Why a line was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// This line took the client over its budget: the outbox is now closed (say so).
    OverBudget,
    /// Closed before (already said).
    Closed,
}

impl Outbox {
    /// An outbox of `budget` bytes.
    pub fn new(budget: usize) -> (Outbox, Drain) {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            budget: AtomicUsize::new(budget),
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
        });
        (
            Outbox {
                tx,
                shared: shared.clone(),
            },
            Drain { rx, shared },
        )
    }

    /// Queue `line`, or close the outbox when that would pass the budget.
    pub fn put(&self, line: Vec<u8>) -> Result<(), Refused> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Refused::Closed);
        }
        let len = line.len();
        let before = self.shared.queued.fetch_add(len, Ordering::AcqRel);
        if before.saturating_add(len) > self.shared.budget.load(Ordering::Acquire) {
            self.shared.queued.fetch_sub(len, Ordering::AcqRel);
            if self.shared.closed.swap(true, Ordering::AcqRel) {
                return Err(Refused::Closed);
            }
            self.shared.closing.notify_one();
            return Err(Refused::OverBudget);
        }
        self.tx.send(line).map_err(|_| Refused::Closed)
    }

    /// Change the budget (a client that turns out to be a watcher gets a smaller one).
    pub fn set_budget(&self, budget: usize) {
        self.shared.budget.store(budget, Ordering::Release);
    }

    /// Bytes queued now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }
}

impl Drain {
    /// The next line to write; `None` once the outbox is closed (over budget) or every
    /// sender is gone.
    pub async fn next(&mut self) -> Option<Vec<u8>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return None;
        }
        let line = self.rx.recv().await?;
        self.shared.queued.fetch_sub(line.len(), Ordering::AcqRel);
        if self.shared.closed.load(Ordering::Acquire) {
            return None;
        }
        Some(line)
    }

    /// Once the outbox has closed over its budget (for a writer to give up a write the
    /// client never takes).
    pub async fn closed(&self) {
        // One waiter, the writer: `notify_one` keeps the wake-up for it if it came
        // before the writer waited.
        self.shared.closing.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_over_its_budget_is_closed_once() {
        let (out, mut drain) = Outbox::new(10);
        assert_eq!(out.put(vec![0; 6]), Ok(()));
        assert_eq!(out.queued(), 6);
        assert_eq!(out.put(vec![0; 5]), Err(Refused::OverBudget), "6 + 5 > 10");
        assert_eq!(out.put(vec![0; 1]), Err(Refused::Closed), "said once");
        assert_eq!(drain.next().await, None, "the writer stops");
        let (out, mut drain) = Outbox::new(10);
        for _ in 0..100 {
            out.put(vec![1; 10]).expect("drained as it goes");
            assert_eq!(drain.next().await, Some(vec![1; 10]));
        }
        drop(out);
        assert_eq!(drain.next().await, None);
    }
}
