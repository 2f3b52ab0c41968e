//! [`PathVerdict`]: what a prober says about one path, in the one shape its listeners
//! share: the engine's inputs (`Input::PathDown`/`PathUp`/`PathHeld`), the Manager's
//! fabric event stream (`apm watch --sim`), and the verdicts `apm run`'s host agent
//! sends its processes and its watchers (`apm watch --agent`).
//!
//! A hold crosses clocks (the agent's prober and a process's engine count time from
//! different starts), so a verdict carries how long the hold lasts, never when it ends.

use super::{FailureKind, PathEnds, ProbeOutput};
use crate::io::Input;
use crate::types::Time;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A probe session's verdict on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum PathVerdict {
    /// The session went down: this host's port, the peer's, or the fabric between.
    Down {
        /// What kind of failure the prober saw.
        kind: FailureKind,
    },
    /// The session is up (the first time, or again): the path is usable.
    Up,
    /// The session is up again, but the path has been flapping: nothing is armed onto
    /// it for `hold_ms` more (a connection whose primary is dead still moves onto it).
    Held {
        /// How long the hold lasts from the verdict on, in milliseconds.
        hold_ms: u64,
    },
}

impl PathVerdict {
    /// The name `apm watch` prints: `path_down`, `path_up`, `path_held`.
    pub fn name(self) -> &'static str {
        match self {
            PathVerdict::Down { .. } => "path_down",
            PathVerdict::Up => "path_up",
            PathVerdict::Held { .. } => "path_held",
        }
    }

    /// The failure kind of a verdict down.
    pub fn failure(self) -> Option<FailureKind> {
        match self {
            PathVerdict::Down { kind } => Some(kind),
            _ => None,
        }
    }

    /// The verdict a prober's output carries, at `now` (a send carries none).
    pub fn of_output(output: &ProbeOutput, now: Time) -> Option<(PathEnds, PathVerdict)> {
        match *output {
            ProbeOutput::Send { .. } => None,
            ProbeOutput::Down { ends, kind } => Some((ends, PathVerdict::Down { kind })),
            ProbeOutput::Up {
                ends, held_until, ..
            } => Some((ends, PathVerdict::held_until(held_until, now))),
        }
    }

    /// The verdict an engine input carries, at `now` (the other inputs carry none).
    pub fn of_input(input: &Input, now: Time) -> Option<(PathEnds, PathVerdict)> {
        match *input {
            Input::PathDown { ends, kind } => Some((ends, PathVerdict::Down { kind })),
            Input::PathUp { ends } => Some((ends, PathVerdict::Up)),
            Input::PathHeld { ends, until } => {
                Some((ends, PathVerdict::held_until(Some(until), now)))
            }
            _ => None,
        }
    }

    /// The engine input of this verdict on `ends`, received at `now`.
    pub fn input(self, ends: PathEnds, now: Time) -> Input {
        match self {
            PathVerdict::Down { kind } => Input::PathDown { ends, kind },
            PathVerdict::Up | PathVerdict::Held { hold_ms: 0 } => Input::PathUp { ends },
            PathVerdict::Held { hold_ms } => Input::PathHeld {
                ends,
                until: now.plus(Duration::from_millis(hold_ms)),
            },
        }
    }

    /// Up, or held until `until` as seen at `now` (rounded up to a whole millisecond,
    /// so that a hold is never cut short).
    fn held_until(until: Option<Time>, now: Time) -> PathVerdict {
        match until {
            Some(t) if t > now => {
                let ns = t.since(now).as_nanos();
                let hold_ms = u64::try_from(ns.div_ceil(1_000_000)).unwrap_or(u64::MAX);
                PathVerdict::Held { hold_ms }
            }
            _ => PathVerdict::Up,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Gid;

    #[test]
    fn a_hold_crosses_clocks_as_a_duration() {
        let ends = PathEnds {
            local: Gid::from_guid(1),
            remote: Gid::from_guid(2),
        };
        let now = Time::from_millis(1_000);
        let out = ProbeOutput::Up {
            ends,
            after_down: true,
            held_until: Some(Time::from_micros(7_000_500)),
        };
        let (e, v) = PathVerdict::of_output(&out, now).expect("a verdict");
        assert_eq!((e, v), (ends, PathVerdict::Held { hold_ms: 6_001 }));
        // Another clock: the hold ends that long after it is heard.
        let there = Time::from_millis(50);
        assert_eq!(
            v.input(ends, there),
            Input::PathHeld {
                ends,
                until: Time::from_millis(6_051)
            }
        );
        let past = ProbeOutput::Up {
            ends,
            after_down: true,
            held_until: Some(now),
        };
        assert_eq!(
            PathVerdict::of_output(&past, now),
            Some((ends, PathVerdict::Up))
        );
        let down = PathVerdict::Down {
            kind: FailureKind::PeerPort,
        };
        assert_eq!(down.failure(), Some(FailureKind::PeerPort));
        assert_eq!(
            PathVerdict::of_input(&down.input(ends, now), now),
            Some((ends, down))
        );
        assert_eq!(
            serde_json::to_string(&down).expect("json"),
            r#"{"state":"down","kind":"peer_port"}"#
        );
    }
}
