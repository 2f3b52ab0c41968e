//! The progress monitor's rule: when outstanding sends that stopped completing, or a
//! failed send, make a stalled path, and how often it is reported or repaired. Pure: the
//! caller takes the view under its lock and passes the time.

use super::Stall;
use std::time::{Duration, Instant};

/// What the stall verdict looks at.
#[derive(Debug, Clone, Copy)]
pub(super) struct StallView {
    pub(super) migrating: bool,
    pub(super) failed: bool,
    pub(super) outstanding: bool,
    pub(super) last_progress: Instant,
    pub(super) migrated_at: Option<Instant>,
}

/// The progress monitor's rule (see [`RcConn::check_stall`]); updates when the stall was
/// reported and how many repairs ran.
pub(super) fn stall_verdict(
    v: &StallView,
    now: Instant,
    stall: Duration,
    reported_at: &mut Option<Instant>,
    repairs: &mut u32,
) -> Stall {
    if v.migrating {
        return Stall::Healthy;
    }
    let settling = v
        .migrated_at
        .is_some_and(|t| now.saturating_duration_since(t) < stall.saturating_mul(3));
    if settling {
        if v.failed && *repairs < 2 {
            *repairs += 1;
            return Stall::Repair;
        }
        if !v.failed {
            return Stall::Healthy;
        }
    }
    let stalled =
        v.failed || (v.outstanding && now.saturating_duration_since(v.last_progress) > stall);
    if !stalled {
        return Stall::Healthy;
    }
    match *reported_at {
        Some(at) if now.saturating_duration_since(at) < stall.saturating_mul(4) => Stall::Reported,
        _ => {
            *reported_at = Some(now);
            Stall::Report
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_millis(300);

    fn view(t0: Instant) -> StallView {
        StallView {
            migrating: false,
            failed: false,
            outstanding: true,
            last_progress: t0,
            migrated_at: None,
        }
    }

    #[test]
    fn outstanding_sends_without_progress_report_once_then_every_four_timeouts() {
        let t0 = Instant::now();
        let v = view(t0);
        let (mut rep, mut repairs) = (None, 0);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            stall_verdict(&v, at(200), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
        assert_eq!(
            stall_verdict(&v, at(301), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        assert_eq!(
            stall_verdict(&v, at(900), STALL, &mut rep, &mut repairs),
            Stall::Reported
        );
        assert_eq!(
            stall_verdict(&v, at(1502), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        // Nothing outstanding: an idle QP is never reported.
        let idle = StallView {
            outstanding: false,
            ..v
        };
        let mut rep = None;
        assert_eq!(
            stall_verdict(&idle, at(5000), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
        // During a migration: never.
        let moving = StallView {
            migrating: true,
            failed: true,
            ..v
        };
        assert_eq!(
            stall_verdict(&moving, at(5000), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
    }

    #[test]
    fn the_longest_stall_timeout_overflows_nothing() {
        let t0 = Instant::now();
        let failed = StallView {
            failed: true,
            migrated_at: Some(t0),
            ..view(t0)
        };
        let (mut rep, mut repairs) = (None, 0);
        for _ in 0..4 {
            let _ = stall_verdict(&failed, t0, Duration::MAX, &mut rep, &mut repairs);
        }
        assert_eq!(repairs, 2);
    }

    #[test]
    fn a_failed_send_reports_at_once_but_is_repaired_right_after_a_migration() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let failed = StallView {
            failed: true,
            last_progress: at(0),
            ..view(t0)
        };
        let (mut rep, mut repairs) = (None, 0);
        assert_eq!(
            stall_verdict(&failed, at(1), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        // Just moved: settle (no report for a slow peer), repair a failure in place, twice
        // at most, then report.
        let moved = StallView {
            failed: false,
            migrated_at: Some(at(1000)),
            ..view(t0)
        };
        let (mut rep, mut repairs) = (None, 0);
        assert_eq!(
            stall_verdict(&moved, at(1800), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
        let broke = StallView {
            failed: true,
            ..moved
        };
        assert_eq!(
            stall_verdict(&broke, at(1100), STALL, &mut rep, &mut repairs),
            Stall::Repair
        );
        assert_eq!(
            stall_verdict(&broke, at(1200), STALL, &mut rep, &mut repairs),
            Stall::Repair
        );
        assert_eq!(
            stall_verdict(&broke, at(1300), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        // After the settling time a slow path is reported as usual.
        let mut rep = None;
        assert_eq!(
            stall_verdict(&moved, at(1901), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
    }
}
