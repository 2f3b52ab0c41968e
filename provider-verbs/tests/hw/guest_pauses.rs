//! The guest's own pauses, for `bench failover`: a thread in the real-time class
//! (`SCHED_FIFO` 50, where the kernel allows it) sleeps 1 ms at a time and notes each
//! wake-up that came more than [`PAUSE_OVER`] late. What it notes is time in which no
//! ordinary thread of the guest could have run, nor apm's control threads unless
//! they were given a priority of 50 or more: the guest's kernel busy with preemption
//! off (rxe's own packet work in softirq included), or the emulator not running the
//! guest's vCPUs. A stall no longer than the pauses inside it says nothing of a
//! protection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A wake-up this late is a pause.
pub(crate) const PAUSE_OVER: Duration = Duration::from_millis(5);

/// The watcher's `SCHED_FIFO` priority.
const PRIORITY: u8 = 50;

/// The running watcher; it stops when finished or dropped.
pub(crate) struct GuestPauses {
    stop: Arc<AtomicBool>,
    /// (when the pause began on the caller's clock in ms, how long it was in ms).
    pauses: Arc<Mutex<Vec<(f64, f64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GuestPauses {
    /// Start watching; times count from `t0`.
    pub(crate) fn start(t0: Instant) -> GuestPauses {
        let stop = Arc::new(AtomicBool::new(false));
        let pauses = Arc::new(Mutex::new(Vec::new()));
        let (stop2, pauses2) = (Arc::clone(&stop), Arc::clone(&pauses));
        let thread = std::thread::spawn(move || {
            if let Err(e) = provider_verbs::ffi::sched::set_thread_fifo(PRIORITY) {
                // Then ordinary threads compete with it: its pauses are upper bounds.
                println!("  guest pause watcher at ordinary priority ({e}): its figures are upper bounds");
            }
            let tick = Duration::from_millis(1);
            let mut before = Instant::now();
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                let now = Instant::now();
                let late = now.saturating_duration_since(before).saturating_sub(tick);
                if late > PAUSE_OVER {
                    let at = before.saturating_duration_since(t0).as_secs_f64() * 1e3;
                    let ms = late.as_secs_f64() * 1e3;
                    pauses2
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((at, ms));
                }
                before = now;
            }
        });
        GuestPauses {
            stop,
            pauses,
            thread: Some(thread),
        }
    }

    /// Stop; the pauses noted.
    pub(crate) fn finish(mut self) -> Vec<(f64, f64)> {
        self.stop_thread();
        std::mem::take(&mut *self.pauses.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for GuestPauses {
    /// A run that panics midway stops its real-time watcher too.
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The longest pause and the pauses' sum within `[from, to)` (ms on the watcher's
/// clock), each pause counted only for the part of it inside the window.
pub(crate) fn pauses_within(pauses: &[(f64, f64)], from: f64, to: f64) -> (f64, f64) {
    pauses
        .iter()
        .map(|&(at, ms)| ((at + ms).min(to) - at.max(from)).max(0.0))
        .filter(|&inside| inside > 0.0)
        .fold((0.0, 0.0), |(longest, sum), inside| {
            (f64::max(longest, inside), sum + inside)
        })
}

#[test]
fn pauses_count_only_their_part_inside_the_window() {
    // A pause of 10 ms from 95, one of 20 from 120, one of 5 from 300 (outside).
    let pauses = [(95.0, 10.0), (120.0, 20.0), (300.0, 5.0)];
    let (longest, sum) = pauses_within(&pauses, 100.0, 130.0);
    assert_eq!(longest, 10.0, "the second one's first 10 ms");
    assert_eq!(sum, 15.0, "5 ms of the first, 10 of the second");
    assert_eq!(pauses_within(&pauses, 200.0, 250.0), (0.0, 0.0));
}
