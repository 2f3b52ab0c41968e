//! Log lines go to standard error from a thread of their own.
//!
//! Why: apm logs from the threads that carry a failover out (the Manager, the moves,
//! the peer channel). A write to standard error is a system call that can take long,
//! or block outright: a pipe whose reader is slow (a supervisor, `journald`, a test
//! harness), a terminal over a slow link; a full pipe blocks it until the reader reads.
//! Traced in the VM, consecutive lines of one synchronous step of the Manager lay
//! milliseconds apart, and a move logs several. So a thread formats its
//! line into a buffer and hands it over; one writer thread, at a lower priority
//! (`nice` 10: it runs when apm's work does not), writes the lines in order.
//!
//! Bounded: at most [`QUEUED_LINES`] lines wait. A line that finds the queue full is
//! dropped and counted, and the writer says how many it dropped before its next line
//! (or at the next flush), so memory stays bounded when standard error stops draining
//! and nothing is dropped unsaid. A closed standard error ends the writing quietly
//! (there is nowhere left to complain to). [`LogWriter::flush`] waits, for a bounded
//! time (a few seconds), until what was queued is written: before a message of apm's
//! own on stderr, and at exit. With nothing queued it returns at once, so such a
//! message costs no wait while the log is quiet.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// How many lines may wait for the writer.
pub const QUEUED_LINES: usize = 4096;

/// How long [`LogWriter::flush`] waits for the writer at most: standard error may never
/// drain (a full pipe nobody reads), and apm must still end.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// What the writer is handed: a line, or a request to say when all before it is out.
#[derive(Debug)]
enum Item {
    Line(Vec<u8>),
    Flush(SyncSender<()>),
}

/// The handle the log subscriber writes through (cloneable, cheap).
#[derive(Clone, Debug)]
pub struct LogWriter {
    queue: SyncSender<Item>,
    counts: Arc<Counts>,
}

/// What the loggers and the writer count together.
#[derive(Debug, Default)]
struct Counts {
    /// Lines dropped on a full queue and not yet said.
    dropped: AtomicU64,
    /// Lines queued and not yet written (or discarded): a flush with none waits for
    /// nothing, so a message on stderr (`errln!`, `apm pingpong --json`'s notes, some
    /// during a failover) costs no round trip to the writer while the log is quiet.
    unwritten: AtomicU64,
}

impl LogWriter {
    /// Start the writer thread on standard error. When no thread can be started, lines
    /// are written by the thread that logs them, as before.
    pub fn start() -> Result<LogWriter, std::io::Error> {
        Self::start_on(std::io::stderr())
    }

    fn start_on(out: impl Write + Send + 'static) -> Result<LogWriter, std::io::Error> {
        let (queue, lines) = mpsc::sync_channel(QUEUED_LINES);
        let counts = Arc::new(Counts::default());
        let counted = Arc::clone(&counts);
        std::thread::Builder::new()
            .name("apm-log".into())
            .spawn(move || {
                // Best effort: an ordinary priority only makes the writer compete.
                let _ = provider_verbs::ffi::sched::set_thread_nice(10);
                write_lines(&lines, &counted, out);
            })?;
        Ok(LogWriter { queue, counts })
    }

    /// Wait until every line queued so far is written, or [`FLUSH_WAIT`] has passed.
    pub fn flush(&self) {
        const RETRY: Duration = Duration::from_millis(1);
        if self.counts.unwritten.load(Ordering::Acquire) == 0
            && self.counts.dropped.load(Ordering::Relaxed) == 0
        {
            return;
        }
        let (done, written) = mpsc::sync_channel(1);
        let mut ask = Item::Flush(done);
        // A full queue takes the request once the writer has made room; a writer gone
        // (its thread ended) has nothing left to write. Each wait is bounded by
        // FLUSH_WAIT, counted in retries rather than read off the clock.
        let mut tries = FLUSH_WAIT.as_millis();
        loop {
            match self.queue.try_send(ask) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if tries > 0 => {
                    ask = back;
                    tries -= 1;
                    std::thread::sleep(RETRY);
                }
                Err(_) => return,
            }
        }
        let _ = written.recv_timeout(FLUSH_WAIT);
    }
}

/// The writer thread: each line in order, after a note of lines dropped before it.
fn write_lines(lines: &Receiver<Item>, counts: &Counts, mut out: impl Write) {
    while let Ok(item) = lines.recv() {
        let written = match item {
            Item::Line(line) => {
                let w = say_dropped(counts, &mut out).and_then(|()| out.write_all(&line));
                counts.unwritten.fetch_sub(1, Ordering::Release);
                w
            }
            Item::Flush(done) => {
                // Lines dropped with none after them are said here, at the latest.
                let w = say_dropped(counts, &mut out).and_then(|()| out.flush());
                let _ = done.send(());
                w
            }
        };
        if written.is_err() {
            // Closed or broken: drain what comes (so no logging thread ever waits on
            // a full queue) without writing it.
            for item in lines.iter() {
                match item {
                    Item::Line(_) => {
                        counts.unwritten.fetch_sub(1, Ordering::Release);
                    }
                    Item::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
            return;
        }
    }
}

/// Say how many lines were dropped since the last time, if any were.
fn say_dropped(counts: &Counts, out: &mut impl Write) -> std::io::Result<()> {
    match counts.dropped.swap(0, Ordering::Relaxed) {
        0 => Ok(()),
        lost => out.write_all(
            format!("apm: {lost} log line(s) dropped: standard error did not keep up\n").as_bytes(),
        ),
    }
}

/// One event's line, handed to the writer when the subscriber is done with it.
#[derive(Debug)]
pub struct Line {
    buf: Vec<u8>,
    writer: LogWriter,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let line = std::mem::take(&mut self.buf);
        let counts = &self.writer.counts;
        // Counted before it is queued, so that the writer never counts below zero.
        counts.unwritten.fetch_add(1, Ordering::Release);
        match self.writer.queue.try_send(Item::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Disconnected(_)) => {
                counts.unwritten.fetch_sub(1, Ordering::Release);
            }
            Err(TrySendError::Full(_)) => {
                counts.unwritten.fetch_sub(1, Ordering::Release);
                counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::with_capacity(256),
            writer: self.clone(),
        }
    }
}

/// The log writer of this process, once `main` has started it: what [`flush`] waits for.
static STARTED: Mutex<Option<LogWriter>> = Mutex::new(None);

/// Remember `writer` as this process's, for [`flush`].
pub fn set_global(writer: &LogWriter) {
    *STARTED.lock().unwrap_or_else(PoisonError::into_inner) = Some(writer.clone());
}

/// Write out what this process logged so far (bounded wait; nothing when no writer was
/// started): before a message that must follow the log, and before exit.
pub fn flush() {
    let writer = STARTED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if let Some(w) = writer {
        w.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read back, or one that fails every write.
    #[derive(Clone, Default)]
    struct Sink {
        got: Arc<Mutex<Vec<u8>>>,
        broken: bool,
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.broken {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn log(w: &LogWriter, text: &str) {
        let mut line = w.make_writer();
        line.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_come_out_whole_and_in_order() {
        let sink = Sink::default();
        let w = LogWriter::start_on(sink.clone()).unwrap();
        for i in 0..100 {
            log(&w, &format!("line {i}\n"));
        }
        w.flush();
        let text = String::from_utf8(sink.got.lock().unwrap().clone()).unwrap();
        let want: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, want);
    }

    #[test]
    fn a_full_queue_drops_lines_and_says_how_many() {
        // No writer thread: the queue fills and stays full.
        let (queue, lines) = mpsc::sync_channel(QUEUED_LINES);
        let w = LogWriter {
            queue,
            counts: Arc::default(),
        };
        for i in 0..QUEUED_LINES + 5 {
            log(&w, &format!("line {i}\n"));
        }
        let counts = Arc::clone(&w.counts);
        assert_eq!(counts.dropped.load(Ordering::Relaxed), 5);
        assert_eq!(
            counts.unwritten.load(Ordering::Relaxed),
            QUEUED_LINES as u64
        );
        let sink = Sink::default();
        let got = Arc::clone(&sink.got);
        drop(w);
        write_lines(&lines, &counts, sink);
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert!(text.starts_with("apm: 5 log line(s) dropped"), "{text:.80}");
        assert_eq!(text.lines().count(), QUEUED_LINES + 1);
        assert_eq!(counts.unwritten.load(Ordering::Relaxed), 0);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // measures how long the flush took
    fn a_flush_with_nothing_queued_waits_for_no_writer() {
        // A writer that never runs: a flush that asked it would wait its whole bound.
        let (queue, _lines) = mpsc::sync_channel(QUEUED_LINES);
        let w = LogWriter {
            queue,
            counts: Arc::default(),
        };
        let before = std::time::Instant::now();
        w.flush();
        assert!(before.elapsed() < FLUSH_WAIT / 4, "{:?}", before.elapsed());
    }

    #[test]
    fn lines_dropped_with_none_after_them_are_said_at_the_flush() {
        let sink = Sink::default();
        let w = LogWriter::start_on(sink.clone()).unwrap();
        w.counts.dropped.store(3, Ordering::Relaxed);
        w.flush();
        let text = String::from_utf8(sink.got.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "apm: 3 log line(s) dropped: standard error did not keep up\n"
        );
    }

    #[test]
    fn a_closed_stderr_costs_the_loggers_nothing() {
        let w = LogWriter::start_on(Sink {
            broken: true,
            ..Sink::default()
        })
        .unwrap();
        // Far more than the queue holds: none of these may block or fail.
        for i in 0..QUEUED_LINES * 3 {
            log(&w, &format!("line {i}\n"));
        }
        w.flush();
    }
}
