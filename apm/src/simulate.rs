//! `apm simulate`: run a fault scenario on the simulated fabric under `apm` and the two
//! baselines, side by side, and show what each saved.
//!
//! Output: a summary table and a timeline on stdout (or one JSON document with
//! `--json`), an SVG plot with `--svg`, a progress bar on stderr only when stderr is a
//! terminal and the output is not JSON. The three runs are independent simulations of
//! the same scenario and seed; they run on separate threads and print in a fixed order,
//! so the output is the same whatever the machine.

#[path = "sim_svg.rs"]
mod sim_svg;

use crate::out::{out, outln};
use anyhow::{bail, Context};
use apm::input::SCENARIO_LIMIT;
use provider_sim::{PolicyKind, RunConfig, RunReport, Scenario, Sim};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `apm simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario file (TOML; see provider-sim/scenarios/). Default: the built-in dual-rail
    /// demonstration.
    #[arg(long, value_name = "FILE")]
    scenario: Option<PathBuf>,
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
    /// Policies to run, comma-separated (apm, hw-only, reload-local).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "apm,hw-only,reload-local"
    )]
    policies: Vec<String>,
    /// Let the simulated hosts' engines log through `--log` (off by default: thousands
    /// of engines warning about the faults the scenario injects drown the report).
    #[arg(long)]
    engine_logs: bool,
}

/// One policy's figures in the JSON document: exactly the fields of the issue.
#[derive(Debug, Serialize)]
struct JsonPolicy {
    connections: u64,
    lost: u64,
    messages_lost: u64,
    messages_duplicated: u64,
    failovers: u64,
    restore_ms: JsonPct,
    unprotected_ms_total: f64,
    sa_queries: u64,
    mads_sent: u64,
}

#[derive(Debug, Serialize)]
struct JsonPct {
    p50: f64,
    p99: f64,
    max: f64,
}

#[derive(Debug, Serialize)]
struct JsonDoc {
    seed: u64,
    scenario: String,
    policies: BTreeMap<String, JsonPolicy>,
}

/// Load the scenario and apply the command-line overrides.
fn scenario(args: &Args) -> anyhow::Result<Scenario> {
    let mut s = match &args.scenario {
        Some(path) => {
            let text = apm::input::read_file(path, SCENARIO_LIMIT, "a scenario file")?;
            Scenario::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => Scenario::default(),
    };
    if let Some(n) = args.connections {
        s.workload.connections = n;
    }
    if let Some(n) = args.hosts {
        s.topology.hosts = n;
    }
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
    // Build first so that errors surface before any thread starts.
    let mut sims = Vec::new();
    for &p in policies {
        let mut cfg = RunConfig::new(p, seed);
        // The checks are cheap; a violation in a user's scenario is worth showing.
        cfg.check = true;
        let sim = Sim::new(scenario, cfg).map_err(anyhow::Error::msg)?;
        sims.push(sim);
    }
    let reports = std::thread::scope(|scope| {
        let handles: Vec<_> = sims
            .into_iter()
            .map(|sim| {
                let bar = progress.cloned();
                scope.spawn(move || {
                    let mut last = 0u64;
                    let run = move || {
                        sim.run_with_progress(50, |t| {
                            let ms = t.as_nanos() / 1_000_000;
                            if let Some(b) = &bar {
                                b.inc(ms.saturating_sub(last));
                            }
                            last = ms;
                        })
                    };
                    if engine_logs {
                        run()
                    } else {
                        let quiet = tracing::subscriber::NoSubscriber::default();
                        tracing::subscriber::with_default(quiet, run)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))
            })
            .collect::<anyhow::Result<Vec<RunReport>>>()
    })?;
    Ok(reports)
}

/// Run the simulation.
pub fn run(args: Args) -> anyhow::Result<()> {
    let scenario = scenario(&args)?;
    let mut policies = Vec::new();
    for name in &args.policies {
        match PolicyKind::from_name(name.trim()) {
            Some(p) if !policies.contains(&p) => policies.push(p),
            Some(_) => {}
            None => bail!("unknown policy {name:?} (use apm, hw-only, reload-local)"),
        }
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
                        messages_lost: r.messages_lost,
                        messages_duplicated: r.messages_duplicated,
                        failovers: r.failovers,
                        restore_ms: JsonPct {
                            p50: round3(r.restore_ms.p50),
                            p99: round3(r.restore_ms.p99),
                            max: round3(r.restore_ms.max),
                        },
                        unprotected_ms_total: round3(r.unprotected_ms_total),
                        sa_queries: r.sa_queries,
                        mads_sent: r.mads_sent,
                    },
                )
            })
            .collect(),
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
    let _ = write!(o, "{:<28}", "");
    for r in reports {
        let _ = write!(o, "{:>14}", r.policy);
    }
    o.push('\n');
    type Row = (&'static str, fn(&RunReport) -> String);
    let rows: [Row; 12] = [
        ("connections lost", |r| r.lost.to_string()),
        ("messages lost", |r| r.messages_lost.to_string()),
        ("messages duplicated", |r| r.messages_duplicated.to_string()),
        ("messages retransmitted", |r| {
            r.messages_retransmitted.to_string()
        }),
        ("failovers", |r| r.failovers.to_string()),
        ("restore p50 (ms)", |r| format!("{:.2}", r.restore_ms.p50)),
        ("restore p99 (ms)", |r| format!("{:.2}", r.restore_ms.p99)),
        ("restore max (ms)", |r| format!("{:.2}", r.restore_ms.max)),
        ("unprotected (conn-s)", |r| {
            format!("{:.1}", r.unprotected_ms_total / 1000.0)
        }),
        ("SA queries", |r| r.sa_queries.to_string()),
        ("MADs sent", |r| r.mads_sent.to_string()),
        ("armed at the end", |r| {
            format!("{}/{}", r.end_state[0], r.connections)
        }),
    ];
    for (name, f) in rows {
        let _ = write!(o, "{name:<28}");
        for r in reports {
            let _ = write!(o, "{:>14}", f(r));
        }
        o.push('\n');
    }
    // The fabric's timeline is the same under every policy (up to MAD timing); show
    // the first run's, with each policy's connection states just after each fault.
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

fn sample_at(r: &RunReport, t_ms: u64) -> Option<provider_sim::Sample> {
    let i = r.samples.partition_point(|s| s.t_ms <= t_ms);
    r.samples.get(i.checked_sub(1)?).copied()
}
