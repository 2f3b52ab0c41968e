//! Simulator benchmark (`cargo xtask bench`, or `cargo bench -p provider-sim`): on the
//! 4,096-host fat-tree scenario (`scenarios/fat-tree-4096.toml`), at 10k, 100k and 1M
//! connections, apm's run on one thread (events, events per second, bytes per
//! connection), then what `apm simulate` does (apm and every baseline, as many at once
//! as there are cores) in wall and CPU time, and the peak memory of it all.
//!
//! A plain harness, not criterion: one run per size is the measurement (a million
//! connections take tens of seconds), and what matters is where the scale limits are.
//! Each measurement runs in a process of its own (the benchmark runs itself again), so
//! that its peak resident memory (`VmHWM`) is its own; bytes per connection are apm's peak
//! less the same fabric's with no connection, over the connections. Sizes can be
//! chosen with `APM_BENCH_SIZES=10000,50000`.
// The wall clock is what a benchmark measures; the simulation itself never reads it.
#![allow(clippy::disallowed_methods)]

use provider_sim::{PolicyKind, RunConfig, Scenario, Sim};
use std::time::Instant;

/// Runs one size in this process and prints its figures as one line of numbers.
const CHILD: &str = "APM_BENCH_ONE";

fn scenario(connections: usize) -> Scenario {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/fat-tree-4096.toml");
    let text = std::fs::read_to_string(path).expect("the 4,096-host scenario");
    let mut s = Scenario::from_toml(&text).expect("the 4,096-host scenario is valid");
    s.workload.connections = connections;
    s.workload.connections_per_host = None;
    s
}

/// A field of `/proc/self/status` in kB (0 where there is none).
fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// User and system CPU seconds this process used (`/proc/self/stat`, clock ticks of
/// 1/100 s).
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = |k: usize| {
        fields
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// What a process of the benchmark measures.
#[derive(Clone, Copy, Debug)]
enum Part {
    /// apm's run on one thread: `events events/s hwm_kb`.
    One,
    /// `apm simulate`'s three policies, as many at once as cores: `wall cpu hwm_kb`.
    Simulate,
}

/// One part of one size, in this process: its line of figures.
fn child(n: usize, part: Part) {
    let s = scenario(n);
    match part {
        Part::One => {
            let sim = Sim::new(&s, RunConfig::for_scenario(&s, PolicyKind::Apm, 1)).expect("sim");
            let t = Instant::now();
            let r = sim.run();
            let one = t.elapsed().as_secs_f64();
            let rate = r.events as f64 / one.max(1e-9);
            println!("{} {rate:.0} {}", r.events, status_kb("VmHWM:"));
        }
        Part::Simulate => {
            let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
            let next = std::sync::atomic::AtomicUsize::new(0);
            let (t, cpu) = (Instant::now(), cpu_s());
            std::thread::scope(|scope| {
                for _ in 0..cores.min(PolicyKind::ALL.len()) {
                    scope.spawn(|| loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&p) = PolicyKind::ALL.get(i) else {
                            break;
                        };
                        let mut cfg = RunConfig::for_scenario(&s, p, 1);
                        cfg.check = true;
                        drop(Sim::new(&s, cfg).expect("sim").run());
                    });
                }
            });
            let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_s() - cpu);
            println!("{wall:.2} {cpu:.2} {}", status_kb("VmHWM:"));
        }
    }
}

/// Run one part of one size in a process of its own; its line of figures.
fn measure(n: usize, part: Part) -> Vec<f64> {
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let out = std::process::Command::new(exe)
        .env(CHILD, format!("{n} {part:?}"))
        .output()
        .expect("the benchmark runs itself");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect()
}

fn main() {
    if let Ok(job) = std::env::var(CHILD) {
        let (n, part) = job.split_once(' ').unwrap_or((&job, "One"));
        let n = n.parse().expect("a connection count");
        let part = if part == "Simulate" {
            Part::Simulate
        } else {
            Part::One
        };
        let quiet = tracing::subscriber::NoSubscriber::default();
        tracing::subscriber::with_default(quiet, || child(n, part));
        return;
    }
    // cargo bench passes `--bench` and perhaps a filter; there is nothing to filter.
    let sizes: Vec<usize> = std::env::var("APM_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    println!(
        "4,096 hosts, two fat-tree rails (scenarios/fat-tree-4096.toml), {cores} core(s); \
         simulate: apm, hw-only, reload-local, {} at once",
        cores.min(3)
    );
    println!(
        "{:>12} {:>11} {:>10} {:>12} {:>10} {:>9} {:>10}",
        "connections", "events", "events/s", "bytes/conn", "wall (s)", "CPU (s)", "peak (MB)"
    );
    println!(
        "{:>12} {:>11} {:>10} {:>12} {:>10} {:>9} {:>10}",
        "", "(apm)", "(apm)", "(apm)", "(simulate)", "", ""
    );
    let empty = measure(0, Part::One).get(2).copied().unwrap_or(0.0);
    for n in sizes {
        let (one, all) = (measure(n, Part::One), measure(n, Part::Simulate));
        let at = |v: &[f64], k: usize| v.get(k).copied().unwrap_or(0.0);
        let (events, rate, hwm_one) = (at(&one, 0), at(&one, 1), at(&one, 2));
        let (wall, cpu, hwm) = (at(&all, 0), at(&all, 1), at(&all, 2));
        println!(
            "{:>12} {:>11.0} {:>10.0} {:>12.0} {:>10.2} {:>9.2} {:>10.0}",
            n,
            events,
            rate,
            (hwm_one - empty).max(0.0) * 1024.0 / n.max(1) as f64,
            wall,
            cpu,
            hwm / 1024.0
        );
    }
}
