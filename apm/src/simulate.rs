//! `apm simulate`: run a fault scenario on the simulated fabric under `apm` and the two
//! baselines, side by side, and show what each saved.
//!
//! Output: a summary table and a timeline on stdout (or one JSON document with
//! `--json`), an SVG plot with `--svg`, a progress bar on stderr only when stderr is a
//! terminal and the output is not JSON. The three runs are independent simulations of
//! the same scenario and seed; they run on separate threads and print in a fixed order,
//! so the output is the same whatever the machine.

#[path = "sim_events.rs"]
mod sim_events;
#[path = "sim_svg.rs"]
mod sim_svg;
#[path = "sim_sweep.rs"]
mod sim_sweep;

use crate::out::{out, outln};
use anyhow::{bail, Context};
use provider_sim::{
    compare, Family, Percentiles, PolicyKind, RunConfig, RunReport, Scenario, Sim, Size,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Arguments of `apm simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario file (TOML; see provider-sim/scenarios/). Default: the built-in dual-rail
    /// demonstration.
    #[arg(long, value_name = "FILE", conflicts_with = "family")]
    scenario: Option<PathBuf>,
    /// The scenario of a family for `--seed` instead of a file: dual-rail,
    /// leaf-spine-lmc2, random-dual-rail-lmc0, random-dual-rail-lmc1, random-leaf-spine,
    /// mad-loss-50, mad-loss-90, sm-failures, random-roce, silent-split-rail, silent-roce.
    #[arg(long, value_name = "NAME")]
    family: Option<String>,
    /// With `--family` or `--sweep`: the small scenarios of the chaos campaign.
    #[arg(long)]
    small: bool,
    /// Run every family (or those of `--families`) over N seeds from `--seed` and print,
    /// per family, connections lost per policy, the seeds where apm did better, the
    /// same or worse than each baseline, and restore p99.
    #[arg(long, value_name = "N", conflicts_with_all = ["scenario", "family", "svg"])]
    sweep: Option<u64>,
    /// With `--sweep`: the families to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    families: Vec<String>,
    /// Seed of the simulation's RNG: the same seed gives the same output.
    #[arg(long, default_value_t = 1, env = "APM_SIM_SEED")]
    seed: u64,
    /// Number of connections (overrides the scenario).
    #[arg(long, value_name = "N")]
    connections: Option<usize>,
    /// Number of hosts (overrides the scenario).
    #[arg(long, value_name = "N")]
    hosts: Option<usize>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Write a plot of connection states over time, per policy.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Policies to run, comma-separated: apm; the baselines hw-only, reload-local,
    /// reload-boost (reload-local with apm's alternate ACK timeout) and port-err-move
    /// (reload-local that also forces a migration on PORT_ERR); and the naive ways of
    /// using the SA apm is compared with at scale, apm-wildcard and per-conn-sa.
    /// Default: the scenario's `policies`, or apm and the four baselines.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    policies: Vec<String>,
    /// Run apm with this `fast_moves` (self-armed, always, never) instead of the
    /// scenario's or family's: which hardware-APM connections move at once.
    #[arg(long, value_name = "MODE", value_parser = fast_moves)]
    fast_moves: Option<apm_core::FastMoves>,
    /// Let apm post on every connection's QP (`workload.apm_may_post`): its arming
    /// write arms a QP after a move without waiting for the application's traffic.
    #[arg(long)]
    apm_may_post: bool,
    /// Let the simulated hosts' engines log through `--log` (off by default: thousands
    /// of engines warning about the faults the scenario injects drown the report).
    #[arg(long)]
    engine_logs: bool,
}

/// One policy's figures in the JSON document.
#[derive(Debug, Serialize)]
struct JsonPolicy {
    connections: u64,
    lost: u64,
    /// Which connections were lost (indices), and of those the ones whose primary died
    /// after a move and before they were armed again, and those lost while no path
    /// between their two hosts worked (`provider_sim::compare::Cause`).
    lost_ids: Vec<u64>,
    lost_in_rearm_window: Vec<u64>,
    lost_in_total_outage: Vec<u64>,
    /// Those lost after a total outage since they last worked (a diagnostic).
    lost_after_total_outage: Vec<u64>,
    /// Offered by the applications over the whole run and never delivered.
    messages_lost: u64,
    messages_offered: u64,
    messages_duplicated: u64,
    failovers: u64,
    /// Of those, off a primary that still worked both ways.
    false_failovers: u64,
    restore_ms: JsonPct,
    /// Restores of connections armed on a port-disjoint alternate when the fault hit.
    restore_disjoint_ms: JsonPct,
    /// Working unarmed, failing over, or lost (to the end of the run).
    unprotected_ms_total: f64,
    armed_disjoint_ms_total: f64,
    armed_shared_port_ms_total: f64,
    lost_ms_total: f64,
    armed_at_end: u64,
    armed_disjoint_at_end: u64,
    sa_queries: u64,
    /// Every MAD (apm's probes and messages on InfiniBand included).
    mads_sent: u64,
    /// Liveness probes sent (0 with probes off), and per host and second.
    probes_sent: u64,
    probes_per_host_per_s: f64,
    /// What each failure event cost the SMs and SAs (the first entry: before any).
    failure_events: Vec<sim_events::JsonEvent>,
}

/// Percentiles; all `null` when there was nothing to measure.
#[derive(Debug, Serialize)]
struct JsonPct {
    p50: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

impl JsonPct {
    fn of(p: &Percentiles) -> JsonPct {
        let v = |x: f64| (!p.is_empty()).then_some(round3(x));
        JsonPct {
            p50: v(p.p50),
            p99: v(p.p99),
            max: v(p.max),
        }
    }
}

#[derive(Debug, Serialize)]
struct JsonDoc {
    seed: u64,
    scenario: String,
    policies: BTreeMap<String, JsonPolicy>,
    /// apm against each baseline that ran, per connection with nothing subtracted
    /// (`provider_sim::compare`); absent without apm or without a baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    judgement: Option<JsonJudgement>,
}

#[derive(Debug, Serialize)]
struct JsonJudgement {
    /// The run fails against some judged baseline (one that waits for the HCA): apm
    /// lost more connections, or one the baseline kept outside a total outage.
    fails: bool,
    against: Vec<compare::Against>,
}

/// `--fast-moves`'s value.
fn fast_moves(s: &str) -> Result<apm_core::FastMoves, String> {
    match s {
        "self-armed" => Ok(apm_core::FastMoves::SelfArmed),
        "always" => Ok(apm_core::FastMoves::Always),
        "never" => Ok(apm_core::FastMoves::Never),
        other => Err(format!("{other:?}: use self-armed, always or never")),
    }
}

/// The command line's changes to every scenario run.
fn tweaks(args: &Args) -> sim_sweep::Tweaks {
    sim_sweep::Tweaks {
        fast_moves: args.fast_moves,
        apm_may_post: args.apm_may_post,
    }
}

/// Load the scenario and apply the command-line overrides.
fn scenario(args: &Args) -> anyhow::Result<Scenario> {
    let mut s = match (&args.scenario, &args.family) {
        (Some(path), _) => apm::scenario_file::read(path)?,
        (None, Some(name)) => family(name)?.scenario(args.seed, size(args)),
        (None, None) => Scenario::demo(),
    };
    if let Some(n) = args.connections {
        s.workload.connections = n;
        s.workload.connections_per_host = None;
    }
    if let Some(n) = args.hosts {
        s.topology.hosts = n;
    }
    tweaks(args).apply(&mut s);
    s.validate()
        .context("the scenario after --hosts/--connections")?;
    Ok(s)
}

/// Run `policies` on `scenario` with `seed`, one thread each, reports in the given order.
pub fn run_all(
    scenario: &Scenario,
    seed: u64,
    policies: &[PolicyKind],
    progress: Option<&indicatif::ProgressBar>,
    engine_logs: bool,
) -> anyhow::Result<Vec<RunReport>> {
    // What can be refused is refused before any thread starts.
    scenario.validate()?;
    scenario.engine_policy().validate()?;
    // No more simulations at once than cores: a run of a million connections holds a
    // gigabyte or two, and more threads than cores only share the same cores.
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, policies.len().max(1));
    let next = AtomicUsize::new(0);
    // The bar's own message, put back after a build says what it is building.
    let shown = progress.map(|b| b.message());
    let progress = progress.zip(shown.as_deref());
    let mut done: Vec<(usize, anyhow::Result<RunReport>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&p) = policies.get(i) else {
                            break;
                        };
                        let run = || run_one(scenario, seed, p, (i + 1, policies.len()), progress);
                        let report = if engine_logs {
                            run()
                        } else {
                            let quiet = tracing::subscriber::NoSubscriber::default();
                            tracing::subscriber::with_default(quiet, run)
                        };
                        out.push((i, report));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect())
    })?;
    done.sort_by_key(|(i, _)| *i);
    let reports = done
        .into_iter()
        .map(|(_, r)| r)
        .collect::<anyhow::Result<Vec<RunReport>>>()?;
    Ok(reports)
}

/// One policy's run of `scenario` (the `nth` of `of`), telling `progress` as simulated
/// time passes; `progress` carries the bar's own message, put back after the build.
fn run_one(
    scenario: &Scenario,
    seed: u64,
    policy: PolicyKind,
    (nth, of): (usize, usize),
    progress: Option<(&indicatif::ProgressBar, &str)>,
) -> anyhow::Result<RunReport> {
    let mut cfg = RunConfig::for_scenario(scenario, policy, seed);
    // The checks are cheap; a violation in a user's scenario is worth showing.
    cfg.check = true;
    // Building a large workload takes a while of its own: the bar says so rather than
    // sit at 0%. Another worker may be building too: the last to finish puts back the
    // bar's own message.
    let building = format!(
        "(building {} connections for {}, {}/{})",
        scenario.workload.connections,
        policy.name(),
        nth,
        of
    );
    if let Some((b, _)) = progress {
        b.set_message(building.clone());
    }
    let sim = Sim::new(scenario, cfg);
    if let Some((b, shown)) = progress {
        if b.message() == building {
            b.set_message(shown.to_owned());
        }
    }
    let sim = sim?;
    let mut last = 0u64;
    Ok(sim.run_with_progress(50, |t| {
        let ms = t.as_nanos() / 1_000_000;
        if let Some((b, _)) = progress {
            b.inc(ms.saturating_sub(last));
        }
        last = ms;
    }))
}

fn family(name: &str) -> anyhow::Result<Family> {
    Family::from_name(name.trim()).with_context(|| {
        let all: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
        format!("unknown family {name:?} (use {})", all.join(", "))
    })
}

fn size(args: &Args) -> Size {
    if args.small {
        Size::Small
    } else {
        Size::Full
    }
}

/// The most seeds `--sweep` runs: a sweep keeps every seed's result, and this many
/// already take days.
const MAX_SWEEP_SEEDS: u64 = 100_000;

/// `--sweep N`: every family over N seeds.
fn sweep(args: &Args, seeds: u64) -> anyhow::Result<()> {
    let families = if args.families.is_empty() {
        Family::ALL.to_vec()
    } else {
        args.families
            .iter()
            .map(|n| family(n))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if seeds == 0 {
        bail!("--sweep needs at least one seed");
    }
    if seeds > MAX_SWEEP_SEEDS {
        bail!("--sweep {seeds}: at most {MAX_SWEEP_SEEDS} seeds (each family runs every one)");
    }
    let sweep = sim_sweep::Sweep {
        families,
        seeds,
        first_seed: args.seed,
        size: size(args),
        tweaks: tweaks(args),
    };
    let total = seeds * sweep.families.len() as u64;
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} sweeping {bar:40} {pos}/{len} seeds ({elapsed}, ~{eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(std::time::Duration::from_millis(250));
        b
    });
    let results = sim_sweep::run(&sweep, bar.as_ref())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&results)?)?;
    } else {
        out!("{}", sim_sweep::table(&sweep, &results))?;
    }
    Ok(())
}

/// Run the simulation.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(n) = args.sweep {
        return sweep(&args, n);
    }
    let scenario = scenario(&args)?;
    let mut policies = Vec::new();
    for name in &args.policies {
        match PolicyKind::from_name(name.trim()) {
            Some(p) if !policies.contains(&p) => policies.push(p),
            Some(_) => {}
            None => {
                let all: Vec<&str> = PolicyKind::EVERY.iter().map(|k| k.name()).collect();
                bail!("unknown policy {name:?} (use {})", all.join(", "))
            }
        }
    }
    if args.policies.is_empty() {
        policies = scenario.run_policies()?;
    }
    if policies.is_empty() {
        bail!("no policy to run");
    }
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(scenario.duration_ms * policies.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} simulating {msg} {bar:40} {percent}% ({elapsed}, ~{eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(format!(
            "{:.1} s x {} polic{}",
            scenario.duration_ms as f64 / 1000.0,
            policies.len(),
            if policies.len() == 1 { "y" } else { "ies" }
        ));
        // The elapsed time moves even while nothing else does (a large build).
        b.enable_steady_tick(std::time::Duration::from_millis(250));
        b
    });
    let reports = run_all(
        &scenario,
        args.seed,
        &policies,
        bar.as_ref(),
        args.engine_logs,
    )?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(path) = &args.svg {
        let svg = sim_svg::render(&scenario, args.seed, &reports);
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let doc = json_doc(&scenario, args.seed, &reports);
        outln!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        out!("{}", table(&scenario, args.seed, &reports))?;
    }
    Ok(())
}

fn json_doc(scenario: &Scenario, seed: u64, reports: &[RunReport]) -> JsonDoc {
    JsonDoc {
        seed,
        scenario: scenario.name.clone(),
        policies: reports
            .iter()
            .map(|r| {
                (
                    r.policy.clone(),
                    JsonPolicy {
                        connections: r.connections,
                        lost: r.lost,
                        lost_ids: r.lost_ids.clone(),
                        lost_in_rearm_window: r.lost_in_rearm_window.clone(),
                        lost_in_total_outage: r.lost_in_total_outage.clone(),
                        lost_after_total_outage: r.lost_after_total_outage.clone(),
                        messages_lost: r.messages_lost,
                        messages_offered: r.messages_posted,
                        messages_duplicated: r.messages_duplicated,
                        failovers: r.failovers,
                        false_failovers: r.false_failovers,
                        restore_ms: JsonPct::of(&r.restore_ms),
                        restore_disjoint_ms: JsonPct::of(&r.restore_disjoint_ms),
                        unprotected_ms_total: round3(r.unprotected_ms_total),
                        armed_disjoint_ms_total: round3(r.armed_disjoint_ms_total),
                        armed_shared_port_ms_total: round3(r.armed_shared_ms_total),
                        lost_ms_total: round3(r.lost_ms_total),
                        armed_at_end: r.end_state[0],
                        armed_disjoint_at_end: r.end_armed_disjoint,
                        sa_queries: r.sa_queries,
                        mads_sent: r.mads_sent,
                        probes_sent: r.probes_sent,
                        probes_per_host_per_s: round3(r.probes_per_host_per_s),
                        failure_events: r
                            .failure_events
                            .iter()
                            .map(sim_events::JsonEvent::of)
                            .collect(),
                    },
                )
            })
            .collect(),
        judgement: {
            let against = compare::judge(reports);
            (!against.is_empty()).then(|| JsonJudgement {
                fails: compare::run_fails(&against),
                against,
            })
        },
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The summary table and the timeline, as printed.
pub fn table(scenario: &Scenario, seed: u64, reports: &[RunReport]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let t = &scenario.topology;
    let _ = writeln!(
        o,
        "apm simulate: {}\nseed {seed}, {} hosts x {} port(s) (LMC {}), {} connections, {:.1} s simulated\n",
        scenario.name,
        t.hosts,
        t.ports,
        t.lmc,
        reports.first().map_or(0, |r| r.connections),
        scenario.duration_ms as f64 / 1000.0
    );
    let _ = write!(o, "{:<30}", "");
    for r in reports {
        let _ = write!(o, "{:>18}", r.policy);
    }
    o.push('\n');
    type Row = (&'static str, fn(&RunReport) -> String);
    let rows: [Row; 18] = [
        ("connections lost", |r| r.lost.to_string()),
        ("messages not delivered", |r| r.messages_lost.to_string()),
        ("messages duplicated", |r| r.messages_duplicated.to_string()),
        ("messages retransmitted", |r| {
            r.messages_retransmitted.to_string()
        }),
        ("failovers", |r| r.failovers.to_string()),
        ("  of which false", |r| r.false_failovers.to_string()),
        ("restore p50 (ms)", |r| ms(&r.restore_ms, r.restore_ms.p50)),
        ("restore p99 (ms)", |r| ms(&r.restore_ms, r.restore_ms.p99)),
        ("restore max (ms)", |r| ms(&r.restore_ms, r.restore_ms.max)),
        ("  disjoint armed: p99 (ms)", |r| {
            ms(&r.restore_disjoint_ms, r.restore_disjoint_ms.p99)
        }),
        ("armed, port-disjoint (conn-s)", |r| {
            conn_s(r.armed_disjoint_ms_total)
        }),
        ("armed, same port (conn-s)", |r| {
            conn_s(r.armed_shared_ms_total)
        }),
        ("unprotected (conn-s)", |r| conn_s(r.unprotected_ms_total)),
        ("  of which lost (conn-s)", |r| conn_s(r.lost_ms_total)),
        ("SA queries", |r| r.sa_queries.to_string()),
        ("MADs sent", |r| r.mads_sent.to_string()),
        ("probes per host per s", |r| {
            format!("{:.1}", r.probes_per_host_per_s)
        }),
        ("armed at the end (disjoint)", |r| {
            format!(
                "{}/{} ({})",
                r.end_state[0], r.connections, r.end_armed_disjoint
            )
        }),
    ];
    for (name, f) in rows {
        let _ = write!(o, "{name:<30}");
        for r in reports {
            // A space before each, so that values wider than the column stay apart.
            let _ = write!(o, " {:>17}", f(r));
        }
        o.push('\n');
    }
    o.push_str(&timeline(reports));
    o.push_str(&sim_events::section(reports));
    o.push_str(&judgement(reports));
    let viol: usize = reports.iter().map(|r| r.violations.len()).sum();
    if viol > 0 {
        let _ = writeln!(o, "\n{viol} invariant violation(s):");
        for r in reports {
            for v in &r.violations {
                let _ = writeln!(o, "  {}: {v}", r.policy);
            }
        }
    }
    o
}

/// The fabric's timeline, which is the same under every policy (up to MAD timing): the
/// first run's, with each policy's connection states just after each fault.
fn timeline(reports: &[RunReport]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\ntimeline (connections armed/unprotected/failing-over/lost per policy, 100 ms later)"
    );
    let Some(first) = reports.first() else {
        return o;
    };
    for (t_ms, text) in &first.timeline {
        let _ = write!(o, "{:>9.1} ms  {text}", t_ms);
        if !text.starts_with("SM ") {
            let at = (*t_ms as u64) + 100;
            o.push_str("   ");
            for r in reports {
                if let Some(s) = sample_at(r, at) {
                    let _ = write!(
                        o,
                        " {}: {}/{}/{}/{}",
                        r.policy, s.armed, s.unprotected, s.migrating, s.lost
                    );
                }
            }
        }
        o.push('\n');
    }
    o
}

/// apm against each baseline that ran: connections lost, and every connection apm
/// lost that the baseline kept with the cause class of apm's loss.
fn judgement(reports: &[RunReport]) -> String {
    use std::fmt::Write;
    let against = compare::judge(reports);
    let mut o = String::new();
    if against.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "\njudgement (every loss counted; apm fails against a baseline that waits for the \
         HCA when it lost more connections, or one the baseline kept outside a total outage; \
         against port-err-move, which moves at once, \"worse\" says the same, compared only):"
    );
    for a in &against {
        let mark = match (a.judged, a.fails) {
            (true, true) => "FAILS",
            (false, true) => "worse",
            (_, false) => "ok",
        };
        let _ = writeln!(o, "  {mark:5} {}", a.line(200));
    }
    o
}

/// A percentile in milliseconds, "n/a" when there was nothing to measure.
fn ms(p: &Percentiles, v: f64) -> String {
    if p.is_empty() {
        "n/a".to_string()
    } else {
        format!("{v:.2}")
    }
}

/// Connection-milliseconds as connection-seconds.
fn conn_s(ms: f64) -> String {
    format!("{:.1}", ms / 1000.0)
}

fn sample_at(r: &RunReport, t_ms: u64) -> Option<provider_sim::Sample> {
    let i = r.samples.partition_point(|s| s.t_ms <= t_ms);
    r.samples.get(i.checked_sub(1)?).copied()
}
