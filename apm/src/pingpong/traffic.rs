//! `apm pingpong`'s traffic: numbered messages both ways at a steady pace, every
//! arrival counted (in order, lost, late, duplicated), the stalls between arrivals,
//! apm's notifications as they come, and the final report. It never changes the
//! connection: moving it is apm's business.

// A driver with real devices and a wall clock: it paces messages and measures stalls.
#![allow(clippy::disallowed_methods)]

use super::setup::{say, send_line, Ctl, Session};
use super::{Args, Event, Report, Stall, DEPTH, MSG, SLOT};
use anyhow::Result;
use apm_core::{Cause, Notification, NotificationKind, Path};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What arrived: each message carries its number, and every number is expected once.
#[derive(Default)]
struct Arrivals {
    /// The next number in order.
    expected: u64,
    received: u64,
    lost: u64,
    dup: u64,
    ooo: u64,
    /// Numbers skipped over (counted lost until they arrive late).
    skipped: BTreeSet<u64>,
    last: Option<Instant>,
    stalls: Vec<Stall>,
    longest: Duration,
    /// A gap longer than this is a stall in the report: ten message intervals, at
    /// least 20 ms (scheduling noise is not a stall).
    stall_over: Duration,
}

impl Arrivals {
    /// Message `n` arrived at `t` (`ms` turns a time into the report's milliseconds).
    fn arrived(&mut self, n: u64, t: Instant, ms: impl Fn(Instant) -> f64) {
        if let Some(prev) = self.last {
            let gap = t.saturating_duration_since(prev);
            self.longest = self.longest.max(gap);
            if gap > self.stall_over {
                self.stalls.push(Stall {
                    at_ms: ms(prev),
                    ms: gap.as_secs_f64() * 1e3,
                });
            }
        }
        self.last = Some(t);
        if n == self.expected {
            self.received += 1;
            self.expected += 1;
        } else if n > self.expected {
            // A gap: count it lost for now; a late arrival moves it to out-of-order.
            self.received += 1;
            self.lost += n - self.expected;
            self.skipped.extend(self.expected..n);
            self.expected = n + 1;
        } else if self.skipped.remove(&n) {
            self.received += 1;
            self.lost -= 1;
            self.ooo += 1;
        } else {
            self.dup += 1;
        }
    }
}

/// The sending side: paced, at most a window in flight.
struct Sender {
    sent: u64,
    in_flight: u32,
    next_due: Instant,
    sending: bool,
    stop_at: Option<Instant>,
    interval: Duration,
    window: u32,
}

impl Sender {
    /// Post what is due now; stop when the count, the duration or stdin says so.
    fn post_due(&mut self, args: &Args, s: &Session, now: Instant, eof: bool) -> Result<()> {
        let over = if args.until_stdin_eof {
            eof
        } else {
            self.stop_at.map_or(self.sent >= args.count, |t| now >= t)
        };
        if over {
            self.sending = false;
            return Ok(());
        }
        while self.in_flight < self.window && now >= self.next_due {
            let slot = (DEPTH as usize + (self.sent % u64::from(DEPTH)) as usize) * SLOT;
            s.rc.write(slot, &self.sent.to_be_bytes())?;
            s.rc.post_send(self.sent, slot, MSG, None)?;
            self.sent += 1;
            self.in_flight += 1;
            self.next_due += self.interval;
            if self.stop_at.is_none() && !args.until_stdin_eof && self.sent >= args.count {
                break;
            }
        }
        // After a stall, catch up at most a window's worth at once.
        let floor = now.checked_sub(self.interval * self.window).unwrap_or(now);
        if self.next_due < floor {
            self.next_due = floor;
        }
        Ok(())
    }
}

/// apm's notifications as the report and the progress lines show them.
struct Notes {
    events: Vec<Event>,
    current: Path,
    failovers: u64,
}

impl Notes {
    fn note(&mut self, args: &Args, s: &Session, n: &Notification) {
        let role = s.role;
        let at = s.ms(Instant::now());
        let secs = at / 1e3;
        let mut how = None;
        let mut cause = None;
        let (kind, path) = match &n.kind {
            NotificationKind::Migrated {
                primary,
                forced,
                cause: why,
            } => {
                self.failovers += 1;
                let from = std::mem::replace(&mut self.current, *primary);
                let (key, text) = match (*forced, s.hardware) {
                    (true, true) => ("forced", "apm forced it"),
                    (true, false) => ("forced", "apm moved it"),
                    (false, true) => ("device", "the device migrated"),
                    (false, false) => ("peer", "peer asked"),
                };
                how = Some(key);
                cause = why.map(Cause::name);
                let line = format!(
                    "{role}: FAILOVER at {secs:.1} s: {} -> {} ({text}{})",
                    from.sgid,
                    primary.sgid,
                    cause_text(*why)
                );
                say(args, line);
                ("failover".to_owned(), Some(primary.to_string()))
            }
            NotificationKind::Protected {
                alternate,
                survives,
            } => {
                let line = format!(
                    "{role}: protected at {secs:.1} s: alternate {} ({})",
                    alternate.sgid,
                    survives.name()
                );
                say(args, line);
                ("protected".to_owned(), Some(alternate.to_string()))
            }
            NotificationKind::Rearmed {
                alternate,
                survives,
            } => {
                let line = format!(
                    "{role}: re-armed at {secs:.1} s: alternate {} ({})",
                    alternate.sgid,
                    survives.name()
                );
                say(args, line);
                ("rearmed".to_owned(), Some(alternate.to_string()))
            }
            NotificationKind::Unprotected { reason, cause: why } => {
                cause = why.map(Cause::name);
                say(
                    args,
                    format!(
                        "{role}: unprotected at {secs:.1} s: {reason:?}{}",
                        cause_text(*why)
                    ),
                );
                (format!("unprotected: {reason:?}"), None)
            }
            NotificationKind::Lost { reason } => {
                say(
                    args,
                    format!("{role}: CONNECTION LOST at {secs:.1} s: {reason:?}"),
                );
                (format!("lost: {reason:?}"), None)
            }
            other => (format!("{other:?}"), None),
        };
        self.events.push(Event {
            at_ms: at,
            kind,
            path,
            how,
            cause,
        });
    }
}

/// What killed the primary, as a progress line says it (nothing when this side saw
/// nothing: the peer asked, or the device moved by itself).
fn cause_text(cause: Option<Cause>) -> String {
    let Some(c) = cause else {
        return String::new();
    };
    let what = match c {
        Cause::LocalPort => "this side's port went down",
        Cause::PeerPort => "the peer's port went down",
        Cause::Fabric => "probes lost with both ports up",
        Cause::Stall => "the sends stalled",
        _ => "",
    };
    format!("; {}: {what}", c.name())
}

/// A flag set once standard input is closed (`--until-stdin-eof`).
fn watch_stdin() -> Arc<AtomicBool> {
    let closed = Arc::new(AtomicBool::new(false));
    let flag = closed.clone();
    // A plain thread: blocking stdin reads have no place on the runtime.
    std::thread::spawn(move || {
        // Read and forget: an endless stdin costs one buffer, not memory without end.
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        flag.store(true, Ordering::SeqCst);
    });
    closed
}

/// Keeps the peer's MAC resolved on every rail (RoCE), so a migration does not wait
/// for ARP: under hardware APM. Under software migration provider-rxe's facet keeps the
/// same rails warm itself (`keep_warm`, handed the paths at set-up, protected or not),
/// so this warms nothing then.
struct Neighbours {
    pairs: Vec<(IpAddr, IpAddr)>,
    warmed_at: Option<Instant>,
}

impl Neighbours {
    fn of(args: &Args, s: &Session) -> Neighbours {
        let pairs = if s.infiniband || !s.hardware {
            Vec::new()
        } else {
            args.rails
                .iter()
                .copied()
                .zip(s.peer.rails.iter().copied())
                .collect()
        };
        Neighbours {
            pairs,
            warmed_at: None,
        }
    }

    /// Resolve them again when the last time is 5 s ago.
    fn keep_warm(&mut self, now: Instant) {
        if self
            .warmed_at
            .is_none_or(|t| now.saturating_duration_since(t) > Duration::from_secs(5))
        {
            for (l, r) in &self.pairs {
                provider_rxe::route::warm_neighbour(*l, *r);
            }
            self.warmed_at = Some(now);
        }
    }
}

/// Take the completions: a send frees its place in the window, a receive is counted
/// and its buffer posted again.
fn take_completions(s: &Session, tx: &mut Sender, rx: &mut Arrivals) -> Result<()> {
    for c in s.rc.poll(64)? {
        if !c.recv {
            tx.in_flight = tx.in_flight.saturating_sub(1);
            continue;
        }
        let slot = c.wr_id as usize * SLOT;
        let mut b = [0u8; MSG];
        b.copy_from_slice(&s.rc.read(slot, MSG)?);
        s.rc.post_recv(c.wr_id, slot, SLOT)?;
        rx.arrived(u64::from_be_bytes(b), Instant::now(), |t| s.ms(t));
    }
    Ok(())
}

/// Send and count until both sides are done (or the peer leaves, or the drain time runs
/// out), then report.
pub(super) async fn run(args: &Args, mut s: Session) -> Result<Report> {
    let stdin_closed = args.until_stdin_eof.then(watch_stdin);
    let start = Instant::now();
    let mut tx = Sender {
        sent: 0,
        in_flight: 0,
        next_due: start,
        sending: true,
        stop_at: args.duration.map(|d| start + Duration::from_secs_f64(d)),
        interval: Duration::from_secs_f64(args.interval_ms.max(0.01) / 1e3),
        window: args.window.clamp(1, DEPTH),
    };
    let mut rx = Arrivals {
        stall_over: (tx.interval * 10).max(Duration::from_millis(20)),
        ..Arrivals::default()
    };
    let mut notes = Notes {
        events: Vec::new(),
        current: s.primary,
        failovers: 0,
    };
    let mut done_sent = false;
    let mut stopped_at: Option<Instant> = None;
    let mut peer_sent: Option<u64> = None;
    let mut drain_deadline: Option<Instant> = None;
    let mut peer_left = false;
    let mut neighbours = Neighbours::of(args, &s);
    loop {
        let now = Instant::now();
        neighbours.keep_warm(now);
        if tx.sending {
            let eof = stdin_closed
                .as_ref()
                .is_some_and(|f| f.load(Ordering::SeqCst));
            tx.post_due(args, &s, now, eof)?;
        }
        take_completions(&s, &mut tx, &mut rx)?;
        // Done once every send completed, or, on a connection that no longer completes
        // any (it died: no protection, or both rails dead), once the drain time is up.
        if !tx.sending && stopped_at.is_none() {
            stopped_at = Some(now);
        }
        let gave_up = stopped_at.is_some_and(|t| {
            now.saturating_duration_since(t) >= Duration::from_secs_f64(args.drain_secs)
        });
        if !tx.sending && (tx.in_flight == 0 || gave_up) && !done_sent {
            send_line(&mut s.wr, &Ctl::Done { sent: tx.sent }).await?;
            done_sent = true;
            drain_deadline = Some(Instant::now() + Duration::from_secs_f64(args.drain_secs));
        }
        if peer_left && peer_sent.is_none() {
            // The peer is gone without its count: nothing more will arrive or complete.
            say(
                args,
                format!("{}: the peer left before it finished", s.role),
            );
            break;
        }
        if done_sent
            && (peer_sent.is_some_and(|ps| rx.expected >= ps)
                || drain_deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
        tokio::select! {
            line = s.lines.next_line(), if !peer_left => match line {
                Ok(Some(l)) => {
                    if let Ok(Ctl::Done { sent }) = serde_json::from_str(&l) {
                        peer_sent = Some(sent);
                    }
                }
                _ => peer_left = true,
            },
            n = s.notes.recv() => {
                if let Ok(n) = n {
                    notes.note(args, &s, &n);
                }
            }
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    let _ = send_line(&mut s.wr, &Ctl::Bye).await;
    if let Some(ps) = peer_sent {
        // Numbers never seen at all by the end.
        rx.lost = ps.saturating_sub(rx.expected) + rx.skipped.len() as u64;
    }
    report(args, s, tx.sent, peer_sent, rx, notes).await
}

/// Stop apm and put the figures together.
async fn report(
    args: &Args,
    s: Session,
    sent: u64,
    peer_sent: Option<u64>,
    rx: Arrivals,
    notes: Notes,
) -> Result<Report> {
    let final_primary = s
        .handle
        .status(s.conn)
        .await
        .ok()
        .flatten()
        .map_or(notes.current, |st| st.primary);
    s.handle.shutdown();
    let t0 = s.t0;
    let _ = s.manager_task.await;
    let elapsed_ms = Instant::now().saturating_duration_since(t0).as_secs_f64() * 1e3;
    let now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3);
    let st = s.rc.stats();
    Ok(Report {
        role: s.role,
        device: args.device.clone(),
        mode: match (s.protected, s.hardware) {
            (false, _) => "none",
            (true, true) => "hardware",
            (true, false) => "software",
        },
        sent,
        received: rx.received,
        peer_sent,
        lost: rx.lost,
        duplicated: rx.dup,
        out_of_order: rx.ooo,
        longest_stall_ms: rx.longest.as_secs_f64() * 1e3,
        last_arrival_ms: rx
            .last
            .map(|t| t.saturating_duration_since(t0).as_secs_f64() * 1e3),
        stalls: rx.stalls,
        failovers: notes.failovers,
        events: notes.events,
        initial_primary: s.primary.to_string(),
        final_primary: final_primary.to_string(),
        flushed_sends_replayed: st.flushed_sends,
        flushed_recvs_reposted: st.flushed_recvs,
        drain_migrations: st.drain_migrations,
        reinit_migrations: st.reinit_migrations,
        peer_datagrams_dropped: s.peer_auth.map(|auths| {
            auths
                .iter()
                .map(|a| {
                    let c = a.counters().get();
                    c.unauthenticated + c.bad_tag + c.other_key + c.replayed + c.stale + c.malformed
                })
                .sum()
        }),
        elapsed_ms,
        clock_origin_unix_ms: now_unix_ms - elapsed_ms,
    })
}
