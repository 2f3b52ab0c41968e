//! Flap damping of one probe session, after BGP's route-flap damping (RFC 2439): every
//! time the session leaves Up it earns a penalty of one flap; the penalty decays
//! exponentially with a half-life; at the `suppress`-th flap in quick succession (a
//! penalty above `suppress - 0.5`, so that the decay between quick flaps does not let
//! the last one slip under) the session's return is held (the engine does not arm onto
//! the path, but still moves a connection with a dead primary onto it: a flapping path
//! beats a dead one) until the penalty has decayed to half that threshold. The hold therefore grows
//! with the flaps (about one half-life at the threshold, one more per doubling of the
//! penalty) and is capped at `max_hold`: the penalty never exceeds what decays to the
//! reuse level in that time (RFC 2439's ceiling).
//!
//! Why: a path that comes and goes makes apm move every connection over it back and
//! forth, each move a drain, a modify and a LAP exchange on both sides, and each return
//! onto it a bet that it stays; a BFD session is the wrong place to learn a path is
//! unstable one flap at a time. RFC 5880 leaves damping to its clients and BFD
//! implementations add it on top in this same shape (exponential decay, suppress and
//! reuse thresholds, a maximum hold). A single failure and its repair (one flap) is
//! never held: the return of a path after one cut is reported at once.

use crate::types::Time;
use std::time::Duration;

/// The damping settings, from the probe policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DampingRule {
    /// The penalty halves in this time; zero turns damping off.
    pub(crate) half_life: Duration,
    /// The flap (counted with decay) that makes a return held.
    pub(crate) suppress: f64,
    /// The longest a return is held.
    pub(crate) max_hold: Duration,
}

impl DampingRule {
    /// The penalty above which returns are held.
    fn threshold(&self) -> f64 {
        self.suppress - 0.5
    }

    /// The penalty at which a held return is let through: half the threshold.
    fn reuse(&self) -> f64 {
        self.threshold() / 2.0
    }

    /// The highest penalty: the one that decays to the reuse level in `max_hold`.
    fn ceiling(&self) -> f64 {
        let halvings = self.max_hold.as_secs_f64() / self.half_life.as_secs_f64();
        self.reuse() * halvings.exp2()
    }

    fn off(&self) -> bool {
        self.half_life.is_zero()
    }
}

/// One session's flap history.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Damping {
    /// The penalty as of `at`.
    penalty: f64,
    at: Time,
    /// Returns are held until the penalty decays to the reuse level.
    suppressed: bool,
}

impl Damping {
    /// The penalty now.
    fn decayed(&self, rule: &DampingRule, now: Time) -> f64 {
        if self.penalty == 0.0 || rule.off() {
            return 0.0;
        }
        let halvings = now.since(self.at).as_secs_f64() / rule.half_life.as_secs_f64();
        self.penalty * (-halvings).exp2()
    }

    /// The session left Up: one more flap.
    pub(crate) fn flap(&mut self, rule: &DampingRule, now: Time) {
        if rule.off() {
            return;
        }
        self.penalty = (self.decayed(rule, now) + 1.0).min(rule.ceiling());
        self.at = now;
        if self.penalty > rule.threshold() {
            self.suppressed = true;
        }
    }

    /// When a return at `now` may be reported: `None` at once, or the time the penalty
    /// reaches the reuse level. Ends a suppression whose penalty has decayed.
    pub(crate) fn release_at(&mut self, rule: &DampingRule, now: Time) -> Option<Time> {
        if !self.suppressed {
            return None;
        }
        let p = self.decayed(rule, now);
        if p <= rule.reuse() {
            self.suppressed = false;
            return None;
        }
        let wait = rule.half_life.mul_f64((p / rule.reuse()).log2());
        Some(
            now.plus(wait.min(rule.max_hold))
                .max(now.plus(Duration::from_nanos(1))),
        )
    }

    /// Whether returns are held now.
    #[cfg(test)]
    pub(crate) fn suppressed(&self) -> bool {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> DampingRule {
        DampingRule {
            half_life: Duration::from_secs(5),
            suppress: 3.0,
            max_hold: Duration::from_secs(30),
        }
    }

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn one_or_two_flaps_are_never_held() {
        let mut d = Damping::default();
        d.flap(&rule(), at(0));
        assert_eq!(d.release_at(&rule(), at(100)), None);
        d.flap(&rule(), at(200));
        assert_eq!(d.release_at(&rule(), at(300)), None);
        assert!(!d.suppressed());
    }

    #[test]
    fn the_third_quick_flap_holds_for_a_little_more_than_a_half_life() {
        let mut d = Damping::default();
        for t in [0, 100, 200] {
            d.flap(&rule(), at(t));
        }
        assert!(d.suppressed());
        let release = d.release_at(&rule(), at(300)).expect("held");
        let hold = release.since(at(300));
        // A penalty just under 3 decays to 1.25 in about 1.25 half-lives.
        assert!(
            hold > Duration::from_secs(6) && hold < Duration::from_millis(6500),
            "{hold:?}"
        );
        // At that time it is let through, and the suppression ends.
        assert_eq!(d.release_at(&rule(), release), None);
        assert!(!d.suppressed());
    }

    #[test]
    fn the_hold_grows_with_the_flaps_up_to_the_maximum() {
        let mut holds = Vec::new();
        let mut d = Damping::default();
        for k in 0..100u64 {
            d.flap(&rule(), at(k * 10));
            if let Some(r) = d.release_at(&rule(), at(k * 10 + 1)) {
                holds.push(r.since(at(k * 10 + 1)));
            }
        }
        assert!(holds.windows(2).all(|w| w[1] >= w[0]), "{holds:?}");
        assert!(holds[0] < Duration::from_millis(6500), "{holds:?}");
        let last = *holds.last().expect("held");
        assert!(last <= Duration::from_secs(30), "{last:?}");
        assert!(last > Duration::from_secs(29), "{last:?}");
    }

    #[test]
    fn flaps_spread_out_decay_and_are_never_held() {
        let mut d = Damping::default();
        // One flap every 10 s: the penalty never gets near 3.
        for k in 0..20u64 {
            d.flap(&rule(), at(k * 10_000));
            assert_eq!(d.release_at(&rule(), at(k * 10_000 + 50)), None);
        }
    }

    #[test]
    fn a_zero_half_life_turns_damping_off() {
        let off = DampingRule {
            half_life: Duration::ZERO,
            ..rule()
        };
        let mut d = Damping::default();
        for t in 0..10 {
            d.flap(&off, at(t));
        }
        assert_eq!(d.release_at(&off, at(20)), None);
    }
}
