//! Pacing of the engine's SA requests (PathRecord queries, rechecks, subscriptions):
//! at most `Policy::sa_max_outstanding` out at once, the others waiting in order; the
//! window halves when a request times out and grows back by one with each answer (an
//! SA under load answers late, and a client that resends adds a second copy to the
//! queue it waits in: OpenSM answers both, so resending faster only deepens the
//! queue); and the first request after a quiet spell waits `Policy::sa_jitter_ms` at
//! most, pseudo-randomly per host, so that hosts told of one failure at the same
//! instant do not all ask in the same millisecond. Off (every request out at once)
//! unless the policy sets them.

use super::timers::TimerKey;
use super::{Engine, Pending};
use crate::io::{CommandOp, CommandOutcome, ProviderError};
use crate::policy::Policy;
use crate::types::Time;
use std::collections::VecDeque;

/// The requests held back and the window.
#[derive(Debug, Default)]
pub(crate) struct SaGate {
    waiting: VecDeque<(CommandOp, Pending)>,
    outstanding: usize,
    /// Requests allowed out at once now (up to `sa_max_outstanding`); 0 until first
    /// used.
    window: usize,
    /// Nothing goes out before this (the jitter of the current burst).
    hold_until: Time,
    /// Bursts started so far (each draws its own jitter).
    bursts: u64,
}

/// A pseudo-random number from `seed` (splitmix64): the jitter must differ between
/// hosts and between bursts, and replay the same for the same inputs.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Engine {
    /// Issue an SA request, through the gate when the policy paces them.
    pub(super) fn issue_sa(&mut self, op: CommandOp, why: Pending) {
        let max = self.policy.sa_max_outstanding;
        if max == 0 {
            self.issue(op, why);
            return;
        }
        let gate = &mut self.sa_gate;
        if gate.window == 0 {
            gate.window = max;
        }
        if gate.outstanding == 0 && gate.waiting.is_empty() && self.policy.sa_jitter_ms > 0 {
            // A new burst: this host's own delay before its first request.
            gate.bursts += 1;
            let host = self
                .ports
                .values()
                .filter_map(|p| p.info.gids.first())
                .map(|g| g.guid())
                .min()
                .unwrap_or(0);
            let jitter = mix(host ^ mix(gate.bursts)) % (self.policy.sa_jitter_ms + 1);
            gate.hold_until = self.now.plus(Policy::ms(jitter));
            if gate.hold_until > self.now {
                self.timers.schedule(gate.hold_until, TimerKey::SaRelease);
            }
        }
        self.sa_gate.waiting.push_back((op, why));
        self.release_sa();
    }

    /// Let out what the window and the jitter allow.
    pub(super) fn release_sa(&mut self) {
        while self.now >= self.sa_gate.hold_until && self.sa_gate.outstanding < self.sa_gate.window
        {
            let Some((op, why)) = self.sa_gate.waiting.pop_front() else {
                break;
            };
            self.sa_gate.outstanding += 1;
            self.issue(op, why);
        }
    }

    /// An SA request came back (or ran out of time): its slot is free, and its fate
    /// moves the window.
    pub(super) fn sa_answered(&mut self, result: &Result<CommandOutcome, ProviderError>) {
        let max = self.policy.sa_max_outstanding;
        if max == 0 {
            return;
        }
        let gate = &mut self.sa_gate;
        gate.outstanding = gate.outstanding.saturating_sub(1);
        gate.window = match result {
            Err(ProviderError::Timeout { .. } | ProviderError::NoAnswer { .. }) => {
                (gate.window / 2).max(1)
            }
            _ => (gate.window + 1).min(max),
        };
        self.release_sa();
    }
}
