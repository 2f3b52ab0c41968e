//! The host's probe budget: how fast its sessions send so that all of them together
//! stay within `max_probes_per_sec`, whatever the number of paths, and the detection
//! time that follows (what `apm agent --explain` prints).
//!
//! Probes go out on a grid whose gaps average 7/8 of the interval (`schedule.rs`), so
//! `n` sessions at interval `I` send `8n / 7I` probes a second: the interval is stretched
//! to `8n / (7 x budget)` once that exceeds the policy's. Sessions that are not Up send
//! at `down_interval_ms`, stretched the same way, so a rail that dies with thousands of
//! sessions on it does not blow the budget either.

use super::ProbePolicy;
use serde::Serialize;
use std::time::Duration;

/// What a number of probed paths costs and buys under a policy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Budget {
    /// Paths probed (one session each).
    pub paths: usize,
    /// The most probes a second the host sends ([`ProbePolicy::max_probes_per_sec`]).
    pub max_probes_per_sec: u32,
    /// The interval Up sessions send at: the policy's, or stretched.
    #[serde(serialize_with = "as_ms")]
    pub interval: Duration,
    /// The interval sessions that are not Up send at.
    #[serde(serialize_with = "as_ms")]
    pub down_interval: Duration,
    /// The interval was stretched to keep within the budget.
    pub stretched: bool,
    /// Probes a second the host sends with every session Up (on average).
    pub probes_per_sec: f64,
    /// A silent failure of a path is found between these two times after it: the
    /// multiplier times the interval after the last probe heard, which crossed the
    /// path at most one interval before the failure.
    #[serde(serialize_with = "as_ms")]
    pub detection_min: Duration,
    /// See `detection_min`.
    #[serde(serialize_with = "as_ms")]
    pub detection_max: Duration,
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

impl ProbePolicy {
    /// What probing `paths` paths costs and buys under this policy.
    pub fn budget(&self, paths: usize) -> Budget {
        let interval = self.stretched(self.interval_ms, paths);
        let base = Duration::from_millis(u64::from(self.interval_ms));
        let mult = u32::from(self.multiplier.max(1));
        Budget {
            paths,
            max_probes_per_sec: self.max_probes_per_sec,
            interval,
            down_interval: self.stretched(self.down_interval_ms, paths),
            stretched: interval > base,
            probes_per_sec: paths as f64 * 8.0 / 7.0 / interval.as_secs_f64(),
            detection_min: interval * (mult - 1),
            detection_max: interval * mult,
        }
    }

    /// `interval_ms`, stretched so that `paths` sessions sending at it keep within
    /// `max_probes_per_sec` on average.
    pub(super) fn stretched(&self, interval_ms: u32, paths: usize) -> Duration {
        let base = Duration::from_millis(u64::from(interval_ms));
        let cap = u128::from(self.max_probes_per_sec.max(1));
        let ns = (paths as u128) * 8 * 1_000_000_000 / (7 * cap);
        base.max(Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_at_any_number_of_paths() {
        let p = ProbePolicy {
            enabled: true,
            ..ProbePolicy::default()
        };
        for paths in [1, 2, 16, 100, 256, 1_000, 4_096, 8_192, 100_000] {
            let b = p.budget(paths);
            assert!(
                b.probes_per_sec <= f64::from(p.max_probes_per_sec) * 1.000_001,
                "{paths}: {b:?}"
            );
            assert!(b.down_interval >= b.interval, "{paths}: {b:?}");
            assert_eq!(b.stretched, b.interval > Duration::from_millis(15));
        }
        // Unstretched: the policy's own interval and detection.
        let small = p.budget(16);
        assert_eq!(small.interval, Duration::from_millis(15));
        assert_eq!(small.detection_max, Duration::from_millis(45));
    }
}
