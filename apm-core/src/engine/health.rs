//! Health of local ports and remote port GIDs: up or down, and flap hold-down.
//!
//! A port or GID that fails again within the flap window is held down after it comes
//! back, for `base * 2^(failures-2)` capped at `max`; a first failure is not held. While
//! held it counts as dead: no command may move a connection onto it.

use crate::policy::Policy;
use crate::types::Time;

/// Health record of one port or remote GID.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    pub(crate) up: bool,
    /// Consecutive failures within the flap window.
    pub(crate) failures: u32,
    pub(crate) last_failure: Option<Time>,
    /// Held down until then even though it is up.
    pub(crate) hold_until: Time,
}

impl Health {
    /// Up until told otherwise (a remote GID the engine has heard nothing about).
    pub(crate) fn up() -> Health {
        Health::new(true)
    }

    pub(crate) fn new(up: bool) -> Health {
        Health {
            up,
            failures: 0,
            last_failure: None,
            hold_until: Time::ZERO,
        }
    }

    /// Usable now: up and not held down.
    pub(crate) fn usable(&self, now: Time) -> bool {
        self.up && now >= self.hold_until
    }

    /// Record a failure. Returns true when it changed the state.
    pub(crate) fn fail(&mut self, now: Time, policy: &Policy) -> bool {
        if !self.up {
            return false;
        }
        self.up = false;
        let window = Policy::ms(policy.flap_window_ms);
        self.failures = match self.last_failure {
            Some(last) if now.since(last) <= window => self.failures.saturating_add(1),
            _ => 1,
        };
        self.last_failure = Some(now);
        true
    }

    /// Record a recovery. Returns `Some(hold_until)` when it changed the state (the time
    /// from which the resource is usable; `now` when not held).
    pub(crate) fn recover(&mut self, now: Time, policy: &Policy) -> Option<Time> {
        if self.up {
            return None;
        }
        self.up = true;
        self.hold_until = if self.failures >= 2 {
            let shift = (self.failures - 2).min(30);
            let hold = policy
                .hold_down_base_ms
                .saturating_mul(1u64 << shift)
                .min(policy.hold_down_max_ms);
            now.plus(Policy::ms(hold))
        } else {
            now
        };
        Some(self.hold_until)
    }
}
