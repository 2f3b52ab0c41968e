//! What runs on each simulated host to look after its connections: the apm engine, or
//! one of the baselines it is judged against (`baseline.rs`); and, for what apm costs
//! the SM and SA
//! at scale, two naive ways of using the SA: apm's engine with every SA economy undone
//! (`apm-wildcard`) and a manager that asks the SA per connection (`per-conn-sa`,
//! `per_conn_sa.rs`).
//!
//! All of them speak the engine's sans-IO contract (`Input` in, `Output` out), so the
//! simulator drives them identically. The baselines model what applications do today
//! and must stay as simple as they are in the wild: they are not straw men, but they
//! are not to be improved either.

use apm_core::probe::{ProbeAction, ProbeDriver, ProbePolicy};
use apm_core::{Command, CommandId, CommandOp, ConnSpec, Engine, Input, Output, Policy, Time};
use serde::Serialize;
use std::collections::VecDeque;

mod baseline;
mod by_id;
mod per_conn_sa;
pub use baseline::{AfterMigration, Baseline, Rules};
use by_id::{ById, Outstanding};
pub use per_conn_sa::PerConnSa;

/// Which controller a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// The apm engine with its default policy.
    Apm,
    /// Alternate loaded and armed once at connect time; nothing else.
    HwOnly,
    /// Re-arm locally on `PATH_MIG` (old MPI libraries): no LAP, no SA notices.
    ReloadLocal,
    /// `reload-local` with apm's alternate timeout: every alternate loaded with a local
    /// ACK timeout `alternate_timeout_boost` steps above the connection's own, as apm's
    /// engine loads them, so that what comes from timeouts shows apart from what comes
    /// from coordination.
    ReloadBoost,
    /// `reload-local` that also forces the migration of its QPs whose primary runs on a
    /// port that goes down (`PORT_ERR`), when their alternate's local port is up: the
    /// obvious local remedy, with no SA, no LAP and no word to the peer (whose ARMED QP
    /// follows the first packet with MigReq=1).
    PortErrMove,
    /// apm's engine with its SA economies undone ([`wildcard_policy`]): subscribed to
    /// traps 64/65 on every port, every SA request out at once.
    ApmWildcard,
    /// Every connection asks the SA for its own paths ([`PerConnSa`]).
    PerConnSa,
}

impl PolicyKind {
    /// apm and the baselines it is judged against, in report order.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Apm,
        PolicyKind::HwOnly,
        PolicyKind::ReloadLocal,
        PolicyKind::ReloadBoost,
        PolicyKind::PortErrMove,
    ];

    /// Every controller, the ways of using the SA included.
    pub const EVERY: [PolicyKind; 7] = [
        PolicyKind::Apm,
        PolicyKind::HwOnly,
        PolicyKind::ReloadLocal,
        PolicyKind::ReloadBoost,
        PolicyKind::PortErrMove,
        PolicyKind::ApmWildcard,
        PolicyKind::PerConnSa,
    ];

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Apm => "apm",
            PolicyKind::HwOnly => "hw-only",
            PolicyKind::ReloadLocal => "reload-local",
            PolicyKind::ReloadBoost => "reload-boost",
            PolicyKind::PortErrMove => "port-err-move",
            PolicyKind::ApmWildcard => "apm-wildcard",
            PolicyKind::PerConnSa => "per-conn-sa",
        }
    }

    /// Parse a report name.
    pub fn from_name(s: &str) -> Option<PolicyKind> {
        PolicyKind::EVERY.into_iter().find(|p| p.name() == s)
    }

    /// True when the hosts run apm's engine (its invariants are checked).
    pub fn is_apm_engine(self) -> bool {
        matches!(self, PolicyKind::Apm | PolicyKind::ApmWildcard)
    }

    /// True for the baselines apm must not do worse than: those that leave every move
    /// to the HCA, as applications do today (`hw-only`, `reload-local`,
    /// `reload-boost`). `port-err-move`, which moves at once, is compared with apm but
    /// not judged: no policy keeps every connection that both a policy that waits for
    /// the HCA and one that moves at once keep, since each wins the races of a second
    /// failure the other loses (`docs/dominance.md`).
    pub fn is_judged_baseline(self) -> bool {
        matches!(
            self,
            PolicyKind::HwOnly | PolicyKind::ReloadLocal | PolicyKind::ReloadBoost
        )
    }

    /// True for every baseline apm is compared with.
    pub fn is_baseline(self) -> bool {
        matches!(
            self,
            PolicyKind::HwOnly
                | PolicyKind::ReloadLocal
                | PolicyKind::ReloadBoost
                | PolicyKind::PortErrMove
        )
    }
}

/// A per-host connection manager in the engine's sans-IO shape.
pub trait Controller: std::fmt::Debug + Send {
    /// Feed one input.
    fn handle_input(&mut self, now: Time, input: Input);
    /// Protect a connection (the API call).
    fn protect(&mut self, now: Time, spec: ConnSpec);
    /// Let deadlines up to `now` pass.
    fn handle_timeout(&mut self, now: Time);
    /// The next output.
    fn poll_output(&mut self) -> Option<Output>;
    /// The next deadline.
    fn poll_timeout(&self) -> Option<Time>;
    /// The engine, when this is one (for getters in tests).
    fn engine(&self) -> Option<&Engine> {
        None
    }
}

/// The engine policy apm runs with in the simulator: the defaults, with liveness probes
/// on every path, InfiniBand ones included. In the simulator a probe rides a datagram of
/// its own on the rail (what a UD QP of apm's would carry), routed like data and never
/// lost to MAD loss; on a real InfiniBand fabric probes would ride vendor MADs on QP1,
/// which is why they are off there by default.
pub fn sim_policy() -> Policy {
    Policy {
        probe: ProbePolicy {
            enabled: true,
            infiniband: true,
            ..ProbePolicy::default()
        },
        ..Policy::default()
    }
}

/// `policy` with apm's SA economies undone, as `apm-wildcard` runs it: subscribed to
/// traps 64/65 on every port (a wildcard subscription: OpenSM sends every trap of the
/// subnet to it), every SA request out at once with no jitter.
pub fn wildcard_policy(policy: &Policy) -> Policy {
    Policy {
        subscribe: true,
        sa_max_outstanding: 0,
        sa_jitter_ms: 0,
        ..policy.clone()
    }
}

/// The apm engine as a controller, with its prober beside it as the `Manager` runs it
/// (`ProbeDriver`): probes in and out through the simulated fabric, verdicts to the
/// engine at once.
#[derive(Debug)]
pub struct ApmController {
    engine: Engine,
    probes: Option<ProbeDriver>,
    /// Connections were protected since the prober last looked at their paths.
    follow_due: bool,
    /// Probe sends waiting for `poll_output`.
    sends: VecDeque<Output>,
    next_send: u64,
}

/// Command ids of probe sends: apart from the engine's, never answered to it.
const PROBE_SEND: u64 = 1 << 63;

impl ApmController {
    /// An engine with `policy`; `seed` drives its prober's jitter.
    pub fn new(policy: Policy, seed: u64) -> Result<ApmController, apm_core::PolicyError> {
        let probes = ProbeDriver::new(&policy.probe, seed);
        Ok(ApmController {
            engine: Engine::new(policy)?,
            probes,
            follow_due: false,
            sends: VecDeque::new(),
            next_send: 0,
        })
    }

    /// Run the prober's due timers; its sends become outputs, its verdicts engine inputs.
    fn run_probes(&mut self, now: Time) {
        let Some(p) = self.probes.as_mut() else {
            return;
        };
        if std::mem::take(&mut self.follow_due) {
            p.follow(now, self.engine.follow_probe_paths());
        }
        for action in p.poll(now) {
            match action {
                ProbeAction::Send { port, to, msg } => {
                    self.next_send += 1;
                    let id = CommandId(PROBE_SEND | self.next_send);
                    let op = CommandOp::SendPeer { port, to, msg };
                    self.sends.push_back(Output::Command(Command { id, op }));
                }
                ProbeAction::Engine(input) => self.engine.handle_input(now, input),
            }
        }
    }
}

impl Controller for ApmController {
    fn handle_input(&mut self, now: Time, input: Input) {
        let input = match self.probes.as_mut() {
            Some(p) => p.on_input(now, input),
            None => Some(input),
        };
        if let Some(input) = input {
            self.engine.handle_input(now, input);
        }
        self.run_probes(now);
    }
    fn protect(&mut self, now: Time, spec: ConnSpec) {
        if let Err(e) = self.engine.protect(now, spec) {
            // The simulator protects each connection once; an error here is a
            // simulator bug worth seeing in the logs, not a crash.
            tracing::warn!(error = %e, "engine refused a simulator connection");
        }
        // Followed at the next timer: protecting n connections costs one walk, not n.
        self.follow_due = self.probes.is_some();
    }
    fn handle_timeout(&mut self, now: Time) {
        self.engine.handle_timeout(now);
        self.run_probes(now);
    }
    fn poll_output(&mut self) -> Option<Output> {
        self.sends.pop_front().or_else(|| self.engine.poll_output())
    }
    fn poll_timeout(&self) -> Option<Time> {
        let probes = self.probes.as_ref().and_then(|p| {
            if self.follow_due {
                Some(Time::ZERO)
            } else {
                p.next_deadline()
            }
        });
        [self.engine.poll_timeout(), probes]
            .into_iter()
            .flatten()
            .min()
    }
    fn engine(&self) -> Option<&Engine> {
        Some(&self.engine)
    }
}

/// The seed of host `host`'s prober in a run seeded `seed`: each host jitters on its
/// own stream, as hosts started together do. Managers driving simulated hosts (through
/// `SimProvider`) take the same, so a seed plays the same whoever runs the host.
pub fn probe_seed(seed: u64, host: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ host as u64
}

/// A controller of `kind`; `policy` and `seed` (its prober's jitter) are used by `apm`
/// and `apm-wildcard`, and `reload-boost` takes apm's alternate timeout from `policy`.
pub fn make(
    kind: PolicyKind,
    policy: &Policy,
    seed: u64,
) -> Result<Box<dyn Controller>, apm_core::PolicyError> {
    Ok(match kind {
        PolicyKind::Apm => Box::new(ApmController::new(policy.clone(), seed)?),
        PolicyKind::HwOnly => Box::new(Baseline::new(Rules::HW_ONLY)),
        PolicyKind::ReloadLocal => Box::new(Baseline::new(Rules::RELOAD_LOCAL)),
        PolicyKind::ReloadBoost => Box::new(Baseline::new(Rules {
            alternate_timeout_boost: policy.alternate_timeout_boost,
            ..Rules::RELOAD_LOCAL
        })),
        PolicyKind::PortErrMove => Box::new(Baseline::new(Rules {
            move_on_port_err: true,
            ..Rules::RELOAD_LOCAL
        })),
        PolicyKind::ApmWildcard => Box::new(ApmController::new(wildcard_policy(policy), seed)?),
        PolicyKind::PerConnSa => Box::new(PerConnSa::default()),
    })
}
