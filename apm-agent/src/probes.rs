//! The agent's liveness probes: one [`Prober`] per host for every protected process, so
//! that a host with 64 processes talking to the same peers sends one probe per path,
//! not 64 (the cost is O(peers x rails), never O(QPs) or O(processes)).
//!
//! The paths come from the processes' registrations ([`crate::wire::Route::paths`]);
//! probes travel between agents on the peer port like every other peer message and are
//! never routed to a process; verdicts (a path down, of which kind, or back) go to
//! every process as [`crate::wire::FromAgent::Path`], whose engine moves the
//! connections on it and stops arming onto it.
//!
//! The agent sees no port events (the processes do): a local port's death shows here as
//! the fabric's, and the processes' own PORT_ERR is what moves their connections first.
//!
//! Watchers (`apm watch --agent`) get the same verdicts; with none attached, telling
//! them costs a look at an empty map.

use apm_core::probe::{
    PathEnds, PathVerdict, Probe, ProbeOutput, ProbePolicy, Prober, SessionState,
};
use apm_core::{Gid, Time};
use std::collections::BTreeSet;
use tokio::time::Instant;

/// What the probe loop must do after a step.
#[derive(Debug, Default)]
pub(crate) struct Step {
    /// Probes to send: (from this GID, the probe).
    pub(crate) sends: Vec<(Gid, Probe)>,
    /// Verdicts for every process and watcher.
    pub(crate) verdicts: Vec<(PathEnds, PathVerdict)>,
}

/// The prober and the agent's clock.
#[derive(Debug)]
pub(crate) struct AgentProbes {
    prober: Prober,
    origin: Instant,
}

impl AgentProbes {
    pub(crate) fn new(policy: ProbePolicy) -> AgentProbes {
        AgentProbes {
            prober: Prober::new(policy, u64::from(std::process::id())),
            origin: Instant::now(),
        }
    }

    /// The agent's time, as the prober counts it.
    pub(crate) fn now(&self) -> Time {
        let d = Instant::now().saturating_duration_since(self.origin);
        Time(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// When the prober next has work, as a tokio instant.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.prober
            .next_deadline()
            .map(|t| self.origin + std::time::Duration::from_nanos(t.0))
    }

    /// Probe exactly `paths` from now on.
    pub(crate) fn follow(&mut self, paths: BTreeSet<PathEnds>) {
        let now = self.now();
        self.prober.follow(now, &paths);
    }

    /// A probe arrived from a peer's agent.
    pub(crate) fn receive(&mut self, probe: &Probe) {
        let now = self.now();
        self.prober.receive(now, probe);
    }

    /// Run the due timers and collect what to do.
    pub(crate) fn step(&mut self) -> Step {
        let now = self.now();
        self.prober.poll_timers(now);
        let mut step = Step::default();
        while let Some(o) = self.prober.poll_output() {
            // Every Up, the first too (see apm-core's `ProbeDriver::poll`): a process
            // may hold a path dead that the agent stopped watching. A hold goes as its
            // length: the processes' engines count time from their own starts.
            match o {
                ProbeOutput::Send { ends, probe } => step.sends.push((ends.local, probe)),
                verdict => step.verdicts.extend(PathVerdict::of_output(&verdict, now)),
            }
        }
        step
    }

    /// Every path probed, with its session's state (for a watcher that attaches).
    pub(crate) fn sessions(&self) -> Vec<(PathEnds, SessionState)> {
        self.prober.sessions().collect()
    }
}
