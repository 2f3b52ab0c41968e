//! The engine: a deterministic, sans-IO state machine that keeps connections armed.
//!
//! Methods come in four groups, in the style of quinn-proto:
//! - inputs: [`Engine::handle_input`] (events of the world, which cannot fail),
//!   [`Engine::handle_timeout`], and the API calls [`Engine::protect`],
//!   [`Engine::unprotect`] and [`Engine::report_stall`] (which fail on misuse), each
//!   with `now`;
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

mod cache;
mod conn;
mod events;
mod health;
mod limiter;
mod peer;
mod pending;
mod probed;
mod rails;
mod rearm;
mod remote;
mod results;
mod sa_gate;
mod select;
pub(crate) mod timers;
mod words;

use crate::io::{
    AlternateKind, Command, CommandId, CommandOp, Input, Notification, NotificationKind, Output,
    PeerMsg, ProviderError, QpEvent, UnprotectedReason,
};
use crate::policy::{Policy, PolicyError};
use crate::probe::PathEnds;
use crate::types::{
    ConnId, ConnSpec, Gid, GidService, MigState, Path, PeerAddr, PortInfo, PortKey, Time,
};
use cache::PathCache;
use conn::{Conn, InFlight, Phase, Told};
use health::Health;
use limiter::RearmLimiter;
use pending::{Deadlines, PendingTable};
use remote::Remotes;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
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
    /// Paths a probe session reported down.
    pub probe_paths_down: u64,
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
    subscription: Subscription,
}

/// Where a local port stands with its SA subscription for traps 64/65.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subscription {
    /// None (never asked, or a retry is pending).
    Wanted,
    /// Asked for (outstanding or established).
    Asked,
    /// The SA facet said subscriptions are unsupported: never asked again.
    Unsupported,
}

impl Subscription {
    /// The SA may have forgotten us (SM change, client reregister, LID change): ask
    /// again, unless it never supported it.
    fn renew(&mut self) {
        if *self == Subscription::Asked {
            *self = Subscription::Wanted;
        }
    }
}

/// What an outstanding command was for.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Conn(ConnId),
    Send,
    /// A hint to the provider (`CommandOp::PeerThere`): nothing waits for its answer.
    Hint,
    /// apm's arming write on a connection's QP: its answer says whether apm can arm
    /// the QP itself (`conn::Arming`).
    ArmingWrite(ConnId),
    Resolve(PortKey, Gid),
    Subscribe(PortKey),
    /// A PathRecord query checking whether an out-of-service remote GID is back, and
    /// when the next check was due as it left (a different due date when the answer
    /// comes means a notice or a newer check came meanwhile: the answer is stale).
    Recheck(Gid, Time),
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
    remotes: Remotes,
    /// Paths whose probe session is down (module `probed`).
    dead_paths: BTreeSet<PathEnds>,
    /// Paths whose probe session the prober reported up and has watched since (module
    /// `probed`): both ends heard each other within a detection time.
    alive_paths: BTreeSet<PathEnds>,
    /// Probe-dead paths a peer's request came over since, and when (module `probed`).
    heard_paths: BTreeMap<PathEnds, Time>,
    /// Paths whose session is up again but held for flapping, until when.
    held_paths: BTreeMap<PathEnds, Time>,
    /// RoCE source GIDs their port reported and no longer has (module `rails`).
    gone_gids: BTreeSet<(PortKey, Gid)>,
    /// RoCE source GIDs whose interface's link is down (module `rails`).
    rails_down: BTreeSet<(PortKey, Gid)>,
    cache: PathCache,
    pending: PendingTable<Pending>,
    /// When each command handed to the provider must have been answered.
    deadlines: Deadlines,
    timers: Timers,
    out: VecDeque<Output>,
    rearms: RearmLimiter,
    stats: Stats,
    sa_gate: sa_gate::SaGate,
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
            remotes: Remotes::default(),
            dead_paths: BTreeSet::new(),
            alive_paths: BTreeSet::new(),
            heard_paths: BTreeMap::new(),
            held_paths: BTreeMap::new(),
            gone_gids: BTreeSet::new(),
            rails_down: BTreeSet::new(),
            cache: PathCache::default(),
            pending: PendingTable::new(1),
            deadlines: Deadlines::default(),
            timers: Timers::default(),
            out: VecDeque::new(),
            rearms: RearmLimiter::default(),
            stats: Stats::default(),
            sa_gate: sa_gate::SaGate::default(),
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
        self.port_usable(path.port)
            && self.remote_usable(&path.dgid)
            && !self.local_gid_gone(path)
            && !self.probed_dead(path)
            && !self.probe_held(path)
    }

    fn status_of(&self, c: &Conn) -> ConnStatus {
        let protection = if c.is_lost() {
            Protection::Lost
        } else if c.phase().moving() {
            Protection::Migrating
        } else if self.is_protected(c) {
            Protection::Armed
        } else {
            Protection::Unprotected
        };
        ConnStatus {
            protection,
            primary: c.primary,
            alternate: c.alt.path(),
            mig_state: c.mig,
        }
    }

    fn is_protected(&self, c: &Conn) -> bool {
        // A lost connection's alternate is disarmed.
        c.alt.armed().is_some_and(|a| self.path_usable(&a))
    }

    fn port_usable(&self, port: PortKey) -> bool {
        self.ports
            .get(&port)
            .is_some_and(|p| p.health.usable(self.now))
    }

    fn remote_usable(&self, gid: &Gid) -> bool {
        self.remotes.usable(gid, self.now)
    }

    /// True when `path` is up, held down for flapping or not: what a connection whose
    /// primary is dead may still move to (after asking the peer over it), since a
    /// flapping path beats a dead one. No command ever moves a connection onto a path
    /// for which this is false (the property test checks it against this engine's
    /// view, provider-sim's `Sim::check_move_target` against what the host was told).
    pub fn path_up(&self, path: &Path) -> bool {
        self.ports.get(&path.port).is_some_and(|p| p.health.up)
            && self.remotes.up(&path.dgid)
            && !self.local_gid_gone(path)
            && !self.probe_verdict_stands(path)
    }

    // ---------------------------------------------------------------- outputs

    /// The next command or notification, in the order the engine decided them.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Engine::handle_timeout`] should be called next, if ever.
    pub fn poll_timeout(&self) -> Option<Time> {
        match (self.timers.next(), self.deadlines.next()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Issue a command that concerns no connection's QP (a send, a query, a
    /// subscription): it goes out at once.
    fn issue(&mut self, op: CommandOp, why: Pending) -> CommandId {
        let id = self.pending.issue(why);
        self.emit(Command { id, op });
        id
    }

    /// Issue the QP command of `conn`'s next phase. It goes out at once unless an
    /// earlier command of the connection is still in flight (one an override abandoned:
    /// its result is ignored): then it waits for that one's answer or deadline
    /// (`Engine::dispatch_waiting`), so that the provider never runs two commands on
    /// one QP at once and they take effect in the order the engine decided them.
    fn issue_qp(&mut self, conn: ConnId, op: CommandOp) -> CommandId {
        let id = self.pending.issue(Pending::Conn(conn));
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Some(busy) = c.in_flight {
                debug!(%conn, ?id, waits_for = ?busy.id, "a command waits for the one in flight");
                return id;
            }
            c.in_flight = Some(InFlight::of(id, &op));
        }
        self.emit(Command { id, op });
        id
    }

    /// The command `conn`'s phase waits for goes out if it was held back and nothing
    /// of the connection's is in flight any more.
    fn dispatch_waiting(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.in_flight.is_some() {
            return;
        }
        let Some(mut cmd) = c.phase().command(conn) else {
            return;
        };
        if !self.pending.is_outstanding(cmd.id) {
            return;
        }
        c.in_flight = Some(InFlight::of(cmd.id, &cmd.op));
        let move_to = match c.phase() {
            Phase::SwMigrating {
                path, responder, ..
            } => Some((*path, *responder)),
            _ => None,
        };
        if let (CommandOp::SoftwareMigrate { announce, .. }, Some((path, responder))) =
            (&mut cmd.op, move_to)
        {
            *announce = self.word_after_move(conn, path, responder);
        }
        self.emit(cmd);
    }

    /// Hand a command to the provider, with its deadline.
    fn emit(&mut self, cmd: Command) {
        let at = self.now.plus(Policy::ms(self.policy.command_timeout_ms));
        self.deadlines.push(at, cmd.id);
        self.out.push_back(Output::Command(cmd));
    }

    fn send(&mut self, port: PortKey, to: PeerAddr, msg: PeerMsg) {
        match msg {
            PeerMsg::Apr(_) => self.stats.aprs_sent += 1,
            PeerMsg::Mra(_) => self.stats.mras_sent += 1,
            PeerMsg::Migrate(_) | PeerMsg::MigrateAck(_) => self.stats.migrate_msgs_sent += 1,
            PeerMsg::Lap(_) | PeerMsg::Probe(_) => {}
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

    /// Feed one event of the world that happened at `now`. It cannot fail: faults in
    /// the fabric, from peers or from providers are handled, and an event about a
    /// connection the engine does not know (a QP event racing an unprotect) is ignored.
    pub fn handle_input(&mut self, now: Time, input: Input) {
        self.at(now, |e| match input {
            Input::PortInfo(info) => e.port_info(info),
            Input::PortEvent { port, event } => e.port_event(port, event),
            Input::DeviceFatal { device } => e.device_fatal(device),
            Input::QpEvent { conn, event } => {
                if e.conns.contains_key(&conn) {
                    e.qp_event(conn, event);
                } else {
                    debug!(%conn, ?event, "QP event for a connection not protected: ignored");
                }
            }
            Input::RemoteGid {
                gid,
                service: GidService::InService,
            } => e.remote_in_service(gid),
            Input::RemoteGid {
                gid,
                service: GidService::OutOfService,
            } => e.remote_out_of_service(gid),
            Input::PathDown { ends, kind } => e.probe_path_down(ends, kind),
            Input::PathUp { ends } => e.probe_path_up(ends),
            Input::PathHeld { ends, until } => e.probe_path_held(ends, until),
            Input::RailLink { port, gid, link } => e.rail_link(port, gid, link),
            Input::PeerMessage { from, port, msg } => e.peer_message(from, port, msg),
            Input::CommandDone { id, result } => e.command_done(id, result),
        });
    }

    /// API call at `now`: put a connection under protection. An `Err` means the call
    /// was wrong (a connection id or comm id in use, a spec that cannot work).
    pub fn protect(&mut self, now: Time, spec: ConnSpec) -> Result<(), EngineError> {
        self.at(now, |e| e.add_conn(spec))
    }

    /// API call at `now`: stop protecting a connection (its QP is left as it is).
    pub fn unprotect(&mut self, now: Time, id: ConnId) -> Result<(), EngineError> {
        self.at(now, |e| e.remove_conn(id))
    }

    /// API call at `now`: the application saw the sends of `id` stop completing; the
    /// engine takes its primary path as stalled (see `ManagerHandle::report_stall`).
    pub fn report_stall(&mut self, now: Time, id: ConnId) -> Result<(), EngineError> {
        self.at(now, |e| {
            if !e.conns.contains_key(&id) {
                return Err(EngineError::UnknownConnection(id));
            }
            e.qp_event(id, QpEvent::PrimaryStalled);
            Ok(())
        })
    }

    /// Run `f` at `now`: deadlines that passed before take effect first, so that it
    /// sees the state a real clock would have produced.
    fn at<T>(&mut self, now: Time, f: impl FnOnce(&mut Engine) -> T) -> T {
        self.advance(now);
        self.run_timers();
        let out = f(self);
        self.prune_deadlines();
        out
    }

    /// Let deadlines up to `now` take effect.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
        self.run_timers();
    }

    fn run_timers(&mut self) {
        self.run_deadlines_and_timers();
        self.prune_deadlines();
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

    /// Commands answered need no deadline any more: `poll_timeout` names a live one.
    fn prune_deadlines(&mut self) {
        let pending = &self.pending;
        self.deadlines.prune(|id| pending.is_outstanding(id));
    }

    /// Timers and command deadlines that are due, in time order.
    fn run_deadlines_and_timers(&mut self) {
        loop {
            let timer = self.timers.next().filter(|t| *t <= self.now);
            let deadline = self.deadlines.next().filter(|t| *t <= self.now);
            match (timer, deadline) {
                (_, Some(d)) if timer.is_none_or(|t| d < t) => {
                    if let Some(id) = self.deadlines.pop_due(self.now) {
                        self.command_deadline(id);
                    }
                }
                (Some(_), _) => self.run_one_timer(),
                (None, _) => break,
            }
        }
    }

    /// A command's deadline passed: unanswered, it has failed.
    fn command_deadline(&mut self, id: CommandId) {
        if !self.pending.is_outstanding(id) {
            return;
        }
        let after_ms = self.policy.command_timeout_ms;
        warn!(
            ?id,
            after_ms, "the provider did not answer a command in time: failed"
        );
        self.command_done(id, Err(ProviderError::NoAnswer { after_ms }));
    }

    fn run_one_timer(&mut self) {
        if let Some((at, key)) = self.timers.pop_due(self.now) {
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
                TimerKey::PathHold(ends) => self.probe_hold_ends(ends, at),
                TimerKey::Subscribe(port) => self.subscribe(port),
                TimerKey::SaRelease => self.release_sa(),
                TimerKey::RemoteRecheck(gid) => {
                    if self.remotes.recheck(&gid).is_some_and(|(due, _)| due == at) {
                        self.recheck_remote(gid);
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- API calls

    fn add_conn(&mut self, spec: ConnSpec) -> Result<(), EngineError> {
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

    fn remove_conn(&mut self, id: ConnId) -> Result<(), EngineError> {
        let Some(c) = self.conns.remove(&id) else {
            return Err(EngineError::UnknownConnection(id));
        };
        self.by_comm_id.remove(&c.local_comm_id);
        let mut c = c;
        drop_held_command(&mut c, &mut self.pending);
        if self.rearms.release(id) {
            self.pump_queue();
        }
        self.rearms.dequeue(id);
        info!(%id, "unprotected on request");
        Ok(())
    }

    fn set_phase(&mut self, id: ConnId, phase: Phase) {
        if let Some(c) = self.conns.get_mut(&id) {
            drop_held_command(c, &mut self.pending);
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
        drop_held_command(c, &mut self.pending);
        c.set_phase(phase);
        c.deadline = None;
        if queued {
            self.rearms.dequeue(id);
        }
        if self.rearms.release(id) {
            self.pump_queue();
        }
    }

    fn take_slot(&mut self, id: ConnId) {
        if self.conns.contains_key(&id) {
            self.rearms.take(id);
        }
    }

    fn release_slot(&mut self, id: ConnId) {
        if self.rearms.release(id) {
            self.pump_queue();
        }
    }

    fn pump_queue(&mut self) {
        while !self.rearms.full(self.policy.max_concurrent_rearms) {
            let Some(next) = self.rearms.next_waiting() else {
                break;
            };
            if self
                .conns
                .get(&next)
                .is_some_and(|c| matches!(c.phase(), Phase::Queued))
            {
                self.set_phase(next, Phase::Idle);
                self.initiate(next, rearm::AskSa::IfNeeded);
            }
        }
    }

    /// Tell the application when protection changed since it was last told.
    fn update_protection(&mut self, id: ConnId, reason: UnprotectedReason) {
        let Some(c) = self.live(id) else {
            return;
        };
        let now = match (self.is_protected(c), c.alt.path()) {
            (true, Some(_)) => Told::Protected,
            _ => c.told.unprotected(reason),
        };
        // Tell each change once; an unprotected connection hears again only when the
        // reason changes (e.g. "alternate down" becomes "primary down, unarmed").
        if c.told == now {
            return;
        }
        let first = !c.told.ever_protected();
        let c_alt = c.alt.path();
        let c_primary = c.primary;
        let cause = match reason {
            UnprotectedReason::PrimaryDownUnarmed => c.primary_down,
            _ => None,
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.told = now;
        }
        let kind = match (now, c_alt) {
            (Told::Protected, Some(alternate)) if first => NotificationKind::Protected {
                alternate,
                survives: AlternateKind::of(&c_primary, &alternate),
            },
            (Told::Protected, Some(alternate)) => NotificationKind::Rearmed {
                alternate,
                survives: AlternateKind::of(&c_primary, &alternate),
            },
            (_, _) => NotificationKind::Unprotected { reason, cause },
        };
        self.notify(id, kind);
    }
}

impl Engine {
    /// A connection the engine still acts on: known and not lost. With
    /// [`live_mut`] and [`Engine::live_conns`], the one place that tells lost
    /// connections (kept only to be reported) from the others.
    fn live(&self, id: ConnId) -> Option<&Conn> {
        live(&self.conns, id)
    }

    /// Every connection the engine still acts on, in id order.
    fn live_conns(&self) -> impl Iterator<Item = (ConnId, &Conn)> + '_ {
        self.conns
            .iter()
            .filter(|(_, c)| !c.is_lost())
            .map(|(id, c)| (*id, &**c))
    }
}

/// [`Engine::live`] as a function of the map alone, so that the rest of the engine
/// stays usable while the connection is borrowed.
fn live(conns: &BTreeMap<ConnId, Box<Conn>>, id: ConnId) -> Option<&Conn> {
    conns.get(&id).map(|c| &**c).filter(|c| !c.is_lost())
}

/// [`live`], to change.
fn live_mut(conns: &mut BTreeMap<ConnId, Box<Conn>>, id: ConnId) -> Option<&mut Conn> {
    conns
        .get_mut(&id)
        .map(|c| &mut **c)
        .filter(|c| !c.is_lost())
}

/// The phase of `c` is about to end: a command it issued that never went out (it was
/// waiting for an earlier one in flight) never will, and is forgotten.
fn drop_held_command(c: &mut Conn, pending: &mut PendingTable<Pending>) {
    if let Some(cmd) = c.phase().awaited() {
        if c.in_flight.map(|f| f.id) != Some(cmd) {
            pending.complete(cmd);
        }
    }
}

#[cfg(test)]
mod tests;
