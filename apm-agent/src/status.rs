//! What `apm status` shows and the agent's metrics count: each protected process's own
//! account of itself ([`ProcessStatus`], which it pushes to the agent as it changes,
//! [`crate::wire::ToAgent::Report`]) and the agent's answer to a status request
//! ([`AgentStatus`]).
//!
//! The engine of a protected process runs inside that process: only it knows its QPs,
//! its failovers and its moves. The agent keeps the last status each process pushed,
//! adds what only the agent knows (the probe sessions, the peer datagrams it dropped)
//! and keeps the counters of processes that have left ([`Totals`]), so that a counter
//! never goes backwards when a process exits.
//!
//! Every figure is the process's own word: a process can only misstate its own
//! counts. A status is bounded ([`ProcessStatus::check`]) and its labels are closed
//! enums ([`QpState`], [`FailoverCause`]: serde refuses any other word), so that
//! neither the agent's memory nor the metrics' label sets can be grown by a client.

use crate::report::{MovedBy, PortMechanism, ProcessReport};
use apm_core::probe::{PathEnds, SessionState};
use apm_core::UnprotectedReason;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The upper bounds of the move-duration histogram's buckets, in seconds (a software
/// move, from the SQ drain to the send queue's restart: milliseconds on a live path,
/// up to the command deadline on a dead one). The last bucket (`+Inf`) is implied.
pub const MOVE_BUCKETS_S: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 10.0,
];

/// QPs a status lists one by one, at most (the counts cover every QP).
pub const MAX_LISTED_QPS: usize = 64;
/// Distinct refusal reasons a status lists, at most (the total counts every refusal).
pub const MAX_REFUSALS: usize = 32;
/// Device ports a status lists, at most.
pub const MAX_PORTS: usize = 64;
/// The longest text a status carries (a program name, a reason, a device name, a
/// port's evidence).
pub const MAX_TEXT: usize = 512;

/// Where a QP apm looks after stands now: protected, or why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QpState {
    /// An armed alternate is agreed with the peer.
    Protected,
    /// Not yet: the peer has not agreed an alternate since apm took the QP.
    Pending,
    /// Moved onto its alternate, not armed again yet.
    Moved,
    /// No healthy candidate path (both rails down, ...).
    NoCandidate,
    /// The armed alternate's port or remote address went down.
    AlternateDown,
    /// The device reported the alternate did not work (`PATH_MIG_ERR`).
    AlternateFailed,
    /// The peer never answered.
    PeerUnresponsive,
    /// The peer refused the alternate.
    PeerRejected,
    /// The device refused to load or arm the alternate.
    ModifyFailed,
    /// The primary failed with nothing armed to move to.
    PrimaryDownUnarmed,
}

impl QpState {
    /// Every state, in label order.
    pub const ALL: [QpState; 10] = [
        QpState::Protected,
        QpState::Pending,
        QpState::Moved,
        QpState::NoCandidate,
        QpState::AlternateDown,
        QpState::AlternateFailed,
        QpState::PeerUnresponsive,
        QpState::PeerRejected,
        QpState::ModifyFailed,
        QpState::PrimaryDownUnarmed,
    ];

    /// Its name (the metrics' `reason` label, the JSON's word).
    pub fn name(self) -> &'static str {
        match self {
            QpState::Protected => "protected",
            QpState::Pending => "pending",
            QpState::Moved => "moved",
            QpState::NoCandidate => "no_candidate",
            QpState::AlternateDown => "alternate_down",
            QpState::AlternateFailed => "alternate_failed",
            QpState::PeerUnresponsive => "peer_unresponsive",
            QpState::PeerRejected => "peer_rejected",
            QpState::ModifyFailed => "modify_failed",
            QpState::PrimaryDownUnarmed => "primary_down_unarmed",
        }
    }
}

impl From<UnprotectedReason> for QpState {
    fn from(r: UnprotectedReason) -> QpState {
        match r {
            UnprotectedReason::NoCandidate => QpState::NoCandidate,
            UnprotectedReason::AlternateDown => QpState::AlternateDown,
            UnprotectedReason::AlternateFailed => QpState::AlternateFailed,
            UnprotectedReason::PeerUnresponsive => QpState::PeerUnresponsive,
            UnprotectedReason::PeerRejected(_) => QpState::PeerRejected,
            UnprotectedReason::ModifyFailed => QpState::ModifyFailed,
            // PrimaryDownUnarmed, and any reason a later engine adds.
            _ => QpState::PrimaryDownUnarmed,
        }
    }
}

/// What moved a QP onto its alternate (the metrics' `cause` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailoverCause {
    /// This host's port under the primary (its `PORT_ERR`, or the probes' verdict).
    LocalPort,
    /// The peer's port (the SA's trap 65, or the probes naming it).
    PeerPort,
    /// Both ports up and the path between them dead (the probes).
    Fabric,
    /// A stall reported from outside the engine: under `apm run` only an operator's
    /// rail-down verdict (`apm agent --rail-down`) reports one.
    Operator,
    /// The device migrated the QP by itself (hardware APM: its retries on the primary
    /// ran out, or the peer's packets asked) with nothing seen on this side.
    Device,
    /// The peer asked this side to move (software moves).
    Peer,
}

impl FailoverCause {
    /// Every cause, in label order.
    pub const ALL: [FailoverCause; 6] = [
        FailoverCause::LocalPort,
        FailoverCause::PeerPort,
        FailoverCause::Fabric,
        FailoverCause::Operator,
        FailoverCause::Device,
        FailoverCause::Peer,
    ];

    /// Its name (the metrics' label).
    pub fn name(self) -> &'static str {
        match self {
            FailoverCause::LocalPort => "local_port",
            FailoverCause::PeerPort => "peer_port",
            FailoverCause::Fabric => "fabric",
            FailoverCause::Operator => "operator",
            FailoverCause::Device => "device",
            FailoverCause::Peer => "peer",
        }
    }

    /// The cause of one failover of a report (its `cause` is what this side saw, its
    /// `by` who moved it).
    pub fn of(cause: Option<&str>, by: MovedBy) -> FailoverCause {
        match (cause, by) {
            (Some("local_port"), _) => FailoverCause::LocalPort,
            (Some("peer_port"), _) => FailoverCause::PeerPort,
            (Some("fabric"), _) => FailoverCause::Fabric,
            (Some(_), _) => FailoverCause::Operator,
            (None, MovedBy::Hardware) => FailoverCause::Device,
            (None, MovedBy::Software) => FailoverCause::Peer,
        }
    }
}

/// One QP apm looks after now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpEntry {
    /// Its number.
    pub qpn: u32,
    /// Its device.
    pub device: String,
    /// Protected, or why not.
    pub state: QpState,
}

/// QPs apm did not protect for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusals {
    /// The reason as the process said it.
    pub reason: String,
    /// How many QPs.
    pub count: u64,
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

    /// Each bucket's bound (`+Inf` last) and its own count, not cumulative (the
    /// exposition encoder sums them).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        MOVE_BUCKETS_S
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.counts.iter().copied())
            .collect()
    }
}

/// A protected process's account of itself, as it pushes it to the agent. The
/// `*_total` figures, the histogram and `unprotected_s` only grow over its life.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// Its program (argv\[0\] as the kernel knows it).
    pub program: String,
    /// QPs the program moved to RTS.
    pub qps_seen_total: u64,
    /// QPs protected at least once.
    pub protected_total: u64,
    /// QPs apm did not protect.
    pub refused_total: u64,
    /// Those, by reason (at most [`MAX_REFUSALS`] reasons).
    pub refused: Vec<Refusals>,
    /// The QPs apm looks after now, by state (every one counted).
    pub looked_after: BTreeMap<QpState, u64>,
    /// The QPs apm looks after, at most [`MAX_LISTED_QPS`] of them.
    pub qps: Vec<QpEntry>,
    /// Failovers, by cause.
    pub failovers_total: BTreeMap<FailoverCause, u64>,
    /// Software moves' durations (a hardware migration has none apm can time).
    pub moves: MoveHistogram,
    /// Connection-seconds of QPs apm looked after while they had no agreed alternate.
    pub unprotected_s: f64,
    /// Connections lost (QP in error).
    pub lost_total: u64,
    /// How each device port in use moves QPs, as apm found when it tried.
    pub ports: Vec<PortMechanism>,
}

impl ProcessStatus {
    /// The status of a process from its report, the QPs it looks after now and its
    /// unprotected time so far (the report's, plus the running intervals).
    pub fn from_report(
        report: &ProcessReport,
        qps: impl IntoIterator<Item = QpEntry>,
        unprotected_s: f64,
    ) -> ProcessStatus {
        let mut s = ProcessStatus {
            program: clip(&report.program),
            qps_seen_total: report.qps_seen,
            protected_total: report.protected,
            refused_total: report.not_protected.len() as u64,
            unprotected_s,
            lost_total: report.lost.len() as u64,
            ports: report.ports.iter().take(MAX_PORTS).cloned().collect(),
            ..ProcessStatus::default()
        };
        for p in &mut s.ports {
            p.device = clip(&p.device);
            p.evidence = clip(&p.evidence);
            p.link_layer = clip(&p.link_layer);
            p.mechanism = clip(&p.mechanism);
        }
        for r in &report.not_protected {
            let reason = clip(&r.reason);
            if let Some(x) = s.refused.iter_mut().find(|x| x.reason == reason) {
                x.count += 1;
            } else if s.refused.len() < MAX_REFUSALS {
                s.refused.push(Refusals { reason, count: 1 });
            }
        }
        for f in &report.failovers {
            let cause = FailoverCause::of(f.cause.as_deref(), f.by);
            *s.failovers_total.entry(cause).or_default() += 1;
            if let Some(ms) = f.move_ms {
                s.moves.observe(ms / 1000.0);
            }
        }
        for q in qps {
            *s.looked_after.entry(q.state).or_default() += 1;
            if s.qps.len() < MAX_LISTED_QPS {
                s.qps.push(QpEntry {
                    device: clip(&q.device),
                    ..q
                });
            }
        }
        s
    }

    /// Whether the status is within its bounds; `Err` says what is not.
    pub fn check(&self) -> Result<(), String> {
        let texts = std::iter::once(&self.program)
            .chain(self.refused.iter().map(|r| &r.reason))
            .chain(self.qps.iter().map(|q| &q.device))
            .chain(
                self.ports
                    .iter()
                    .flat_map(|p| [&p.device, &p.link_layer, &p.mechanism, &p.evidence]),
            );
        for t in texts {
            if t.len() > MAX_TEXT {
                return Err(format!("a text longer than {MAX_TEXT} bytes"));
            }
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

/// `s` cut to at most [`MAX_TEXT`] bytes, at a character boundary.
fn clip(s: &str) -> String {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default().to_owned()
}

/// Counters summed over processes: the live ones' last words, and those of the
/// processes that have left, kept so that the agent's counters never go backwards.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// QPs seen.
    pub qps_seen: u64,
    /// QPs protected at least once.
    pub protected: u64,
    /// QPs refused.
    pub refused: u64,
    /// Failovers by cause.
    pub failovers: BTreeMap<FailoverCause, u64>,
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
        self.refused += s.refused_total;
        for (cause, n) in &s.failovers_total {
            *self.failovers.entry(*cause).or_default() += n;
        }
        self.moves.add(&s.moves);
        self.unprotected_s += s.unprotected_s;
        self.lost += s.lost_total;
    }
}

/// One process under apm, as the agent sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessEntry {
    /// Its process id (as the kernel gave it to the agent).
    pub pid: Option<u32>,
    /// Its user.
    pub uid: u32,
    /// Connections it registered with the agent.
    pub registered: u64,
    /// What it last said of itself (`None`: nothing yet).
    pub status: Option<ProcessStatus>,
}

/// Peer datagrams the agent dropped, by reason (its authentication's counters).
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

impl From<cm_lap::auth::CounterValues> for PeerDrops {
    fn from(c: cm_lap::auth::CounterValues) -> PeerDrops {
        PeerDrops {
            unauthenticated: c.unauthenticated,
            forged: c.bad_tag,
            other_key: c.other_key,
            replayed: c.replayed,
            stale: c.stale,
            malformed: c.malformed,
        }
    }
}

impl PeerDrops {
    /// Each reason's name (the metrics' label) and count.
    pub fn by_reason(&self) -> [(&'static str, u64); 6] {
        [
            ("unauthenticated", self.unauthenticated),
            ("forged", self.forged),
            ("other_key", self.other_key),
            ("replayed", self.replayed),
            ("stale", self.stale),
            ("malformed", self.malformed),
        ]
    }
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
    /// The processes (at most so many: see `omitted`).
    pub processes: Vec<ProcessEntry>,
    /// Processes left out to keep the answer within its size.
    pub omitted: u64,
    /// The probe sessions (an operator sees every one; others those of their own
    /// processes' connections), each path's ends and its state.
    pub sessions: Vec<(PathEnds, SessionState)>,
    /// Peer datagrams dropped (operators only).
    pub peer_drops: Option<PeerDrops>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Failover, Refusal};

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
        let b = h.buckets();
        assert_eq!(b.first(), Some(&(0.001, 2)));
        assert_eq!(b.last(), Some(&(f64::INFINITY, 1)));
    }

    #[test]
    fn a_status_outside_its_bounds_is_refused_and_unknown_labels_do_not_read() {
        let ok = ProcessStatus {
            failovers_total: [(FailoverCause::Fabric, 2)].into(),
            looked_after: [(QpState::Pending, 1)].into(),
            ..ProcessStatus::default()
        };
        ok.check().expect("within bounds");
        let json = serde_json::to_string(&ok).expect("json");
        assert!(json.contains(r#""failovers_total":{"fabric":2}"#), "{json}");
        let forged = json.replace("\"fabric\"", "\"chosen-by-me\"");
        assert!(serde_json::from_str::<ProcessStatus>(&forged).is_err());
        let entry = QpEntry {
            qpn: 1,
            device: "rxe0".into(),
            state: QpState::Protected,
        };
        let mut bad = ok.clone();
        bad.qps = vec![entry; MAX_LISTED_QPS + 1];
        assert!(bad.check().is_err());
        let mut bad = ok.clone();
        bad.moves.counts.push(1);
        assert!(bad.check().is_err());
        let mut bad = ok.clone();
        bad.program = "x".repeat(MAX_TEXT + 1);
        assert!(bad.check().is_err());
        let mut bad = ok;
        bad.unprotected_s = f64::NAN;
        assert!(bad.check().is_err());
    }

    #[test]
    fn a_report_becomes_a_bounded_status() {
        let failover = |cause: Option<&str>, by, move_ms| Failover {
            qpn: 17,
            device: "rxe0".into(),
            at_ms: 1.0,
            move_ms,
            to: "x".into(),
            cause: cause.map(str::to_owned),
            by,
        };
        let refusal = |reason: String| Refusal {
            qpn: 1,
            device: "rxe0".into(),
            reason,
        };
        let report = ProcessReport {
            program: "é".repeat(MAX_TEXT),
            qps_seen: 300,
            protected: 100,
            not_protected: (0..40)
                .map(|i| refusal(format!("reason {}", i % 35)))
                .collect(),
            failovers: vec![
                failover(Some("fabric"), MovedBy::Software, Some(3.0)),
                failover(Some("stall"), MovedBy::Software, Some(4.0)),
                failover(None, MovedBy::Hardware, None),
                failover(None, MovedBy::Software, Some(2000.0)),
            ],
            ..ProcessReport::default()
        };
        let qps = (0..100).map(|i| QpEntry {
            qpn: i,
            device: "rxe0".into(),
            state: if i < 90 {
                QpState::Protected
            } else {
                QpState::Moved
            },
        });
        let s = ProcessStatus::from_report(&report, qps, 1.5);
        s.check().expect("within bounds");
        assert_eq!(s.program.len(), MAX_TEXT);
        assert_eq!(s.refused_total, 40);
        assert_eq!(s.refused.len(), MAX_REFUSALS);
        assert_eq!(s.qps.len(), MAX_LISTED_QPS);
        assert_eq!(s.looked_after[&QpState::Protected], 90);
        assert_eq!(s.looked_after[&QpState::Moved], 10);
        let causes: Vec<_> = s.failovers_total.keys().map(|c| c.name()).collect();
        assert_eq!(causes, ["fabric", "operator", "device", "peer"]);
        assert_eq!(s.moves.count(), 3);
        let mut t = Totals::default();
        t.add(&s);
        t.add(&s);
        assert_eq!(t.qps_seen, 600);
        assert_eq!(t.failovers[&FailoverCause::Fabric], 2);
        assert_eq!(t.moves.count(), 6);
    }
}
