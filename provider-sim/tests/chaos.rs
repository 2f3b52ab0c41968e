//! Chaos: the scenario families with random fault schedules, invariants checked after
//! every step, each seed's invariant run done twice, and apm compared with both
//! baselines on every seed. `APM_SIM_SEED=n` replays one seed; `APM_SIM_SEEDS=N` (default 200)
//! and `APM_SIM_SEED_START=s` choose a range (`cargo xtask chaos --seeds 10000`).

use provider_sim::chaos::{replay_command, run_seed};

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

#[test]
fn chaos() {
    let seeds: Vec<u64> = match env_u64("APM_SIM_SEED") {
        Some(one) => vec![one],
        None => {
            let start = env_u64("APM_SIM_SEED_START").unwrap_or(0);
            let n = env_u64("APM_SIM_SEEDS").unwrap_or(200);
            (start..start + n).collect()
        }
    };
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(seeds.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(
        u64,
        Result<provider_sim::chaos::SeedOutcome, provider_sim::chaos::SeedError>,
    )> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&seed) = seeds.get(i) else { break };
                        out.push((seed, run_seed(seed)));
                    }
                    out
                })
            })
            .collect();
        let mut all: Vec<_> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("a chaos worker panicked"))
            .collect();
        all.sort_by_key(|(s, _)| *s);
        all
    });
    let ok: Vec<&provider_sim::chaos::SeedOutcome> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    let events: u64 = ok.iter().map(|o| o.events).sum();
    let lost: u64 = ok.iter().map(|o| o.lost).sum();
    let hw: u64 = ok.iter().map(|o| o.baseline_lost[0]).sum();
    let rl: u64 = ok.iter().map(|o| o.baseline_lost[1]).sum();
    let findings: Vec<String> = results
        .iter()
        .filter_map(|(seed, r)| r.as_ref().ok().map(|o| (seed, o)))
        .filter(|(_, o)| !o.findings.is_empty())
        .map(|(seed, o)| {
            format!(
                "seed {seed}: {}\n  replay: {}",
                o.findings.join("; "),
                replay_command(*seed)
            )
        })
        .collect();
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(seed, r)| {
            r.as_ref()
                .err()
                .map(|e| format!("seed {seed}: {e}\n  replay: {}", replay_command(*seed)))
        })
        .collect();
    eprintln!(
        "chaos: {} seed(s) over the scenario families, {events} events in the invariant runs, \
         connections lost apm {lost} / hw-only {hw} / reload-local {rl}, {} failure(s), \
         {} seed(s) with findings (losses a baseline avoided, in the re-arm window after a \
         move or in a total outage)",
        results.len(),
        failures.len(),
        findings.len()
    );
    for f in &findings {
        eprintln!("finding: {f}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
