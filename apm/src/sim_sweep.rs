//! `apm simulate --sweep N`: every scenario family over N seeds, apm against every
//! baseline on each, summed per family: connections lost per policy and, of those,
//! lost in total outages; against each baseline, the runs where apm lost more and the
//! connections apm lost that the baseline kept, by cause (`provider_sim::compare`);
//! the seeds whose judgement fails (the first few listed with the command that replays
//! them); and the restore p99 of all restores pooled.
//!
//! Seeds run on every core, each seed's runs on one thread; results are gathered in
//! seed order, so the output is the same whatever the machine.

use anyhow::Context;
use provider_sim::compare::{self, Cause, Verdict};
use provider_sim::{Family, Percentiles, PolicyKind, RunReport, Size};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Changes to every scenario run, from the command line: what a family states
/// otherwise, for measuring the engine's choices across the families.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tweaks {
    /// The engine policy's `fast_moves` instead of the scenario's.
    pub fast_moves: Option<apm_core::FastMoves>,
    /// apm may post on every connection's QP (`workload.apm_may_post`).
    pub apm_may_post: bool,
}

impl Tweaks {
    /// `s` with the tweaks applied.
    pub fn apply(&self, s: &mut provider_sim::Scenario) {
        if let Some(fast_moves) = self.fast_moves {
            let mut policy = s.engine_policy();
            policy.fast_moves = fast_moves;
            s.policy = Some(policy);
        }
        if self.apm_may_post {
            s.workload.apm_may_post = true;
        }
    }

    /// How the tweaks read in a report's title (empty without any).
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.fast_moves {
            parts.push(format!("fast_moves {m:?}"));
        }
        if self.apm_may_post {
            parts.push("apm may post on every QP".to_string());
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(", with {}", parts.join(" and "))
        }
    }
}

/// What to sweep.
#[derive(Debug)]
pub struct Sweep {
    /// Families, in report order.
    pub families: Vec<Family>,
    /// Seeds per family, starting at `first_seed`.
    pub seeds: u64,
    /// The first seed.
    pub first_seed: u64,
    /// Scenario size.
    pub size: Size,
    /// Changes to every scenario.
    pub tweaks: Tweaks,
}

/// How apm did against one baseline over a family's seeds.
#[derive(Debug, Default, Serialize)]
pub struct Versus {
    /// Seeds where apm lost fewer connections.
    pub better: u64,
    /// Seeds where it lost as many.
    pub same: u64,
    /// Seeds where it lost more.
    pub worse: u64,
    /// Connections apm lost that the baseline kept, summed over the seeds, by the cause
    /// class of apm's loss.
    pub kept_rearm_window: u64,
    /// The same, cause "other".
    pub kept_other: u64,
    /// The same, lost by apm in a total outage.
    pub kept_total_outage: u64,
    /// Of `kept_rearm_window` and `kept_other`, the connections that had gone through
    /// a total outage since they last worked under apm (a diagnostic).
    pub kept_after_total_outage: u64,
    /// Connections the baseline lost in a total outage that apm kept.
    pub outage_losses_apm_kept: u64,
}

/// One family's totals.
#[derive(Debug, Serialize)]
pub struct FamilyResult {
    /// The family's name.
    pub family: String,
    /// What it exercises.
    pub description: String,
    /// What it holds fixed: link layer and device migration, whose QPs, SM polling,
    /// probes, traffic (`provider_sim::families::Settings`).
    pub settings: String,
    /// Seeds run.
    pub seeds: u64,
    /// Connections per seed.
    pub connections: u64,
    /// Connections lost over all seeds, per policy (every loss).
    pub lost: BTreeMap<String, u64>,
    /// Of those, lost in a total outage, per policy.
    pub lost_in_total_outage: BTreeMap<String, u64>,
    /// apm against each baseline.
    pub versus: BTreeMap<String, Versus>,
    /// Seeds whose judgement fails against some judged baseline (`compare::run_fails`).
    pub seeds_failing: Vec<u64>,
    /// Restore p99 over every restore of every seed, per policy (`None`: none).
    pub restore_p99_ms: BTreeMap<String, Option<f64>>,
    /// The same over the connections no policy lost on that seed: a policy that keeps
    /// connections through long outages restores them late, and the others have no
    /// sample for what they lost.
    pub restore_p99_kept_by_all_ms: BTreeMap<String, Option<f64>>,
}

impl FamilyResult {
    /// Over the family, apm lost more connections in total outages that `base` kept
    /// than `base` lost in total outages that apm kept: the races of total outages
    /// went against apm.
    pub fn outage_excess(&self, base: &str) -> bool {
        self.versus
            .get(base)
            .is_some_and(|v| v.kept_total_outage > v.outage_losses_apm_kept)
    }
}

/// Run the sweep. `progress` is told after each seed.
pub fn run(
    sweep: &Sweep,
    progress: Option<&indicatif::ProgressBar>,
) -> anyhow::Result<Vec<FamilyResult>> {
    let jobs: Vec<(Family, u64)> = sweep
        .families
        .iter()
        .flat_map(|&f| (0..sweep.seeds).map(move |k| (f, sweep.first_seed + k)))
        .collect();
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let mut outcomes: Vec<(usize, Result<Vec<RunReport>, provider_sim::SimError>)> =
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let quiet = tracing::subscriber::NoSubscriber::default();
                        tracing::subscriber::with_default(quiet, || {
                            let mut out = Vec::new();
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(&(family, seed)) = jobs.get(i) else {
                                    break;
                                };
                                let mut scenario = family.scenario(seed, sweep.size);
                                sweep.tweaks.apply(&mut scenario);
                                let policy = scenario.engine_policy();
                                out.push((i, compare::run_all(&scenario, seed, &policy)));
                                if let Some(b) = progress {
                                    b.inc(1);
                                }
                            }
                            out
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
    outcomes.sort_by_key(|(i, _)| *i);
    let mut results = Vec::new();
    for &family in &sweep.families {
        let mut per_seed = Vec::new();
        for (i, outcome) in outcomes.iter() {
            let (f, seed) = jobs[*i];
            if f != family {
                continue;
            }
            let reports = outcome
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("{} seed {seed}", family.name()))?;
            per_seed.push((seed, reports));
        }
        results.push(summarise(family, &per_seed));
    }
    Ok(results)
}

fn summarise(family: Family, per_seed: &[(u64, &Vec<RunReport>)]) -> FamilyResult {
    let mut lost: BTreeMap<String, u64> = BTreeMap::new();
    let mut in_outage: BTreeMap<String, u64> = BTreeMap::new();
    let mut versus: BTreeMap<String, Versus> = BTreeMap::new();
    let mut restores: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut restores_kept: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut failing = Vec::new();
    let mut connections = 0;
    for (seed, reports) in per_seed {
        let lost_by_any: std::collections::BTreeSet<u64> = reports
            .iter()
            .flat_map(|r| r.lost_ids.iter().copied())
            .collect();
        for r in reports.iter() {
            let kept = r
                .restore_samples_ns
                .iter()
                .zip(&r.restore_sample_conns)
                .filter(|(_, c)| !lost_by_any.contains(&u64::from(**c)))
                .map(|(ns, _)| *ns);
            restores_kept
                .entry(r.policy.clone())
                .or_default()
                .extend(kept);
            *lost.entry(r.policy.clone()).or_default() += r.lost;
            *in_outage.entry(r.policy.clone()).or_default() += r.lost_in_total_outage.len() as u64;
            restores
                .entry(r.policy.clone())
                .or_default()
                .extend(&r.restore_samples_ns);
            connections = r.connections;
        }
        let Some(apm) = reports.iter().find(|r| r.policy == PolicyKind::Apm.name()) else {
            continue;
        };
        let judgement = compare::judge(reports);
        for (against, base) in judgement.iter().zip(
            reports
                .iter()
                .filter(|r| PolicyKind::from_name(&r.policy).is_some_and(|k| k.is_baseline())),
        ) {
            let v = versus.entry(against.baseline.clone()).or_default();
            match compare::verdict(apm, base) {
                Verdict::Better => v.better += 1,
                Verdict::Same => v.same += 1,
                Verdict::Worse => v.worse += 1,
            }
            v.kept_rearm_window += against.kept(Cause::RearmWindow).count() as u64;
            v.kept_other += against.kept(Cause::Other).count() as u64;
            v.kept_total_outage += against.kept(Cause::TotalOutage).count() as u64;
            v.kept_after_total_outage += against.kept_outside_outages_after_one() as u64;
            v.outage_losses_apm_kept += against.outage_losses_apm_kept;
        }
        if compare::run_fails(&judgement) {
            failing.push(*seed);
        }
    }
    let restore_p99_ms = p99_per_policy(restores);
    let restore_p99_kept_by_all_ms = p99_per_policy(restores_kept);
    FamilyResult {
        family: family.name().to_string(),
        description: family.description().to_string(),
        settings: family.settings().describe(),
        seeds: per_seed.len() as u64,
        connections,
        lost,
        lost_in_total_outage: in_outage,
        versus,
        seeds_failing: failing,
        restore_p99_ms,
        restore_p99_kept_by_all_ms,
    }
}

/// The p99 of each policy's pooled samples, in milliseconds (`None`: no sample).
fn p99_per_policy(samples: BTreeMap<String, Vec<u64>>) -> BTreeMap<String, Option<f64>> {
    samples
        .into_iter()
        .map(|(p, mut ns)| {
            ns.sort_unstable();
            let pct = Percentiles::of_sorted(&ns);
            (p, (!pct.is_empty()).then_some(round2(pct.p99)))
        })
        .collect()
}

/// The policies of the sweep, apm first, then the baselines, as the runs name them.
fn policy_names() -> Vec<&'static str> {
    PolicyKind::ALL.iter().map(|k| k.name()).collect()
}

/// Connections lost per policy (of those, in total outages), one row per family.
fn losses_table(o: &mut String, results: &[FamilyResult]) {
    use std::fmt::Write;
    let names = policy_names();
    let _ = write!(
        o,
        "connections lost (of those, in total outages)\n{:<24} {:>5}",
        "family", "conns"
    );
    for n in &names {
        let _ = write!(o, " {n:>15}");
    }
    let _ = writeln!(o, " {:>5}", "fail");
    for r in results {
        let _ = write!(o, "{:<24} {:>5}", r.family, r.connections);
        for n in &names {
            let lost = r.lost.get(*n).copied().unwrap_or(0);
            let outage = r.lost_in_total_outage.get(*n).copied().unwrap_or(0);
            let _ = write!(o, " {:>15}", format!("{lost} ({outage})"));
        }
        let _ = writeln!(o, " {:>5}", r.seeds_failing.len());
    }
}

/// apm against each baseline, one row per family: seeds where apm lost more,
/// connections apm lost that the baseline kept outside total outages, and in them.
fn versus_table(o: &mut String, results: &[FamilyResult]) {
    use std::fmt::Write;
    let names = policy_names();
    let bases = &names[1..];
    let _ = write!(
        o,
        "\napm against each baseline: seeds apm lost more / connections apm lost that \
         the baseline kept,\noutside total outages (re-arm window + other) / in total \
         outages (after one)\n{:<24}",
        "family"
    );
    for b in bases {
        let _ = write!(o, " {b:>21}");
    }
    o.push('\n');
    for r in results {
        let _ = write!(o, "{:<24}", r.family);
        for b in bases {
            let cell = r.versus.get(*b).map_or("-".to_string(), |v| {
                let after = if v.kept_after_total_outage > 0 {
                    format!(" ({})", v.kept_after_total_outage)
                } else {
                    String::new()
                };
                format!(
                    "{}/{}+{}/{}{}{after}",
                    v.worse,
                    v.kept_rearm_window,
                    v.kept_other,
                    v.kept_total_outage,
                    if r.outage_excess(b) { "!" } else { "" }
                )
            });
            let _ = write!(o, " {cell:>21}");
        }
        o.push('\n');
    }
}

/// Restore p99 per policy, over every restore and over the connections no policy
/// lost, one row per family.
fn restores_table(o: &mut String, results: &[FamilyResult]) {
    use std::fmt::Write;
    let names = policy_names();
    let _ = write!(
        o,
        "\nrestore p99 (ms), every restore | over the connections every policy kept\n{:<24}",
        "family"
    );
    for n in &names {
        let _ = write!(o, " {n:>15}");
    }
    o.push('\n');
    let ms = |m: &BTreeMap<String, Option<f64>>, p: &str| {
        m.get(p)
            .copied()
            .flatten()
            .map_or("n/a".to_string(), |v| format!("{v:.1}"))
    };
    for r in results {
        let _ = write!(o, "{:<24}", r.family);
        for n in &names {
            let cell = format!(
                "{} | {}",
                ms(&r.restore_p99_ms, n),
                ms(&r.restore_p99_kept_by_all_ms, n)
            );
            let _ = write!(o, " {cell:>15}");
        }
        o.push('\n');
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The legend printed under the tables: what each figure counts, exactly.
pub const LEGEND: &str = "\
Every connection a policy lost is counted; nothing is subtracted. A connection's loss
is \"in a total outage\" when, at the instant its QPs gave up, no path between its two
hosts worked; \"in the re-arm window\" when (otherwise) its primary died after it had
moved and before it was armed again on a working alternate; \"other\" otherwise.
w/a+b/c against a baseline: w seeds where apm lost more connections than the baseline;
a + b connections apm lost that the baseline kept, in the re-arm window (a) and other
(b); c connections apm lost in a total outage that the baseline kept; (t) of a + b,
those that had gone through a total outage since they last worked (said, not
excused). A seed fails (fail) when, against hw-only, reload-local or reload-boost (the
baselines that wait for the HCA), w or a + b is not zero; port-err-move, which moves at
once, is compared only: no policy keeps every connection that both kinds keep. '!'
marks a family where, over all its seeds, apm lost more connections in total outages
that the baseline kept than the baseline lost in total outages that apm kept (the
losses in total outages of each policy are in the first table).";

/// The table of the sweep, as printed.
pub fn table(sweep: &Sweep, results: &[FamilyResult]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let size = match sweep.size {
        Size::Small => "small",
        Size::Full => "full-size",
    };
    let _ = writeln!(
        o,
        "apm simulate --sweep {}: {} families x {} seeds (seeds {}..={}), {size} scenarios, \
         each family's own fabric, traffic and engine policy{}\n",
        sweep.seeds,
        results.len(),
        sweep.seeds,
        sweep.first_seed,
        sweep.first_seed + sweep.seeds.saturating_sub(1),
        sweep.tweaks.describe()
    );
    let _ = writeln!(o, "families (what each holds fixed)");
    for r in results {
        let _ = writeln!(o, "  {:<24} {}: {}", r.family, r.description, r.settings);
    }
    o.push('\n');
    losses_table(&mut o, results);
    versus_table(&mut o, results);
    restores_table(&mut o, results);
    let _ = writeln!(
        o,
        "\n{LEGEND}\nReplay a seed with\n  apm simulate --family FAMILY{} --seed N",
        if sweep.size == Size::Small {
            " --small"
        } else {
            ""
        }
    );
    for r in results.iter().filter(|r| !r.seeds_failing.is_empty()) {
        let shown: Vec<String> = r
            .seeds_failing
            .iter()
            .take(10)
            .map(u64::to_string)
            .collect();
        let more = r.seeds_failing.len().saturating_sub(10);
        let _ = writeln!(
            o,
            "  {}: failing seeds {}{}",
            r.family,
            shown.join(" "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    o
}
