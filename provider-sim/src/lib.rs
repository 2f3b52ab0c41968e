//! A deterministic simulated InfiniBand fabric implementing every apm Provider facet.
//!
//! Never reads a clock or entropy: virtual time and one seeded RNG ([`rng::Rng`]) drive
//! everything, so a scenario, a seed and a policy give byte-identical results.
//!
//! - [`config`]: scenarios (topology, fabric constants, workload, faults) from TOML.
//! - [`topology`]: the fabric's shape as a scenario writes it.
//! - [`fabric`]: host ports, switches, links, LIDs, forwarding tables.
//! - [`sim`]: the discrete-event simulation: SM/SA with sweeps and traps 64/65 as
//!   Reports, RC QPs with real APM semantics, MAD delivery, traffic, faults; it steps one
//!   controller per host directly (sans-IO, fast).
//! - [`controller`]: what runs on the hosts: the apm engine or a baseline.
//! - [`provider`]: [`SimProvider`], the apm-core `Provider` facets over a shared
//!   simulation, for end-to-end runs through `apm_core::Manager` on tokio's paused clock.
//! - [`report`]: the figures a run produces.
//! - [`families`]: the scenario families apm is compared on, each a function of a seed;
//!   [`compare`]: apm against the baselines and the dominance check; [`chaos`]: the
//!   randomized campaign over the families.
#![forbid(unsafe_code)]

pub mod chaos;
pub mod compare;
pub mod config;
pub mod controller;
pub mod fabric;
pub mod families;
pub mod provider;
pub mod report;
pub mod rng;
pub mod sim;
pub mod topology;

pub use config::{Fault, Scenario, ScenarioError};
pub use controller::PolicyKind;
pub use fabric::FabricError;
pub use families::{Family, Size};
pub use provider::SimProvider;
pub use report::{EventLoad, Percentiles, RunReport, Sample};
pub use sim::{ConnState, RunConfig, Sim, SimError};

/// Run `scenario` under `policy` with `seed` and report (no invariant checks).
pub fn run(scenario: &Scenario, policy: PolicyKind, seed: u64) -> Result<RunReport, SimError> {
    Ok(Sim::new(scenario, RunConfig::new(policy, seed))?.run())
}
