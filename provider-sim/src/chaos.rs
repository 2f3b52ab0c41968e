//! Chaos runs: every seed is a small scenario of one family (seed `n` belongs to family
//! `n % 9`), run
//! - under `apm` alone, long enough for every bound to pass, twice (the two runs must be
//!   byte-identical), with every invariant checked after every step, the "armed again
//!   within a bound after the faults stop" one included (with [`chaos_policy`]'s shorter
//!   backoffs, so the bound is seconds, not minutes);
//! - under `apm` and both baselines with the default policy, for the scenario's own
//!   duration, checking dominance: apm loses no more connections than either baseline
//!   and no connection that a baseline kept. Two kinds of loss of a connection a
//!   baseline kept are reported, not failed (they still count against apm's total):
//!   one whose new path died in the re-arm window right after a move, which waiting
//!   out the retry budget, as the baselines do, happens to survive; and one lost in or
//!   after a total outage, whose survival is down to where its QP's retry timer stood
//!   when a path came back ([`compare::findings`]).
//!
//! The test suite runs a few hundred seeds (`cargo test -p provider-sim --test chaos`);
//! `cargo xtask chaos --seeds 10000` runs the long campaign. A failing seed is replayed
//! alone with `APM_SIM_SEED=<seed> cargo test -p provider-sim --test chaos`, and its
//! comparison with `apm simulate --family <family> --small --seed <seed>`.

use crate::compare;
use crate::families::{Family, Size};
use crate::sim::{RunConfig, Sim, SimError};
use crate::Scenario;
use apm_core::Policy;

/// The engine policy the invariant runs use: the simulator's (probes on) with the hold-down, the
/// re-arm backoff and the SA recheck of an out-of-service GID (1 s, doubling) capped at
/// 2 s, so that "armed again within a bound after the faults stop" can be checked within
/// seconds of simulated time rather than minutes, for every connection: a host that
/// missed the SM's last notice is not excused, its engine must find out from the SA.
pub fn chaos_policy() -> Policy {
    Policy {
        hold_down_max_ms: 2000,
        rearm_retry_max_ms: 2000,
        remote_recheck_ms: 1000,
        remote_recheck_max_ms: 2000,
        ..crate::controller::sim_policy()
    }
}

/// The family of `seed`.
pub fn family_of(seed: u64) -> Family {
    Family::ALL[(seed % Family::ALL.len() as u64) as usize]
}

/// The scenario of `seed` (its family's small scenario).
pub fn scenario_for(seed: u64) -> Scenario {
    family_of(seed).scenario(seed, Size::Small)
}

/// The scenario stretched until every invariant's bound has passed after its last
/// fault: the settle bound, plus a standby SM's takeover (OpenSM's polling) and its
/// first sweep when an SM may have died.
fn stretched(s: &Scenario, seed: u64) -> Result<Scenario, SimError> {
    let last = s
        .all_faults(seed)
        .iter()
        .map(|f| f.end_ms())
        .max()
        .unwrap_or(0);
    let probe = Sim::new(s, invariant_config(seed))?;
    let settle = probe.settle_bound().as_nanos() / 1_000_000;
    let f = &s.fabric;
    let takeover = f
        .sm_failover_ms
        .unwrap_or((u64::from(f.polling_retry_number) + 3) * f.sminfo_polling_timeout_ms);
    let mut long = s.clone();
    long.duration_ms = s.duration_ms.max(last + settle + takeover + 200);
    Ok(long)
}

fn invariant_config(seed: u64) -> RunConfig {
    let mut cfg = RunConfig::new(crate::PolicyKind::Apm, seed);
    cfg.engine_policy = chaos_policy();
    cfg.check = true;
    cfg.sample_ms = 100;
    cfg
}

/// Why a seed failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// Its scenario could not be simulated.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A report could not be serialised for the comparison of the two runs.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Violations, a divergence between the two runs, or apm worse than a baseline.
    #[error("{family}: {}", problems.join(" | "))]
    Failed {
        /// The seed's family.
        family: &'static str,
        /// What went wrong, one entry per kind.
        problems: Vec<String>,
    },
}

/// What one seed produced.
#[derive(Debug)]
pub struct SeedOutcome {
    /// Digest of the event sequence (the invariant run).
    pub digest: u64,
    /// Events processed (one invariant run).
    pub events: u64,
    /// Connections apm lost in the comparison (double faults, device failures).
    pub lost: u64,
    /// Connections each baseline lost in the comparison (hw-only, reload-local).
    pub baseline_lost: [u64; 2],
    /// Where apm lost a connection a baseline kept in the re-arm window after a move or
    /// in a total outage ([`compare::findings`]): reported, not a failure.
    pub findings: Vec<String>,
}

/// Run `seed`: the invariant runs and the comparison. `Err` describes the violations,
/// the divergence between the two runs, or where apm did worse than a baseline.
pub fn run_seed(seed: u64) -> Result<SeedOutcome, SeedError> {
    let s = scenario_for(seed);
    let long = stretched(&s, seed)?;
    let one = || -> Result<crate::report::RunReport, SimError> {
        Ok(Sim::new(&long, invariant_config(seed))?.run())
    };
    let a = one()?;
    let b = one()?;
    let mut problems = Vec::new();
    if !a.violations.is_empty() {
        problems.push(format!(
            "{} violation(s): {}",
            a.violations.len(),
            a.violations.join("; ")
        ));
    }
    let ja = serde_json::to_string(&a)?;
    let jb = serde_json::to_string(&b)?;
    if ja != jb {
        problems.push(format!(
            "two runs of the same seed differ (digests {:#x} / {:#x})",
            a.digest, b.digest
        ));
    }
    let reports = compare::run_all(&s, seed, &crate::controller::sim_policy())?;
    for r in &reports {
        if !r.violations.is_empty() {
            problems.push(format!(
                "{}: {} violation(s): {}",
                r.policy,
                r.violations.len(),
                r.violations.join("; ")
            ));
        }
    }
    let worse = compare::dominance_violations(&reports);
    if !worse.is_empty() {
        problems.push(format!("dominance: {}", worse.join("; ")));
    }
    if !problems.is_empty() {
        return Err(SeedError::Failed {
            family: family_of(seed).name(),
            problems,
        });
    }
    let lost = |i: usize| reports.get(i).map_or(0, |r| r.lost);
    Ok(SeedOutcome {
        digest: a.digest,
        events: a.events,
        lost: lost(0),
        baseline_lost: [lost(1), lost(2)],
        findings: compare::findings(&reports),
    })
}

/// The commands that replay `seed` alone: the whole chaos check, and the comparison.
pub fn replay_command(seed: u64) -> String {
    format!(
        "APM_SIM_SEED={seed} cargo test -p provider-sim --test chaos -- --nocapture\n  \
         compare: cargo run --release -p apm -- simulate --family {} --small --seed {seed}",
        family_of(seed).name()
    )
}
