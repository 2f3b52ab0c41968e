//! Events from the fabric and the QPs: local ports (up, down, LID changes), remote
//! GIDs (SA traps 64/65), device and QP events, and what a failure or a recovery means
//! for each connection.

use super::conn::{Chore, Chores, Conn, MoveReason, Moved, PeerOnPath, Phase, Responder, Told};
use super::health::Health;
use super::timers::TimerKey;
use super::{live, live_mut, select, Engine, LocalPort, Pending, Subscription};
use crate::io::{
    Cause, CommandOp, CommandOutcome, LostReason, MigrateIntent, NotificationKind, PortEvent,
    ProviderError, QpEvent, UnprotectedReason,
};
use crate::policy::{FastMoves, Policy};
use crate::types::{
    ConnId, Gid, Lid, LinkLayer, MigState, MigrationMode, Path, PeerAddr, PortInfo, PortKey, Time,
};
use tracing::{debug, info, warn};

impl Engine {
    // ---------------------------------------------------------------- local ports

    pub(super) fn port_info(&mut self, info: PortInfo) {
        let key = info.key;
        let is_ib = info.link_layer == LinkLayer::InfiniBand;
        match self.ports.get_mut(&key) {
            None => {
                let health = Health::new(info.active);
                self.ports.insert(
                    key,
                    LocalPort {
                        info,
                        health,
                        subscription: if is_ib {
                            Subscription::Wanted
                        } else {
                            Subscription::Unsupported
                        },
                    },
                );
                if is_ib {
                    self.subscribe(key);
                }
                // A port reported after connections were protected is a new path.
                if self.port_usable(key) {
                    self.path_returned(|p| p.port == key);
                }
            }
            Some(p) => {
                let old = std::mem::replace(&mut p.info, info.clone());
                if old.lid != info.lid {
                    self.lid_changed(key, old.lid, info.lid);
                }
                self.local_gids_changed(&old, &info);
            }
        }
    }

    pub(super) fn port_event(&mut self, port: PortKey, event: PortEvent) {
        debug!(%port, ?event, "port event");
        match event {
            PortEvent::Down => self.port_down(port),
            PortEvent::Active => self.port_up(port),
            PortEvent::SmChange | PortEvent::ClientReregister => {
                // The SA may have forgotten us: subscribe again. Cached paths may come
                // from an SM that routes differently now.
                if let Some(p) = self.ports.get_mut(&port) {
                    p.subscription.renew();
                }
                self.invalidate_cache(|k| k.0 == port);
                self.subscribe(port);
                if event == PortEvent::ClientReregister {
                    self.forget_stale_remote_verdicts(port);
                }
            }
            PortEvent::LidChange => {
                // The new LID arrives in a PortInfo; resubscribe (the SA keys
                // subscriptions by our address) and forget paths through the port.
                if let Some(p) = self.ports.get_mut(&port) {
                    p.subscription.renew();
                }
                self.invalidate_cache(|k| k.0 == port);
                self.subscribe(port);
            }
            PortEvent::PkeyChange | PortEvent::GidChange => {
                self.invalidate_cache(|k| k.0 == port);
            }
        }
    }

    pub(super) fn port_down(&mut self, port: PortKey) {
        let now = self.now;
        let changed = match self.ports.get_mut(&port) {
            Some(p) => p.health.fail(now, &self.policy),
            None => {
                warn!(%port, "PORT_ERR on a port never reported: ignored");
                return;
            }
        };
        if changed {
            info!(%port, "local port down");
            self.path_failed(|p| p.port == port, Cause::LocalPort);
        }
    }

    pub(super) fn port_up(&mut self, port: PortKey) {
        let now = self.now;
        let Some(p) = self.ports.get_mut(&port) else {
            warn!(%port, "PORT_ACTIVE on a port never reported: ignored");
            return;
        };
        // A port that is back may sit behind a new SM or LID: re-learn its paths.
        if let Some(usable_at) = p.health.recover(now, &self.policy) {
            info!(%port, held_until = %usable_at, "local port active");
            self.invalidate_cache(|k| k.0 == port);
            if usable_at > now {
                self.timers.schedule(usable_at, TimerKey::PortHold(port));
                self.path_up_while_held(|p| p.port == port);
            } else {
                self.path_returned(|p| p.port == port);
            }
            self.forget_stale_remote_verdicts(port);
        }
    }

    /// Notices sent while `port` was down (or while the SA had forgotten us) never
    /// reached us, and the SM stops resending a Report after a few tries: a trap 64 may
    /// have been missed, leaving a remote GID believed dead forever. Treat the remote
    /// GIDs of the port's subnet that we hold out of service as back in service;
    /// traffic, LAPs and the next notices tell otherwise. (provider-sim's record of
    /// what a host was told, `Sim::feed`, follows the same rule.)
    pub(super) fn forget_stale_remote_verdicts(&mut self, port: PortKey) {
        let Some(p) = self.ports.get(&port) else {
            return;
        };
        let prefixes: Vec<&[u8]> = p.info.gids.iter().map(|g| &g.0[..8]).collect();
        let stale = self.remotes.down_in(&prefixes);
        for gid in stale {
            debug!(%port, %gid, "out-of-service verdict may be stale: forgotten");
            self.remote_in_service(gid);
        }
    }

    pub(super) fn lid_changed(&mut self, port: PortKey, old: Lid, new: Lid) {
        info!(%port, %old, %new, "local LID changed");
        self.invalidate_cache(|k| k.0 == port);
        // Paths keep their path bits: rebase every local path through the port.
        let rebase = |p: &mut Path| {
            if p.port == port {
                let bits = p.slid.get().wrapping_sub(old.get());
                p.slid = Lid::from_wire(new.get().wrapping_add(bits));
            }
        };
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            let Some(c) = live_mut(&mut self.conns, id) else {
                continue;
            };
            rebase(&mut c.primary);
            c.candidates.iter_mut().for_each(rebase);
            let alt_on_port = c.alt.path().is_some_and(|a| a.port == port);
            if let Some(a) = c.alt.path_mut() {
                rebase(a);
            }
            let primary_on_port = c.primary.port == port;
            if alt_on_port {
                // The peer's copy of this alternate names our old LID: agree on it anew.
                c.alt.disarm();
                self.update_protection(id, UnprotectedReason::AlternateDown);
                self.need_rearm(id);
            } else if primary_on_port {
                // The peer's primary still names our old LID and cannot reach us: move
                // to the alternate while it is armed, then re-arm from there.
                self.primary_failed(id);
            }
        }
    }

    pub(super) fn device_fatal(&mut self, device: u16) {
        let ids: Vec<ConnId> = self
            .live_conns()
            .filter(|(_, c)| c.primary.port.device == device)
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            self.lose(id, LostReason::DeviceFatal);
        }
    }

    // ---------------------------------------------------------------- remote ports

    /// True when `gid` is one of our own ports': notices about them are ignored (the
    /// local port events are the better source).
    fn is_local_gid(&self, gid: &Gid) -> bool {
        self.ports.values().any(|p| p.info.gids.contains(gid))
    }

    /// `gid` is in service (trap 64, or something proves it).
    pub(super) fn remote_in_service(&mut self, gid: Gid) {
        if self.is_local_gid(&gid) {
            debug!(%gid, "in-service notice about a local GID: ignored");
            return;
        }
        let now = self.now;
        self.remotes.forget_rechecks(&gid);
        let Some(usable_at) = self.remotes.health_mut(gid).recover(now, &self.policy) else {
            return;
        };
        info!(%gid, held_until = %usable_at, "remote GID in service");
        // Its LIDs may have changed (trap 64 follows a sweep).
        self.invalidate_cache(|k| k.1 == gid);
        if usable_at > now {
            self.timers.schedule(usable_at, TimerKey::RemoteHold(gid));
            self.path_up_while_held(|p| p.dgid == gid);
        } else {
            self.path_returned(|p| p.dgid == gid);
        }
    }

    /// `gid` is out of service (trap 65).
    pub(super) fn remote_out_of_service(&mut self, gid: Gid) {
        if self.is_local_gid(&gid) {
            debug!(%gid, "out-of-service notice about a local GID: ignored");
            return;
        }
        if !self.gid_in_use(gid) {
            // Its Reports reach every host the SM thinks interested (with a wildcard
            // subscription, every host): remembering the GID would cost an SA recheck
            // of it per host, at every failure, for no connection at all.
            debug!(%gid, "out-of-service notice about a GID no connection uses: ignored");
            return;
        }
        if self.remotes.health_mut(gid).fail(self.now, &self.policy) {
            info!(%gid, "remote GID out of service");
            self.invalidate_cache(|k| k.1 == gid);
            self.schedule_recheck(gid, self.policy.remote_recheck_ms);
            self.path_failed(|p| p.dgid == gid, Cause::PeerPort);
        }
    }

    /// Check `gid` again with the SA in `interval_ms` (0: never).
    fn schedule_recheck(&mut self, gid: Gid, interval_ms: u64) {
        if interval_ms == 0 {
            return;
        }
        let due = self.now.plus(Policy::ms(interval_ms));
        self.remotes.set_recheck(gid, due, interval_ms);
        self.timers.schedule(due, TimerKey::RemoteRecheck(gid));
    }

    /// Ask the SA, through every usable InfiniBand port, for paths to `gid`, which has
    /// been out of service for a while: a lost trap 64 must not keep it dead forever.
    pub(super) fn recheck_remote(&mut self, gid: Gid) {
        if self.remotes.up(&gid) {
            self.remotes.drop_recheck(&gid);
            return;
        }
        if !self.gid_in_use(gid) {
            // The connections that needed it are gone: nothing is asked, and nothing is
            // believed (a connection made to it later starts from "never heard of").
            self.remotes.forget(&gid);
            return;
        }
        let interval = self
            .remotes
            .recheck(&gid)
            .map_or(self.policy.remote_recheck_ms, |(_, i)| i);
        // Until an answer says otherwise, the next check is due a doubled interval later.
        let next = interval
            .saturating_mul(2)
            .min(self.policy.remote_recheck_max_ms.max(interval));
        self.schedule_recheck(gid, next);
        let due = self.remotes.recheck(&gid).map_or(Time::ZERO, |r| r.0);
        self.ask_sa_about(gid, due);
    }

    /// Whether a connection the engine acts on may use a path to remote GID `gid` (its
    /// primary, its alternate or one of its candidates leads there).
    fn gid_in_use(&self, gid: Gid) -> bool {
        self.live_conns().any(|(_, c)| {
            c.primary.dgid == gid
                || c.alt.path().is_some_and(|a| a.dgid == gid)
                || c.candidates.iter().any(|p| p.dgid == gid)
        })
    }

    /// Ask the SA, through every usable InfiniBand port, for paths to `gid`; the answer
    /// counts only while the recheck due at `due` is still the latest.
    fn ask_sa_about(&mut self, gid: Gid, due: Time) {
        let ports: Vec<PortKey> = self
            .ports
            .iter()
            .filter(|(_, p)| {
                p.info.link_layer == LinkLayer::InfiniBand && p.health.usable(self.now)
            })
            .map(|(k, _)| *k)
            .collect();
        for port in ports {
            debug!(%gid, %port, "asking the SA whether an out-of-service GID is back");
            self.stats.path_queries += 1;
            self.issue_sa(
                CommandOp::ResolvePaths { port, dgid: gid },
                Pending::Recheck(gid, due),
            );
        }
    }

    /// An answer to [`Engine::recheck_remote`]: any path means the SA routes to `gid`
    /// again, so it is in service, unless a notice about `gid` came after the question
    /// left (the SA's answer is then older than what the SM said last: a port that came
    /// back and died again must not be revived by the answer about its short life).
    pub(super) fn recheck_done(
        &mut self,
        gid: Gid,
        due: Time,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        if self.remotes.recheck(&gid).map(|r| r.0) != Some(due) {
            debug!(%gid, "an SA recheck answer older than the last notice: ignored");
            return;
        }
        let reachable =
            matches!(&result, Ok(CommandOutcome::Paths(p)) if p.iter().any(|p| p.dgid == gid));
        let still_down = !self.remotes.up(&gid);
        if reachable && still_down {
            info!(%gid, "the SA routes to a GID held out of service: it is back (trap 64 lost?)");
            self.remote_in_service(gid);
        }
    }

    // ---------------------------------------------------------------- failures

    /// Something on some paths died (`cause` says what): move connections off them. A
    /// path being armed or negotiated that dies meanwhile is armed all the same (see
    /// `select`).
    pub(super) fn path_failed(&mut self, hit: impl Fn(&Path) -> bool, cause: Cause) {
        // One pass to find who is hit (most connections usually are not), then act.
        let hits: Vec<(ConnId, bool)> = self
            .live_conns()
            .filter_map(|(id, c)| {
                let primary_hit = hit(&c.primary);
                let alt_hit = c.alt.path().is_some_and(|a| hit(&a));
                (primary_hit || alt_hit).then_some((id, primary_hit))
            })
            .collect();
        for (id, primary_hit) in hits {
            if primary_hit {
                self.primary_down(id, cause);
                self.primary_failed(id);
            } else {
                self.alternate_failed(id);
            }
        }
    }

    /// Remember what killed the primary of `id`, unless something already did: the
    /// first failure seen is what the notifications of the move say.
    pub(super) fn primary_down(&mut self, id: ConnId, cause: Cause) {
        if let Some(c) = live_mut(&mut self.conns, id) {
            c.primary_down.get_or_insert(cause);
        }
    }

    /// The primary path of `id` is dead (local port down, remote GID out of service,
    /// progress stalled): migrate while an armed healthy alternate exists.
    pub(super) fn primary_failed(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.phase().moving() {
            return;
        }
        let alt = c
            .alt
            .armed()
            .filter(|a| !c.is_bad(a, self.now) && self.path_up(a));
        let mode = c.mode;
        let armed_on_dead = c.alt.is_armed();
        match alt {
            Some(alt) if self.leaves_move_to_hca(c) => {
                debug!(%id, to = %alt, "primary down: the HCA moves it when its retries run out");
            }
            Some(alt) => {
                // A migration overrides whatever negotiation was going on.
                self.stats.migrations_forced += 1;
                if self.move_at_once(id, &alt) {
                    debug!(%id, to = %alt, "primary dead, alternate probed alive: moving now, telling the peer");
                    self.tell_and_move(id, alt);
                } else {
                    debug!(%id, to = %alt, ?mode, "primary down: asking the peer to move first");
                    self.probe_and_move(id, alt);
                }
            }
            None => {
                warn!(%id, "primary down with no armed healthy alternate");
                self.update_protection(id, UnprotectedReason::PrimaryDownUnarmed);
                // An alternate armed on a dead path stays: the HCA migrates there when
                // its retries run out, which gives the connection a second retry budget
                // for either path to come back. Without one, look for one now: the
                // connection survives if the port returns before the transport gives up.
                if !armed_on_dead {
                    self.need_rearm(id);
                } else {
                    self.recheck_alternate_now(id);
                }
            }
        }
    }

    /// Whether the engine leaves the move of `c`, whose primary died with a healthy
    /// alternate armed, to the HCA's own migration on retry exhaustion
    /// ([`crate::FastMoves`]): a hardware QP that only the application's traffic can
    /// arm again, which a move at once would leave unarmed for as long as that
    /// traffic pauses.
    ///
    /// Under `self_armed`, a stall (the application or the operator says the QP's
    /// traffic stopped, [`crate::ManagerHandle::report_stall`]) moves at once: the QP has
    /// unacknowledged packets on the dead path, which it sends again on the new one
    /// right after the move, and the peer's answers arm it within a round trip, as apm's
    /// own write would. Left to the HCA, the move waits a whole retry budget, and on a
    /// device that retries without end (rxe, retry count 7) it never comes.
    fn leaves_move_to_hca(&self, c: &Conn) -> bool {
        c.mode == MigrationMode::Hardware
            && match self.policy.fast_moves {
                FastMoves::SelfArmed => !c.arming.prompt() && c.primary_down != Some(Cause::Stall),
                FastMoves::Always => false,
                FastMoves::Never => true,
            }
    }

    /// The primary of `id` is dead and its armed alternate is held dead only because
    /// the SM said its remote GID is out of service: ask the SA now whether it routes
    /// there, rather than at the next scheduled recheck. A Report the SM resent after a
    /// newer one (OpenSM resends a Report until the subscriber answers) can declare a
    /// working port dead; on the connection's last path that mistake is fatal. A "yes"
    /// revives the GID and the connection moves there (`path_up_while_held`).
    fn recheck_alternate_now(&mut self, id: ConnId) {
        let Some(alt) = self.conns.get(&id).and_then(|c| c.alt.path()) else {
            return;
        };
        let port_up = self.ports.get(&alt.port).is_some_and(|p| p.health.up);
        let gid = alt.dgid;
        if !port_up || self.remotes.up(&gid) {
            return;
        }
        let recent = Policy::ms(self.policy.lap_timeout_ms);
        if !self.remotes.ask_out_of_turn(gid, self.now, recent) {
            return;
        }
        let Some((due, _)) = self.remotes.recheck(&gid) else {
            return;
        };
        self.ask_sa_about(gid, due);
    }

    /// Force `id` onto its armed alternate (hardware).
    pub(super) fn force_migration(&mut self, id: ConnId, why: MoveReason) {
        let cmd = self.issue_qp(id, CommandOp::ForceMigrate { conn: id });
        self.replace_phase(id, Phase::Migrating { cmd, why });
    }

    /// The primary of `id` is dead and its armed alternate `alt` looks healthy: ask the
    /// peer over `alt` to move there (`Migrate`), and move when it answers. A forced
    /// migration spends the armed alternate; onto a path that turns out dead it leaves
    /// the QP one retry budget where the HCA, left alone, would have had two (the
    /// primary's, then the alternate's after migrating on exhaustion); a RoCE QP moved
    /// in software onto a dead path while its peer stays stalls both. The peer's answer
    /// proves `alt` works both ways. Without an answer nothing moves: the HCA migrates
    /// on retry exhaustion as it would without apm, and the peer's first packet with
    /// MigReq=1 on `alt` moves our QP too. (A software connection whose own rail died
    /// under it, with `alt` probed alive, moves without waiting: `move_at_once`.)
    fn probe_and_move(&mut self, id: ConnId, alt: Path) {
        let Some(msg) = self.migrate_msg(id, alt, MigrateIntent::Probe) else {
            return;
        };
        self.replace_phase(id, Phase::Idle);
        self.await_peer(id, alt.port, PeerAddr::far_end(&alt), msg);
    }

    /// Move `id` to `path` in software, dropping whatever it was doing; `responder` is
    /// the peer whose request this answers (None when we move first).
    pub(super) fn start_sw_migration(
        &mut self,
        id: ConnId,
        path: Path,
        responder: Option<Responder>,
        peer: PeerOnPath,
    ) {
        let op = CommandOp::SoftwareMigrate {
            conn: id,
            path,
            peer: peer.as_command(),
            announce: self.word_after_move(id, path, responder),
        };
        let cmd = self.issue_qp(id, op);
        self.replace_phase(
            id,
            Phase::SwMigrating {
                cmd,
                path,
                responder,
                peer,
            },
        );
    }

    /// The peer of software connection `id` runs on `path` (our primary, or where our
    /// software move in flight goes): the provider may send what it held back for it
    /// there (`CommandOp::PeerThere`). A hint, sent without waiting on the connection's
    /// QP commands; hardware QPs need none.
    pub(super) fn tell_peer_there(&mut self, id: ConnId, path: Path) {
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.mode == MigrationMode::Software)
        {
            self.issue(CommandOp::PeerThere { conn: id, path }, Pending::Hint);
        }
    }

    /// The alternate of `id` is dead: look for a better one.
    pub(super) fn alternate_failed(&mut self, id: ConnId) {
        self.update_protection(id, UnprotectedReason::AlternateDown);
        self.need_rearm(id);
    }

    /// Some paths are up again but held down for flapping: nothing is armed onto them
    /// yet, but a connection whose primary is dead moves to its armed alternate among
    /// them now (a flapping path beats a dead one).
    pub(super) fn path_up_while_held(&mut self, hit: impl Fn(&Path) -> bool) {
        let ids: Vec<ConnId> = self
            .live_conns()
            .filter(|(_, c)| c.alt.armed().is_some_and(|a| hit(&a)))
            .filter(|(_, c)| self.should_move_now(c))
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            self.primary_failed(id);
        }
    }

    /// The armed alternate of `c` is up while its primary is dead, or stalled (its
    /// traffic stopped: on RoCE a far end's port going down tells this side nothing
    /// else): move now rather than wait for the transport to give up on the primary.
    fn should_move_now(&self, c: &Conn) -> bool {
        (!self.path_up(&c.primary) || c.primary_down == Some(Cause::Stall))
            && c.alt
                .armed()
                .is_some_and(|a| self.path_up(&a) && !c.is_bad(&a, self.now))
    }

    /// Some paths are usable again: an armed alternate that came back protects again,
    /// connections that lack protection re-arm, and those whose alternate scores below
    /// what is now available upgrade.
    pub(super) fn path_returned(&mut self, hit: impl Fn(&Path) -> bool) {
        // What killed a primary that works again is history: a later move has its own.
        let revived: Vec<ConnId> = self
            .live_conns()
            .filter(|(_, c)| c.primary_down.is_some() && hit(&c.primary))
            .filter(|(_, c)| self.path_up(&c.primary))
            .map(|(id, _)| id)
            .collect();
        for id in revived {
            if let Some(c) = self.conns.get_mut(&id) {
                c.primary_down = None;
            }
        }
        let ids: Vec<ConnId> = self
            .live_conns()
            .filter(|(_, c)| c.candidates.iter().any(&hit) || c.alt.path().is_some_and(|a| hit(&a)))
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            self.update_protection(id, UnprotectedReason::AlternateDown);
            let Some(c) = self.conns.get(&id) else {
                continue;
            };
            if self.should_move_now(c) {
                self.primary_failed(id);
                continue;
            }
            let current = self.current_score(c);
            let better = self
                .choose(c)
                .is_some_and(|(_, s)| current.is_none_or(|cur| s > cur));
            if !better {
                continue;
            }
            if !self.is_protected(c) {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.failed_rearms = 0;
                }
            }
            self.need_rearm(id);
        }
    }

    pub(super) fn lose(&mut self, id: ConnId, reason: LostReason) {
        let Some(c) = live_mut(&mut self.conns, id) else {
            return;
        };
        c.told = Told::Lost;
        c.alt.disarm();
        c.chores = Chores::default();
        c.deferred_lap = None;
        self.stats.lost += 1;
        warn!(%id, ?reason, "connection lost");
        self.abort_phase(id);
        self.set_phase(id, Phase::Idle);
        self.notify(id, NotificationKind::Lost { reason });
    }

    // ---------------------------------------------------------------- QP events

    pub(super) fn qp_event(&mut self, id: ConnId, event: QpEvent) {
        let Some(c) = live(&self.conns, id) else {
            return;
        };
        debug!(%id, ?event, "QP event");
        match event {
            QpEvent::PathMigrated => {
                // Our own forced migration raises PATH_MIG too, and the event may come
                // after we have already armed the next alternate: shortly after forcing,
                // an event is ours unless the QP says otherwise (asked when idle).
                let recently_forced = c.forced_at.is_some_and(|t| {
                    self.now.since(t) <= Policy::ms(self.policy.forced_event_grace_ms)
                }) && !matches!(c.phase(), Phase::Migrating { .. });
                let own_forced = recently_forced && c.mig == MigState::Migrated;
                if recently_forced && !own_forced {
                    self.query(id);
                    return;
                }
                // The HCA migrates only from ARMED: an alternate the QP was last known to
                // hold armed (or arming) is where it went, even when a LAP given up on
                // left it unagreed with the peer.
                let may_migrate = c.alt.path().is_some()
                    && (c.alt.is_armed()
                        || c.mig != MigState::Migrated
                        || matches!(
                            c.phase(),
                            Phase::Arming { .. }
                                | Phase::Migrating { .. }
                                | Phase::LoadingToFollow { .. }
                        ));
                if own_forced {
                    debug!(%id, "PATH_MIG of our own forced migration");
                } else if may_migrate {
                    self.stats.migrations_observed += 1;
                    let why = match c.phase() {
                        Phase::Migrating { why, .. } => *why,
                        _ => MoveReason::Ours,
                    };
                    self.migrated(id, Moved::Unforced, why);
                } else {
                    // Not armed as far as we know: ask the QP what happened.
                    self.query(id);
                }
            }
            QpEvent::PathMigrationError => {
                let now = self.now;
                let hold = now.plus(Policy::ms(self.policy.bad_path_hold_ms));
                if let Some(c) = self.conns.get_mut(&id) {
                    if let Some(a) = c.alt.take() {
                        c.mark_bad(a, hold, now);
                    }
                    c.mig = MigState::Migrated;
                }
                self.update_protection(id, UnprotectedReason::AlternateFailed);
                self.need_rearm(id);
            }
            QpEvent::CommEstablished => {
                // Traffic flows on the current primary: nothing to decide, but worth a
                // trace. The re-arm race (docs/iba-facts.md, section 2: the next
                // alternate must be loaded between MIGRATED and this event) is already
                // run: the re-arm started at PATH_MIG.
                debug!(%id, "communication established");
            }
            QpEvent::Fatal => self.lose(id, LostReason::QpFatal),
            QpEvent::SqDrained => {}
            QpEvent::PrimaryStalled => {
                self.primary_down(id, Cause::Stall);
                self.primary_failed(id);
            }
        }
    }

    pub(super) fn query(&mut self, id: ConnId) {
        let busy = self.conns.get(&id).is_none_or(|c| c.phase().busy());
        if busy {
            return;
        }
        let cmd = self.issue_qp(id, CommandOp::QueryQp { conn: id });
        self.set_phase(id, Phase::Querying { cmd });
    }

    /// The QP of `id` now runs on what was its alternate. Then, by `why`: tell the peer
    /// where we are (`Migrate`, retransmitted until it answers) when it has not heard;
    /// answer it when it asked. Re-arming waits for that, so that the peer has moved
    /// before either side arms the next alternate (a QP that arms sends MigReq=0, and a
    /// peer still on the old path would never follow it); it still comes before the
    /// migrated path's COMM_EST (the re-arm race the IBA's APM leaves to software).
    pub(super) fn migrated(&mut self, id: ConnId, moved: Moved, why: MoveReason) {
        let forced = moved == Moved::Forced;
        let now = self.now;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(new_primary) = c.alt.take() else {
            return;
        };
        let old = std::mem::replace(&mut c.primary, new_primary);
        let cause = c.primary_down.take();
        c.learn(old);
        c.mig = MigState::Migrated;
        c.chores.add(Chore::Rearm);
        // "Migrated" itself tells the application the connection is unprotected.
        c.told = c.told.unprotected(UnprotectedReason::PrimaryDownUnarmed);
        if moved == Moved::Forced {
            c.forced_at = Some(now);
        }
        info!(%id, primary = %new_primary, forced, cause = cause.map(Cause::name), "migrated");
        self.abort_phase(id);
        self.notify(
            id,
            NotificationKind::Migrated {
                primary: new_primary,
                forced,
                cause,
            },
        );
        let back = self.conns.get(&id).is_some_and(|c| {
            select::rank(&new_primary, &old).is_some() && !c.is_bad(&old, self.now)
        });
        match why {
            MoveReason::PeerAsked(r) => {
                self.answer_moved(id, r);
                if back {
                    // The word comes within a round trip and a device command; without
                    // it, ask (every quarter LAP timeout), and after two LAP timeouts
                    // arm anyway.
                    let give_up = self
                        .now
                        .plus(Policy::ms(self.policy.lap_timeout_ms.saturating_mul(2)));
                    self.set_phase(id, Phase::AwaitFollow { old, give_up });
                    self.set_deadline(id, Some(self.follow_check_at(give_up)));
                } else {
                    self.after_phase(id);
                }
                return;
            }
            MoveReason::PeerAskedAndMoved(r) => self.answer_moved(id, r),
            // The peer hears where we are.
            MoveReason::Ours => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.chores.add(Chore::Announce);
                }
            }
            // The peer moved when we asked and waits for word that we followed: an
            // unsolicited "moved" answer is that word.
            MoveReason::PeerMoved => {
                let r = Responder {
                    to: PeerAddr::far_end(&new_primary),
                    port: new_primary.port,
                    digest: 0,
                };
                self.answer_moved(id, r);
            }
        }
        // Both sides know the path they left: arm it again at once, dead or not, as
        // the HCA's own users did (load it, set REARM), with no message to lose. It
        // comes back as the alternate the peer arms too, and a dead one still gives the
        // second retry budget. A better alternate, if any, is negotiated after.
        if back {
            self.start_load(id, old, None);
        } else {
            self.after_phase(id);
        }
    }

    /// When a connection in `AwaitFollow` next asks its peer whether it followed.
    pub(super) fn follow_check_at(&self, give_up: Time) -> Time {
        self.now
            .plus(Policy::ms((self.policy.lap_timeout_ms / 4).max(1)))
            .min(give_up)
    }

    /// The peer that asked us to move has moved too (`AwaitFollow`): arm the path we
    /// both left.
    pub(super) fn peer_followed(&mut self, id: ConnId) {
        let Some(Phase::AwaitFollow { old, .. }) = self.conns.get(&id).map(|c| c.phase().clone())
        else {
            return;
        };
        self.set_phase(id, Phase::Idle);
        self.start_load(id, old, None);
    }
}
