//! `cargo xtask bench failover [--reps N] [--probe MS,N] [--only NAMES] [--log FILTER]
//! [--idle] [--json]`: apm against Linux bonding and no
//! protection on real rxe in the VM (`provider-verbs/tests/hw/bench_failover.rs` runs
//! the traffic and the faults there and prints one `FAILOVER-BENCH key=value ...` line
//! per run); this gathers the runs into one row per protection and fault: what became
//! of the connections, the stall at the fault (min / median / max over the runs that kept
//! the connection; a run with no gap as long as the pingpong records, 20 ms at the
//! default interval, counts as that long, and the minimum then reads `<20`), when each side's move was done (medians, from the last message
//! before the fault), the stall after the rail came back, messages lost and duplicated.
//! `--idle` runs the same traffic with no fault under no protection, apm without probes
//! and apm with them, and prints what each costs: gaps in arrivals, false failovers, CPU.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One run, as the guest printed it.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    variant: String,
    fault: String,
    outcome: String,
    stall_ms: Option<f64>,
    /// The connection was kept and neither side saw a gap as long as the pingpong
    /// records (`stall_ms` then holds that threshold: the stall was shorter).
    stall_below: bool,
    heal_stall_ms: f64,
    lost: u64,
    duplicated: u64,
    failovers: u64,
    /// When the first and the last side's move was done, ms after the fault's stall
    /// began (the last message before it; apm only).
    first_move_ms: Option<f64>,
    last_move_ms: Option<f64>,
    /// The guest's longest pause inside the stall (no thread of the guest could run).
    guest_pause_max_ms: Option<f64>,
}

fn parse(line: &str) -> Option<Run> {
    let rest = line.trim().strip_prefix("FAILOVER-BENCH ")?;
    let kv: BTreeMap<&str, &str> = rest
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect();
    let num = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok());
    Some(Run {
        variant: (*kv.get("variant")?).to_owned(),
        fault: (*kv.get("fault")?).to_owned(),
        outcome: (*kv.get("outcome")?).to_owned(),
        stall_ms: kv
            .get("stall_ms")
            .and_then(|v| v.strip_prefix("below:").unwrap_or(v).parse().ok()),
        stall_below: kv.get("stall_ms").is_some_and(|v| v.starts_with("below:")),
        heal_stall_ms: kv
            .get("heal_stall_ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        lost: num("lost")?,
        duplicated: num("duplicated")?,
        failovers: num("failovers")?,
        first_move_ms: kv.get("first_move_ms").and_then(|v| v.parse().ok()),
        last_move_ms: kv.get("last_move_ms").and_then(|v| v.parse().ok()),
        guest_pause_max_ms: kv.get("guest_pause_max_ms").and_then(|v| v.parse().ok()),
    })
}

/// One row of the table: a protection under one fault.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    variant: String,
    fault: String,
    runs: usize,
    kept: usize,
    lost_conns: usize,
    hung: usize,
    /// Stall at the fault over the kept runs: min, median, max; a run whose stall was
    /// below the recording threshold counts as the threshold (an upper bound).
    stall: Option<(f64, f64, f64)>,
    /// Kept runs whose stall was below the recording threshold.
    stall_below: usize,
    heal_stall_median: Option<f64>,
    /// Medians over the kept runs: the first side's move done, the last side's, ms
    /// after the fault's stall began.
    moves_median: Option<(f64, f64)>,
    /// The longest guest pause inside any kept run's stall.
    guest_pause_max: Option<f64>,
    lost: u64,
    duplicated: u64,
    failovers: u64,
}

fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn rows(runs: &[Run]) -> Vec<Row> {
    let mut order: Vec<(String, String)> = Vec::new();
    for r in runs {
        let key = (r.variant.clone(), r.fault.clone());
        if !order.contains(&key) {
            order.push(key);
        }
    }
    order
        .into_iter()
        .map(|(variant, fault)| {
            let mine: Vec<&Run> = runs
                .iter()
                .filter(|r| r.variant == variant && r.fault == fault)
                .collect();
            let count = |o: &str| mine.iter().filter(|r| r.outcome == o).count();
            let kept: Vec<&&Run> = mine.iter().filter(|r| r.outcome == "kept").collect();
            let mut stalls: Vec<f64> = kept.iter().filter_map(|r| r.stall_ms).collect();
            let stall = median(&mut stalls).map(|m| (stalls[0], m, stalls[stalls.len() - 1]));
            let mut heal: Vec<f64> = kept.iter().map(|r| r.heal_stall_ms).collect();
            let mut first: Vec<f64> = kept.iter().filter_map(|r| r.first_move_ms).collect();
            let mut last: Vec<f64> = kept.iter().filter_map(|r| r.last_move_ms).collect();
            Row {
                runs: mine.len(),
                kept: kept.len(),
                lost_conns: count("lost"),
                hung: count("hung"),
                stall,
                stall_below: kept.iter().filter(|r| r.stall_below).count(),
                heal_stall_median: median(&mut heal),
                moves_median: median(&mut first).zip(median(&mut last)),
                guest_pause_max: kept
                    .iter()
                    .filter_map(|r| r.guest_pause_max_ms)
                    .reduce(f64::max),
                lost: mine.iter().map(|r| r.lost).sum(),
                duplicated: mine.iter().map(|r| r.duplicated).sum(),
                failovers: mine.iter().map(|r| r.failovers).sum(),
                variant,
                fault,
            }
        })
        .collect()
}

fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<13} {:<11} {:>16} {:>22} {:>14} {:>10} {:>9} {:>5} {:>11}\n",
        "protection",
        "fault",
        "kept/lost/hung",
        "stall ms min/med/max",
        "moved: med ms",
        "back: med",
        "msgs lost",
        "dup",
        "pause: max"
    );
    for r in rows {
        let below = if r.stall_below > 0 { "<" } else { "" };
        let stall = r.stall.map_or("-".to_owned(), |(a, m, b)| {
            format!("{below}{a:.0} / {m:.0} / {b:.0}")
        });
        let heal = r
            .heal_stall_median
            .map_or("-".to_owned(), |m| format!("{m:.0}"));
        let moved = r
            .moves_median
            .map_or("-".to_owned(), |(a, b)| format!("{a:.0} / {b:.0}"));
        let pause = r
            .guest_pause_max
            .map_or("-".to_owned(), |m| format!("{m:.0}"));
        let _ = writeln!(
            out,
            "{:<13} {:<11} {:>16} {:>22} {:>14} {:>10} {:>9} {:>5} {:>11}",
            r.variant,
            r.fault,
            format!("{}/{}/{} of {}", r.kept, r.lost_conns, r.hung, r.runs),
            stall,
            moved,
            heal,
            r.lost,
            r.duplicated,
            pause
        );
    }
    out
}

fn json(rows: &[Row]) -> String {
    let num = |x: Option<f64>| x.map_or("null".to_owned(), |x| format!("{x:.1}"));
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"protection\":\"{}\",\"fault\":\"{}\",\"runs\":{},\"kept\":{},\"lost\":{},\
                 \"hung\":{},\"stall_ms\":{{\"min\":{},\"median\":{},\"max\":{}}},\
                 \"stalls_below_threshold\":{},\
                 \"first_move_ms_median\":{},\"last_move_ms_median\":{},\
                 \"stall_after_return_ms_median\":{},\"messages_lost\":{},\
                 \"messages_duplicated\":{},\"failovers\":{},\"guest_pause_max_ms\":{}}}",
                r.variant,
                r.fault,
                r.runs,
                r.kept,
                r.lost_conns,
                r.hung,
                num(r.stall.map(|s| s.0)),
                num(r.stall.map(|s| s.1)),
                num(r.stall.map(|s| s.2)),
                r.stall_below,
                num(r.moves_median.map(|m| m.0)),
                num(r.moves_median.map(|m| m.1)),
                num(r.heal_stall_median),
                r.lost,
                r.duplicated,
                r.failovers,
                num(r.guest_pause_max)
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

const USAGE: &str = "\
cargo xtask bench failover [--reps N] [--probe MS,N] [--interval MS] [--realtime P]
                           [--only NAMES] [--log FILTER] [--sched-trace] [--perf]
                           [--idle] [--dev] [--json]

apm against Linux bonding and no protection, on real rxe in the VM: one RC
connection's numbered messages through a link down and a silent cut (netem 100%
loss) of the rail in use, then the rail back; one row per protection and fault.

  --reps N        runs per protection and fault (default 10)
  --probe MS,N    apm's liveness probes: interval in ms and multiplier (default:
                  apm's policy default, 15,3)
  --interval MS   the traffic's message interval each way, in ms (default 2); a
                  pingpong records only gaps of ten intervals or more (20 ms at
                  least), so a longer interval hides shorter stalls
  --realtime P    apm's control threads in SCHED_FIFO at priority P (apm pingpong
                  --realtime); default ordinary threads
  --only NAMES    only these protections, comma-separated (apm, apm-no-probes, none,
                  bond-miimon, bond-arp); default all
  --log FILTER    the pingpong processes' log filter (APM_LOG syntax), to trace a run;
                  their lines land in target/vm/bench-failover.out
  --sched-trace   trace the guest's scheduler and softirqs from the fault on (tracefs)
                  and print, per run, what ran on each CPU during the stall and how
                  long the pingpongs' threads waited for one, then the same for as
                  long a window 1.5 s after the fault (bench-failover.out); the
                  tracing costs the guest CPU, so its stalls are not the table's
  --perf          profile both pingpongs for 400 ms from the fault (perf record, the
                  CPU clock sampled; in the VM when the host has linux-perf) and print
                  the report per run (bench-failover.out); not the table's stalls either
  --idle          no fault: what each protection costs (gaps, false failovers, CPU)
  --dev           build apm and the suite in the dev profile (unoptimised), as the
                  test suite does; default: the release profile
  --json          the rows as JSON instead of the table
";

/// `bench failover`'s options.
struct Options {
    reps: u32,
    as_json: bool,
    idle: bool,
    dev: bool,
    /// `K=V` settings for the suite in the guest.
    env: Vec<String>,
}

/// The options in `args`; `None` after printing the help.
fn options(args: &[String]) -> Result<Option<Options>> {
    let mut o = Options {
        reps: 10,
        as_json: false,
        idle: false,
        dev: false,
        env: Vec::new(),
    };
    let env = &mut o.env;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => {
                o.reps = it
                    .next()
                    .context("--reps needs a number")?
                    .parse()
                    .context("--reps N")?;
            }
            "--json" => o.as_json = true,
            "--dev" => o.dev = true,
            "--idle" => o.idle = true,
            "--only" => {
                let names = it.next().context("--only needs NAME[,NAME...]")?;
                env.push(format!("APM_BENCH_ONLY={names}"));
            }
            "--interval" => {
                let ms = it.next().context("--interval needs a number of ms")?;
                let ok = ms.parse::<f64>().is_ok_and(|v| v.is_finite() && v > 0.0);
                if !ok {
                    bail!("--interval {ms:?}: a positive number of milliseconds");
                }
                env.push(format!("APM_BENCH_INTERVAL_MS={ms}"));
            }
            "--realtime" => {
                let p = it.next().context("--realtime needs a priority")?;
                if !p.parse::<u8>().is_ok_and(|v| (1..=99).contains(&v)) {
                    bail!("--realtime {p:?}: a SCHED_FIFO priority, 1 to 99");
                }
                env.push(format!("APM_BENCH_REALTIME={p}"));
            }
            "--sched-trace" => env.push("APM_BENCH_SCHED_TRACE=1".to_owned()),
            "--perf" => env.push("APM_BENCH_PERF=1".to_owned()),
            "--log" => {
                let filter = it.next().context("--log needs a filter")?;
                env.push(format!("APM_PINGPONG_LOG={filter}"));
            }
            "--probe" => {
                let p = it.next().context("--probe needs INTERVAL_MS,MULTIPLIER")?;
                env.push(format!("APM_BENCH_PROBE={p}"));
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown `bench failover` argument {other:?}\n\n{USAGE}"),
        }
    }
    let has = |k: &str| o.env.iter().any(|e| e.starts_with(k));
    if has("APM_BENCH_PERF=") && has("APM_BENCH_SCHED_TRACE=") {
        // Each would measure the other's cost.
        bail!("--perf and --sched-trace: one at a time");
    }
    Ok(Some(o))
}

/// Run the benchmark in the VM and print its table (or JSON).
pub fn main(args: &[String]) -> Result<()> {
    let Some(Options {
        reps,
        as_json,
        idle,
        dev,
        env,
    }) = options(args)?
    else {
        return Ok(());
    };
    let out = std::env::current_dir()?.join("target/vm/bench-failover.out");
    let mut vm = vec![
        "--vm".to_owned(),
        "--timeout".to_owned(),
        "3600".to_owned(),
        "--filter".to_owned(),
        // Module path and name: `bench_failover` alone also names the idle test.
        if idle {
            "bench_failover::bench_idle_cost"
        } else {
            "bench_failover::bench_failover"
        }
        .to_owned(),
        "--env".to_owned(),
        "APM_BENCH=1".to_owned(),
        "--env".to_owned(),
        format!("APM_BENCH_REPS={reps}"),
    ];
    if !dev {
        vm.push("--release".to_owned());
    }
    for e in env {
        vm.extend(["--env".to_owned(), e]);
    }
    std::env::set_var("APM_VM_OUTPUT", &out);
    crate::hwtest::main(&vm)?;
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    if idle {
        return idle_report(&text, as_json);
    }
    let runs: Vec<Run> = text.lines().filter_map(parse).collect();
    if runs.is_empty() {
        bail!("the VM printed no FAILOVER-BENCH line (see its output above)");
    }
    let rows = rows(&runs);
    if as_json {
        println!("{}", json(&rows));
    } else {
        println!(
            "failover in the VM (rxe, qemu TCG, {} build), {reps} runs per row:\n{}",
            if dev { "dev" } else { "release" },
            table(&rows)
        );
    }
    Ok(())
}

/// `--idle`: the guest's `FAILOVER-IDLE key=value ...` lines (one per configuration and
/// repetition, no fault), each as it came or as a JSON array of objects.
fn idle_report(text: &str, as_json: bool) -> Result<()> {
    let runs: Vec<BTreeMap<&str, &str>> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FAILOVER-IDLE "))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect()
        })
        .collect();
    if runs.is_empty() {
        bail!("the VM printed no FAILOVER-IDLE line (see its output above)");
    }
    if as_json {
        let items: Vec<String> = runs
            .iter()
            .map(|kv| {
                let fields: Vec<String> = kv
                    .iter()
                    .map(|(k, v)| match v.parse::<f64>() {
                        Ok(n) if n.is_finite() => format!("\"{k}\":{n}"),
                        _ => format!("\"{k}\":\"{v}\""),
                    })
                    .collect();
                format!("{{{}}}", fields.join(","))
            })
            .collect();
        println!("[{}]", items.join(","));
        return Ok(());
    }
    println!(
        "{:<14} {:>4} {:>12} {:>15} {:>10} {:>6}",
        "config", "rep", "gaps/s>=20ms", "longest gap ms", "failovers", "cpu %"
    );
    for kv in &runs {
        let get = |k: &str| kv.get(k).copied().unwrap_or("-");
        println!(
            "{:<14} {:>4} {:>12} {:>15} {:>10} {:>6}",
            get("config"),
            get("rep"),
            get("gaps_per_s"),
            get("longest_gap_ms"),
            get("failovers"),
            get("cpu_percent")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_gather_into_rows_with_medians_over_the_kept_ones() {
        let lines = "noise\n\
            FAILOVER-BENCH variant=apm fault=link-down rep=0 outcome=kept stall_ms=40.0 heal_stall_ms=0.0 lost=0 duplicated=0 failovers=2 first_move_ms=20.0 last_move_ms=30.0\n\
            FAILOVER-BENCH variant=apm fault=link-down rep=1 outcome=kept stall_ms=60.0 heal_stall_ms=10.0 lost=0 duplicated=0 failovers=2 first_move_ms=40.0 last_move_ms=50.0\n\
            FAILOVER-BENCH variant=apm fault=link-down rep=2 outcome=kept stall_ms=50.0 heal_stall_ms=0.0 lost=0 duplicated=0 failovers=2\n\
            FAILOVER-BENCH variant=apm fault=link-down rep=3 outcome=kept stall_ms=below:20 heal_stall_ms=0.0 lost=0 duplicated=0 failovers=2\n\
            FAILOVER-BENCH variant=none fault=link-down rep=0 outcome=lost stall_ms=- heal_stall_ms=0.0 lost=900 duplicated=0 failovers=0\n";
        let runs: Vec<Run> = lines.lines().filter_map(parse).collect();
        assert_eq!(runs.len(), 5);
        let r = rows(&runs);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].kept, r[0].runs), (4, 4));
        // The run below the threshold counts as the threshold, and the table says so.
        assert_eq!(r[0].stall, Some((20.0, 45.0, 60.0)));
        assert_eq!(r[0].stall_below, 1);
        // Over the runs that state their moves (a record without them still counts).
        assert_eq!(r[0].moves_median, Some((30.0, 40.0)));
        assert_eq!(r[1].lost_conns, 1);
        assert_eq!(r[1].moves_median, None);
        assert_eq!((r[1].stall, r[1].stall_below), (None, 0));
        let t = table(&r);
        assert!(
            t.contains("4/0/0 of 4") && t.contains("<20 / 45 / 60") && t.contains("30 / 40"),
            "{t}"
        );
        let j = json(&r);
        assert!(
            j.contains("\"median\":45.0")
                && j.contains("\"stalls_below_threshold\":1")
                && j.contains("\"messages_lost\":900"),
            "{j}"
        );
    }
}
