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
/// connections apm lost that the baseline kept. Losses in the re-arm window after a
/// migration (see [`RunReport::lost_in_rearm_window`]) are left out: they are
/// [`findings`], reported apart. `reports` holds apm's run and the baselines' (in any
/// order).
pub fn dominance_violations(reports: &[RunReport]) -> Vec<String> {
    compare_with_baselines(reports, false)
}

/// The losses apm could not avoid: connections apm lost that a baseline kept, whose
/// primary died in the re-arm window right after a migration (no policy that moves
/// before the retry budget runs out can avoid it; waiting that budget out, as the
/// baselines do, is what kept them).
pub fn findings(reports: &[RunReport]) -> Vec<String> {
    compare_with_baselines(reports, true)
}

fn compare_with_baselines(reports: &[RunReport], in_window: bool) -> Vec<String> {
    let Some(apm) = reports.iter().find(|r| r.policy == PolicyKind::Apm.name()) else {
        return vec!["no apm run to compare".into()];
    };
    let window = |id: &u64| apm.lost_in_rearm_window.binary_search(id).is_ok();
    let mut out = Vec::new();
    for base in reports.iter().filter(|r| r.policy != apm.policy) {
        let kept: Vec<u64> = apm
            .lost_ids
            .iter()
            .copied()
            .filter(|id| base.lost_ids.binary_search(id).is_err())
            .filter(|id| window(id) == in_window)
            .collect();
        let raced = apm.lost_ids.iter().filter(|id| window(id)).count() as u64;
        // Counted without the window's losses, apm must not lose more than the baseline.
        let worse_count = !in_window && apm.lost.saturating_sub(raced) > base.lost;
        if worse_count || !kept.is_empty() {
            out.push(format!(
                "apm lost {} connection(s) ({} in the re-arm window after a move), {} lost {}; \
                 {}: {}",
                apm.lost,
                raced,
                base.policy,
                base.lost,
                if in_window {
                    format!("lost in that window, {} kept", base.policy)
                } else {
                    format!("apm lost {} that {} kept", kept.len(), base.policy)
                },
                ids(&kept)
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
