//! What the engine believes about the peers' port GIDs: up or out of service (SA
//! traps 64/65, flap hold-down), and the SA rechecks of those held out of service
//! (a lost trap 64 must not keep a GID dead forever). Bookkeeping only: the engine
//! issues the queries and schedules the timers.

use super::health::Health;
use crate::types::{Gid, Time};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Default)]
pub(crate) struct Remotes {
    /// GIDs never heard of are up.
    health: BTreeMap<Gid, Health>,
    /// GIDs out of service awaiting an SA recheck: when it is due, and the interval.
    rechecks: BTreeMap<Gid, (Time, u64)>,
    /// When the SA was last asked out of turn about a GID
    /// (`Engine::recheck_alternate_now`).
    urgent: BTreeMap<Gid, Time>,
}

impl Remotes {
    /// Usable now: not out of service and not held down.
    pub(crate) fn usable(&self, gid: &Gid, now: Time) -> bool {
        self.health.get(gid).is_none_or(|h| h.usable(now))
    }

    /// Not out of service (held down for flapping or not).
    pub(crate) fn up(&self, gid: &Gid) -> bool {
        self.health.get(gid).is_none_or(|h| h.up)
    }

    /// The health record of `gid`, created (up) on first use.
    pub(crate) fn health_mut(&mut self, gid: Gid) -> &mut Health {
        self.health.entry(gid).or_insert_with(Health::up)
    }

    /// The GIDs held out of service whose subnet prefix is one of `prefixes`.
    pub(crate) fn down_in(&self, prefixes: &[&[u8]]) -> Vec<Gid> {
        self.health
            .iter()
            .filter(|(g, h)| !h.up && prefixes.contains(&&g.0[..8]))
            .map(|(g, _)| *g)
            .collect()
    }

    /// When the recheck of `gid` is due, and its interval.
    pub(crate) fn recheck(&self, gid: &Gid) -> Option<(Time, u64)> {
        self.rechecks.get(gid).copied()
    }

    pub(crate) fn set_recheck(&mut self, gid: Gid, due: Time, interval_ms: u64) {
        self.rechecks.insert(gid, (due, interval_ms));
    }

    pub(crate) fn drop_recheck(&mut self, gid: &Gid) {
        self.rechecks.remove(gid);
    }

    /// `gid` is in service: no recheck, and no memory of asking out of turn.
    pub(crate) fn forget_rechecks(&mut self, gid: &Gid) {
        self.rechecks.remove(gid);
        self.urgent.remove(gid);
    }

    /// Nothing is known about `gid` any more: it is up, as a GID never heard of.
    pub(crate) fn forget(&mut self, gid: &Gid) {
        self.health.remove(gid);
        self.forget_rechecks(gid);
    }

    /// May the SA be asked out of turn about `gid` now (not within `recent` of the last
    /// time)? Remembers that it was.
    pub(crate) fn ask_out_of_turn(&mut self, gid: Gid, now: Time, recent: Duration) -> bool {
        if self
            .urgent
            .get(&gid)
            .is_some_and(|t| now.since(*t) < recent)
        {
            return false;
        }
        self.urgent.insert(gid, now);
        true
    }
}
