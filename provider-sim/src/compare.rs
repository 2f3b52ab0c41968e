//! apm against the baselines on the same scenario and seed, and the dominance check:
//! apm must never lose more connections than a baseline, nor lose a connection that a
//! baseline kept under the same fault schedule.
//!
//! The three runs share the scenario, the seed, the connection placement, the fault
//! schedule and the SMs' own random draws (sweep SMP loss, traps), so the fabric evolves
//! the same way under each; what differs is what the hosts do.

use crate::controller::PolicyKind;
use crate::report::RunReport;
use crate::sim::{RunConfig, Sim, SimError};
use crate::Scenario;
use apm_core::Policy;

/// Run `scenario` with `seed` under every policy (apm first), with the invariants
/// checked, using `policy` for the apm engine.
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

/// What apm did worse than a baseline, if anything: one line per baseline, naming the
/// connections apm lost that the baseline kept. A connection apm lost that the
/// baseline kept is a violation unless it was lost in the re-arm window after a
/// migration or in a total outage (those are [`findings`]); and apm must not lose more
/// connections than the baseline, counting every loss but those findings. `reports`
/// holds apm's run and the baselines' (in any order).
pub fn dominance_violations(reports: &[RunReport]) -> Vec<String> {
    compare_with_baselines(reports, Side::Violations)
}

/// The losses apm could not avoid, one line per baseline: connections apm lost that the
/// baseline kept, either
/// - in the re-arm window right after a migration (see
///   [`RunReport::lost_in_rearm_window`]): no policy that moves before the retry budget
///   runs out can avoid it; waiting that budget out, as the baselines do, is what kept
///   them; or
/// - in a total outage (see [`RunReport::lost_in_outage`]): nothing could carry their
///   packets, and which connections outlast it depends on where each QP's retry timer
///   stood when a path came back.
pub fn findings(reports: &[RunReport]) -> Vec<String> {
    compare_with_baselines(reports, Side::Findings)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Violations,
    Findings,
}

/// Why apm lost a connection, as far as the comparison cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LossKind {
    RearmWindow,
    Outage,
    Other,
}

fn loss_kind(apm: &RunReport, id: u64) -> LossKind {
    if apm.lost_in_rearm_window.binary_search(&id).is_ok() {
        LossKind::RearmWindow
    } else if apm.lost_in_outage.binary_search(&id).is_ok() {
        LossKind::Outage
    } else {
        LossKind::Other
    }
}

fn compare_with_baselines(reports: &[RunReport], side: Side) -> Vec<String> {
    let Some(apm) = reports.iter().find(|r| r.policy == PolicyKind::Apm.name()) else {
        return vec!["no apm run to compare".into()];
    };
    let raced = apm.lost_in_rearm_window.len() as u64;
    let in_outage = apm.lost_in_outage.len();
    let mut out = Vec::new();
    let baseline =
        |r: &&RunReport| PolicyKind::from_name(&r.policy).is_some_and(|k| k.is_baseline());
    for base in reports.iter().filter(baseline) {
        let kept = |kind: LossKind| -> Vec<u64> {
            apm.lost_ids
                .iter()
                .copied()
                .filter(|id| base.lost_ids.binary_search(id).is_err())
                .filter(|&id| loss_kind(apm, id) == kind)
                .collect()
        };
        let head = format!(
            "apm lost {} connection(s) ({raced} in the re-arm window after a move, \
             {in_outage} in a total outage), {} lost {}",
            apm.lost, base.policy, base.lost
        );
        match side {
            Side::Violations => {
                let other = kept(LossKind::Other);
                let excused =
                    (kept(LossKind::RearmWindow).len() + kept(LossKind::Outage).len()) as u64;
                if apm.lost.saturating_sub(excused) > base.lost || !other.is_empty() {
                    out.push(format!(
                        "{head}; apm lost {} that {} kept: {}",
                        other.len(),
                        base.policy,
                        ids(&other)
                    ));
                }
            }
            Side::Findings => {
                let (window, outage) = (kept(LossKind::RearmWindow), kept(LossKind::Outage));
                let mut parts = Vec::new();
                if !window.is_empty() {
                    parts.push(format!(
                        "lost in that window, {} kept: {}",
                        base.policy,
                        ids(&window)
                    ));
                }
                if !outage.is_empty() {
                    parts.push(format!(
                        "lost in an outage, {} kept: {}",
                        base.policy,
                        ids(&outage)
                    ));
                }
                if !parts.is_empty() {
                    out.push(format!("{head}; {}", parts.join("; ")));
                }
            }
        }
    }
    out
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

/// At most 20 connection ids, `conn3 conn7 ...`.
fn ids(v: &[u64]) -> String {
    let mut s: Vec<String> = v.iter().take(20).map(|i| format!("conn{i}")).collect();
    if v.len() > 20 {
        s.push(format!("and {} more", v.len() - 20));
    }
    s.join(" ")
}
