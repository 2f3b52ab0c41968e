//! apm against the baselines on the same scenario and seed, and the dominance check:
//! apm must never lose more connections than a baseline, nor lose a connection that a
//! baseline kept under the same fault schedule.
//!
//! The three runs share the scenario, the seed, the connection placement, the fault
//! schedule and the SMs' own random draws (sweep SMP loss, traps), so the fabric evolves
//! the same way under each; what differs is what the hosts do.

use crate::controller::PolicyKind;
use crate::report::RunReport;
use crate::sim::{RunConfig, Sim};
use crate::Scenario;
use apm_core::Policy;

/// Run `scenario` with `seed` under every policy (apm first), with the invariants
/// checked, using `policy` for the apm engine.
pub fn run_all(scenario: &Scenario, seed: u64, policy: &Policy) -> Result<Vec<RunReport>, String> {
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
/// connections apm lost that the baseline kept. `reports` holds apm's run and the
/// baselines' (in any order).
pub fn dominance_violations(reports: &[RunReport]) -> Vec<String> {
    let Some(apm) = reports.iter().find(|r| r.policy == PolicyKind::Apm.name()) else {
        return vec!["no apm run to compare".into()];
    };
    let mut out = Vec::new();
    for base in reports.iter().filter(|r| r.policy != apm.policy) {
        let kept_by_base: Vec<u64> = apm
            .lost_ids
            .iter()
            .copied()
            .filter(|id| base.lost_ids.binary_search(id).is_err())
            .collect();
        if apm.lost > base.lost || !kept_by_base.is_empty() {
            out.push(format!(
                "apm lost {} connection(s), {} lost {}; apm lost {} that {} kept: {}",
                apm.lost,
                base.policy,
                base.lost,
                kept_by_base.len(),
                base.policy,
                ids(&kept_by_base)
            ));
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
