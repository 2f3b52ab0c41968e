//! Chaos runs: every seed is a small scenario of one family (seed `n` belongs to family
//! `n % N` of the N families), run
//! - under `apm` alone, long enough for every bound to pass, twice (the two runs must be
//!   byte-identical), with every invariant checked after every step, the "armed again
//!   within a bound after the faults stop" one included (with [`chaos_policy`]'s shorter
//!   backoffs, so the bound is seconds, not minutes);
//! - under `apm` and every baseline with the family's own engine policy, for the
//!   scenario's own duration, judged per connection ([`compare::judge`]): the seed
//!   fails when apm lost more connections than a baseline, or lost one that a baseline
//!   kept outside a total outage. Losses in total outages are counted per policy
//!   ([`SeedOutcome::lost`]) and judged over the campaign, family by family (apm's
//!   total no more than any baseline's).
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

/// The engine policy the invariant runs of `s` use: the scenario's (its family's) with
/// the hold-down, the re-arm backoff and the SA recheck of an out-of-service GID (1 s,
/// doubling) capped at 2 s, so that "armed again within a bound after the faults stop"
/// can be checked within seconds of simulated time rather than minutes, for every
/// connection: a host that missed the SM's last notice is not excused, its engine must
/// find out from the SA.
pub fn chaos_policy(s: &Scenario) -> Policy {
    Policy {
        hold_down_max_ms: 2000,
        rearm_retry_max_ms: 2000,
        remote_recheck_ms: 1000,
        remote_recheck_max_ms: 2000,
        ..s.engine_policy()
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
    let last = s.last_fault_end_ms(seed);
    let probe = Sim::new(s, invariant_config(s, seed))?;
    let settle = probe.settle_bound().as_nanos() / 1_000_000;
    let f = &s.fabric;
    let takeover = f
        .sm_failover_ms
        .unwrap_or((u64::from(f.polling_retry_number) + 3) * f.sminfo_polling_timeout_ms);
    let mut long = s.clone();
    long.duration_ms = s.duration_ms.max(last + settle + takeover + 200);
    Ok(long)
}

fn invariant_config(s: &Scenario, seed: u64) -> RunConfig {
    let mut cfg = RunConfig::new(crate::PolicyKind::Apm, seed);
    cfg.engine_policy = chaos_policy(s);
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
    /// Violations, a divergence between the two runs, or a failed judgement.
    #[error("{family}: {}", problems.join(" | "))]
    Failed {
        /// The seed's family.
        family: &'static str,
        /// What went wrong, one entry per kind.
        problems: Vec<String>,
    },
}

/// One policy's losses on a seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Losses {
    /// The policy's name.
    pub policy: String,
    /// Connections it lost.
    pub lost: u64,
    /// Of those, lost in a total outage.
    pub in_total_outage: u64,
}

/// What one seed produced.
#[derive(Debug)]
pub struct SeedOutcome {
    /// The seed's family.
    pub family: &'static str,
    /// Digest of the event sequence (the invariant run).
    pub digest: u64,
    /// Events processed (one invariant run).
    pub events: u64,
    /// Every policy's losses in the comparison, apm first.
    pub lost: Vec<Losses>,
    /// apm against each baseline (none fails: a seed that fails is an error).
    pub judgement: Vec<compare::Against>,
}

/// Run `seed`: the invariant runs and the comparison. `Err` describes the violations,
/// the divergence between the two runs, or the judgement's failures.
pub fn run_seed(seed: u64) -> Result<SeedOutcome, SeedError> {
    let s = scenario_for(seed);
    let long = stretched(&s, seed)?;
    let one = || -> Result<crate::report::RunReport, SimError> {
        Ok(Sim::new(&long, invariant_config(&s, seed))?.run())
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
    let reports = compare::run_all(&s, seed, &s.engine_policy())?;
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
    let judgement = compare::judge(&reports);
    for against in judgement.iter().filter(|a| a.judged && a.fails) {
        problems.push(format!("judgement: {}", against.line(usize::MAX)));
    }
    if !problems.is_empty() {
        return Err(SeedError::Failed {
            family: family_of(seed).name(),
            problems,
        });
    }
    Ok(SeedOutcome {
        family: family_of(seed).name(),
        digest: a.digest,
        events: a.events,
        lost: reports
            .iter()
            .map(|r| Losses {
                policy: r.policy.clone(),
                lost: r.lost,
                in_total_outage: r.lost_in_total_outage.len() as u64,
            })
            .collect(),
        judgement,
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

/// A campaign's losses, family by family: each policy's connections lost and, of
/// those, lost in total outages, summed over the seeds that passed.
#[derive(Debug, Default)]
pub struct Tally {
    /// The families in the order first seen.
    pub families: Vec<FamilyTally>,
}

/// One family's losses in a campaign.
#[derive(Debug)]
pub struct FamilyTally {
    /// The family's name.
    pub family: &'static str,
    /// Every policy's losses summed over the family's seeds, in the order first seen.
    pub policies: Vec<Losses>,
    /// Against each judged baseline: connections apm lost in total outages that the
    /// baseline kept, and the baseline lost in total outages that apm kept.
    pub outage_races: Vec<(String, u64, u64)>,
}

impl Tally {
    /// Add one seed's outcome.
    pub fn add(&mut self, o: &SeedOutcome) {
        let i = match self.families.iter().position(|f| f.family == o.family) {
            Some(i) => i,
            None => {
                self.families.push(FamilyTally {
                    family: o.family,
                    policies: Vec::new(),
                    outage_races: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        let f = &mut self.families[i];
        for l in &o.lost {
            match f.policies.iter_mut().find(|r| r.policy == l.policy) {
                Some(row) => {
                    row.lost += l.lost;
                    row.in_total_outage += l.in_total_outage;
                }
                None => f.policies.push(l.clone()),
            }
        }
        for a in o.judgement.iter().filter(|a| a.judged) {
            let ours = a.kept(compare::Cause::TotalOutage).count() as u64;
            match f.outage_races.iter_mut().find(|r| r.0 == a.baseline) {
                Some(r) => {
                    r.1 += ours;
                    r.2 += a.outage_losses_apm_kept;
                }
                None => f
                    .outage_races
                    .push((a.baseline.clone(), ours, a.outage_losses_apm_kept)),
            }
        }
    }

    /// The families where the races of total outages went against apm, against some
    /// judged baseline: apm lost more connections in total outages that the baseline
    /// kept than the baseline lost in total outages that apm kept. One line each.
    pub fn outage_excess(&self) -> Vec<String> {
        let mut out = Vec::new();
        for f in &self.families {
            for (base, ours, theirs) in &f.outage_races {
                if ours > theirs {
                    out.push(format!(
                        "{}: in total outages apm lost {ours} connection(s) {base} kept, \
                         {base} lost {theirs} apm kept",
                        f.family
                    ));
                }
            }
        }
        out
    }

    /// One line per family: every policy's losses, `lost (in total outages)`.
    pub fn lines(&self) -> Vec<String> {
        self.families
            .iter()
            .map(|f| {
                let cells: Vec<String> = f
                    .policies
                    .iter()
                    .map(|r| format!("{} {} ({})", r.policy, r.lost, r.in_total_outage))
                    .collect();
                format!("{}: {}", f.family, cells.join(", "))
            })
            .collect()
    }
}
