//! [`RunConfig`]: what a run needs besides the scenario (the seed, the controller, the
//! engine's policy, checks, tracing, how probes are carried).

use crate::controller::{self, PolicyKind};
use crate::Scenario;
use apm_core::Policy;

/// Everything a run needs besides the scenario.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The seed of the run's one RNG.
    pub seed: u64,
    /// Which controller every host runs.
    pub policy: PolicyKind,
    /// The engine's policy (for `apm`).
    pub engine_policy: Policy,
    /// Record a state sample this often (ms); 0 for none.
    pub sample_ms: u64,
    /// Check the invariants after every event and record violations.
    pub check: bool,
    /// Hosts driven from outside (by `apm_core::Manager` through [`crate::SimProvider`])
    /// instead of by an in-process controller.
    pub external_hosts: Vec<usize>,
    /// Log every change of this connection's QPs (target `provider_sim::trace`, level
    /// info), for finding out why it was lost.
    pub trace_conn: Option<usize>,
    /// Carry every probe packet, healthy paths' too, instead of parking the sessions of
    /// healthy paths (`parked.rs`): the way to check that parking changes nothing.
    pub probe_packets: bool,
}

impl RunConfig {
    /// A run of `scenario` under `policy` with `seed`, with the scenario's engine
    /// policy ([`Scenario::engine_policy`]), samples every 10 ms.
    pub fn for_scenario(scenario: &Scenario, policy: PolicyKind, seed: u64) -> RunConfig {
        RunConfig {
            engine_policy: scenario.engine_policy(),
            ..RunConfig::new(policy, seed)
        }
    }

    /// A run of `policy` with `seed`, the simulator's engine policy
    /// ([`crate::controller::sim_policy`]: the defaults with probes on), samples every
    /// 10 ms.
    pub fn new(policy: PolicyKind, seed: u64) -> RunConfig {
        RunConfig {
            seed,
            policy,
            engine_policy: controller::sim_policy(),
            sample_ms: 10,
            check: false,
            external_hosts: Vec::new(),
            trace_conn: None,
            probe_packets: false,
        }
    }
}
