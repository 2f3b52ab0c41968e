//! The engine's policy knobs, each with its default and the reason for it.
//!
//! `Policy` deserialises from TOML (durations in milliseconds, `*_ms` keys); missing keys
//! take the defaults below, unknown keys are an error so a typo never goes unnoticed.

pub use crate::probe::ProbePolicy;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a LAP from a source that is not the connection's peer gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum UnexpectedLap {
    /// Answer APR "rejected" (the default: the sender learns it is wrong; the QP is untouched).
    Reject,
    /// Drop it silently (for fabrics where answering strangers is undesirable).
    Ignore,
}

/// Which hardware-APM connections apm moves at once when their primary dies, rather
/// than leave the move to the HCA (which migrates when the QP's retries on the primary
/// run out, a whole retry budget after the traffic stalled: 537 ms at timeout 14).
///
/// A migration leaves a QP MIGRATED; once the engine has loaded the next alternate and
/// set REARM, the QP arms only when a packet of its peer's arrives (IBA; rdmavt's
/// `ruc_check_hdr`). Until then a failure of its new primary has nothing to migrate
/// to. A connection whose QP apm may post on is armed by apm's own zero-length write
/// (`CommandOp::ArmingWrite`) within a round trip of the move; one that only the
/// application's traffic arms stays unarmed for as long as that traffic pauses (a
/// second at one message a second, the whole gap between an application's bursts), and
/// a move at once then loses connections that staying on the old path, as the HCA
/// does, keeps (see `docs/dominance.md` for the measurements).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FastMoves {
    /// Move at once the connections apm arms itself after a move (its arming write
    /// accepted), and any connection whose stall is reported (its unacknowledged
    /// packets, sent again on the new path, arm it); leave the others to the HCA. The
    /// default.
    #[default]
    SelfArmed,
    /// Move every hardware-APM connection at once, whatever arms it afterwards.
    Always,
    /// Leave every hardware-APM move to the HCA. For devices that keep the QP's one
    /// ACK timeout on every path (rdmavt: hfi1, qib, soft-RoCE): there a connection
    /// moved at once keeps one retry budget on its new path where the HCA's own
    /// sequence gives the path it moves to a budget that starts later, and loses the
    /// races of a second failure that the HCA's timing wins (`alternate_timeout_boost`,
    /// which makes up for it, is not applied there).
    Never,
}

/// Tunable behaviour of the engine. See each field for its default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// First LAP retransmission timeout. Default 100 ms: well above a fabric round trip
    /// (sub-millisecond) plus the peer's modify_qp, short enough to re-arm quickly.
    pub lap_timeout_ms: u64,
    /// LAP attempts before giving up (first send included). Default 4 (with doubling:
    /// 100+200+400+800 ms = 1.5 s before the connection is reported unprotected).
    pub lap_max_tries: u32,
    /// After giving up (or when no candidate exists), try to re-arm again after this.
    /// Default 1000 ms, doubled on each consecutive failure up to `rearm_retry_max_ms`.
    pub rearm_retry_ms: u64,
    /// Cap of the re-arm retry backoff. Default 30000 ms.
    pub rearm_retry_max_ms: u64,
    /// How long the passive side waits for the active side's LAP before sending its own.
    /// Default 50 ms: the active side normally initiates; the passive side only steps in
    /// when it alone knows the reason to re-arm (e.g. its own port came back).
    pub passive_initiate_delay_ms: u64,
    /// A LAP that names our current primary while we are armed may mean the HCA migrated
    /// and we have not read its `PATH_MIG` event yet (the peer migrated on its own and
    /// proposes the path we just left: the re-arm race of docs/iba-facts.md, section
    /// 2): wait this long for the event before answering "is current". Default 20 ms.
    pub lap_defer_ms: u64,
    /// Hold-down of a port or remote GID that failed again within `flap_window_ms`:
    /// `hold_down_base_ms * 2^(failures-2)`, capped at `hold_down_max_ms`. A first failure
    /// is not held. Default 500 ms.
    pub hold_down_base_ms: u64,
    /// Cap of the hold-down. Default 30000 ms.
    pub hold_down_max_ms: u64,
    /// Failures further apart than this do not count as flapping. Default 10000 ms.
    pub flap_window_ms: u64,
    /// A path that failed as an alternate (`PATH_MIG_ERR`, APR rejection) is not proposed
    /// again for this connection for this long. Default 5000 ms.
    pub bad_path_hold_ms: u64,
    /// At most this many connections negotiate a new alternate at once; the others queue
    /// in order. Paces rearm storms after a rail returns. Default 256.
    pub max_concurrent_rearms: usize,
    /// Ask the fabric (SA PathRecord) for more paths when a connection has no usable
    /// candidate. Default true.
    pub resolve_paths: bool,
    /// Subscribe for traps 64/65 on every InfiniBand port. Default true.
    pub subscribe: bool,
    /// Retry a failed subscription after this. Default 1000 ms.
    pub subscribe_retry_ms: u64,
    /// A `PATH_MIG` within this long after a forced migration is that migration's own
    /// event, not a new one. Default 100 ms.
    pub forced_event_grace_ms: u64,
    /// A remote GID out of service for this long is checked with an SA PathRecord query
    /// (the SA routes only to ports that are up): the trap 64 that should have brought
    /// it back may have been lost (a Report given up, a subscription gone). Doubled
    /// after each check that finds it still unreachable, up to `remote_recheck_max_ms`.
    /// 0 disables. Default 5000 ms.
    pub remote_recheck_ms: u64,
    /// The longest interval between those checks. Default 60 000 ms.
    pub remote_recheck_max_ms: u64,
    /// At most this many SA requests (PathRecord queries, rechecks, subscriptions)
    /// outstanding at once; the others wait in order. The window halves when a
    /// request times out and grows back by one with each answer, up to this: pacing
    /// under the SA's back-pressure (a loaded OpenSM answers late, and a client that
    /// resends puts a second copy in the queue it waits in). 0: no limit, every
    /// request goes out at once. Default 0; a fabric of thousands of hosts wants a
    /// few (the simulator's 4,096-host scenario runs 8).
    pub sa_max_outstanding: usize,
    /// With `sa_max_outstanding`: the first SA request after a quiet spell waits up to
    /// this long, a pseudo-random delay drawn from the host's port GUID, so that hosts
    /// told of one failure at the same instant do not all ask in the same
    /// millisecond. Default 0.
    pub sa_jitter_ms: u64,
    /// What a LAP from a source that is not the connection's peer gets. Default reject.
    pub unexpected_lap: UnexpectedLap,
    /// Hardware APM: an alternate is loaded with a local ACK timeout this many steps
    /// (each doubles the retry budget) above the connection's own. On a device that
    /// applies the alternate's own timeout once the QP runs on it (mlx5 writes it into
    /// the alternate's address path), the transport then waits this much longer for a
    /// dead path to come back before giving up: a connection apm moved at once gave up
    /// the old path's budget, and if the new path dies before the QP could arm again
    /// only the new path's budget stands between it and ERR. A device that keeps the
    /// QP's one timeout on every path (rdmavt: a migration never applies
    /// `alt_timeout`) ignores it. Default 2: four times the budget (2.15 s at timeout 14
    /// and retry count 7, against the HCA's 1.07 s for two budgets). The price: on such
    /// a path a lost packet waits four times as long for its retransmission, and a path
    /// that comes back is found up to one (longer) retry interval later. 0 keeps the
    /// connection's own timeout.
    pub alternate_timeout_boost: u8,
    /// Which hardware-APM connections move at once when their primary dies: see
    /// [`FastMoves`]. Default `self_armed`. Software moves (RoCE) need no arming and
    /// always go at once.
    pub fast_moves: FastMoves,
    /// Liveness probes per path (`[policy.probe]`): see [`ProbePolicy`]'s fields.
    pub probe: ProbePolicy,
    /// A command the provider has not answered this long after it was handed over is
    /// treated as failed (the driver abandons the call), so that a provider call that
    /// never returns neither wedges its connection nor holds up the commands after it.
    /// Default 10 000 ms: five times the longest any provider's own bounded operation
    /// takes by design (provider-rxe's SQ drain before a software migration, 2 s by
    /// default; an SA query with its retries, under a second; a `modify_qp`, a send,
    /// microseconds to milliseconds), so it only ever ends a call that is stuck.
    pub command_timeout_ms: u64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            lap_timeout_ms: 100,
            lap_max_tries: 4,
            rearm_retry_ms: 1000,
            rearm_retry_max_ms: 30_000,
            passive_initiate_delay_ms: 50,
            lap_defer_ms: 20,
            hold_down_base_ms: 500,
            hold_down_max_ms: 30_000,
            flap_window_ms: 10_000,
            bad_path_hold_ms: 5000,
            max_concurrent_rearms: 256,
            resolve_paths: true,
            subscribe: true,
            subscribe_retry_ms: 1000,
            forced_event_grace_ms: 100,
            remote_recheck_ms: 5000,
            remote_recheck_max_ms: 60_000,
            sa_max_outstanding: 0,
            sa_jitter_ms: 0,
            unexpected_lap: UnexpectedLap::Reject,
            alternate_timeout_boost: 2,
            fast_moves: FastMoves::SelfArmed,
            probe: ProbePolicy::default(),
            command_timeout_ms: 10_000,
        }
    }
}

/// Why a policy is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A setting is out of its range.
    #[error("policy setting `{field}` = {value}: {why}")]
    OutOfRange {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What is wrong.
        why: &'static str,
    },
}

impl Policy {
    /// Check the settings against their ranges: the first setting out of its range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every setting out of its range, in [`Policy::validate`]'s order (a reader of a
    /// file reports them all at once).
    pub fn problems(&self) -> Vec<PolicyError> {
        let mut out = Vec::new();
        let nonzero: [(&'static str, u64); 6] = [
            ("lap_timeout_ms", self.lap_timeout_ms),
            ("lap_max_tries", u64::from(self.lap_max_tries)),
            ("rearm_retry_ms", self.rearm_retry_ms),
            ("subscribe_retry_ms", self.subscribe_retry_ms),
            ("max_concurrent_rearms", self.max_concurrent_rearms as u64),
            ("command_timeout_ms", self.command_timeout_ms),
        ];
        for (field, value) in nonzero {
            if value == 0 {
                out.push(PolicyError::OutOfRange {
                    field,
                    value,
                    why: "must be at least 1",
                });
            }
        }
        if self.rearm_retry_max_ms < self.rearm_retry_ms {
            out.push(PolicyError::OutOfRange {
                field: "rearm_retry_max_ms",
                value: self.rearm_retry_max_ms,
                why: "must be at least rearm_retry_ms",
            });
        }
        if self.hold_down_max_ms < self.hold_down_base_ms {
            out.push(PolicyError::OutOfRange {
                field: "hold_down_max_ms",
                value: self.hold_down_max_ms,
                why: "must be at least hold_down_base_ms",
            });
        }
        if self.remote_recheck_ms > 0 && self.remote_recheck_max_ms < self.remote_recheck_ms {
            out.push(PolicyError::OutOfRange {
                field: "remote_recheck_max_ms",
                value: self.remote_recheck_max_ms,
                why: "must be at least remote_recheck_ms",
            });
        }
        if self.sa_jitter_ms > 60_000 {
            out.push(PolicyError::OutOfRange {
                field: "sa_jitter_ms",
                value: self.sa_jitter_ms,
                why: "at most 60000: a minute's delay before asking the SA helps nobody",
            });
        }
        if self.sa_max_outstanding > 65_536 {
            out.push(PolicyError::OutOfRange {
                field: "sa_max_outstanding",
                value: self.sa_max_outstanding as u64,
                why: "at most 65536 (0 for no limit)",
            });
        }
        out.extend(self.probe.problems());
        if self.alternate_timeout_boost > 8 {
            out.push(PolicyError::OutOfRange {
                field: "alternate_timeout_boost",
                value: u64::from(self.alternate_timeout_boost),
                why: "more than 8 steps multiplies the retry budget by over 256",
            });
        }
        if self.lap_max_tries > 32 {
            out.push(PolicyError::OutOfRange {
                field: "lap_max_tries",
                value: u64::from(self.lap_max_tries),
                why: "more than 32 tries would back off for years",
            });
        }
        out
    }

    pub(crate) fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_lists_every_setting_out_of_range_and_validate_the_first() {
        assert_eq!(Policy::default().problems(), Vec::new());
        let mut p = Policy {
            lap_timeout_ms: 0,
            sa_jitter_ms: 60_001,
            ..Policy::default()
        };
        p.probe.multiplier = 0;
        let fields: Vec<&str> = p
            .problems()
            .into_iter()
            .map(|e| match e {
                PolicyError::OutOfRange { field, .. } => field,
            })
            .collect();
        assert_eq!(
            fields,
            ["lap_timeout_ms", "sa_jitter_ms", "probe.multiplier"]
        );
        assert_eq!(p.validate(), Err(p.problems().swap_remove(0)));
    }
}
