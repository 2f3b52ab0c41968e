//! What a protected process reports (`apm run --report FILE`, and the summary line):
//! each process writes its own [`ProcessReport`] (JSON) into the directory `apm run`
//! gives it, and `apm run` merges them ([`RunReport`]) when the program has exited.

use serde::{Deserialize, Serialize};

/// A QP apm did not protect, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    /// The QP number.
    pub qpn: u32,
    /// Its device.
    pub device: String,
    /// Why it is not protected.
    pub reason: String,
}

/// One move of a protected connection onto its alternate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failover {
    /// The QP number.
    pub qpn: u32,
    /// Its device.
    pub device: String,
    /// When, in ms since the process started using apm.
    pub at_ms: f64,
    /// The move itself (SQ drain to send-queue restart), in ms; the program's stall is
    /// this plus the time to notice the failure.
    pub move_ms: Option<f64>,
    /// The new primary path.
    pub to: String,
    /// What this side saw kill the old primary (`local_port`, `peer_port`, `fabric`,
    /// `stall`); absent when it saw nothing (the peer asked it to move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Who moved it.
    #[serde(default)]
    pub by: MovedBy,
}

/// Who moved a QP onto its alternate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MovedBy {
    /// apm, through the SQ drain (software migration).
    #[default]
    Software,
    /// The device (hardware APM): by itself when its retries on the dead path ran out or
    /// the peer's packets said so, or forced by apm.
    Hardware,
}

/// What one port of a device showed it can do when apm tried it, at its first QP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMechanism {
    /// The device.
    pub device: String,
    /// The port (1-based).
    pub port: u8,
    /// `infiniband` or `ethernet` (RoCE).
    pub link_layer: String,
    /// How its QPs move (`hardware_apm`, `software_move`, `none`), as tried.
    pub mechanism: String,
    /// The evidence, one line (each trial and its outcome).
    pub evidence: String,
}

/// One process's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// The process.
    pub pid: u32,
    /// Its program (argv\[0\] as the kernel knows it).
    pub program: String,
    /// When it started using apm, in ms since the Unix epoch (the system clock): the
    /// origin of every `at_ms`, so a reader can put the moves on its own clock.
    #[serde(default)]
    pub started_unix_ms: f64,
    /// QPs the program moved to RTS.
    pub qps_seen: u64,
    /// QPs protected (an alternate agreed with the peer) at least once.
    pub protected: u64,
    /// QPs not protected, with the reason.
    pub not_protected: Vec<Refusal>,
    /// Moves onto an alternate.
    pub failovers: Vec<Failover>,
    /// Connections lost under apm (QP in error), with the reason.
    pub lost: Vec<Refusal>,
    /// Connection-milliseconds of RC QPs apm looked after while they had no agreed
    /// alternate (before the first agreement, after a move until the next, ...).
    pub unprotected_ms: f64,
    /// Anything else said once (apm's own failures, the agent going away).
    pub notes: Vec<String>,
    /// Set when apm saw none of the process's verbs though it held an RDMA device at
    /// exit: why (a statically linked libibverbs, a provider's direct verbs, ...). Its
    /// QPs, if any, ran unprotected and uncounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_seen: Option<String>,
    /// The ports of the process's QPs and how each moves QPs, as apm found when it
    /// tried (what `apm run --explain` prints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortMechanism>,
}

/// Every process of one `apm run`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The program's exit status (the code, or 128 + signal).
    pub exit_status: i32,
    /// The processes that used verbs (and so apm).
    pub processes: Vec<ProcessReport>,
}

impl RunReport {
    /// The one-line summary printed at exit.
    pub fn summary(&self) -> String {
        let sum = |f: fn(&ProcessReport) -> u64| self.processes.iter().map(f).sum::<u64>();
        let seen = sum(|p| p.qps_seen);
        let protected = sum(|p| p.protected);
        let failovers: Vec<&Failover> = self.processes.iter().flat_map(|p| &p.failovers).collect();
        let worst = failovers
            .iter()
            .filter_map(|f| f.move_ms)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        let unprot: f64 = self.processes.iter().map(|p| p.unprotected_ms).sum();
        let mut reasons: Vec<String> = Vec::new();
        for r in self.processes.iter().flat_map(|p| &p.not_protected) {
            if !reasons.contains(&r.reason) {
                reasons.push(r.reason.clone());
            }
        }
        let lost = self.processes.iter().map(|p| p.lost.len()).sum::<usize>();
        let mut s = format!(
            "apm run: {seen} QPs seen, {protected} protected, {} failovers",
            failovers.len()
        );
        let by_device = failovers
            .iter()
            .filter(|f| f.by == MovedBy::Hardware)
            .count();
        if by_device > 0 {
            s.push_str(&format!(" ({by_device} by hardware APM)"));
        }
        if let Some(w) = worst {
            s.push_str(&format!(" (longest move {w:.1} ms)"));
        }
        if lost > 0 {
            s.push_str(&format!(", {lost} lost"));
        }
        s.push_str(&format!(", unprotected {:.1} conn-s", unprot / 1000.0));
        if !reasons.is_empty() {
            s.push_str(&format!("; not protected: {}", reasons.join("; ")));
        }
        let mut unseen: Vec<&str> = Vec::new();
        for why in self.processes.iter().filter_map(|p| p.not_seen.as_deref()) {
            if !unseen.contains(&why) {
                unseen.push(why);
            }
        }
        if !unseen.is_empty() {
            let n = self
                .processes
                .iter()
                .filter(|p| p.not_seen.is_some())
                .count();
            let what = if n == 1 { "process" } else { "processes" };
            s.push_str(&format!("; {n} {what} not seen: {}", unseen.join("; ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_counts_moves_and_reasons_once() {
        let p = ProcessReport {
            qps_seen: 3,
            protected: 1,
            not_protected: vec![
                Refusal {
                    qpn: 18,
                    device: "rxe0".into(),
                    reason: "a UD QP".into(),
                },
                Refusal {
                    qpn: 19,
                    device: "rxe0".into(),
                    reason: "a UD QP".into(),
                },
            ],
            failovers: vec![Failover {
                qpn: 17,
                device: "rxe0".into(),
                at_ms: 10.0,
                move_ms: Some(3.25),
                to: "x".into(),
                by: MovedBy::Software,
                cause: Some("fabric".into()),
            }],
            unprotected_ms: 1500.0,
            ..ProcessReport::default()
        };
        let r = RunReport {
            exit_status: 0,
            processes: vec![p],
        };
        assert_eq!(
            r.summary(),
            "apm run: 3 QPs seen, 1 protected, 1 failovers (longest move 3.2 ms), unprotected \
             1.5 conn-s; not protected: a UD QP"
        );
    }

    #[test]
    fn the_summary_names_processes_apm_could_not_see() {
        let unseen = ProcessReport {
            not_seen: Some("no shared libibverbs".into()),
            ..ProcessReport::default()
        };
        let r = RunReport {
            exit_status: 0,
            processes: vec![unseen.clone(), ProcessReport::default(), unseen],
        };
        assert_eq!(
            r.summary(),
            "apm run: 0 QPs seen, 0 protected, 0 failovers, unprotected 0.0 conn-s; 2 processes \
             not seen: no shared libibverbs"
        );
        // An older report without the field still reads.
        let old: ProcessReport = serde_json::from_str(
            r#"{"pid":1,"program":"p","qps_seen":0,"protected":0,"not_protected":[],
                "failovers":[],"lost":[],"unprotected_ms":0.0,"notes":[]}"#,
        )
        .expect("an old report");
        assert_eq!(old.not_seen, None);
    }
}
