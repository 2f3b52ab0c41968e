//! Simulator benchmark (`cargo xtask bench`, or `cargo bench -p provider-sim`): for 1k,
//! 10k and 100k connections on the default scenario, the simulator's throughput
//! (simulated events and messages per second, one policy on one thread) and the wall
//! time of what `apm simulate` does (the three policies on their own threads).
//!
//! A plain harness, not criterion: one run per size is the measurement (a 100k run is
//! tens of seconds), and what matters is where the scale limits are. Sizes can be
//! chosen with `APM_BENCH_SIZES=1000,5000`.
// The wall clock is what a benchmark measures; the simulation itself never reads it.
#![allow(clippy::disallowed_methods)]

use provider_sim::{PolicyKind, RunConfig, Scenario, Sim};
use std::time::Instant;

fn main() {
    // cargo bench passes `--bench` and perhaps a filter; there is nothing to filter.
    let sizes: Vec<usize> = std::env::var("APM_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000]);
    println!(
        "{:>12} {:>14} {:>14} {:>14} {:>16} {:>18}",
        "connections", "events", "messages", "events/s", "messages/s", "simulate wall (s)"
    );
    for n in sizes {
        let mut s = Scenario::default();
        s.workload.connections = n;
        // Throughput: one policy, one thread.
        let sim = Sim::new(&s, RunConfig::new(PolicyKind::Apm, 1)).expect("default scenario");
        let t = Instant::now();
        let r = sim.run();
        let one = t.elapsed().as_secs_f64();
        // `apm simulate`: three policies on three threads.
        let t = Instant::now();
        std::thread::scope(|scope| {
            for p in PolicyKind::ALL {
                let s = &s;
                scope.spawn(move || {
                    let mut cfg = RunConfig::new(p, 1);
                    cfg.check = true;
                    Sim::new(s, cfg).expect("default scenario").run()
                });
            }
        });
        let all = t.elapsed().as_secs_f64();
        println!(
            "{:>12} {:>14} {:>14} {:>14.0} {:>16.0} {:>18.2}",
            n,
            r.events,
            r.messages_posted,
            r.events as f64 / one,
            r.messages_posted as f64 / one,
            all
        );
    }
}
