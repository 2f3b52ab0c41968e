//! Choosing an alternate path: which candidates are usable and how they rank.
//!
//! Rank (higher is better), relative to the primary:
//! 3. a different local port and a different remote port (survives either port dying),
//! 2. a different local port or a different remote port,
//! 1. the same ports but different LIDs (an LMC variant: survives a switch path failure).
//!
//! A candidate on the same route as the primary, on another device (a QP lives on one
//! HCA), or with a different MTU (IBA requires the alternate MTU to match) is not a
//! candidate at all. Ties keep the order the candidates were given in.

use crate::types::Path;

/// How good `cand` is as an alternate for `primary`; `None` when it cannot be one.
pub(crate) fn rank(primary: &Path, cand: &Path) -> Option<u8> {
    if cand.port.device != primary.port.device || cand.mtu != primary.mtu {
        return None;
    }
    if cand.same_route(primary) {
        return None;
    }
    let port_differs = cand.port != primary.port;
    let remote_differs = cand.dgid != primary.dgid;
    Some(match (port_differs, remote_differs) {
        (true, true) => 3,
        (true, false) | (false, true) => 2,
        (false, false) => 1,
    })
}

/// The best usable candidate: highest rank, first in order among equals.
pub(crate) fn best<'a>(
    primary: &Path,
    candidates: impl IntoIterator<Item = &'a Path>,
    mut usable: impl FnMut(&Path) -> bool,
) -> Option<(Path, u8)> {
    let mut best: Option<(Path, u8)> = None;
    for cand in candidates {
        let Some(r) = rank(primary, cand) else {
            continue;
        };
        if best.is_some_and(|(_, br)| br >= r) || !usable(cand) {
            continue;
        }
        best = Some((*cand, r));
    }
    best
}
