//! When a session's probes go out: slots on a jittered grid whose times are known in
//! closed form, so that the time of any probe is computable without the ones before
//! it.
//!
//! RFC 5880 6.8.7 asks for every interval to be shortened by a random 0 to 25%, so that
//! senders never lock step. A chain of such intervals (each send drawing the next) has
//! the same spread, but the time of its k-th probe is known only by drawing the k-1
//! before it. Here slot `k >= 1` of a grid anchored at `a` with interval `I` goes out at
//! `a + I/8 + p + 7(k-1)I/8 + j_k`, the phase `p` drawn in `[0, 3I/4)` and `j_k` in
//! `[0, I/8]` from a hash of the prober's seed, the grid's salt and `k`: two consecutive
//! slots are `3I/4` to `I` apart (the RFC's range, a mean of `7I/8` as before), the
//! first comes `I/8` to `I` after the anchor (sooner is harmless; the phase spreads
//! sessions that started together over the interval, where a chain of draws spreads
//! them by its random walk), and the k-th is a formula. What that buys:
//! a simulator that carries no probe over a healthy path still knows, when the path
//! fails, which probe was the last to cross it (`park.rs`).
//!
//! Slot 0 is the anchor itself: a send "at once" (a session that starts, changes state,
//! or must tell its peer of a port) re-anchors the grid there, as the chain of draws
//! restarted at such a send.

use crate::types::Time;
use std::time::Duration;

/// One session's grid of send slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Grid {
    anchor: Time,
    /// The interval in nanoseconds (at least 1).
    interval_ns: u64,
    salt: u64,
    /// The next slot to send.
    pub(super) next: u64,
}

impl Grid {
    /// A grid whose slot 0, the next to send, is `at`.
    pub(super) fn start(at: Time, interval: Duration, salt: u64) -> Grid {
        Grid {
            anchor: at,
            interval_ns: u64::try_from(interval.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            salt,
            next: 0,
        }
    }

    /// The interval the grid was drawn for.
    pub(super) fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    /// When slot `k` goes out.
    pub(super) fn slot(&self, k: u64) -> Time {
        if k == 0 {
            return self.anchor;
        }
        let jitter = mix(self.salt ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % (self.spread() + 1);
        let at = self.first() + u128::from(k - 1) * self.step() + u128::from(jitter);
        Time(u64::try_from(at).unwrap_or(u64::MAX))
    }

    /// The mean gap between slots, `7I/8`.
    fn step(&self) -> u128 {
        (u128::from(self.interval_ns) * 7 / 8).max(1)
    }

    /// The jitter's range, `I/8`.
    fn spread(&self) -> u64 {
        self.interval_ns / 8
    }

    /// The earliest slot 1 can be: `a + I/8 + p`.
    fn first(&self) -> u128 {
        let phase = u128::from(mix(self.salt)) % (u128::from(self.spread()) * 6).max(1);
        u128::from(self.anchor.0) + u128::from(self.spread()) + phase
    }

    /// When the next slot goes out.
    pub(super) fn next_at(&self) -> Time {
        self.slot(self.next)
    }

    /// The last slot from `next` on that goes out before `t`, and how many slots from
    /// `next` to it: what a session that stopped sending at `next` would have sent by
    /// `t`. Constant time.
    pub(super) fn sent_by(&self, t: Time) -> (u64, Option<Time>) {
        let before = |k: u64| self.slot(k) < t;
        if !before(self.next) {
            return (0, None);
        }
        // Slot k >= 1 is at least first + 7(k-1)I/8: none past the estimate below
        // is before `t`, and the last one before it is within two of it.
        let est = u128::from(t.0).saturating_sub(self.first()) / self.step();
        let mut k = u64::try_from(est).unwrap_or(u64::MAX - 2).saturating_add(2);
        while k > self.next && !before(k) {
            k -= 1;
        }
        (k - self.next + 1, Some(self.slot(k)))
    }
}

/// The salt of a grid: the prober's seed, the session's identity and how many grids it
/// had before (so that a re-anchored grid draws afresh).
pub(super) fn salt(seed: u64, session: u64, anchors: u64) -> u64 {
    mix(seed ^ mix(session ^ mix(anchors.wrapping_add(0x632B_E59B_D9B4_E019))))
}

/// splitmix64's finaliser: a bijection that spreads every input bit over the output.
pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_slots_are_three_quarters_to_one_interval_apart() {
        for seed in 0..50 {
            let g = Grid::start(Time(1_000_000), Duration::from_millis(15), salt(seed, 7, 0));
            for k in 1..200 {
                let gap = g.slot(k + 1).0 - g.slot(k).0;
                assert!(
                    (11_250_000..=15_000_000).contains(&gap),
                    "{seed} {k}: {gap}"
                );
            }
            let first = g.slot(1).0 - g.slot(0).0;
            assert!((1_875_000..=15_000_000).contains(&first), "{first}");
        }
    }

    #[test]
    fn sent_by_finds_the_last_slot_before_a_time_as_counting_would() {
        let mut g = Grid::start(Time(5), Duration::from_micros(15_003), salt(3, 9, 1));
        g.next = 4;
        for t in (0..2_000_000_000u64).step_by(777_777) {
            let counted: Vec<u64> = (4..10_000).filter(|&k| g.slot(k) < Time(t)).collect();
            let want = (counted.len() as u64, counted.last().map(|&k| g.slot(k)));
            assert_eq!(g.sent_by(Time(t)), want, "t {t}");
        }
    }
}
