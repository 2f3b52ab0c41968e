//! This process's report ([`apm_agent::report::ProcessReport`]): kept up to date as
//! things happen and written whole to `APM_RUN_REPORT_DIR/<pid>.json` after each change
//! (a program that ends with `_exit` or a signal still leaves its last state). Each
//! distinct reason a QP is not protected is said once on stderr. The same account,
//! with each QP apm looks after and where it stands, goes to the host's agent as it
//! changes (`push`: `apm status` and the agent's metrics read it there).

use apm_agent::report::{Failover, MovedBy, PortMechanism, ProcessReport, Refusal};
use apm_agent::status::{ProcessStatus, QpEntry, QpState};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use crate::fork::PerProcess;

struct State {
    report: ProcessReport,
    said: BTreeSet<String>,
    /// RC QPs apm looks after that have no agreed alternate now (by device and QP
    /// number: two devices number their QPs alike): since when.
    unprotected: BTreeMap<(String, u32), Instant>,
    /// The RC QPs apm looks after now (by device and QP number), and where each stands.
    looked_after: BTreeMap<(String, u32), QpState>,
    dir: Option<PathBuf>,
    start: Instant,
}

static STATE: OnceLock<Mutex<PerProcess<State>>> = OnceLock::new();

fn state() -> &'static Mutex<PerProcess<State>> {
    STATE.get_or_init(|| Mutex::new(PerProcess::new(State::new())))
}

/// The report's lock, held across a fork (see `crate::fork`).
pub(crate) struct ForkHold {
    _state: Option<std::sync::MutexGuard<'static, PerProcess<State>>>,
}

/// Before a fork: hold the report's lock, if there is a report.
pub(crate) fn before_fork() -> ForkHold {
    ForkHold {
        _state: STATE
            .get()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner)),
    }
}

/// The system clock now, in ms since the Unix epoch (0 if the clock is before it).
fn unix_ms_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

impl State {
    /// This process's report, empty.
    fn new() -> State {
        let program = std::fs::read_to_string("/proc/self/comm")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        State {
            report: ProcessReport {
                pid: std::process::id(),
                program,
                started_unix_ms: unix_ms_now(),
                ..ProcessReport::default()
            },
            said: BTreeSet::new(),
            unprotected: BTreeMap::new(),
            looked_after: BTreeMap::new(),
            dir: std::env::var_os("APM_RUN_REPORT_DIR").map(PathBuf::from),
            start: Instant::now(),
        }
    }

    /// The QP's unprotected time so far is counted; it is no longer unprotected.
    fn settle(&mut self, qpn: u32, device: &str) {
        if let Some(t) = self.unprotected.remove(&(device.to_owned(), qpn)) {
            self.report.unprotected_ms += t.elapsed().as_secs_f64() * 1000.0;
        }
    }

    /// The report with the running unprotected intervals counted up to now.
    fn now(&self) -> ProcessReport {
        let mut report = self.report.clone();
        let now = Instant::now();
        report.unprotected_ms += self
            .unprotected
            .values()
            .map(|t| now.saturating_duration_since(*t).as_secs_f64() * 1000.0)
            .sum::<f64>();
        report
    }

    /// What the agent is told.
    fn status(&self) -> ProcessStatus {
        let report = self.now();
        let qps = self
            .looked_after
            .iter()
            .map(|((device, qpn), state)| QpEntry {
                qpn: *qpn,
                device: device.clone(),
                state: *state,
            });
        ProcessStatus::from_report(&report, qps, report.unprotected_ms / 1000.0)
    }
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    // Whole updates only: a poisoned report is still consistent. A forked child's
    // report starts empty, under its own process id.
    let mut g = state().lock().unwrap_or_else(PoisonError::into_inner);
    let s = g.get(State::new);
    let r = f(s);
    write(s);
    r
}

fn write(s: &State) {
    CHANGED.notify_one();
    let Some(dir) = &s.dir else { return };
    let report = s.now();
    let Ok(json) = serde_json::to_vec_pretty(&report) else {
        return;
    };
    let path = dir.join(format!("{}.json", report.pid));
    let tmp = dir.join(format!(".{}.json.tmp", report.pid));
    if std::fs::write(&tmp, json).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// Wakes [`push`] after a change.
static CHANGED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Tell the agent this process's account of itself as it changes: at most every
/// [`PUSH_GAP`], and every [`PUSH_EVERY`] while nothing changes (the unprotected
/// time grows). Ends when the agent is gone.
pub(crate) async fn push(client: std::sync::Arc<apm_agent::client::AgentClient>) {
    let mut last = None;
    loop {
        let _ = tokio::time::timeout(PUSH_EVERY, CHANGED.notified()).await;
        let status = {
            let mut g = state().lock().unwrap_or_else(PoisonError::into_inner);
            if g.stale() {
                return; // a forked child: its own protection pushes its own
            }
            g.get(State::new).status()
        };
        if last.as_ref() != Some(&status) {
            if client.report(status.clone()).is_err() {
                return;
            }
            last = Some(status);
        }
        tokio::time::sleep(PUSH_GAP).await;
    }
}

/// The shortest time between two pushes.
const PUSH_GAP: std::time::Duration = std::time::Duration::from_millis(200);
/// The longest.
const PUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Say `line` on stderr unless it was said already.
fn say_once(s: &mut State, key: &str, line: &str) {
    if s.said.insert(key.to_owned()) {
        eprintln!("apm: {line}");
    }
}

/// A QP reached RTS.
pub fn seen() {
    with(|s| s.report.qps_seen += 1);
}

/// A QP apm will not protect, and why (said once per reason).
pub fn refused(qpn: u32, device: &str, reason: &str) {
    with(|s| {
        s.unprotected.remove(&(device.to_owned(), qpn));
        s.looked_after.remove(&(device.to_owned(), qpn));
        say_once(
            s,
            reason,
            &format!("QP {qpn:#x} on {device} is not protected: {reason} (said once per reason)"),
        );
        s.report.not_protected.push(Refusal {
            qpn,
            device: device.to_owned(),
            reason: reason.to_owned(),
        });
    });
}

/// apm started looking after an RC QP (unprotected until the peer agrees).
pub fn looking_after(qpn: u32, device: &str) {
    unprotected(qpn, device, QpState::Pending);
}

/// An alternate is agreed (`first`: the QP's first).
pub fn protected(qpn: u32, device: &str, first: bool) {
    with(|s| {
        if first {
            s.report.protected += 1;
        }
        s.settle(qpn, device);
        s.looked_after
            .insert((device.to_owned(), qpn), QpState::Protected);
    });
}

/// The QP has no agreed alternate (any more), and why.
pub fn unprotected(qpn: u32, device: &str, why: QpState) {
    with(|s| {
        s.looked_after.insert((device.to_owned(), qpn), why);
        s.unprotected
            .entry((device.to_owned(), qpn))
            .or_insert_with(Instant::now);
    });
}

/// A move onto the alternate: how long apm's part took, where to, who moved it, and
/// what this side saw kill the old primary.
pub fn failover(
    qpn: u32,
    device: &str,
    move_ms: Option<f64>,
    to: String,
    by: MovedBy,
    cause: Option<&str>,
) {
    with(|s| {
        let at_ms = s.start.elapsed().as_secs_f64() * 1000.0;
        s.looked_after
            .insert((device.to_owned(), qpn), QpState::Moved);
        s.unprotected
            .entry((device.to_owned(), qpn))
            .or_insert_with(Instant::now);
        s.report.failovers.push(Failover {
            qpn,
            device: device.to_owned(),
            at_ms,
            move_ms,
            to,
            by,
            cause: cause.map(str::to_owned),
        });
    });
}

/// The connection is lost (its QP in error).
pub fn lost(qpn: u32, device: &str, reason: &str) {
    with(|s| {
        s.settle(qpn, device);
        s.looked_after.remove(&(device.to_owned(), qpn));
        s.report.lost.push(Refusal {
            qpn,
            device: device.to_owned(),
            reason: reason.to_owned(),
        });
    });
}

/// apm stopped looking after the QP (destroyed, out of RTS).
pub fn released(qpn: u32, device: &str) {
    with(|s| {
        s.settle(qpn, device);
        s.looked_after.remove(&(device.to_owned(), qpn));
    });
}

/// What a port showed it can do when apm tried it (kept once per port: a port tried
/// again replaces what it showed before).
pub fn port(probe: &provider_verbs::capability::PortProbe) {
    let entry = PortMechanism {
        device: probe.device.clone(),
        port: probe.port,
        link_layer: probe.link_layer.clone(),
        mechanism: probe.mechanism().code().to_owned(),
        evidence: probe.line(),
    };
    with(|s| {
        let ports = &mut s.report.ports;
        ports.retain(|p| (p.device.as_str(), p.port) != (entry.device.as_str(), entry.port));
        ports.push(entry);
    });
}

/// Something said once, kept in the report's notes.
pub fn note(line: &str) {
    with(|s| {
        say_once(s, line, line);
        if !s.report.notes.iter().any(|n| n == line) {
            s.report.notes.push(line.to_owned());
        }
    });
}

/// apm saw none of the process's verbs though it holds an RDMA device: why (said once).
pub fn not_seen(why: &str) {
    with(|s| {
        say_once(s, why, why);
        s.report.not_seen = Some(why.to_owned());
    });
}

/// At exit: the last write; without `apm run`, a summary line of this process.
pub fn finish() {
    // A program that never moved a QP to RTS has no report: nothing to do.
    let Some(s) = STATE.get() else { return };
    let mut g = s.lock().unwrap_or_else(PoisonError::into_inner);
    if g.stale() {
        // A forked child that never used apm: the report is the parent's.
        return;
    }
    let s = g.get(State::new);
    write(s);
    if s.dir.is_none() && (s.report.qps_seen > 0 || s.report.not_seen.is_some()) {
        let run = apm_agent::report::RunReport {
            exit_status: 0,
            processes: vec![s.report.clone()],
        };
        eprintln!("{}", run.summary().replacen("apm run:", "apm:", 1));
    }
}
