//! The engine: a deterministic, sans-IO state machine that keeps connections armed.
//!
//! Methods come in four groups, in the style of quinn-proto:
//! - inputs: [`Engine::handle_input`] and [`Engine::handle_timeout`], each with `now`;
//! - outputs: [`Engine::poll_output`] (commands and notifications, in order);
//! - timing: [`Engine::poll_timeout`] (when to call `handle_timeout` next);
//! - getters: [`Engine::connection`], [`Engine::stats`], ...
//!
//! After every input, drain `poll_output` and re-read `poll_timeout`. Time never goes
//! backwards: an input older than the last is treated as happening at the last one.
//! Extra `handle_timeout` calls are harmless.
//!
//! The engine never reads a clock, never sleeps, does no IO, spawns nothing, and iterates
//! only ordered collections: the same inputs give the same outputs.

mod conn;
mod health;
mod peer;
mod pending;
mod select;
mod timers;

use crate::io::*;
use crate::policy::{Policy, PolicyError};
use crate::types::*;
use conn::{Conn, Phase, Responder, Told};
use health::Health;
use pending::PendingTable;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use timers::{TimerKey, Timers};
use tracing::{debug, info, warn};

/// A misuse of the engine's API (not a fault in the fabric: those are inputs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// `Protect` with a connection id already in use.
    #[error("connection {0} is already protected")]
    DuplicateConnection(ConnId),
    /// `Protect` with a local comm id another connection has.
    #[error("comm id {0:#x} is already used by another connection")]
    DuplicateCommId(u32),
    /// `Unprotect` or an event for a connection the engine does not know.
    #[error("unknown connection {0}")]
    UnknownConnection(ConnId),
    /// A connection spec that cannot work.
    #[error("connection {conn}: {why}")]
    InvalidSpec {
        /// The connection.
        conn: ConnId,
        /// What is wrong.
        why: &'static str,
    },
}

/// How a connection stands, as the engine believes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protection {
    /// An alternate is armed and healthy.
    Armed,
    /// Moving to the alternate (forced or software migration in flight).
    Migrating,
    /// No armed healthy alternate (a re-arm may be in progress).
    Unprotected,
    /// The QP is gone.
    Lost,
}

/// A read-only view of one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ConnStatus {
    /// Protection state.
    pub protection: Protection,
    /// The current primary path.
    pub primary: Path,
    /// The loaded/agreed alternate, if any (it may be unhealthy: see `protection`).
    pub alternate: Option<Path>,
    /// Migration state as last known.
    pub mig_state: MigState,
}

/// Counters, for reports and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// LAPs sent, first transmissions.
    pub laps_sent: u64,
    /// LAP retransmissions.
    pub lap_retransmits: u64,
    /// APRs sent.
    pub aprs_sent: u64,
    /// MRAs sent.
    pub mras_sent: u64,
    /// Software-migration messages sent (requests, retransmissions and acks).
    pub migrate_msgs_sent: u64,
    /// Migrations the engine forced (hardware) or performed (software).
    pub migrations_forced: u64,
    /// Hardware migrations the engine learnt of from `PATH_MIG`.
    pub migrations_observed: u64,
    /// Times a connection became armed.
    pub arms: u64,
    /// SA PathRecord queries issued.
    pub path_queries: u64,
    /// SA subscriptions issued.
    pub subscriptions: u64,
    /// LAPs rejected because they did not come from the connection's peer.
    pub laps_from_strangers: u64,
    /// Connections lost.
    pub lost: u64,
}

#[derive(Debug)]
struct LocalPort {
    info: PortInfo,
    health: Health,
    /// A subscription is outstanding or established (false: none, or retry pending).
    subscribed: bool,
    /// The SA facet said subscriptions are unsupported: stop asking.
    subscribe_unsupported: bool,
}

#[derive(Debug, Default)]
struct CacheEntry {
    paths: Vec<Path>,
    /// A query is out.
    pending: bool,
    /// The SA answered (possibly with no paths): do not ask again until invalidated.
    resolved: bool,
}

/// What an outstanding command was for.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Conn(ConnId),
    Send,
    Resolve(PortKey, Gid),
    Subscribe(PortKey),
}

/// The path-protection engine. See the module documentation.
#[derive(Debug)]
pub struct Engine {
    policy: Policy,
    now: Time,
    // Boxed: B-tree nodes stay small and half-empty nodes waste pointers, not whole
    // connections (the memory target is 512 bytes per connection).
    conns: BTreeMap<ConnId, Box<Conn>>,
    by_comm_id: BTreeMap<u32, ConnId>,
    ports: BTreeMap<PortKey, LocalPort>,
    remotes: BTreeMap<Gid, Health>,
    cache: BTreeMap<(PortKey, Gid), CacheEntry>,
    pending: PendingTable<Pending>,
    timers: Timers,
    out: VecDeque<Output>,
    rearm_queue: VecDeque<ConnId>,
    rearms_active: usize,
    stats: Stats,
}

impl Engine {
    /// An engine with `policy`, or the reason the policy is unusable.
    pub fn new(policy: Policy) -> Result<Engine, PolicyError> {
        policy.validate()?;
        Ok(Engine {
            policy,
            now: Time::ZERO,
            conns: BTreeMap::new(),
            by_comm_id: BTreeMap::new(),
            ports: BTreeMap::new(),
            remotes: BTreeMap::new(),
            cache: BTreeMap::new(),
            pending: PendingTable::new(1),
            timers: Timers::default(),
            out: VecDeque::new(),
            rearm_queue: VecDeque::new(),
            rearms_active: 0,
            stats: Stats::default(),
        })
    }

    // ---------------------------------------------------------------- getters

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The last time the engine was given.
    pub fn now(&self) -> Time {
        self.now
    }

    /// How one connection stands.
    pub fn connection(&self, id: ConnId) -> Option<ConnStatus> {
        self.conns.get(&id).map(|c| self.status_of(c))
    }

    /// Every connection, in id order.
    pub fn connections(&self) -> impl Iterator<Item = (ConnId, ConnStatus)> + '_ {
        self.conns.iter().map(|(id, c)| (*id, self.status_of(c)))
    }

    /// Number of protected connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no connection is protected.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// True when `path` is usable now: its local port is up and not held down, and its
    /// remote GID is not known to be out of service or held down.
    pub fn path_usable(&self, path: &Path) -> bool {
        self.port_usable(path.port) && self.remote_usable(&path.dgid)
    }

    fn status_of(&self, c: &Conn) -> ConnStatus {
        let protection = if c.lost {
            Protection::Lost
        } else if matches!(
            c.phase(),
            Phase::Migrating { .. } | Phase::SwMigrating { .. }
        ) {
            Protection::Migrating
        } else if self.is_protected(c) {
            Protection::Armed
        } else {
            Protection::Unprotected
        };
        ConnStatus {
            protection,
            primary: c.primary,
            alternate: c.alternate,
            mig_state: c.mig,
        }
    }

    fn is_protected(&self, c: &Conn) -> bool {
        !c.lost && c.armed && c.alternate.is_some_and(|a| self.path_usable(&a))
    }

    fn port_usable(&self, port: PortKey) -> bool {
        self.ports
            .get(&port)
            .is_some_and(|p| p.health.usable(self.now))
    }

    fn remote_usable(&self, gid: &Gid) -> bool {
        self.remotes.get(gid).is_none_or(|h| h.usable(self.now))
    }

    fn usable_for(&self, c: &Conn, path: &Path) -> bool {
        self.path_usable(path) && !c.is_bad(path, self.now)
    }

    // ---------------------------------------------------------------- outputs

    /// The next command or notification, in the order the engine decided them.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Engine::handle_timeout`] should be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.next()
    }

    fn issue(&mut self, op: CommandOp, why: Pending) -> CommandId {
        let id = self.pending.issue(why);
        self.out.push_back(Output::Command(Command { id, op }));
        id
    }

    fn send(&mut self, port: PortKey, to: PeerAddr, msg: PeerMsg) {
        match msg {
            PeerMsg::Apr(_) => self.stats.aprs_sent += 1,
            PeerMsg::Mra(_) => self.stats.mras_sent += 1,
            PeerMsg::Migrate(_) | PeerMsg::MigrateAck(_) => self.stats.migrate_msgs_sent += 1,
            PeerMsg::Lap(_) => {}
        }
        self.issue(CommandOp::SendPeer { port, to, msg }, Pending::Send);
    }

    fn notify(&mut self, conn: ConnId, kind: NotificationKind) {
        self.out.push_back(Output::Notify(Notification {
            time: self.now,
            conn,
            kind,
        }));
    }

    fn set_deadline(&mut self, id: ConnId, at: Option<Time>) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.deadline = at;
            if let Some(at) = at {
                self.timers.schedule(at, TimerKey::Conn(id));
            }
        }
    }

    // ---------------------------------------------------------------- inputs

    fn advance(&mut self, now: Time) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Feed one input that happened at `now`. An `Err` means the caller misused the API
    /// (duplicate or unknown connection); faults in the fabric or from peers are never
    /// errors here, they are handled.
    pub fn handle_input(&mut self, now: Time, input: Input) -> Result<(), EngineError> {
        self.advance(now);
        // Deadlines that passed before this input take effect first, so that the input
        // sees the state a real clock would have produced.
        self.run_timers();
        match input {
            Input::Protect(spec) => self.protect(spec)?,
            Input::Unprotect(id) => self.unprotect(id)?,
            Input::PortInfo(info) => self.port_info(info),
            Input::PortEvent { port, event } => self.port_event(port, event),
            Input::DeviceFatal { device } => self.device_fatal(device),
            Input::QpEvent { conn, event } => self.qp_event(conn, event)?,
            Input::RemoteGid { gid, in_service } => self.remote_gid(gid, in_service),
            Input::PeerMessage { from, port, msg } => self.peer_message(from, port, msg),
            Input::CommandDone { id, result } => self.command_done(id, result),
        }
        Ok(())
    }

    /// Let deadlines up to `now` take effect.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
        self.run_timers();
    }

    fn run_timers(&mut self) {
        while let Some((at, key)) = self.timers.pop_due(self.now) {
            match key {
                TimerKey::Conn(id) => {
                    let current = self.conns.get(&id).and_then(|c| c.deadline);
                    if current == Some(at) {
                        self.set_deadline(id, None);
                        self.conn_deadline(id);
                    }
                }
                TimerKey::PortHold(port) => {
                    if self.port_usable(port) {
                        self.path_returned(|p| p.port == port);
                    }
                }
                TimerKey::RemoteHold(gid) => {
                    if self.remote_usable(&gid) {
                        self.path_returned(|p| p.dgid == gid);
                    }
                }
                TimerKey::Subscribe(port) => self.subscribe(port),
            }
        }
        // Stale entries pile up when many connections re-schedule; sweep them now and
        // then so memory stays bounded by live deadlines.
        if self.timers.len() > 4 * self.conns.len() + 1024 {
            let conns = &self.conns;
            self.timers.retain(|t, k| match k {
                TimerKey::Conn(id) => conns.get(&id).is_some_and(|c| c.deadline == Some(t)),
                _ => true,
            });
        }
    }

    // ---------------------------------------------------------------- API calls

    fn protect(&mut self, spec: ConnSpec) -> Result<(), EngineError> {
        if self.conns.contains_key(&spec.id) {
            return Err(EngineError::DuplicateConnection(spec.id));
        }
        if self.by_comm_id.contains_key(&spec.local_comm_id) {
            return Err(EngineError::DuplicateCommId(spec.local_comm_id));
        }
        if let Some(alt) = spec.agreed_alternate {
            if select::rank(&spec.primary, &alt).is_none() {
                return Err(EngineError::InvalidSpec {
                    conn: spec.id,
                    why:
                        "the agreed alternate is the primary, on another device, or has another MTU",
                });
            }
        }
        let id = spec.id;
        let conn = Conn::new(&spec);
        info!(%id, primary = %conn.primary, "protecting connection");
        self.by_comm_id.insert(conn.local_comm_id, id);
        self.conns.insert(id, Box::new(conn));
        match spec.agreed_alternate {
            // Agreed at connect time (REQ/REP): load and arm without a LAP.
            Some(alt) if self.path_usable(&alt) => self.start_load(id, alt, None),
            _ => self.need_rearm(id),
        }
        Ok(())
    }

    fn unprotect(&mut self, id: ConnId) -> Result<(), EngineError> {
        let Some(c) = self.conns.remove(&id) else {
            return Err(EngineError::UnknownConnection(id));
        };
        self.by_comm_id.remove(&c.local_comm_id);
        if c.slot {
            self.rearms_active -= 1;
            self.pump_queue();
        }
        self.rearm_queue.retain(|q| *q != id);
        info!(%id, "unprotected on request");
        Ok(())
    }

    // ---------------------------------------------------------------- local ports

    fn port_info(&mut self, info: PortInfo) {
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
                        subscribed: false,
                        subscribe_unsupported: !is_ib,
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
                let old_lid = p.info.lid;
                let new_lid = info.lid;
                p.info = info;
                if old_lid != new_lid {
                    self.lid_changed(key, old_lid, new_lid);
                }
            }
        }
    }

    fn port_event(&mut self, port: PortKey, event: PortEvent) {
        debug!(%port, ?event, "port event");
        match event {
            PortEvent::Down => self.port_down(port),
            PortEvent::Active => self.port_up(port),
            PortEvent::SmChange | PortEvent::ClientReregister => {
                // The SA may have forgotten us: subscribe again. Cached paths may come
                // from an SM that routes differently now.
                if let Some(p) = self.ports.get_mut(&port) {
                    p.subscribed = false;
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
                    p.subscribed = false;
                }
                self.invalidate_cache(|k| k.0 == port);
                self.subscribe(port);
            }
            PortEvent::PkeyChange | PortEvent::GidChange => {
                self.invalidate_cache(|k| k.0 == port);
            }
        }
    }

    fn port_down(&mut self, port: PortKey) {
        let policy = self.policy.clone();
        let now = self.now;
        let changed = match self.ports.get_mut(&port) {
            Some(p) => p.health.fail(now, &policy),
            None => {
                warn!(%port, "PORT_ERR on a port never reported: ignored");
                return;
            }
        };
        if changed {
            info!(%port, "local port down");
            self.path_failed(|p| p.port == port);
        }
    }

    fn port_up(&mut self, port: PortKey) {
        let policy = self.policy.clone();
        let now = self.now;
        let Some(p) = self.ports.get_mut(&port) else {
            warn!(%port, "PORT_ACTIVE on a port never reported: ignored");
            return;
        };
        // A port that is back may sit behind a new SM or LID: re-learn its paths.
        if let Some(usable_at) = p.health.recover(now, &policy) {
            info!(%port, held_until = %usable_at, "local port active");
            self.invalidate_cache(|k| k.0 == port);
            if usable_at > now {
                self.timers.schedule(usable_at, TimerKey::PortHold(port));
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
    /// traffic, LAPs and the next notices tell otherwise.
    fn forget_stale_remote_verdicts(&mut self, port: PortKey) {
        let Some(p) = self.ports.get(&port) else {
            return;
        };
        let prefixes: Vec<&[u8]> = p.info.gids.iter().map(|g| &g.0[..8]).collect();
        let stale: Vec<Gid> = self
            .remotes
            .iter()
            .filter(|(g, h)| !h.up && prefixes.contains(&&g.0[..8]))
            .map(|(g, _)| *g)
            .collect();
        for gid in stale {
            debug!(%port, %gid, "out-of-service verdict may be stale: forgotten");
            self.remote_gid(gid, true);
        }
    }

    fn lid_changed(&mut self, port: PortKey, old: Lid, new: Lid) {
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
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.lost {
                continue;
            }
            rebase(&mut c.primary);
            c.candidates.iter_mut().for_each(rebase);
            let alt_on_port = c.alternate.is_some_and(|a| a.port == port);
            if let Some(a) = c.alternate.as_mut() {
                rebase(a);
            }
            let primary_on_port = c.primary.port == port;
            if alt_on_port {
                // The peer's copy of this alternate names our old LID: agree on it anew.
                c.armed = false;
                self.update_protection(id, UnprotectedReason::AlternateDown);
                self.need_rearm(id);
            } else if primary_on_port {
                // The peer's primary still names our old LID and cannot reach us: move
                // to the alternate while it is armed, then re-arm from there.
                self.primary_failed(id);
            }
        }
    }

    fn device_fatal(&mut self, device: u16) {
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.primary.port.device == device && !c.lost)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.lose(id, LostReason::DeviceFatal);
        }
    }

    // ---------------------------------------------------------------- remote ports

    fn remote_gid(&mut self, gid: Gid, in_service: bool) {
        // Notices about our own ports: the local port events are the better source.
        if self.ports.values().any(|p| p.info.gids.contains(&gid)) {
            debug!(%gid, in_service, "notice about a local GID: ignored");
            return;
        }
        let policy = self.policy.clone();
        let now = self.now;
        let h = self.remotes.entry(gid).or_insert_with(|| Health::new(true));
        if in_service {
            if let Some(usable_at) = h.recover(now, &policy) {
                info!(%gid, held_until = %usable_at, "remote GID in service");
                // Its LIDs may have changed (trap 64 follows a sweep).
                self.invalidate_cache(|k| k.1 == gid);
                if usable_at > now {
                    self.timers.schedule(usable_at, TimerKey::RemoteHold(gid));
                } else {
                    self.path_returned(|p| p.dgid == gid);
                }
            }
        } else if h.fail(now, &policy) {
            info!(%gid, "remote GID out of service");
            self.invalidate_cache(|k| k.1 == gid);
            self.path_failed(|p| p.dgid == gid);
        }
    }

    // ---------------------------------------------------------------- failures

    /// Something on some paths died: move connections off them.
    fn path_failed(&mut self, hit: impl Fn(&Path) -> bool) {
        // One pass to find who is hit (most connections usually are not), then act.
        let hits: Vec<(ConnId, bool, bool)> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.lost)
            .filter_map(|(id, c)| {
                let primary_hit = hit(&c.primary);
                let alt_hit = c.alternate.is_some_and(|a| hit(&a));
                let target_hit = c.phase().target().is_some_and(|t| hit(&t));
                (primary_hit || alt_hit || target_hit).then_some((*id, primary_hit, target_hit))
            })
            .collect();
        for (id, primary_hit, target_hit) in hits {
            if primary_hit {
                if target_hit {
                    // Never keep negotiating a path that just died with the primary.
                    self.abort_phase(id);
                }
                self.primary_failed(id);
            } else {
                self.alternate_failed(id, target_hit);
            }
        }
    }

    /// The primary path of `id` is dead (local port down, remote GID out of service,
    /// progress stalled): migrate while an armed healthy alternate exists.
    fn primary_failed(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if matches!(
            c.phase(),
            Phase::Migrating { .. } | Phase::SwMigrating { .. }
        ) {
            return;
        }
        let alt = c.alternate.filter(|a| c.armed && self.usable_for(c, a));
        let mode = c.mode;
        match alt {
            Some(alt) => {
                // A migration overrides whatever negotiation was going on.
                self.stats.migrations_forced += 1;
                match mode {
                    MigrationMode::Hardware => {
                        debug!(%id, to = %alt, "primary down: forcing migration");
                        let cmd =
                            self.issue(CommandOp::ForceMigrate { conn: id }, Pending::Conn(id));
                        self.replace_phase(id, Phase::Migrating { cmd });
                    }
                    MigrationMode::Software => {
                        debug!(%id, to = %alt, "primary down: software migration");
                        let op = CommandOp::SoftwareMigrate {
                            conn: id,
                            path: alt,
                        };
                        let cmd = self.issue(op, Pending::Conn(id));
                        let phase = Phase::SwMigrating {
                            cmd,
                            path: alt,
                            responder: None,
                        };
                        self.replace_phase(id, phase);
                    }
                }
            }
            None => {
                warn!(%id, "primary down with no armed healthy alternate");
                self.update_protection(id, UnprotectedReason::PrimaryDownUnarmed);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.armed = false;
                }
                // If the connection survives (the port comes back before the transport
                // gives up), it needs an alternate; look for one now.
                self.need_rearm(id);
            }
        }
    }

    /// The alternate (or the path being negotiated) of `id` is dead: find another.
    fn alternate_failed(&mut self, id: ConnId, target_hit: bool) {
        if target_hit {
            self.abort_phase(id);
        }
        self.update_protection(id, UnprotectedReason::AlternateDown);
        self.need_rearm(id);
    }

    /// Some paths are usable again: re-arm connections that lack protection, and upgrade
    /// those whose alternate is worse than what is now available.
    fn path_returned(&mut self, hit: impl Fn(&Path) -> bool) {
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.lost && c.candidates.iter().any(&hit))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(c) = self.conns.get(&id) else {
                continue;
            };
            if !self.is_protected(c) {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.failed_rearms = 0;
                }
                self.need_rearm(id);
                continue;
            }
            let current = c
                .alternate
                .and_then(|a| select::rank(&c.primary, &a))
                .unwrap_or(0);
            let better = select::best(&c.primary, &c.candidates, |p| self.usable_for(c, p))
                .is_some_and(|(_, r)| r > current);
            if better {
                self.need_rearm(id);
            }
        }
    }

    fn lose(&mut self, id: ConnId, reason: LostReason) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.lost {
            return;
        }
        c.lost = true;
        c.armed = false;
        c.told = None;
        c.want_rearm = false;
        c.deferred_lap = None;
        self.stats.lost += 1;
        warn!(%id, ?reason, "connection lost");
        self.abort_phase(id);
        self.set_phase(id, Phase::Idle);
        self.notify(id, NotificationKind::Lost { reason });
    }

    // ---------------------------------------------------------------- QP events

    fn qp_event(&mut self, id: ConnId, event: QpEvent) -> Result<(), EngineError> {
        let Some(c) = self.conns.get(&id) else {
            return Err(EngineError::UnknownConnection(id));
        };
        if c.lost {
            return Ok(());
        }
        debug!(%id, ?event, "QP event");
        match event {
            QpEvent::PathMigrated => {
                let own_forced = c.forced_at.is_some_and(|t| {
                    self.now.since(t) <= Policy::ms(self.policy.forced_event_grace_ms)
                }) && c.mig == MigState::Migrated;
                let may_migrate = c.alternate.is_some()
                    && (c.armed
                        || matches!(c.phase(), Phase::Arming { .. } | Phase::Migrating { .. }));
                if own_forced {
                    debug!(%id, "PATH_MIG of our own forced migration");
                } else if may_migrate {
                    self.stats.migrations_observed += 1;
                    self.migrated(id, false);
                } else {
                    // Not armed as far as we know: ask the QP what happened.
                    self.query(id);
                }
            }
            QpEvent::PathMigrationError => {
                let now = self.now;
                let hold = now.plus(Policy::ms(self.policy.bad_path_hold_ms));
                if let Some(c) = self.conns.get_mut(&id) {
                    if let Some(a) = c.alternate.take() {
                        c.mark_bad(a, hold, now);
                    }
                    c.armed = false;
                    c.mig = MigState::Migrated;
                }
                self.update_protection(id, UnprotectedReason::AlternateFailed);
                self.need_rearm(id);
            }
            QpEvent::CommEstablished => {
                // Traffic flows on the current primary: nothing to decide, but worth a
                // trace (the re-arm was already started at PATH_MIG, seed 001's race).
                debug!(%id, "communication established");
            }
            QpEvent::Fatal => self.lose(id, LostReason::QpFatal),
            QpEvent::SqDrained => {}
            QpEvent::PrimaryStalled => self.primary_failed(id),
        }
        Ok(())
    }

    fn query(&mut self, id: ConnId) {
        let busy = self.conns.get(&id).is_none_or(|c| c.phase().busy());
        if busy {
            return;
        }
        let cmd = self.issue(CommandOp::QueryQp { conn: id }, Pending::Conn(id));
        self.set_phase(id, Phase::Querying { cmd });
    }

    /// The QP of `id` now runs on what was its alternate; start re-arming.
    fn migrated(&mut self, id: ConnId, forced: bool) {
        self.migrated_then(id, forced, true);
    }

    /// The QP of `id` now runs on what was its alternate. With `rearm`, look for a new
    /// alternate at once (a LAP that arrived meanwhile is answered first).
    fn migrated_then(&mut self, id: ConnId, forced: bool, rearm: bool) {
        let now = self.now;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(new_primary) = c.alternate.take() else {
            return;
        };
        let old = std::mem::replace(&mut c.primary, new_primary);
        c.learn(old);
        c.armed = false;
        c.mig = MigState::Migrated;
        // "Migrated" itself tells the application the connection is unprotected.
        c.told = Some(Told::Unprotected(UnprotectedReason::PrimaryDownUnarmed));
        if forced {
            c.forced_at = Some(now);
        }
        info!(%id, primary = %new_primary, forced, "migrated");
        self.abort_phase(id);
        self.notify(
            id,
            NotificationKind::Migrated {
                primary: new_primary,
                forced,
            },
        );
        if rearm {
            // Seed 001: the new alternate is chosen right here, between PATH_MIG and the
            // COMM_EST of the migrated path, so the LAP describes the new geometry.
            if let Some(c) = self.conns.get_mut(&id) {
                c.want_rearm = true;
            }
            self.after_phase(id);
        }
    }

    // ---------------------------------------------------------------- command results

    fn command_done(&mut self, id: CommandId, result: Result<CommandOutcome, ProviderError>) {
        let Some(why) = self.pending.complete(id) else {
            warn!(
                ?id,
                "result for a command never issued or already answered: ignored"
            );
            return;
        };
        match why {
            Pending::Send => {
                if let Err(e) = result {
                    // Retransmission timers cover lost sends; nothing else to do.
                    debug!(error = %e, "peer send failed");
                }
            }
            Pending::Subscribe(port) => self.subscribe_done(port, result),
            Pending::Resolve(port, gid) => self.resolve_done(port, gid, result),
            Pending::Conn(conn) => self.conn_command_done(conn, id, result),
        }
    }

    fn conn_command_done(
        &mut self,
        id: ConnId,
        cmd: CommandId,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.phase().awaited() != Some(cmd) {
            debug!(%id, ?cmd, "result for an abandoned command");
            return;
        }
        if matches!(result, Err(ProviderError::QpInError)) {
            self.lose(id, LostReason::QpFatal);
            return;
        }
        match (c.phase().clone(), result) {
            (
                Phase::Loading {
                    path, responder, ..
                },
                Ok(_),
            ) => {
                if !self.path_usable(&path) {
                    // It died while loading: do not arm a dead path.
                    self.finish_failed(
                        id,
                        responder,
                        ApStatus::Rejected,
                        UnprotectedReason::AlternateDown,
                    );
                    return;
                }
                if let Some(c) = self.conns.get_mut(&id) {
                    c.alternate = Some(path);
                    c.armed = false;
                }
                let cmd = self.issue(CommandOp::SetRearm { conn: id }, Pending::Conn(id));
                self.set_phase(
                    id,
                    Phase::Arming {
                        cmd,
                        path,
                        responder,
                    },
                );
            }
            (
                Phase::Arming {
                    path, responder, ..
                },
                Ok(outcome),
            ) => {
                let mig = match outcome {
                    CommandOutcome::MigState(m) => m,
                    _ => MigState::Rearm,
                };
                self.armed(id, path, mig, responder);
            }
            (
                Phase::Loading {
                    path, responder, ..
                }
                | Phase::Arming {
                    path, responder, ..
                },
                Err(e),
            ) => {
                warn!(%id, error = %e, "loading/arming the alternate failed");
                let now = self.now;
                let hold = now.plus(Policy::ms(self.policy.bad_path_hold_ms));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.mark_bad(path, hold, now);
                    c.alternate = None;
                    c.armed = false;
                }
                self.finish_failed(
                    id,
                    responder,
                    ApStatus::Rejected,
                    UnprotectedReason::ModifyFailed,
                );
            }
            (Phase::Migrating { .. }, Ok(_)) => {
                self.set_phase(id, Phase::Idle);
                self.migrated(id, true);
            }
            (Phase::Migrating { .. }, Err(e)) => {
                // The HCA may have migrated by itself (the peer's MigReq got there first)
                // or the QP is unarmed: ask it.
                warn!(%id, error = %e, "forcing migration failed; querying the QP");
                self.set_phase(id, Phase::Idle);
                self.query(id);
            }
            (
                Phase::SwMigrating {
                    path, responder, ..
                },
                Ok(_),
            ) => {
                self.sw_migrated(id, path, responder);
            }
            (Phase::SwMigrating { responder, .. }, Err(e)) => {
                warn!(%id, error = %e, "software migration failed");
                if let Some(r) = responder {
                    self.send_migrate_ack(id, r, false);
                }
                self.set_phase(id, Phase::Idle);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.armed = false;
                }
                self.update_protection(id, UnprotectedReason::ModifyFailed);
                self.need_rearm(id);
            }
            (Phase::Querying { .. }, Ok(CommandOutcome::Qp(snap))) => {
                self.set_phase(id, Phase::Idle);
                self.reconcile(id, snap);
            }
            (Phase::Querying { .. }, other) => {
                debug!(%id, ?other, "QP query gave no snapshot");
                self.set_phase(id, Phase::Idle);
                self.after_phase(id);
            }
            (phase, result) => {
                debug!(%id, ?phase, ?result, "unexpected result for phase");
            }
        }
    }

    /// Align the engine's view with what the QP says.
    fn reconcile(&mut self, id: ConnId, snap: QpSnapshot) {
        if !snap.operational {
            self.lose(id, LostReason::QpFatal);
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let on = |p: &Path| {
            p.port == snap.primary_port
                && p.dlid == snap.primary_dlid
                && p.dgid == snap.primary_dgid
        };
        if c.alternate.is_some_and(|a| on(&a)) && !on(&c.primary) {
            self.stats.migrations_observed += 1;
            self.migrated(id, false);
            return;
        }
        c.mig = snap.mig_state;
        if snap.mig_state == MigState::Migrated {
            c.armed = false;
        }
        self.update_protection(id, UnprotectedReason::PrimaryDownUnarmed);
        if !self.conns.get(&id).is_some_and(|c| self.is_protected(c)) {
            self.need_rearm(id);
        } else {
            self.after_phase(id);
        }
    }

    /// An alternate is armed (hardware: REARM set; software: the peer agreed).
    fn armed(&mut self, id: ConnId, path: Path, mig: MigState, responder: Option<Responder>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.alternate = Some(path);
        c.armed = true;
        c.mig = mig;
        c.failed_rearms = 0;
        // Both sides have just agreed on this path: an old "bad" mark (a LAP of ours
        // for it refused while it was down) must not stop a migration onto it.
        c.bad.retain(|(p, _)| !p.same_route(&path));
        self.stats.arms += 1;
        if let Some(r) = responder {
            let sender = c.local_comm_id;
            let receiver = c.remote_comm_id;
            c.last_lap = Some((r.digest, ApStatus::Success));
            self.send(
                r.port,
                r.to,
                PeerMsg::Apr(Apr {
                    sender_comm_id: sender,
                    receiver_comm_id: receiver,
                    status: ApStatus::Success,
                }),
            );
        }
        self.release_slot(id);
        self.set_phase(id, Phase::Idle);
        self.update_protection(id, UnprotectedReason::AlternateDown);
        self.after_phase(id);
    }

    /// Loading/arming/agreeing failed: answer a waiting peer, back off.
    fn finish_failed(
        &mut self,
        id: ConnId,
        responder: Option<Responder>,
        status: ApStatus,
        reason: UnprotectedReason,
    ) {
        if let Some(r) = responder {
            self.answer_lap(id, r, status);
        }
        self.release_slot(id);
        self.set_phase(id, Phase::Idle);
        self.update_protection(id, reason);
        // Try the next candidate right away; the failed one is marked bad.
        self.need_rearm(id);
    }

    // ---------------------------------------------------------------- re-arming

    /// `id` wants a (better) alternate. Starts now, queues, or remembers it for later.
    fn need_rearm(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.lost {
            return;
        }
        if c.phase().busy() {
            c.want_rearm = true;
            return;
        }
        match c.phase() {
            Phase::Queued | Phase::Resolving | Phase::WaitPassive => return,
            _ => {}
        }
        if c.role == Role::Passive {
            // The active side initiates; step in only if it stays silent.
            let at = self
                .now
                .plus(Policy::ms(self.policy.passive_initiate_delay_ms));
            self.set_phase(id, Phase::WaitPassive);
            self.set_deadline(id, Some(at));
            return;
        }
        self.initiate(id);
    }

    /// Choose an alternate and send the LAP (or queue for a slot, or resolve paths).
    fn initiate(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.lost {
            return;
        }
        let current_rank = if self.is_protected(c) {
            c.alternate.and_then(|a| select::rank(&c.primary, &a))
        } else {
            None
        };
        let choice = self.choose(c);
        match choice {
            Some((path, rank)) if current_rank.is_none_or(|r| rank > r) => {
                if !c.slot && self.rearms_active >= self.policy.max_concurrent_rearms {
                    self.set_phase(id, Phase::Queued);
                    self.rearm_queue.push_back(id);
                    return;
                }
                self.take_slot(id);
                self.send_lap(id, path);
            }
            Some(_) => {
                // Already armed on something at least as good.
                self.release_slot(id);
                self.set_phase(id, Phase::Idle);
            }
            None => {
                if current_rank.is_some() {
                    self.release_slot(id);
                    self.set_phase(id, Phase::Idle);
                    return;
                }
                if self.policy.resolve_paths && self.resolve_for(id) {
                    self.set_phase(id, Phase::Resolving);
                    return;
                }
                self.release_slot(id);
                self.update_protection(id, UnprotectedReason::NoCandidate);
                self.backoff(id);
            }
        }
    }

    /// The best usable alternate for `c`: its candidates and cached SA paths.
    fn choose(&self, c: &Conn) -> Option<(Path, u8)> {
        let device = c.primary.port.device;
        let gids = c.peer_gids();
        let cached = self
            .cache
            .iter()
            .filter(|((port, gid), _)| port.device == device && gids.contains(gid))
            .flat_map(|(_, e)| e.paths.iter());
        select::best(&c.primary, c.candidates.iter().chain(cached), |p| {
            self.usable_for(c, p)
        })
    }

    /// Issue path queries this connection needs that are neither cached nor pending.
    /// Returns true when the connection should wait for answers.
    fn resolve_for(&mut self, id: ConnId) -> bool {
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
                let entry = self.cache.entry((*port, *gid)).or_default();
                if entry.pending {
                    waiting = true;
                } else if !entry.resolved {
                    // Never asked since the last invalidation: ask once for everyone.
                    entry.pending = true;
                    self.stats.path_queries += 1;
                    self.issue(
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
        waiting
    }

    fn resolve_done(
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
        let entry = self.cache.entry((port, gid)).or_default();
        entry.pending = false;
        entry.resolved = true;
        entry.paths = paths;
        let waiting: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase(), Phase::Resolving))
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            let still = self.conns.get(&id).is_some_and(|c| {
                let g = c.peer_gids();
                self.cache.iter().any(|((p, gg), e)| {
                    e.pending && p.device == c.primary.port.device && g.contains(gg)
                })
            });
            if still {
                continue;
            }
            self.set_phase(id, Phase::Idle);
            // Answers are in: choose, but do not ask again for this attempt.
            let resolve = std::mem::replace(&mut self.policy.resolve_paths, false);
            self.initiate(id);
            self.policy.resolve_paths = resolve;
        }
    }

    fn invalidate_cache(&mut self, hit: impl Fn(&(PortKey, Gid)) -> bool) {
        self.cache.retain(|k, e| e.pending || !hit(k));
    }

    fn send_lap(&mut self, id: ConnId, path: Path) {
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

    fn start_load(&mut self, id: ConnId, path: Path, responder: Option<Responder>) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        match c.mode {
            MigrationMode::Hardware => {
                let cmd = self.issue(
                    CommandOp::LoadAlternate { conn: id, path },
                    Pending::Conn(id),
                );
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
    fn conn_deadline(&mut self, id: ConnId) {
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
                self.lap_received(id, from, port, lap, true);
                return;
            }
        }
        match phase {
            Phase::WaitPassive | Phase::Backoff => {
                self.set_phase(id, Phase::Idle);
                self.initiate(id);
            }
            Phase::AwaitPeer { msg, .. }
                if msg_path(&msg).is_some_and(|p| !self.path_usable(&p)) =>
            {
                // The proposed path died since the last send: stop proposing it.
                self.release_slot(id);
                self.set_phase(id, Phase::Idle);
                self.need_rearm(id);
            }
            Phase::AwaitPeer {
                msg,
                port,
                to,
                tries,
            } => {
                if tries >= self.policy.lap_max_tries {
                    warn!(%id, tries, "peer did not answer: giving up for now");
                    if matches!(msg, PeerMsg::Lap(_)) {
                        // The peer may have loaded our LAP's path and only its APRs were
                        // lost: its alternate and ours may now differ, so ours is no
                        // longer known to be agreed. The next attempt agrees anew.
                        if let Some(c) = self.conns.get_mut(&id) {
                            c.armed = false;
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
            _ => {}
        }
    }

    fn backoff(&mut self, id: ConnId) {
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
    fn after_phase(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.phase().busy() || c.lost {
            return;
        }
        if let Some((from, port, lap)) = c.deferred_lap.take().map(|b| *b) {
            self.lap_received(id, from, port, lap, false);
            return;
        }
        let want = std::mem::take(&mut c.want_rearm);
        if want {
            self.need_rearm(id);
        }
    }

    fn set_phase(&mut self, id: ConnId, phase: Phase) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.set_phase(phase);
            c.deadline = None;
        }
    }

    /// Drop whatever the connection was doing (results of abandoned commands are ignored).
    fn abort_phase(&mut self, id: ConnId) {
        self.replace_phase(id, Phase::Idle);
    }

    /// Drop whatever the connection was doing and start `phase` instead.
    fn replace_phase(&mut self, id: ConnId, phase: Phase) {
        // One lookup: this runs for every connection a port failure touches.
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let queued = matches!(c.phase(), Phase::Queued);
        let had_slot = std::mem::take(&mut c.slot);
        c.set_phase(phase);
        c.deadline = None;
        if queued {
            self.rearm_queue.retain(|q| *q != id);
        }
        if had_slot {
            self.rearms_active -= 1;
            self.pump_queue();
        }
    }

    fn take_slot(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.slot {
                c.slot = true;
                self.rearms_active += 1;
            }
        }
    }

    fn release_slot(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if c.slot {
                c.slot = false;
                self.rearms_active -= 1;
                self.pump_queue();
            }
        }
    }

    fn pump_queue(&mut self) {
        while self.rearms_active < self.policy.max_concurrent_rearms {
            let Some(next) = self.rearm_queue.pop_front() else {
                break;
            };
            if self
                .conns
                .get(&next)
                .is_some_and(|c| matches!(c.phase(), Phase::Queued))
            {
                self.set_phase(next, Phase::Idle);
                self.initiate(next);
            }
        }
    }

    /// Tell the application when protection changed since it was last told.
    fn update_protection(&mut self, id: ConnId, reason: UnprotectedReason) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.lost {
            return;
        }
        let now = match (self.is_protected(c), c.alternate) {
            (true, Some(_)) => Told::Protected,
            _ => Told::Unprotected(reason),
        };
        // Tell each change once; an unprotected connection hears again only when the
        // reason changes (e.g. "alternate down" becomes "primary down, unarmed").
        let same = c.told == Some(now);
        if same {
            return;
        }
        let first = !c.ever_protected;
        let c_alt = c.alternate;
        if let Some(c) = self.conns.get_mut(&id) {
            c.told = Some(now);
            c.ever_protected |= now == Told::Protected;
        }
        let kind = match (now, c_alt) {
            (Told::Protected, Some(alternate)) if first => {
                NotificationKind::Protected { alternate }
            }
            (Told::Protected, Some(alternate)) => NotificationKind::Rearmed { alternate },
            (_, _) => NotificationKind::Unprotected { reason },
        };
        self.notify(id, kind);
    }

    // ---------------------------------------------------------------- subscriptions

    fn subscribe(&mut self, port: PortKey) {
        if !self.policy.subscribe {
            return;
        }
        let Some(p) = self.ports.get_mut(&port) else {
            return;
        };
        if p.subscribed || p.subscribe_unsupported {
            return;
        }
        p.subscribed = true;
        self.stats.subscriptions += 1;
        self.issue(CommandOp::Subscribe { port }, Pending::Subscribe(port));
    }

    fn subscribe_done(&mut self, port: PortKey, result: Result<CommandOutcome, ProviderError>) {
        let Some(p) = self.ports.get_mut(&port) else {
            return;
        };
        match result {
            Ok(_) => debug!(%port, "subscribed for traps 64/65"),
            Err(ProviderError::Unsupported { .. }) => {
                info!(%port, "no SA subscriptions on this port; remote failures are learnt from peers only");
                p.subscribed = false;
                p.subscribe_unsupported = true;
            }
            Err(e) => {
                warn!(%port, error = %e, "subscription failed; will retry");
                p.subscribed = false;
                let at = self.now.plus(Policy::ms(self.policy.subscribe_retry_ms));
                self.timers.schedule(at, TimerKey::Subscribe(port));
            }
        }
    }
}

/// The path a LAP proposes (other messages propose none).
fn msg_path(msg: &PeerMsg) -> Option<Path> {
    match msg {
        PeerMsg::Lap(l) => Some(l.alt),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
