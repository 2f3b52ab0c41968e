//! Choosing an alternate path: which candidates are usable and how they rank.
//!
//! Rank, best first, relative to the primary ([`AlternateKind`]):
//! - a different local port and a different remote port (survives either port dying),
//! - a different local port or a different remote port,
//! - the same ports but different LIDs (an LMC variant: survives a switch path failure).
//!
//! A candidate on the same route as the primary, on another device (a QP lives on one
//! HCA), or with a different MTU (IBA requires the alternate MTU to match) is not a
//! candidate at all. Ties keep the order the candidates were given in.
//!
//! A candidate's [`Score`] is its rank first, then whether it works now: a dead path of
//! a better rank is worth arming over a live one of a worse rank, because an armed
//! alternate, even a dead one, gives the QP a second retry budget when its primary
//! fails (the HCA migrates on retry exhaustion and retries there), and the better-ranked
//! path is the one that survives what the primary does not. apm never forces a
//! connection onto a dead path; it only keeps one armed.
//!
//! The simulator judges the engine by this ranking from outside (provider-sim's
//! `Sim::unarmed_with_healthy_alternate`: once the faults stop, no connection may stay
//! below the best healthy kind): a change to it is a change there too.

use crate::io::AlternateKind;
use crate::types::Path;

/// How good `cand` is as an alternate for `primary`; `None` when it cannot be one.
pub(crate) fn rank(primary: &Path, cand: &Path) -> Option<AlternateKind> {
    if cand.port.device != primary.port.device || cand.mtu != primary.mtu {
        return None;
    }
    if cand.same_route(primary) {
        return None;
    }
    Some(AlternateKind::of(primary, cand))
}

/// How good an alternate is: its rank, then whether it is usable now (see the module
/// documentation). Higher is better.
pub(crate) type Score = (AlternateKind, bool);

/// The score of `cand` as an alternate for `primary`, `None` when it cannot be one.
pub(crate) fn score(primary: &Path, cand: &Path, usable: bool) -> Option<Score> {
    rank(primary, cand).map(|r| (r, usable))
}

/// The best candidate by [`Score`] among those `eligible` (first in order among equals).
pub(crate) fn best<'a>(
    primary: &Path,
    candidates: impl IntoIterator<Item = &'a Path>,
    mut eligible: impl FnMut(&Path) -> bool,
    mut usable: impl FnMut(&Path) -> bool,
) -> Option<(Path, Score)> {
    let mut best: Option<(Path, Score)> = None;
    for cand in candidates {
        let Some(r) = rank(primary, cand) else {
            continue;
        };
        // Cheap checks first: a candidate that cannot beat the best so far is skipped.
        if best.is_some_and(|(_, bs)| bs >= (r, true)) || !eligible(cand) {
            continue;
        }
        let s = (r, usable(cand));
        if best.is_none_or(|(_, bs)| s > bs) {
            best = Some((*cand, s));
        }
    }
    best
}
