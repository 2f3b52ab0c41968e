//! What the engine makes of liveness probes ([`crate::probe`]): a session going down is
//! a dead path between two GIDs, found without any local event; its return is that
//! path's trap 64.
//!
//! The prober runs beside the engine (in the [`crate::Manager`]) and reports only
//! sessions that were up, so a path never probed, or whose peer does not answer
//! probes, keeps the engine's own view. A probe-dead path counts as dead exactly as a
//! dead port or an out-of-service GID does: every connection whose primary runs over it
//! moves, and no alternate over it is armed onto.

use super::Engine;
use crate::probe::{FailureKind, PathEnds};
use crate::types::{Lid, Path, PortKey};
use std::collections::BTreeMap;
use tracing::info;

impl Engine {
    /// True when a probe session says `path` is dead.
    pub(super) fn probed_dead(&self, path: &Path) -> bool {
        !self.dead_paths.is_empty() && self.dead_paths.contains(&ends_of(path))
    }

    pub(super) fn probe_path_down(&mut self, ends: PathEnds, kind: FailureKind) {
        if !self.dead_paths.insert(ends) {
            return;
        }
        self.stats.probe_paths_down += 1;
        info!(local = %ends.local, remote = %ends.remote, kind = kind.name(), "probes: path down");
        self.path_failed(|p| ends_of(p) == ends);
    }

    pub(super) fn probe_path_up(&mut self, ends: PathEnds) {
        if !self.dead_paths.remove(&ends) {
            return;
        }
        info!(local = %ends.local, remote = %ends.remote, "probes: path back");
        self.path_returned(|p| ends_of(p) == ends);
    }

    /// The paths probes should watch, with what a probe needs to reach the peer: every
    /// live connection's primary, alternate and candidates (this host's GID, the peer's
    /// GID, the local port and the peer's LID).
    pub fn probe_paths(&self) -> BTreeMap<PathEnds, (PortKey, Lid)> {
        let mut out = BTreeMap::new();
        for (_, c) in self.live_conns() {
            let paths = std::iter::once(c.primary)
                .chain(c.alt.path())
                .chain(c.candidates.iter().copied());
            for p in paths {
                out.entry(ends_of(&p)).or_insert((p.port, p.dlid));
            }
        }
        out
    }
}

/// The probe session a path belongs to.
pub(crate) fn ends_of(path: &Path) -> PathEnds {
    PathEnds {
        local: path.sgid,
        remote: path.dgid,
    }
}
