//! The simulator's one source of randomness: a small seeded PRNG (SplitMix64).
//!
//! Written here rather than taken from a crate so that the stream for a seed can never
//! change under us with a dependency update: the same seed must give byte-identical runs
//! across versions of the toolchain and of the lockfile. Never seeded from the clock.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, passes BigCrush, one add and a
/// few multiplies per draw. Plenty for fault schedules and loss decisions.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for `seed`. Different seeds give unrelated streams.
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed ^ 0x5851_f42d_4c95_7f2d,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0). The modulo bias is below 2^-40 for the small
    /// ranges used here, which is irrelevant to a simulation.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo + 1)
        }
    }

    /// True with probability `p` (clamped to 0..=1).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        // 53 random bits give a uniform float in [0, 1).
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// An independent generator derived from this one (for a sub-stream such as the
    /// fault generator, so that changing the workload does not shift the faults).
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng::new(self.next_u64() ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn ranges_hold() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let v = r.range(3, 5);
            assert!((3..=5).contains(&v));
            assert!(r.below(10) < 10);
        }
        assert!(!r.chance(0.0));
        assert!(r.chance(1.0));
    }
}
