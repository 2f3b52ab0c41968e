//! What the engine makes of liveness probes ([`crate::probe`]): a session going down is
//! a dead path between two GIDs, found without any local event; its return is that
//! path's trap 64.
//!
//! The prober runs beside the engine (in the [`crate::Manager`]) and reports only
//! sessions that were up, so a path never probed, or whose peer does not answer
//! probes, keeps the engine's own view. A probe-dead path counts as dead exactly as a
//! dead port or an out-of-service GID does: every connection whose primary runs over it
//! moves, and no alternate over it is armed onto. A path whose return the prober holds
//! for flapping ([`Input::PathHeld`](crate::Input::PathHeld)) is up but not usable until
//! the hold ends, like a port held down: a connection whose primary is dead still moves
//! onto it.
//!
//! A session that is up is evidence too: a software connection whose primary's local
//! port or rail went down moves onto an alternate whose session is up without waiting
//! for its peer's answer (`move_at_once`), unless the path is held for flapping or the
//! connection moved on its own word within the last second.

use super::conn::PeerOnPath;
use super::Engine;
use crate::engine::timers::TimerKey;
use crate::io::{Cause, MigrateIntent};
use crate::probe::{FailureKind, PathEnds};
use crate::types::{ConnId, Lid, MigrationMode, Path, PeerAddr, PortKey, Time};
use std::collections::BTreeMap;
use tracing::info;

/// How long after a move of its own a connection asks its peer before moving again
/// ([`Engine::move_at_once`]).
const MOVE_AT_ONCE_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

impl Engine {
    /// True when a probe session says `path` is dead.
    pub(super) fn probed_dead(&self, path: &Path) -> bool {
        !self.dead_paths.is_empty() && self.dead_paths.contains(&ends_of(path))
    }

    /// True while a probed path's return is held for flapping.
    pub(super) fn probe_held(&self, path: &Path) -> bool {
        !self.held_paths.is_empty()
            && self
                .held_paths
                .get(&ends_of(path))
                .is_some_and(|until| self.now < *until)
    }

    /// True when a probe session says `path` is dead and no request of the peer's has
    /// come over it for a detection time.
    pub(super) fn probe_verdict_stands(&self, path: &Path) -> bool {
        if !self.probed_dead(path) {
            return false;
        }
        let detection = std::time::Duration::from_millis(
            u64::from(self.policy.probe.interval_ms) * u64::from(self.policy.probe.multiplier),
        );
        let heard_lately = self
            .heard_paths
            .get(&ends_of(path))
            .is_some_and(|at| self.now < at.plus(detection));
        !heard_lately
    }

    /// A peer's message that asks to move onto `path` arrived from `from`: when that is
    /// the path's far end and the probes call the path dead, remember that it was heard.
    pub(super) fn heard_over(&mut self, path: &Path, from: &crate::types::PeerAddr) {
        if from.gid == path.dgid && self.probed_dead(path) {
            info!(local = %path.sgid, remote = %path.dgid, "probes: path dead, but the peer's request came over it");
            self.heard_paths.insert(ends_of(path), self.now);
        }
    }

    pub(super) fn probe_path_down(&mut self, ends: PathEnds, kind: FailureKind) {
        self.held_paths.remove(&ends);
        self.heard_paths.remove(&ends);
        self.alive_paths.remove(&ends);
        if !self.dead_paths.insert(ends) {
            return;
        }
        self.stats.probe_paths_down += 1;
        info!(local = %ends.local, remote = %ends.remote, kind = kind.name(), "probes: path down");
        self.path_failed(|p| ends_of(p) == ends, kind.into());
    }

    pub(super) fn probe_path_up(&mut self, ends: PathEnds) {
        self.heard_paths.remove(&ends);
        self.alive_paths.insert(ends);
        let held = self.held_paths.remove(&ends).is_some();
        if !self.dead_paths.remove(&ends) && !held {
            return;
        }
        info!(local = %ends.local, remote = %ends.remote, "probes: path back");
        self.path_returned(|p| ends_of(p) == ends);
    }

    /// A probed path is up again but held for flapping until `until`: connections whose
    /// primary is dead move onto it if it is their armed alternate; nothing else uses
    /// it before the hold ends.
    pub(super) fn probe_path_held(&mut self, ends: PathEnds, until: Time) {
        if until <= self.now {
            return self.probe_path_up(ends);
        }
        let was_dead = self.dead_paths.remove(&ends);
        self.heard_paths.remove(&ends);
        // A flapping path is no evidence to move on without the peer's word.
        self.alive_paths.remove(&ends);
        if !was_dead && !self.held_paths.contains_key(&ends) {
            return;
        }
        info!(local = %ends.local, remote = %ends.remote, %until, "probes: path back, held for flapping");
        self.held_paths.insert(ends, until);
        self.timers.schedule(until, TimerKey::PathHold(ends));
        self.path_up_while_held(|p| ends_of(p) == ends);
    }

    /// The hold of `ends` due at `at` ends, unless it was replaced since.
    pub(super) fn probe_hold_ends(&mut self, ends: PathEnds, at: Time) {
        if self.held_paths.get(&ends) != Some(&at) {
            return;
        }
        self.held_paths.remove(&ends);
        self.path_returned(|p| ends_of(p) == ends);
    }

    /// True when `path`'s probe session is up: both ends heard each other within the
    /// last detection time, over that path.
    pub(super) fn probed_alive(&self, path: &Path) -> bool {
        !self.alive_paths.is_empty() && self.alive_paths.contains(&ends_of(path))
    }

    /// Whether `id` may move onto `alt` in software before its peer answers: when this
    /// host's own port or rail under the primary is down (a local fact, not a verdict
    /// that a starved host can get wrong) and `alt`'s probe session is up, so both ends
    /// heard each other over it within a detection time. The peer's answer would tell
    /// nothing new, and waiting for it puts a message and the peer's own move in series
    /// with ours (tens of milliseconds each on a loaded host). The peer moves on our
    /// request as before; what we send before it has followed is dropped by its QP
    /// (RoCE takes an RC packet only from the QP's primary address) and resent at its
    /// first packet. Hardware mode keeps asking first: the peer's HCA follows a forced
    /// migration by itself, and the answer guards the one armed alternate.
    pub(super) fn move_at_once(&self, id: ConnId, alt: &Path) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        // Only this host's own port or rail: a probe verdict can be false (a host
        // starved for three intervals), and the peer's answer is what checks it.
        let known_dead = c.primary_down == Some(Cause::LocalPort);
        // A move of our own within the settle time: this may be a flap (the VM showed
        // false verdicts every 50-100 ms while both hosts starved for CPU, each move
        // adding to the load), and the peer's answer is what damps it.
        let settling = c
            .forced_at
            .is_some_and(|t| self.now < t.plus(MOVE_AT_ONCE_SETTLE));
        c.mode == MigrationMode::Software && known_dead && !settling && self.probed_alive(alt)
    }

    /// Tell the peer that `id` is moving onto `alt` now (`Migrate` "moving", sent once:
    /// our own `Migrate` "moved" follows our move and is retransmitted until answered)
    /// and move. The peer moves on it, and either may finish first: both providers hold
    /// their replay until the other side is there (`PeerMove::Alongside`), so neither
    /// side's replay goes into the other's drop: rxe's retransmit timer armed before the
    /// move still runs after it, and once it fires on a replay sent too early, the peer's
    /// sequence NAK is ignored until the next (docs/iba-facts.md, section 4).
    pub(super) fn tell_and_move(&mut self, id: ConnId, alt: Path) {
        let Some(msg) = self.migrate_msg(id, alt, MigrateIntent::Moving) else {
            return;
        };
        self.send(alt.port, PeerAddr::far_end(&alt), msg);
        self.start_sw_migration(id, alt, None, PeerOnPath::Alongside);
    }

    /// [`Engine::probe_paths`], for the prober to watch exactly those from now on. A
    /// session the prober stops watching tells nothing more, so whatever it said about
    /// a path left out is forgotten: watched again later, the path is alive only once
    /// its new session comes up.
    pub fn follow_probe_paths(&mut self) -> BTreeMap<PathEnds, (PortKey, Lid)> {
        let paths = self.probe_paths();
        self.alive_paths.retain(|ends| paths.contains_key(ends));
        paths
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
