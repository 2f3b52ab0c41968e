//! The path cache: what the SA answered about paths from a local port to a remote GID,
//! shared by every connection between those ends, so that a re-arm storm asks once per
//! destination. It never issues a query itself: it says when one is needed and records
//! the answer (`Engine::resolve_for`, `Engine::resolve_done`).

use crate::types::{Gid, Path, PortKey};
use std::collections::BTreeMap;

/// One (local port, remote GID) pair's paths.
#[derive(Debug)]
enum Entry {
    /// A query is out.
    Asking,
    /// The SA answered (possibly with no paths): not asked again until invalidated.
    Known(Vec<Path>),
}

/// What a connection needs to do about one (port, GID) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Never asked since the last invalidation: ask now (the pair is marked asking).
    Ask,
    /// Someone asked: wait for the answer.
    Wait,
    /// Answered.
    Known,
}

#[derive(Debug, Default)]
pub(crate) struct PathCache {
    entries: BTreeMap<(PortKey, Gid), Entry>,
}

impl PathCache {
    /// The known paths from `device`'s ports to any of `gids`, in key order.
    pub(crate) fn paths<'a>(
        &'a self,
        device: u16,
        gids: &'a [Gid],
    ) -> impl Iterator<Item = &'a Path> + 'a {
        self.entries
            .iter()
            .filter(move |((port, gid), _)| port.device == device && gids.contains(gid))
            .flat_map(|(_, e)| match e {
                Entry::Known(paths) => paths.as_slice(),
                Entry::Asking => &[],
            })
    }

    /// True while a query from one of `device`'s ports to one of `gids` is out.
    pub(crate) fn asking(&self, device: u16, gids: &[Gid]) -> bool {
        self.entries.iter().any(|((port, gid), e)| {
            matches!(e, Entry::Asking) && port.device == device && gids.contains(gid)
        })
    }

    /// What to do about `(port, gid)`; `Need::Ask` marks it asking.
    pub(crate) fn need(&mut self, port: PortKey, gid: Gid) -> Need {
        match self.entries.get(&(port, gid)) {
            Some(Entry::Asking) => Need::Wait,
            Some(Entry::Known(_)) => Need::Known,
            None => {
                self.entries.insert((port, gid), Entry::Asking);
                Need::Ask
            }
        }
    }

    /// The SA's answer about `(port, gid)`.
    pub(crate) fn answer(&mut self, port: PortKey, gid: Gid, paths: Vec<Path>) {
        self.entries.insert((port, gid), Entry::Known(paths));
    }

    /// Forget the answers about the pairs `hit` names (a query out is kept: its answer
    /// comes).
    pub(crate) fn invalidate(&mut self, hit: impl Fn(&(PortKey, Gid)) -> bool) {
        self.entries
            .retain(|k, e| matches!(e, Entry::Asking) || !hit(k));
    }
}
