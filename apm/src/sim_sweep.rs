//! `apm simulate --sweep N`: every scenario family over N seeds, apm against both
//! baselines on each, summed per family: connections lost per policy, the seeds where
//! apm did better, the same or worse than each baseline (by connections lost), the
//! seeds that break dominance and those with findings (`provider_sim::compare`; the
//! first few listed with the command that replays them), and the restore p99 of all
//! restores pooled.
//!
//! Seeds run on every core, each seed's three runs on one thread; results are gathered
//! in seed order, so the output is the same whatever the machine.

use anyhow::Context;
use provider_sim::compare::{self, Verdict};
use provider_sim::{Family, Percentiles, PolicyKind, RunReport, Size};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

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
}

/// One family's totals.
#[derive(Debug, Serialize)]
pub struct FamilyResult {
    /// The family's name.
    pub family: String,
    /// What it exercises.
    pub description: String,
    /// Seeds run.
    pub seeds: u64,
    /// Connections per seed.
    pub connections: u64,
    /// Connections lost over all seeds, per policy.
    pub lost: BTreeMap<String, u64>,
    /// apm against each baseline, by seed.
    pub versus: BTreeMap<String, Versus>,
    /// Seeds where apm did worse than a baseline (`compare::dominance_violations`).
    pub seeds_violating: Vec<u64>,
    /// Seeds where apm lost a connection a baseline kept in the re-arm window after a
    /// move or in a total outage (`compare::findings`).
    pub seeds_with_findings: Vec<u64>,
    /// Restore p99 over every restore of every seed, per policy (`None`: none).
    pub restore_p99_ms: BTreeMap<String, Option<f64>>,
    /// The same over the connections no policy lost on that seed: a policy that keeps
    /// connections through long outages restores them late, and the others have no
    /// sample for what they lost.
    pub restore_p99_kept_by_all_ms: BTreeMap<String, Option<f64>>,
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
                                let scenario = family.scenario(seed, sweep.size);
                                let policy = provider_sim::controller::sim_policy();
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
    let mut versus: BTreeMap<String, Versus> = BTreeMap::new();
    let mut restores: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut restores_kept: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let (mut violating, mut with_findings) = (Vec::new(), Vec::new());
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
            restores
                .entry(r.policy.clone())
                .or_default()
                .extend(&r.restore_samples_ns);
            connections = r.connections;
        }
        let Some(apm) = reports.iter().find(|r| r.policy == PolicyKind::Apm.name()) else {
            continue;
        };
        for base in reports.iter().filter(|r| r.policy != apm.policy) {
            let v = versus.entry(base.policy.clone()).or_default();
            match compare::verdict(apm, base) {
                Verdict::Better => v.better += 1,
                Verdict::Same => v.same += 1,
                Verdict::Worse => v.worse += 1,
            }
        }
        if !compare::dominance_violations(reports).is_empty() {
            violating.push(*seed);
        }
        if !compare::findings(reports).is_empty() {
            with_findings.push(*seed);
        }
    }
    let restore_p99_ms = p99_per_policy(restores);
    let restore_p99_kept_by_all_ms = p99_per_policy(restores_kept);
    FamilyResult {
        family: family.name().to_string(),
        description: family.description().to_string(),
        seeds: per_seed.len() as u64,
        connections,
        lost,
        versus,
        seeds_violating: violating,
        seeds_with_findings: with_findings,
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

/// Connections lost per policy and apm's verdicts, one row per family.
fn losses_table(o: &mut String, results: &[FamilyResult]) {
    use std::fmt::Write;
    let _ = writeln!(
        o,
        "{:<22} {:>6} | {:>21} | {:>14} {:>14} | {:>10}",
        "", "", "connections lost", "apm vs hw-only", "vs reload-loc", "seeds"
    );
    let _ = writeln!(
        o,
        "{:<22} {:>6} | {:>6} {:>6} {:>7} | {:>14} {:>14} | {:>4} {:>5}",
        "family",
        "conns",
        "apm",
        "hw",
        "reload",
        "better/=/worse",
        "better/=/worse",
        "viol",
        "find"
    );
    let vs = |r: &FamilyResult, p: &str| {
        r.versus.get(p).map_or("-".to_string(), |v| {
            format!("{}/{}/{}", v.better, v.same, v.worse)
        })
    };
    for r in results {
        let lost = |p: &str| r.lost.get(p).copied().unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<22} {:>6} | {:>6} {:>6} {:>7} | {:>14} {:>14} | {:>4} {:>5}",
            r.family,
            r.connections,
            lost("apm"),
            lost("hw-only"),
            lost("reload-local"),
            vs(r, "hw-only"),
            vs(r, "reload-local"),
            r.seeds_violating.len(),
            r.seeds_with_findings.len(),
        );
    }
}

/// Restore p99 per policy, over every restore and over the connections no policy
/// lost, one row per family.
fn restores_table(o: &mut String, results: &[FamilyResult]) {
    use std::fmt::Write;
    let _ = writeln!(
        o,
        "\n{:<22} | {:>22} | {:>22}",
        "restore p99 (ms)", "every restore", "connections all kept"
    );
    let _ = writeln!(
        o,
        "{:<22} | {:>6} {:>7} {:>7} | {:>6} {:>7} {:>7}",
        "family", "apm", "hw", "reload", "apm", "hw", "reload"
    );
    let ms = |m: &BTreeMap<String, Option<f64>>, p: &str| {
        m.get(p)
            .copied()
            .flatten()
            .map_or("n/a".to_string(), |v| format!("{v:.1}"))
    };
    for r in results {
        let (all, kept) = (&r.restore_p99_ms, &r.restore_p99_kept_by_all_ms);
        let _ = writeln!(
            o,
            "{:<22} | {:>6} {:>7} {:>7} | {:>6} {:>7} {:>7}",
            r.family,
            ms(all, "apm"),
            ms(all, "hw-only"),
            ms(all, "reload-local"),
            ms(kept, "apm"),
            ms(kept, "hw-only"),
            ms(kept, "reload-local"),
        );
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

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
         the simulator's policy (defaults, probes on) and default fabric constants\n",
        sweep.seeds,
        results.len(),
        sweep.seeds,
        sweep.first_seed,
        sweep.first_seed + sweep.seeds.saturating_sub(1)
    );
    losses_table(&mut o, results);
    restores_table(&mut o, results);
    let _ =
        writeln!(
        o,
        "\nviol: seeds where apm did worse than a baseline (more connections lost, or one lost\n\
         that the baseline kept). find: seeds with findings (a connection lost that a baseline\n\
         kept, in the re-arm window after a move or in a total outage). Replay one with\n  \
         apm simulate --family FAMILY{} --seed N",
        if sweep.size == Size::Small { " --small" } else { "" }
    );
    let listed = |what: &str, seeds: &[u64]| -> Option<String> {
        (!seeds.is_empty()).then(|| {
            let shown: Vec<String> = seeds.iter().take(10).map(u64::to_string).collect();
            format!("{what} {}", shown.join(" "))
        })
    };
    for r in results {
        let lines: Vec<String> = [
            listed("viol", &r.seeds_violating),
            listed("find", &r.seeds_with_findings),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !lines.is_empty() {
            let _ = writeln!(o, "  {}: {}", r.family, lines.join("; "));
        }
    }
    o
}
