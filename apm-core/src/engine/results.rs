//! Results of commands: the next step of whatever phase awaited them, reconciling the
//! engine's view with a queried QP, and SA subscription bookkeeping.

use super::conn::{
    Alternate, Arming, InFlight, InFlightKind, MoveReason, Moved, PeerOnPath, Phase, Responder,
};
use super::timers::TimerKey;
use super::{Engine, Pending, Subscription};
use crate::io::{
    ApStatus, Apr, Command, CommandId, CommandOp, CommandOutcome, LostReason, PeerMsg,
    ProviderError, QpSnapshot, UnprotectedReason,
};
use crate::policy::Policy;
use crate::types::{ConnId, MigState, MigrationMode, Path, PortKey};
use tracing::{debug, info, warn};

impl Engine {
    // ---------------------------------------------------------------- command results

    pub(super) fn command_done(
        &mut self,
        id: CommandId,
        result: Result<CommandOutcome, ProviderError>,
    ) {
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
            Pending::Hint => {
                if let Err(e) = result {
                    // The provider's own deadline releases what it held.
                    debug!(error = %e, "hint to the provider failed");
                }
            }
            Pending::ArmingWrite(conn) => self.arming_write_done(conn, &result),
            Pending::Subscribe(port) => {
                self.sa_answered(&result);
                self.subscribe_done(port, result)
            }
            Pending::Resolve(port, gid) => {
                self.sa_answered(&result);
                self.resolve_done(port, gid, result)
            }
            Pending::Recheck(gid, due) => {
                self.sa_answered(&result);
                self.recheck_done(gid, due, result)
            }
            Pending::Conn(conn) => {
                let finished = self
                    .conns
                    .get_mut(&conn)
                    .and_then(|c| c.in_flight.take_if(|f| f.id == id));
                if let Some(f) = finished {
                    if self.restore_alternate(conn, f, &result) {
                        return;
                    }
                }
                self.conn_command_done(conn, id, result);
                // An override's command may have waited for this one.
                self.dispatch_waiting(conn);
            }
        }
    }

    /// An abandoned command came back while a forced migration waits for it. A load
    /// that went through replaced the alternate the QP migrates onto, and
    /// `ForceMigrate` would carry the QP onto that path instead of the one the engine
    /// chose (and the peer was told): load the engine's alternate again first (loading
    /// keeps an ARMED QP armed), then the migration goes out. A restore that fails
    /// fails the migration. A load refused left the QP as it was (`modify_qp` changes
    /// all or nothing); one that never answered is taken as not done: a provider that
    /// hangs on one modify would hang on the restore too, and the migration would
    /// wait a second deadline. True when this took the result over.
    fn restore_alternate(
        &mut self,
        conn: ConnId,
        finished: InFlight,
        result: &Result<CommandOutcome, ProviderError>,
    ) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        let (Phase::Migrating { cmd: waiting, .. }, Some(alt)) = (c.phase(), c.alt.path()) else {
            return false;
        };
        let waiting = *waiting;
        if finished.kind == InFlightKind::Restore {
            let Err(e) = result else {
                return false;
            };
            warn!(%conn, error = %e, "putting the alternate back failed: not migrating");
            self.pending.complete(waiting);
            self.conn_command_done(conn, waiting, Err(e.clone()));
            self.dispatch_waiting(conn);
            return true;
        }
        if finished.kind != InFlightKind::Load || result.is_err() {
            return false;
        }
        debug!(%conn, %alt, "an abandoned load replaced the alternate: loading it back before migrating");
        let id = self.pending.issue(Pending::Conn(conn));
        c.in_flight = Some(InFlight {
            id,
            kind: InFlightKind::Restore,
        });
        self.emit(Command {
            id,
            op: CommandOp::LoadAlternate { conn, path: alt },
        });
        true
    }

    /// The result of the QP command a connection's phase waited for: the phase's next
    /// step.
    pub(super) fn conn_command_done(
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
        match c.phase().clone() {
            Phase::Loading {
                path, responder, ..
            } => self.loaded(id, path, responder, result),
            Phase::Arming {
                path, responder, ..
            } => match result {
                Ok(outcome) => {
                    let mig = match outcome {
                        CommandOutcome::MigState(m) => m,
                        _ => MigState::Rearm,
                    };
                    if mig == MigState::Armed {
                        if let Some(c) = self.conns.get_mut(&id) {
                            c.arming = Arming::AtOnce;
                        }
                    }
                    self.armed(id, path, mig, responder);
                }
                Err(e) => self.arming_failed(id, path, responder, &e),
            },
            Phase::Migrating { why, .. } => self.forced_done(id, why, result),
            Phase::LoadingToFollow {
                path, responder, ..
            } => self.loaded_to_follow(id, path, responder, result),
            Phase::SwMigrating {
                path,
                responder,
                peer,
                ..
            } => self.sw_migration_done(id, path, responder, peer, result),
            Phase::Querying { .. } => match result {
                Ok(CommandOutcome::Qp(snap)) => {
                    self.set_phase(id, Phase::Idle);
                    self.reconcile(id, snap);
                }
                other => {
                    debug!(%id, ?other, "QP query gave no snapshot");
                    self.set_phase(id, Phase::Idle);
                    self.after_phase(id);
                }
            },
            phase => debug!(%id, ?phase, ?result, "unexpected result for phase"),
        }
    }

    /// `LoadAlternate` of a re-arm answered: set REARM when the QP needs it.
    fn loaded(
        &mut self,
        id: ConnId,
        path: Path,
        responder: Option<Responder>,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        if let Err(e) = result {
            self.arming_failed(id, path, responder, &e);
            return;
        }
        // A path that died while loading is armed all the same (see `select`).
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.alt = Alternate::Loaded(path);
        // A QP in REARM or ARMED keeps its state when a new alternate is loaded,
        // and refuses REARM once ARMED (rdmavt: EINVAL): only a MIGRATED QP
        // needs asking.
        if c.mig != MigState::Migrated {
            let mig = c.mig;
            self.armed(id, path, mig, responder);
            return;
        }
        let cmd = self.issue_qp(id, CommandOp::SetRearm { conn: id });
        self.set_phase(
            id,
            Phase::Arming {
                cmd,
                path,
                responder,
            },
        );
    }

    /// Loading or arming `path` failed: mark it bad, answer a waiting peer, try another.
    fn arming_failed(
        &mut self,
        id: ConnId,
        path: Path,
        responder: Option<Responder>,
        e: &ProviderError,
    ) {
        warn!(%id, error = %e, "loading/arming the alternate failed");
        let now = self.now;
        let hold = now.plus(Policy::ms(self.policy.bad_path_hold_ms));
        if let Some(c) = self.conns.get_mut(&id) {
            c.mark_bad(path, hold, now);
            c.alt = Alternate::None;
        }
        self.finish_failed(
            id,
            responder,
            ApStatus::Rejected,
            UnprotectedReason::ModifyFailed,
        );
    }

    /// `ForceMigrate` answered.
    fn forced_done(
        &mut self,
        id: ConnId,
        why: MoveReason,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        match result {
            Ok(_) => {
                self.set_phase(id, Phase::Idle);
                self.migrated(id, Moved::Forced, why);
            }
            Err(e) => {
                // The HCA may have migrated by itself (the peer's MigReq got there first)
                // or the QP is unarmed: ask it.
                warn!(%id, error = %e, "forcing migration failed; querying the QP");
                if let MoveReason::PeerAsked(r) | MoveReason::PeerAskedAndMoved(r) = why {
                    self.refuse_move(id, r);
                }
                self.set_phase(id, Phase::Idle);
                self.query(id);
            }
        }
    }

    /// `LoadAlternate` of the path the peer moved to answered: move there too.
    fn loaded_to_follow(
        &mut self,
        id: ConnId,
        path: Path,
        responder: Responder,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        match result {
            Ok(_) => {
                // The peer's path is our alternate now, in an ARMED QP: move there.
                if let Some(c) = self.conns.get_mut(&id) {
                    c.alt.replace(path);
                }
                self.force_migration(id, MoveReason::PeerAsked(responder));
            }
            Err(e) => {
                warn!(%id, error = %e, "loading the peer's path to follow it failed");
                self.refuse_move(id, responder);
                self.set_phase(id, Phase::Idle);
                self.query(id);
            }
        }
    }

    /// `SoftwareMigrate` answered.
    fn sw_migration_done(
        &mut self,
        id: ConnId,
        path: Path,
        responder: Option<Responder>,
        peer: PeerOnPath,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        let Err(e) = result else {
            self.sw_migrated(id, path, responder);
            if peer == PeerOnPath::ArrivedMeanwhile {
                self.tell_peer_there(id, path);
            }
            return;
        };
        warn!(%id, error = %e, "software migration failed");
        if let Some(r) = responder {
            self.refuse_move(id, r);
        }
        self.set_phase(id, Phase::Idle);
        if let Some(c) = self.conns.get_mut(&id) {
            c.alt.disarm();
        }
        self.update_protection(id, UnprotectedReason::ModifyFailed);
        // A QP that failed under the move (a software migration cannot bring
        // back a QP in ERR whose work the application owns) is lost; one still
        // working is re-armed: the query's answer decides (`reconcile`).
        self.query(id);
    }

    /// Align the engine's view with what the QP says.
    pub(super) fn reconcile(&mut self, id: ConnId, snap: QpSnapshot) {
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
        if c.alt.path().is_some_and(|a| on(&a)) && !on(&c.primary) {
            self.stats.migrations_observed += 1;
            self.migrated(id, Moved::Unforced, MoveReason::Ours);
            return;
        }
        c.mig = snap.mig_state;
        if snap.mig_state == MigState::Migrated {
            c.alt.disarm();
        }
        self.update_protection(id, UnprotectedReason::PrimaryDownUnarmed);
        if !self.conns.get(&id).is_some_and(|c| self.is_protected(c)) {
            self.need_rearm(id);
        } else {
            self.after_phase(id);
        }
    }

    /// An alternate is armed (hardware: REARM set; software: the peer agreed).
    pub(super) fn armed(
        &mut self,
        id: ConnId,
        path: Path,
        mig: MigState,
        responder: Option<Responder>,
    ) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.alt = Alternate::Armed(path);
        c.mig = mig;
        c.failed_rearms = 0;
        // REARM waits for the peer's packets: send one of apm's own, where it may.
        let write = c.mode == MigrationMode::Hardware
            && mig == MigState::Rearm
            && matches!(c.arming, Arming::Unknown | Arming::ByApm);
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
        if write {
            self.issue(
                CommandOp::ArmingWrite { conn: id },
                Pending::ArmingWrite(id),
            );
        }
        self.release_slot(id);
        self.set_phase(id, Phase::Idle);
        self.update_protection(id, UnprotectedReason::AlternateDown);
        self.after_phase(id);
    }

    /// The answer to an arming write: apm arms this connection's QP itself from now
    /// on, or (unsupported: not apm's to post on) only the application's traffic does.
    /// Any other failure says nothing about which.
    fn arming_write_done(&mut self, id: ConnId, result: &Result<CommandOutcome, ProviderError>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match result {
            Ok(_) if c.arming != Arming::AtOnce => c.arming = Arming::ByApm,
            Ok(_) => {}
            Err(ProviderError::Unsupported { .. }) => {
                if c.arming != Arming::ByTraffic {
                    debug!(%id, "apm cannot post on this QP: its traffic alone arms it");
                }
                c.arming = Arming::ByTraffic;
            }
            Err(e) => debug!(%id, error = %e, "arming write failed"),
        }
    }

    /// Loading/arming/agreeing failed: answer a waiting peer, back off.
    pub(super) fn finish_failed(
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

    // ---------------------------------------------------------------- subscriptions

    pub(super) fn subscribe(&mut self, port: PortKey) {
        if !self.policy.subscribe {
            return;
        }
        let Some(p) = self.ports.get_mut(&port) else {
            return;
        };
        if p.subscription != Subscription::Wanted {
            return;
        }
        p.subscription = Subscription::Asked;
        self.stats.subscriptions += 1;
        self.issue_sa(CommandOp::Subscribe { port }, Pending::Subscribe(port));
    }

    pub(super) fn subscribe_done(
        &mut self,
        port: PortKey,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        let Some(p) = self.ports.get_mut(&port) else {
            return;
        };
        match result {
            Ok(_) => debug!(%port, "subscribed for traps 64/65"),
            Err(ProviderError::Unsupported { .. }) => {
                info!(%port, "no SA subscriptions on this port; remote failures are learnt from peers only");
                p.subscription = Subscription::Unsupported;
            }
            Err(e) => {
                warn!(%port, error = %e, "subscription failed; will retry");
                p.subscription = Subscription::Wanted;
                let at = self.now.plus(Policy::ms(self.policy.subscribe_retry_ms));
                self.timers.schedule(at, TimerKey::Subscribe(port));
            }
        }
    }
}
