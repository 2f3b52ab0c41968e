//! Chaos: the scenario families with random fault schedules, invariants checked after
//! every step, each seed's invariant run done twice, and apm judged against the
//! baselines that wait for the HCA on every seed, per connection
//! (`provider_sim::compare`), and family by family on the races of total outages
//! (connections apm lost in one that a baseline kept, against the reverse). `APM_SIM_SEED=n` replays one seed;
//! `APM_SIM_SEEDS=N` (default 200) and `APM_SIM_SEED_START=s` choose a range (`cargo
//! xtask chaos --seeds 10000`).

use provider_sim::chaos::{replay_command, run_seed, SeedError, SeedOutcome, Tally};

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
    let results: Vec<(u64, Result<SeedOutcome, SeedError>)> = std::thread::scope(|scope| {
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
    let mut tally = Tally::default();
    let mut events = 0;
    for (_, o) in results
        .iter()
        .filter_map(|(s, r)| r.as_ref().ok().map(|o| (s, o)))
    {
        tally.add(o);
        events += o.events;
    }
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(seed, r)| {
            r.as_ref()
                .err()
                .map(|e| format!("seed {seed}: {e}\n  replay: {}", replay_command(*seed)))
        })
        .collect();
    let excess = tally.outage_excess();
    eprintln!(
        "chaos: {} seed(s) over the scenario families, {events} events in the invariant runs, \
         {} failure(s); connections lost per family and policy (in total outages):",
        results.len(),
        failures.len(),
    );
    for line in tally.lines() {
        eprintln!("  {line}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        excess.is_empty(),
        "the races of total outages went against apm:\n{}",
        excess.join("\n")
    );
}
