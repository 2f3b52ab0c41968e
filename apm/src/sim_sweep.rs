//! `apm simulate --sweep N`: every scenario family over N seeds, apm against both
//! baselines on each, summed per family: connections lost per policy, the seeds where
//! apm did better, the same or worse than each baseline, the seeds where apm lost a
//! connection a baseline kept (with the command that replays the first few), and the
//! restore p99 of all restores pooled.
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
    /// Seeds where apm lost a connection that a baseline kept.
    pub seeds_losing_a_kept_connection: Vec<u64>,
    /// Restore p99 over every restore of every seed, per policy (`None`: none).
    pub restore_p99_ms: BTreeMap<String, Option<f64>>,
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
    let mut outcomes: Vec<(usize, Result<Vec<RunReport>, String>)> = std::thread::scope(|scope| {
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
                            let policy = apm_core::Policy::default();
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
    let mut kept = Vec::new();
    let mut connections = 0;
    for (seed, reports) in per_seed {
        for r in reports.iter() {
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
            kept.push(*seed);
        }
    }
    let restore_p99_ms = restores
        .into_iter()
        .map(|(p, mut ns)| {
            ns.sort_unstable();
            let pct = Percentiles::of_sorted(&ns);
            (p, (!pct.is_empty()).then_some(round2(pct.p99)))
        })
        .collect();
    FamilyResult {
        family: family.name().to_string(),
        description: family.description().to_string(),
        seeds: per_seed.len() as u64,
        connections,
        lost,
        versus,
        seeds_losing_a_kept_connection: kept,
        restore_p99_ms,
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
         default policy and fabric constants\n",
        sweep.seeds,
        results.len(),
        sweep.seeds,
        sweep.first_seed,
        sweep.first_seed + sweep.seeds.saturating_sub(1)
    );
    let _ = writeln!(
        o,
        "{:<22} {:>6} | {:>21} | {:>13} {:>13} | {:>6} | {:>22}",
        "", "", "connections lost", "apm vs hw-only", "vs reload-loc", "kept", "restore p99 (ms)"
    );
    let _ = writeln!(
        o,
        "{:<22} {:>6} | {:>6} {:>6} {:>7} | {:>13} {:>13} | {:>6} | {:>6} {:>7} {:>7}",
        "family",
        "conns",
        "apm",
        "hw",
        "reload",
        "better/=/worse",
        "better/=/worse",
        "seeds",
        "apm",
        "hw",
        "reload"
    );
    let p99 = |r: &FamilyResult, p: &str| {
        r.restore_p99_ms
            .get(p)
            .copied()
            .flatten()
            .map_or("n/a".to_string(), |v| format!("{v:.1}"))
    };
    let vs = |r: &FamilyResult, p: &str| {
        r.versus.get(p).map_or("-".to_string(), |v| {
            format!("{}/{}/{}", v.better, v.same, v.worse)
        })
    };
    for r in results {
        let lost = |p: &str| r.lost.get(p).copied().unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<22} {:>6} | {:>6} {:>6} {:>7} | {:>13} {:>13} | {:>6} | {:>6} {:>7} {:>7}",
            r.family,
            r.connections,
            lost("apm"),
            lost("hw-only"),
            lost("reload-local"),
            vs(r, "hw-only"),
            vs(r, "reload-local"),
            r.seeds_losing_a_kept_connection.len(),
            p99(r, "apm"),
            p99(r, "hw-only"),
            p99(r, "reload-local"),
        );
    }
    let _ =
        writeln!(
        o,
        "\nkept seeds: seeds where apm lost a connection that a baseline kept. Replay one with\n  \
         apm simulate --family FAMILY{} --seed N",
        if sweep.size == Size::Small { " --small" } else { "" }
    );
    for r in results
        .iter()
        .filter(|r| !r.seeds_losing_a_kept_connection.is_empty())
    {
        let shown: Vec<String> = r
            .seeds_losing_a_kept_connection
            .iter()
            .take(10)
            .map(u64::to_string)
            .collect();
        let _ = writeln!(o, "  {}: {}", r.family, shown.join(" "));
    }
    o
}
