//! apm against the baselines on the same scenario and seed, judged per connection with
//! nothing subtracted.
//!
//! For every baseline the judgement ([`judge`]) lists each connection apm lost that
//! the baseline kept, with the cause class of apm's loss ([`Cause`]: in the re-arm
//! window after a move, in a total outage, other), and compares the counts of
//! connections lost, every loss counted. A run fails against a baseline
//! ([`Against::fails`]) when apm lost more connections than it, or lost one that it
//! kept outside a total outage; the run fails ([`run_fails`]) when it fails against a
//! judged baseline, one that leaves every move to the HCA
//! ([`PolicyKind::is_judged_baseline`]). `port-err-move`, which moves at once, is
//! compared the same way and shown, not judged: no policy keeps every connection that
//! both kinds keep. Losses in total outages (nothing could carry the
//! connection's packets when its QPs gave up: which connections outlast one is down to
//! where each QP's retry timer stood) are listed and counted, and judged over a whole
//! family rather than per run: apm's total over the family must not exceed a
//! baseline's.
//!
//! The runs share the scenario, the seed, the connection placement, the fault schedule
//! and the SMs' own random draws (sweep SMP loss, traps), so the fabric evolves the
//! same way under each; what differs is what the hosts do.

use crate::controller::PolicyKind;
use crate::report::RunReport;
use crate::sim::{RunConfig, Sim, SimError};
use crate::Scenario;
use apm_core::Policy;
use serde::Serialize;

/// Run `scenario` with `seed` under apm and every baseline (apm first), with the
/// invariants checked, using `policy` for the apm engine.
pub fn run_all(
    scenario: &Scenario,
    seed: u64,
    policy: &Policy,
) -> Result<Vec<RunReport>, SimError> {
    PolicyKind::ALL
        .iter()
        .map(|&kind| {
            let mut cfg = RunConfig::new(kind, seed);
            cfg.engine_policy = policy.clone();
            cfg.check = true;
            cfg.sample_ms = 0;
            Ok(Sim::new(scenario, cfg)?.run())
        })
        .collect()
}

/// What a lost connection's loss was, as a policy's report records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Its primary died after it had moved and before it was armed again on a working
    /// alternate ([`RunReport::lost_in_rearm_window`]), and no total outage.
    RearmWindow,
    /// When its QPs gave up no path between its two hosts worked
    /// ([`RunReport::lost_in_total_outage`]).
    TotalOutage,
    /// Anything else.
    Other,
}

impl Cause {
    /// The cause class of `conn`'s loss in `report` (a connection `report` lost).
    pub fn of(report: &RunReport, conn: u64) -> Cause {
        if report.lost_in_total_outage.binary_search(&conn).is_ok() {
            Cause::TotalOutage
        } else if report.lost_in_rearm_window.binary_search(&conn).is_ok() {
            Cause::RearmWindow
        } else {
            Cause::Other
        }
    }

    /// The class as printed.
    pub fn name(self) -> &'static str {
        match self {
            Cause::RearmWindow => "re-arm window",
            Cause::TotalOutage => "total outage",
            Cause::Other => "other",
        }
    }

    /// Every class, in print order.
    pub const ALL: [Cause; 3] = [Cause::RearmWindow, Cause::Other, Cause::TotalOutage];
}

/// A connection apm lost that a baseline kept, and the cause class of apm's loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// The connection's index.
    pub conn: u64,
    /// Why apm lost it.
    pub cause: Cause,
    /// Whatever its class, it went through a total outage since it last worked under
    /// apm ([`RunReport::lost_after_total_outage`]): its loss followed a race of retry
    /// timers against paths returning. Said, not excused.
    pub after_total_outage: bool,
}

/// apm against one baseline on one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Against {
    /// The baseline's name.
    pub baseline: String,
    /// Connections apm lost, every one counted.
    pub apm_lost: u64,
    /// Connections the baseline lost.
    pub baseline_lost: u64,
    /// apm lost more connections than the baseline.
    pub apm_lost_more: bool,
    /// Every connection apm lost that the baseline kept, in index order.
    pub lost_by_apm_kept_by_baseline: Vec<Kept>,
    /// Connections the baseline lost in a total outage that apm kept: the other side
    /// of the races total outages run (set against apm's total-outage losses the
    /// baseline kept, over a family).
    pub outage_losses_apm_kept: u64,
    /// apm must not do worse than this baseline
    /// ([`PolicyKind::is_judged_baseline`]); the others are compared only.
    pub judged: bool,
    /// apm lost more connections than the baseline, or one it kept outside a total
    /// outage: against a judged baseline, the run fails.
    pub fails: bool,
}

impl Against {
    /// apm against `base`.
    pub fn new(apm: &RunReport, base: &RunReport) -> Against {
        let kept: Vec<Kept> = apm
            .lost_ids
            .iter()
            .filter(|id| base.lost_ids.binary_search(id).is_err())
            .map(|&conn| Kept {
                conn,
                cause: Cause::of(apm, conn),
                after_total_outage: apm.lost_after_total_outage.binary_search(&conn).is_ok(),
            })
            .collect();
        let apm_lost_more = apm.lost > base.lost;
        let fails = apm_lost_more || kept.iter().any(|k| k.cause != Cause::TotalOutage);
        Against {
            baseline: base.policy.clone(),
            apm_lost: apm.lost,
            baseline_lost: base.lost,
            apm_lost_more,
            lost_by_apm_kept_by_baseline: kept,
            outage_losses_apm_kept: base
                .lost_in_total_outage
                .iter()
                .filter(|id| apm.lost_ids.binary_search(id).is_err())
                .count() as u64,
            judged: PolicyKind::from_name(&base.policy).is_some_and(|k| k.is_judged_baseline()),
            fails,
        }
    }

    /// The connections apm lost that the baseline kept whose loss was of `cause`.
    pub fn kept(&self, cause: Cause) -> impl Iterator<Item = u64> + '_ {
        self.lost_by_apm_kept_by_baseline
            .iter()
            .filter(move |k| k.cause == cause)
            .map(|k| k.conn)
    }

    /// How many of those there are outside total outages (what fails a run).
    pub fn kept_outside_outages(&self) -> usize {
        self.lost_by_apm_kept_by_baseline
            .iter()
            .filter(|k| k.cause != Cause::TotalOutage)
            .count()
    }

    /// Of those, how many went through a total outage since they last worked.
    pub fn kept_outside_outages_after_one(&self) -> usize {
        self.lost_by_apm_kept_by_baseline
            .iter()
            .filter(|k| k.cause != Cause::TotalOutage && k.after_total_outage)
            .count()
    }

    /// One line: the counts, and each connection apm lost that the baseline kept, by
    /// cause (at most `max_ids` ids a cause; the JSON has them all).
    pub fn line(&self, max_ids: usize) -> String {
        let verdict = if self.apm_lost_more {
            "apm lost more"
        } else {
            "apm lost no more"
        };
        let mut s = format!(
            "against {}: apm lost {}, {} lost {} ({verdict}); apm lost {} that {} kept",
            self.baseline,
            self.apm_lost,
            self.baseline,
            self.baseline_lost,
            self.lost_by_apm_kept_by_baseline.len(),
            self.baseline
        );
        for cause in Cause::ALL {
            let ids: Vec<u64> = self.kept(cause).collect();
            if !ids.is_empty() {
                s.push_str(&format!(
                    "; {} {}: {}",
                    cause.name(),
                    ids.len(),
                    conn_ids(&ids, max_ids)
                ));
            }
        }
        s
    }
}

/// apm against every baseline among `reports` (which holds apm's run and the
/// baselines', in any order), in report order. Empty without an apm run.
pub fn judge(reports: &[RunReport]) -> Vec<Against> {
    let Some(apm) = reports.iter().find(|r| r.policy == PolicyKind::Apm.name()) else {
        return Vec::new();
    };
    reports
        .iter()
        .filter(|r| PolicyKind::from_name(&r.policy).is_some_and(|k| k.is_baseline()))
        .map(|base| Against::new(apm, base))
        .collect()
}

/// What fails the run, one line per judged baseline it fails against (empty: none);
/// every connection id listed.
pub fn failures(reports: &[RunReport]) -> Vec<String> {
    judge(reports)
        .iter()
        .filter(|a| a.judged && a.fails)
        .map(|a| a.line(usize::MAX))
        .collect()
}

/// The run fails: against some judged baseline, apm lost more connections or one the
/// baseline kept outside a total outage.
pub fn run_fails(judgement: &[Against]) -> bool {
    judgement.iter().any(|a| a.judged && a.fails)
}

/// How apm did against each baseline on one seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// apm lost fewer connections.
    Better,
    /// The same number.
    Same,
    /// More.
    Worse,
}

/// apm's verdict against `base`, by connections lost.
pub fn verdict(apm: &RunReport, base: &RunReport) -> Verdict {
    match apm.lost.cmp(&base.lost) {
        std::cmp::Ordering::Less => Verdict::Better,
        std::cmp::Ordering::Equal => Verdict::Same,
        std::cmp::Ordering::Greater => Verdict::Worse,
    }
}

/// At most `max` connection ids, `conn3 conn7 ...`.
fn conn_ids(v: &[u64], max: usize) -> String {
    let mut s: Vec<String> = v.iter().take(max).map(|i| format!("conn{i}")).collect();
    if v.len() > max {
        s.push(format!("and {} more", v.len() - max));
    }
    s.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of `policy` that lost `lost`, of which `window` in the re-arm window
    /// and `outage` in a total outage.
    fn report(policy: &str, lost: &[u64], window: &[u64], outage: &[u64]) -> RunReport {
        RunReport {
            policy: policy.into(),
            lost: lost.len() as u64,
            lost_ids: lost.to_vec(),
            lost_in_rearm_window: window.to_vec(),
            lost_in_total_outage: outage.to_vec(),
            ..RunReport::default()
        }
    }

    #[test]
    fn every_loss_counts_and_each_kept_connection_has_its_cause() {
        let apm = report("apm", &[1, 2, 3, 4], &[1, 3], &[3, 4]);
        let hw = report("hw-only", &[4], &[], &[]);
        let reload = report("reload-local", &[1, 2, 3, 4, 5], &[], &[]);
        let j = judge(&[apm, hw, reload]);
        assert_eq!(j.len(), 2);
        // Four lost against one: more, whatever the causes.
        assert!(j[0].apm_lost_more && j[0].fails);
        assert_eq!(
            j[0].lost_by_apm_kept_by_baseline,
            vec![
                Kept {
                    conn: 1,
                    cause: Cause::RearmWindow,
                    after_total_outage: false,
                },
                Kept {
                    conn: 2,
                    cause: Cause::Other,
                    after_total_outage: false,
                },
                // A total outage is the class even inside a re-arm window.
                Kept {
                    conn: 3,
                    cause: Cause::TotalOutage,
                    after_total_outage: false,
                },
            ]
        );
        assert_eq!(j[0].kept_outside_outages(), 2);
        // reload-local lost all of apm's and more: nothing to hold against apm.
        assert!(!j[1].apm_lost_more && !j[1].fails);
        assert!(j[1].lost_by_apm_kept_by_baseline.is_empty());
        let line = j[0].line(10);
        assert!(
            line.contains("apm lost 4, hw-only lost 1 (apm lost more)")
                && line.contains("re-arm window 1: conn1")
                && line.contains("other 1: conn2")
                && line.contains("total outage 1: conn3"),
            "{line}"
        );
    }

    #[test]
    fn port_err_move_is_compared_and_not_judged() {
        let apm = report("apm", &[1], &[], &[]);
        let mover = report("port-err-move", &[], &[], &[]);
        let j = judge(&[apm.clone(), mover.clone()]);
        assert!(j[0].fails && !j[0].judged && !run_fails(&j));
        assert!(failures(&[apm, mover]).is_empty());
    }

    #[test]
    fn a_kept_connection_fails_the_run_unless_lost_in_a_total_outage() {
        let base = report("hw-only", &[7], &[], &[]);
        // Fewer lost, but one the baseline kept, outside an outage: fails.
        let apm = report("apm", &[9], &[], &[]);
        assert_eq!(failures(&[apm, base.clone()]).len(), 1);
        // The same connection lost in a total outage: listed, not a failure.
        let apm = report("apm", &[9], &[], &[9]);
        let j = judge(&[apm.clone(), base.clone()]);
        assert!(!j[0].fails && j[0].lost_by_apm_kept_by_baseline.len() == 1);
        assert!(failures(&[apm, base]).is_empty());
    }
}
