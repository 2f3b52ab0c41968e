//! What `apm status` shows and the agent's metrics count: each protected process's own
//! account of its QPs ([`ProcessStatus`], which it pushes to the agent as it changes,
//! [`crate::wire::ToAgent::Report`]) and the agent's answer to a status request
//! ([`AgentStatus`]).
//!
//! The engine of a protected process runs inside that process: only it knows its QPs,
//! its failovers and its moves. The agent keeps the last status each process pushed,
//! adds what only the agent knows (the connections each registered, the probe
//! sessions, the peer datagrams it dropped) and keeps the counters of processes that
//! have left, so that a counter never goes backwards when a process exits.
//!
//! Every figure is the process's own word: a process can only misstate its own
//! counts. A status is bounded ([`ProcessStatus::check`]): the agent refuses one that
//! lists more than it may or names a label outside the fixed sets ([`CAUSES`],
//! [`UNPROTECTED_REASONS`], [`REFUSAL_CLASSES`]), so that neither its memory nor the
//! metrics' label sets can be grown by a client.

use apm_core::probe::{PathEnds, SessionState};
use apm_core::Gid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The upper bounds of the move-duration histogram's buckets, in seconds (a software
/// move, from the SQ drain to the send queue's restart: milliseconds on a live path,
/// up to the command deadline on a dead one). The last bucket (`+Inf`) is implied.
pub const MOVE_BUCKETS_S: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 10.0,
];

/// What moved a QP (a failover's `cause` label): what this side saw kill the old
/// primary (`local_port`, `peer_port`, `fabric`), an operator's rail-down
/// (`operator`: under `apm run` the only source of a stall), the device by itself
/// under hardware APM with nothing seen here (`device`: its retries ran out, or the
/// peer's packets asked), or the peer's request (`peer`).
pub const CAUSES: [&str; 6] = [
    "local_port",
    "peer_port",
    "fabric",
    "operator",
    "device",
    "peer",
];

/// Why a QP apm looks after has no armed alternate now (the `reason` label of the
/// unprotected connections): `pending` until the peer first agrees, `moved` after a
/// failover until it is re-armed, else the engine's own reason.
pub const UNPROTECTED_REASONS: [&str; 9] = [
    "pending",
    "moved",
    "no_candidate",
    "alternate_down",
    "alternate_failed",
    "peer_unresponsive",
    "peer_rejected",
    "modify_failed",
    "primary_down_unarmed",
];

/// The classes of a QP apm did not protect (the `reason` label of the refusals; the
/// status lists the full reason too).
pub const REFUSAL_CLASSES: [&str; 11] = [
    "not_rc",
    "rtr_only",
    "srq",
    "own_apm",
    "forked",
    "no_agent",
    "no_peer_agent",
    "no_second_path",
    "device",
    "engine",
    "other",
];

/// QPs a status lists one by one, at most (the counts cover every QP).
pub const MAX_LISTED_QPS: usize = 64;
/// Distinct refusal reasons a status lists, at most.
pub const MAX_REFUSALS: usize = 32;
/// Device ports a status lists, at most.
pub const MAX_PORTS: usize = 64;
/// The longest text a status carries (a program name, a reason, a device name).
pub const MAX_TEXT: usize = 256;

/// One QP apm looks after now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QpState {
    /// Its number.
    pub qpn: u32,
    /// Its device.
    pub device: String,
    /// An armed alternate is agreed with the peer.
    pub protected: bool,
    /// When not protected: why (one of [`UNPROTECTED_REASONS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// QPs refused for one reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Refusals {
    /// The reason as the process said it.
    pub reason: String,
    /// Its class (one of [`REFUSAL_CLASSES`]).
    pub class: String,
    /// How many QPs.
    pub count: u64,
}

/// How one device port moves QPs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMechanism {
    /// The device.
    pub device: String,
    /// The port (1-based).
    pub port: u8,
    /// `hardware` (the device migrates, apm arms) or `software` (apm moves through
    /// the SQ drain).
    pub mechanism: String,
}

/// A histogram of move durations on [`MOVE_BUCKETS_S`]: per bucket (not cumulative),
/// the last one for moves longer than every bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveHistogram {
    /// Moves per bucket: `MOVE_BUCKETS_S.len() + 1` numbers.
    pub counts: Vec<u64>,
    /// The sum of every move's duration, in seconds.
    pub sum_s: f64,
}

impl Default for MoveHistogram {
    fn default() -> Self {
        MoveHistogram {
            counts: vec![0; MOVE_BUCKETS_S.len() + 1],
            sum_s: 0.0,
        }
    }
}

impl MoveHistogram {
    /// Count a move of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        let i = MOVE_BUCKETS_S
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(MOVE_BUCKETS_S.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum_s += seconds.max(0.0);
    }

    /// Moves counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Add `other`'s moves.
    pub fn add(&mut self, other: &MoveHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_s += other.sum_s;
    }
}

/// A protected process's account of itself, as it pushes it to the agent. Counters
/// (`*_total`, the histogram, `unprotected_s`) only grow over the process's life.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// Its program (argv\[0\] as the kernel knows it).
    pub program: String,
    /// QPs the program moved to RTS.
    pub qps_seen_total: u64,
    /// QPs protected at least once.
    pub protected_total: u64,
    /// QPs apm looks after now.
    pub looked_after: u64,
    /// Of those, protected now (an armed alternate agreed).
    pub protected_now: u64,
    /// Of those, unprotected now, by reason (keys from [`UNPROTECTED_REASONS`]).
    pub unprotected_now: BTreeMap<String, u64>,
    /// The QPs apm looks after, at most [`MAX_LISTED_QPS`] of them.
    pub qps: Vec<QpState>,
    /// QPs refused, by reason.
    pub refused: Vec<Refusals>,
    /// Failovers, by cause (keys from [`CAUSES`]).
    pub failovers_total: BTreeMap<String, u64>,
    /// Software moves' durations.
    pub moves: MoveHistogram,
    /// Connection-seconds of QPs apm looked after while they had no armed alternate.
    pub unprotected_s: f64,
    /// Connections lost (QP in error).
    pub lost_total: u64,
    /// How each device port in use moves QPs.
    pub ports: Vec<PortMechanism>,
}

impl ProcessStatus {
    /// Whether the status is within its bounds and names only known labels; `Err`
    /// says what is not.
    pub fn check(&self) -> Result<(), String> {
        let long = |what: &str, s: &str| {
            (s.len() > MAX_TEXT).then(|| format!("{what} longer than {MAX_TEXT} bytes"))
        };
        if let Some(e) = long("a program name", &self.program) {
            return Err(e);
        }
        if self.qps.len() > MAX_LISTED_QPS {
            return Err(format!("more than {MAX_LISTED_QPS} QPs listed"));
        }
        if self.refused.len() > MAX_REFUSALS {
            return Err(format!("more than {MAX_REFUSALS} refusal reasons"));
        }
        if self.ports.len() > MAX_PORTS {
            return Err(format!("more than {MAX_PORTS} ports"));
        }
        for q in &self.qps {
            if let Some(e) = long("a device name", &q.device) {
                return Err(e);
            }
            if let Some(r) = &q.reason {
                known("an unprotected reason", r, &UNPROTECTED_REASONS)?;
            }
        }
        for r in &self.refused {
            if let Some(e) = long("a refusal reason", &r.reason) {
                return Err(e);
            }
            known("a refusal class", &r.class, &REFUSAL_CLASSES)?;
        }
        for p in &self.ports {
            if let Some(e) = long("a device name", &p.device) {
                return Err(e);
            }
            known("a mechanism", &p.mechanism, &["hardware", "software"])?;
        }
        for k in self.unprotected_now.keys() {
            known("an unprotected reason", k, &UNPROTECTED_REASONS)?;
        }
        for k in self.failovers_total.keys() {
            known("a failover cause", k, &CAUSES)?;
        }
        if self.moves.counts.len() != MOVE_BUCKETS_S.len() + 1 {
            return Err("a move histogram of other buckets".into());
        }
        let finite = |x: f64| x.is_finite() && x >= 0.0;
        if !finite(self.moves.sum_s) || !finite(self.unprotected_s) {
            return Err("a duration that is not a finite non-negative number".into());
        }
        Ok(())
    }

    /// Failovers in all.
    pub fn failovers(&self) -> u64 {
        self.failovers_total.values().sum()
    }
}

fn known(what: &str, value: &str, set: &[&str]) -> Result<(), String> {
    if set.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{what} that is not one of {set:?}: {:?}",
            value.get(..40).unwrap_or(value)
        ))
    }
}

/// The counters of processes that have left, kept so that the agent's counters never
/// go backwards (and the sum of the live ones' last words).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// QPs seen.
    pub qps_seen: u64,
    /// QPs protected at least once.
    pub protected: u64,
    /// QPs refused, by class.
    pub refused: BTreeMap<String, u64>,
    /// Failovers by cause.
    pub failovers: BTreeMap<String, u64>,
    /// Software moves' durations.
    pub moves: MoveHistogram,
    /// Unprotected connection-seconds.
    pub unprotected_s: f64,
    /// Connections lost.
    pub lost: u64,
}

impl Totals {
    /// Add one process's counters.
    pub fn add(&mut self, s: &ProcessStatus) {
        self.qps_seen += s.qps_seen_total;
        self.protected += s.protected_total;
        for r in &s.refused {
            *self.refused.entry(r.class.clone()).or_default() += r.count;
        }
        for (cause, n) in &s.failovers_total {
            *self.failovers.entry(cause.clone()).or_default() += n;
        }
        self.moves.add(&s.moves);
        self.unprotected_s += s.unprotected_s;
        self.lost += s.lost_total;
    }
}

/// One connection a process registered with the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// The local QP number.
    pub local_qpn: u32,
    /// The peer's QP number.
    pub remote_qpn: u32,
    /// Its paths (this host's address, the peer's): the primary and the candidates.
    pub paths: Vec<(Gid, Gid)>,
}

/// One process under apm, as the agent sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessEntry {
    /// Its process id.
    pub pid: Option<u32>,
    /// Its user.
    pub uid: u32,
    /// The connections it registered (at most [`MAX_LISTED_QPS`] listed).
    pub connections: Vec<Registered>,
    /// Connections it registered in all.
    pub connections_total: u64,
    /// What it last said of itself (`None`: nothing yet, or an apm too old to say).
    pub status: Option<ProcessStatus>,
}

/// Peer datagrams the agent dropped, by reason (cm-lap's authentication counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerDrops {
    /// Without a tag where one is required.
    pub unauthenticated: u64,
    /// A tag that does not match: forged or corrupted.
    pub forged: u64,
    /// Under another key.
    pub other_key: u64,
    /// A sequence number seen before.
    pub replayed: u64,
    /// Too far from this host's clock.
    pub stale: u64,
    /// Neither format.
    pub malformed: u64,
}

/// The agent itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// apm's version.
    pub version: String,
    /// The agent's process id.
    pub pid: u32,
    /// Its UDP port.
    pub port: u16,
    /// Whether it probes the processes' paths.
    pub probing: bool,
    /// Where it serves its metrics, if it does.
    pub metrics: Option<String>,
}

/// The agent's answer to a status request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// The agent.
    pub agent: AgentInfo,
    /// Whether every process is shown (an operator asked); else only the asking
    /// user's own.
    pub all_processes: bool,
    /// The processes (within the answer's size: see `omitted`).
    pub processes: Vec<ProcessEntry>,
    /// Processes left out of the answer to keep it within its size (ask for one by
    /// its pid), and processes whose QP lists were left out.
    pub omitted: u64,
    /// The probe sessions (an operator sees every one; others those of their own
    /// processes' paths), with their state.
    pub sessions: Vec<(PathEnds, SessionState)>,
    /// Peer datagrams dropped (operators only).
    pub peer_drops: Option<PeerDrops>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_move_in_its_bucket() {
        let mut h = MoveHistogram::default();
        for s in [0.0005, 0.001, 0.003, 50.0] {
            h.observe(s);
        }
        assert_eq!(h.counts[0], 2);
        assert_eq!(h.counts[2], 1);
        assert_eq!(h.counts[MOVE_BUCKETS_S.len()], 1);
        assert_eq!(h.count(), 4);
        assert!((h.sum_s - 50.0045).abs() < 1e-9);
    }

    #[test]
    fn a_status_outside_its_bounds_or_labels_is_refused() {
        let ok = ProcessStatus {
            failovers_total: [("fabric".to_owned(), 2)].into(),
            unprotected_now: [("pending".to_owned(), 1)].into(),
            ..ProcessStatus::default()
        };
        ok.check().expect("within bounds");
        let mut bad = ok.clone();
        bad.failovers_total.insert("chosen-by-me".into(), 1);
        assert!(bad.check().is_err());
        let mut bad = ok.clone();
        bad.qps = vec![
            QpState {
                qpn: 1,
                device: "rxe0".into(),
                protected: true,
                reason: None,
            };
            MAX_LISTED_QPS + 1
        ];
        assert!(bad.check().is_err());
        let mut bad = ok.clone();
        bad.moves.counts.push(1);
        assert!(bad.check().is_err());
        let mut bad = ok;
        bad.unprotected_s = f64::NAN;
        assert!(bad.check().is_err());
    }

    #[test]
    fn totals_add_up_processes() {
        let mut s = ProcessStatus {
            qps_seen_total: 3,
            failovers_total: [("fabric".to_owned(), 2)].into(),
            ..ProcessStatus::default()
        };
        s.moves.observe(0.004);
        let mut t = Totals::default();
        t.add(&s);
        t.add(&s);
        assert_eq!(t.qps_seen, 6);
        assert_eq!(t.failovers["fabric"], 4);
        assert_eq!(t.moves.count(), 2);
    }
}
