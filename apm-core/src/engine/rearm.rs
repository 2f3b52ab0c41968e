//! Re-arming: when a connection wants a new alternate, choosing it (candidates and SA
//! paths), pacing storms with a concurrency limit, the LAP exchange's sender side with
//! retransmission and backoff, and what to do when a phase deadline passes.

use super::cache::Need;
use super::conn::{Chore, Conn, LapWait, Phase, Responder};
use super::{live_mut, select, Engine, Pending};
use crate::io::{
    ApStatus, CommandOp, CommandOutcome, Lap, MigrateIntent, PeerMsg, ProviderError,
    UnprotectedReason,
};
use crate::policy::Policy;
use crate::types::{
    ConnId, Gid, LinkLayer, MigState, MigrationMode, Path, PeerAddr, PortKey, Role,
};
use tracing::{debug, warn};

impl Engine {
    // ---------------------------------------------------------------- re-arming

    /// `id` wants a (better) alternate. Starts now, queues, or remembers it for later.
    pub(super) fn need_rearm(&mut self, id: ConnId) {
        let Some(c) = live_mut(&mut self.conns, id) else {
            return;
        };
        if c.phase().busy() {
            c.chores.add(Chore::Rearm);
            return;
        }
        // If we refused the peer's last LAP (typically: its path came back at its end
        // before our notice said so), the peer has stepped back from that path for
        // `bad_path_hold_ms`; waiting for it would only add that hold. Propose at once.
        // Refusals are never answered from memory, so the record can be spent here.
        let we_refused = c
            .last_lap
            .is_some_and(|(_, status)| status != ApStatus::Success);
        match c.phase() {
            Phase::Queued | Phase::Resolving => return,
            Phase::WaitPassive if !we_refused => return,
            _ => {}
        }
        if we_refused {
            c.last_lap = None;
        } else if c.role == Role::Passive {
            // The active side initiates; step in only if it stays silent.
            let at = self
                .now
                .plus(Policy::ms(self.policy.passive_initiate_delay_ms));
            self.set_phase(id, Phase::WaitPassive);
            self.set_deadline(id, Some(at));
            return;
        }
        self.initiate(id, AskSa::IfNeeded);
    }

    /// Choose an alternate and send the LAP (or queue for a slot, or ask the SA for
    /// paths when `ask` allows and the policy does).
    pub(super) fn initiate(&mut self, id: ConnId, ask: AskSa) {
        let resolve = self.policy.resolve_paths && ask == AskSa::IfNeeded;
        let Some(c) = self.live(id) else {
            return;
        };
        let current = self.current_score(c);
        let choice = self.choose(c);
        match choice {
            Some((path, score)) if current.is_none_or(|cur| score > cur) => {
                // The best known is dead: the SA may know one that works.
                if !score.1 && resolve && self.resolve_for(id) {
                    self.set_phase(id, Phase::Resolving);
                    return;
                }
                if !self.rearms.holds(id) && self.rearms.full(self.policy.max_concurrent_rearms) {
                    self.set_phase(id, Phase::Queued);
                    self.rearms.enqueue(id);
                    return;
                }
                self.take_slot(id);
                self.send_lap(id, path);
            }
            Some(_) => {
                // Already armed on something at least as good.
                self.release_slot(id);
                self.set_phase(id, Phase::Idle);
                self.update_protection(id, UnprotectedReason::AlternateDown);
            }
            None => {
                if current.is_some() {
                    self.release_slot(id);
                    self.set_phase(id, Phase::Idle);
                    return;
                }
                if resolve && self.resolve_for(id) {
                    self.set_phase(id, Phase::Resolving);
                    return;
                }
                self.release_slot(id);
                self.update_protection(id, UnprotectedReason::NoCandidate);
                self.backoff(id);
            }
        }
    }

    /// The score of `c`'s alternate when the QP holds it armed and it has not failed for
    /// this connection: what a new alternate must beat.
    pub(super) fn current_score(&self, c: &Conn) -> Option<select::Score> {
        let a = c.alt.armed().filter(|a| !c.is_bad(a, self.now))?;
        select::score(&c.primary, &a, self.path_usable(&a))
    }

    /// The best alternate for `c` among its candidates and cached SA paths that have not
    /// failed for it: by rank, then working over dead (see `select`).
    pub(super) fn choose(&self, c: &Conn) -> Option<(Path, select::Score)> {
        let device = c.primary.port.device;
        let gids = c.peer_gids();
        let cached = self.cache.paths(device, &gids);
        select::best(
            &c.primary,
            c.candidates.iter().chain(cached),
            |p| !c.is_bad(p, self.now),
            |p| self.path_usable(p),
        )
    }

    /// Issue path queries this connection needs that are neither cached nor pending.
    /// Returns true when the connection should wait for answers.
    pub(super) fn resolve_for(&mut self, id: ConnId) -> bool {
        let Some(c) = self.conns.get(&id) else {
            return false;
        };
        let device = c.primary.port.device;
        let gids: Vec<Gid> = c
            .peer_gids()
            .into_iter()
            .filter(|g| self.remote_usable(g))
            .collect();
        let ports: Vec<PortKey> = self
            .ports
            .iter()
            .filter(|(k, p)| {
                k.device == device
                    && p.health.usable(self.now)
                    && p.info.link_layer == LinkLayer::InfiniBand
            })
            .map(|(k, _)| *k)
            .collect();
        let mut waiting = false;
        for port in &ports {
            for gid in &gids {
                match self.cache.need(*port, *gid) {
                    Need::Known => {}
                    Need::Wait => waiting = true,
                    Need::Ask => {
                        // Never asked since the last invalidation: ask once for everyone.
                        self.stats.path_queries += 1;
                        self.issue_sa(
                            CommandOp::ResolvePaths {
                                port: *port,
                                dgid: *gid,
                            },
                            Pending::Resolve(*port, *gid),
                        );
                        waiting = true;
                    }
                }
            }
        }
        waiting
    }

    pub(super) fn resolve_done(
        &mut self,
        port: PortKey,
        gid: Gid,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        let paths = match result {
            Ok(CommandOutcome::Paths(paths)) => paths,
            Ok(other) => {
                warn!(?other, "path query answered with something else");
                Vec::new()
            }
            Err(e) => {
                debug!(%port, %gid, error = %e, "path query failed");
                Vec::new()
            }
        };
        // Keep only paths that fit the key; a provider answering for the wrong port
        // must not plant paths elsewhere.
        let paths: Vec<Path> = paths
            .into_iter()
            .filter(|p| p.port == port && p.dgid == gid)
            .collect();
        self.cache.answer(port, gid, paths);
        let waiting: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase(), Phase::Resolving))
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            let still = self
                .conns
                .get(&id)
                .is_some_and(|c| self.cache.asking(c.primary.port.device, &c.peer_gids()));
            if still {
                continue;
            }
            self.set_phase(id, Phase::Idle);
            // Answers are in: choose, but do not ask again for this attempt.
            self.initiate(id, AskSa::No);
        }
    }

    pub(super) fn invalidate_cache(&mut self, hit: impl Fn(&(PortKey, Gid)) -> bool) {
        self.cache.invalidate(hit);
    }

    pub(super) fn send_lap(&mut self, id: ConnId, path: Path) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let lap = Lap {
            sender_comm_id: c.local_comm_id,
            receiver_comm_id: c.remote_comm_id,
            receiver_qpn: c.remote_qpn,
            alt: path,
        };
        // LAPs travel on the current primary (its port, to the peer's primary GID).
        let port = c.primary.port;
        let to = PeerAddr {
            gid: c.primary.dgid,
            lid: c.primary.dlid,
        };
        debug!(%id, alt = %path, "sending LAP");
        self.stats.laps_sent += 1;
        self.issue(
            CommandOp::SendPeer {
                port,
                to,
                msg: PeerMsg::Lap(lap),
            },
            Pending::Send,
        );
        self.set_phase(
            id,
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(lap),
                port,
                to,
                tries: 1,
            },
        );
        let at = self.now.plus(Policy::ms(self.policy.lap_timeout_ms));
        self.set_deadline(id, Some(at));
    }

    pub(super) fn start_load(&mut self, id: ConnId, path: Path, responder: Option<Responder>) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        match c.mode {
            MigrationMode::Hardware => {
                // The alternate carries its own, longer, timeout (see the policy).
                let boosted = c
                    .base_timeout
                    .saturating_add(self.policy.alternate_timeout_boost)
                    .min(31);
                let path = Path {
                    ack_timeout: path.ack_timeout.max(boosted),
                    ..path
                };
                let cmd = self.issue_qp(id, CommandOp::LoadAlternate { conn: id, path });
                self.set_phase(
                    id,
                    Phase::Loading {
                        cmd,
                        path,
                        responder,
                    },
                );
            }
            // No alternate in the QP: agreeing on it is all there is to arming.
            MigrationMode::Software => self.armed(id, path, MigState::Armed, responder),
        }
    }

    /// A phase deadline passed.
    pub(super) fn conn_deadline(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let phase = c.phase().clone();
        if !phase.busy() {
            let deferred = self
                .conns
                .get_mut(&id)
                .and_then(|c| c.deferred_lap.take().map(|b| *b));
            if let Some((from, port, lap)) = deferred {
                // A deferred LAP's wait for PATH_MIG ran out: answer it as things stand.
                self.lap_received(id, from, port, lap, LapWait::Waited);
                return;
            }
        }
        match phase {
            Phase::AwaitFollow { give_up, .. } if self.now < give_up => {
                // No word yet that the peer followed (its own was lost, say): ask. Its
                // "ok" answer (it runs on our primary) ends the wait.
                self.ask_if_followed(id);
                self.set_deadline(id, Some(self.follow_check_at(give_up)));
            }
            Phase::AwaitFollow { .. } => {
                // No word that the peer followed (under MAD loss, say). By now our
                // packets with MigReq=1 have moved its ARMED QP if they reach it at
                // all: arm the path we left as if it had answered.
                self.peer_followed(id);
            }
            Phase::WaitPassive | Phase::Backoff => {
                self.set_phase(id, Phase::Idle);
                self.initiate(id, AskSa::IfNeeded);
            }
            Phase::AwaitPeer { msg, .. } if probe_path(&msg).is_some_and(|p| !self.path_up(&p)) => {
                // The path died since the probe went out: the move is off (the HCA
                // decides at retry exhaustion).
                self.release_slot(id);
                self.set_phase(id, Phase::Idle);
                self.need_rearm(id);
            }
            Phase::AwaitPeer {
                msg,
                port,
                to,
                tries,
            } => self.peer_silent(id, msg, port, to, tries),
            _ => {}
        }
    }

    /// No answer from the peer to `msg` (sent `tries` times) by the deadline: send it
    /// again with the timeout doubled, or give up.
    fn peer_silent(&mut self, id: ConnId, msg: PeerMsg, port: PortKey, to: PeerAddr, tries: u32) {
        if tries >= self.policy.lap_max_tries && matches!(msg, PeerMsg::Migrate(_)) {
            // Hardware: the peer follows our MigReq or its own notices anyway;
            // software: it may have moved and only its answers were lost. Either
            // way the connection needs its next alternate: re-arm now.
            warn!(%id, tries, "peer did not answer our Migrate: re-arming anyway");
            self.set_phase(id, Phase::Idle);
            self.after_phase(id);
            return;
        }
        if tries >= self.policy.lap_max_tries {
            warn!(%id, tries, "peer did not answer: giving up for now");
            if matches!(msg, PeerMsg::Lap(_)) {
                // The peer may have loaded our LAP's path and only its APRs were
                // lost: its alternate and ours may now differ, so ours is no
                // longer known to be agreed. The next attempt agrees anew.
                if let Some(c) = self.conns.get_mut(&id) {
                    c.alt.disarm();
                }
            }
            self.release_slot(id);
            self.set_phase(id, Phase::Idle);
            self.update_protection(id, UnprotectedReason::PeerUnresponsive);
            self.backoff(id);
            return;
        }
        match msg {
            PeerMsg::Lap(_) => self.stats.lap_retransmits += 1,
            _ => self.stats.migrate_msgs_sent += 1,
        }
        self.issue(CommandOp::SendPeer { port, to, msg }, Pending::Send);
        self.set_phase(
            id,
            Phase::AwaitPeer {
                msg,
                port,
                to,
                tries: tries + 1,
            },
        );
        let timeout = self
            .policy
            .lap_timeout_ms
            .saturating_mul(1u64 << tries.min(20));
        let at = self.now.plus(Policy::ms(timeout));
        self.set_deadline(id, Some(at));
    }

    pub(super) fn backoff(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let n = c.failed_rearms.min(20);
        c.failed_rearms = c.failed_rearms.saturating_add(1);
        let delay = self
            .policy
            .rearm_retry_ms
            .saturating_mul(1u64 << n)
            .min(self.policy.rearm_retry_max_ms);
        let at = self.now.plus(Policy::ms(delay));
        self.set_phase(id, Phase::Backoff);
        self.set_deadline(id, Some(at));
    }

    /// Phase is back to idle: do what was remembered meanwhile.
    pub(super) fn after_phase(&mut self, id: ConnId) {
        let Some(c) = live_mut(&mut self.conns, id) else {
            return;
        };
        if c.phase().busy() {
            return;
        }
        if c.chores.take(Chore::Announce) {
            self.announce_migration(id);
            return;
        }
        if let Some((from, port, lap)) = c.deferred_lap.take().map(|b| *b) {
            self.lap_received(id, from, port, lap, LapWait::MayWait);
            return;
        }
        if c.chores.take(Chore::Rearm) {
            self.need_rearm(id);
        }
    }
}

/// Whether a re-arm attempt may ask the SA for paths: not when it follows the answers
/// to its own questions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AskSa {
    IfNeeded,
    No,
}

/// The path a probe asks the peer to move to. (A LAP may propose a dead path on
/// purpose: see `select`.)
fn probe_path(msg: &PeerMsg) -> Option<Path> {
    match msg {
        PeerMsg::Migrate(m) if m.intent == MigrateIntent::Probe => Some(m.path),
        _ => None,
    }
}
