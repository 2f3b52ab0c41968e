//! Chaos runs: a random fabric, workload and fault schedule per seed, the invariants
//! checked after every step, every seed run twice to prove determinism.
//!
//! The test suite runs a few hundred seeds (`cargo test -p provider-sim --test chaos`);
//! `cargo xtask chaos --seeds 10000` runs the long campaign. A failing seed is replayed
//! alone with `APM_SIM_SEED=<seed> cargo test -p provider-sim --test chaos`.

use crate::config::{LinkSpec, Mode, RandomFaults, Scenario, SwitchSpec};
use crate::controller::PolicyKind;
use crate::rng::Rng;
use crate::sim::{RunConfig, Sim};
use apm_core::Policy;

/// The engine policy chaos runs use: the defaults with the hold-down, the re-arm backoff
/// and the SA recheck of an out-of-service GID (1 s, doubling) capped at 2 s, so that
/// "armed again within a bound after the faults stop" can be checked within seconds of
/// simulated time rather than minutes, for every connection: a host that missed the
/// SM's last notice is not excused, its engine must find out from the SA.
pub fn chaos_policy() -> Policy {
    Policy {
        hold_down_max_ms: 2000,
        rearm_retry_max_ms: 2000,
        remote_recheck_ms: 1000,
        remote_recheck_max_ms: 2000,
        ..Policy::default()
    }
}

/// The scenario of `seed`: 3-6 hosts, one or two rails (sometimes leaf/spine rails with
/// several paths per LID pair), LMC 0-2, tens of connections, a handful of faults of
/// every kind, then quiet until every invariant's bound has passed.
pub fn scenario_for(seed: u64) -> Scenario {
    let mut rng = Rng::new(seed).fork(0xc4a05);
    let mut s = Scenario {
        name: format!("chaos seed {seed}"),
        ..Scenario::default()
    };
    let t = &mut s.topology;
    t.hosts = rng.range(3, 6) as usize;
    t.ports = if rng.chance(0.85) { 2 } else { 1 };
    t.lmc = rng.below(3) as u8;
    if rng.chance(0.3) {
        // Leaf/spine rails: two leaves and two spines per rail.
        for r in 0..usize::from(t.ports) {
            let name = |k: &str, i: usize| format!("{k}{}{i}", char::from(b'A' + r as u8));
            for i in 0..2 {
                t.switches.push(SwitchSpec {
                    name: name("L", i),
                    subnet: r,
                });
                t.switches.push(SwitchSpec {
                    name: name("S", i),
                    subnet: r,
                });
            }
            for h in 0..t.hosts {
                t.links.push(LinkSpec {
                    a: format!("h{h}:{}", r + 1),
                    b: name("L", h % 2),
                });
            }
            for l in 0..2 {
                for sp in 0..2 {
                    t.links.push(LinkSpec {
                        a: name("L", l),
                        b: name("S", sp),
                    });
                }
            }
        }
    }
    s.workload.connections = rng.range(10, 40) as usize;
    s.workload.message_interval_ms = 20;
    if rng.chance(0.125) {
        s.workload.mode = Mode::Software;
    }
    s.faults.clear();
    s.random_faults = Some(RandomFaults {
        count: rng.range(2, 8) as u32,
        start_ms: 200,
        end_ms: 2500,
        max_outage_ms: 1500,
        device_fatal: rng.chance(0.1),
    });
    if rng.chance(0.2) {
        s.fabric.mad_loss = 0.02;
    }
    let last = s
        .all_faults(seed)
        .iter()
        .map(|f| f.end_ms())
        .max()
        .unwrap_or(0);
    let probe = Sim::new(&s, chaos_config(seed)).map(|sim| sim.settle_bound());
    let bound_ms = probe.map(|b| b.as_nanos() / 1_000_000).unwrap_or(15_000);
    s.duration_ms = last + bound_ms + 200;
    s
}

fn chaos_config(seed: u64) -> RunConfig {
    let mut cfg = RunConfig::new(PolicyKind::Apm, seed);
    cfg.engine_policy = chaos_policy();
    cfg.check = true;
    cfg.sample_ms = 100;
    cfg
}

/// What one seed produced.
#[derive(Debug)]
pub struct SeedOutcome {
    /// Digest of the event sequence.
    pub digest: u64,
    /// Events processed (one run).
    pub events: u64,
    /// Connections lost (legitimately: double faults, device failures).
    pub lost: u64,
}

/// Run `seed` twice under `apm` with every invariant checked. `Err` describes the
/// violations or the divergence between the two runs.
pub fn run_seed(seed: u64) -> Result<SeedOutcome, String> {
    let s = scenario_for(seed);
    let one = || -> Result<crate::report::RunReport, String> {
        Ok(Sim::new(&s, chaos_config(seed))?.run())
    };
    let a = one()?;
    let b = one()?;
    if !a.violations.is_empty() {
        return Err(format!(
            "{} violation(s): {}",
            a.violations.len(),
            a.violations.join("; ")
        ));
    }
    let ja = serde_json::to_string(&a).map_err(|e| e.to_string())?;
    let jb = serde_json::to_string(&b).map_err(|e| e.to_string())?;
    if ja != jb {
        return Err(format!(
            "two runs of the same seed differ (digests {:#x} / {:#x})",
            a.digest, b.digest
        ));
    }
    Ok(SeedOutcome {
        digest: a.digest,
        events: a.events,
        lost: a.lost,
    })
}

/// The command that replays `seed` alone.
pub fn replay_command(seed: u64) -> String {
    format!("APM_SIM_SEED={seed} cargo test -p provider-sim --test chaos -- --nocapture")
}
