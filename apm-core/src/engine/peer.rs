//! Messages from peers: LAP (receiver side), APR and MRA (sender side), and the
//! software-migration request/answer.
//!
//! Rules, in the order they are applied to a LAP:
//! 1. Unknown receiver comm id: APR "invalid comm ID".
//! 2. Not from the connection's peer (sender comm id or source GID do not match): APR
//!    "rejected" (or silence, per `Policy::unexpected_lap`); the QP is never touched.
//! 3. Wrong QPN: APR "invalid QPN". A GID or LID that is not this node's port, or a remote
//!    GID that is not the peer's: "invalid GID" / "invalid LID".
//! 4. A duplicate of the last LAP answered gets the same APR again; a duplicate of the
//!    LAP being worked on gets an MRA.
//! 5. A LAP naming our current primary (the whole route, LIDs included) while we are
//!    armed waits `lap_defer_ms` for a `PATH_MIG` or `Migrate` we may not have seen yet
//!    (the re-arm race between MIGRATED and COMM_EST), then gets "is current".
//! 6. A path known to be dead is accepted: it is only an alternate (see `select`).
//! 7. Collision (both sides sent a LAP): the active side's LAP wins. The passive side
//!    drops its own and answers; the active side answers the passive's with "rejected".
//! 8. Otherwise: load it, set REARM, answer "success".

use super::conn::{lap_digest, Phase, Responder};
use super::conn::{Chore, LapWait, MoveReason, Moved, PeerOnPath};
use super::Engine;
use crate::io::{
    ApStatus, Apr, CommandOp, Lap, Migrate, MigrateAck, MigrateIntent, Mra, PeerMsg,
    UnprotectedReason,
};
use crate::policy::Policy;
use crate::types::{ConnId, LinkLayer, MigState, MigrationMode, Path, PeerAddr, PortKey, Role};
use std::ops::ControlFlow;
use tracing::{debug, info, warn};

/// What a `MigrateAck` tells the peer that asked us to move.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum MoveAnswer {
    /// We run on the path it named.
    Moved,
    /// We did not move there.
    Refused,
}

/// A LAP from a verified peer, and where its answer goes.
struct IncomingLap {
    from: PeerAddr,
    port: PortKey,
    lap: Lap,
    responder: Responder,
}

impl Engine {
    pub(super) fn peer_message(&mut self, from: PeerAddr, port: PortKey, msg: PeerMsg) {
        if let PeerMsg::Probe(_) = msg {
            // The Manager hands probes to its prober; one here is ignored, and proves
            // nothing to the engine (its sender may not even run probes for us).
            debug!(from = %from.gid, "a probe reached the engine: ignored");
            return;
        }
        // A message from a connection's peer proves its GID is in service. Held out of
        // service, it was put there by a stale Report: the SM resends each Report on its
        // own schedule, so a retransmitted trap 65 can arrive after the trap 64 that
        // followed it, and no later notice would ever correct it. Anyone can write a
        // GID into a datagram's source: one that is not a connection's peer (by comm
        // ids and source GID) proves nothing, or a stranger could bring a dead path
        // back and have connections moved onto it.
        if !self.remotes.up(&from.gid) && self.sent_by_a_peer(&from, &msg) {
            debug!(gid = %from.gid, "message from a GID held out of service: it is back");
            self.remote_in_service(from.gid);
        }
        match msg {
            PeerMsg::Lap(lap) => self.lap_arrived(from, port, lap),
            PeerMsg::Apr(apr) => self.apr_arrived(from, apr),
            PeerMsg::Mra(mra) => self.mra_arrived(from, mra),
            PeerMsg::Migrate(m) => self.migrate_arrived(from, port, m),
            PeerMsg::MigrateAck(a) => self.migrate_ack_arrived(from, a),
            PeerMsg::Probe(_) => {}
        }
    }

    /// The message names a connection (by its comm ids) whose peer `from` is.
    fn sent_by_a_peer(&self, from: &PeerAddr, msg: &PeerMsg) -> bool {
        msg.comm_ids()
            .is_some_and(|(receiver, sender)| self.peer_conn(receiver, sender, from).is_some())
    }

    /// The connection a peer message is addressed to, if it really comes from its peer.
    fn peer_conn(
        &self,
        receiver_comm_id: u32,
        sender_comm_id: u32,
        from: &PeerAddr,
    ) -> Option<ConnId> {
        let id = *self.by_comm_id.get(&receiver_comm_id)?;
        let c = self.conns.get(&id)?;
        (c.remote_comm_id == sender_comm_id && c.is_peer_gid(&from.gid)).then_some(id)
    }

    fn lap_arrived(&mut self, from: PeerAddr, port: PortKey, lap: Lap) {
        let Some(&id) = self.by_comm_id.get(&lap.receiver_comm_id) else {
            debug!(comm_id = lap.receiver_comm_id, "LAP for an unknown comm id");
            self.send(
                port,
                from,
                PeerMsg::Apr(Apr {
                    sender_comm_id: 0,
                    receiver_comm_id: lap.sender_comm_id,
                    status: ApStatus::InvalidCommId,
                }),
            );
            return;
        };
        if self.peer_conn(lap.receiver_comm_id, lap.sender_comm_id, &from) != Some(id) {
            self.stats.laps_from_strangers += 1;
            warn!(%id, from = %from.gid, "LAP not from the connection's peer: QP left alone");
            if self.policy.unexpected_lap == crate::policy::UnexpectedLap::Reject {
                self.send(
                    port,
                    from,
                    PeerMsg::Apr(Apr {
                        sender_comm_id: 0,
                        receiver_comm_id: lap.sender_comm_id,
                        status: ApStatus::Rejected,
                    }),
                );
            }
            return;
        }
        if self.live(id).is_none() {
            return;
        }
        self.lap_received(id, from, port, lap, LapWait::MayWait);
    }

    /// The LAP of rules 3-8, from a verified peer. `wait` says whether it already
    /// waited for a `PATH_MIG` (rule 5).
    pub(super) fn lap_received(
        &mut self,
        id: ConnId,
        from: PeerAddr,
        port: PortKey,
        lap: Lap,
        wait: LapWait,
    ) {
        if self
            .conns
            .get(&id)
            .is_some_and(|c| matches!(c.phase(), Phase::AwaitFollow { .. }))
        {
            // A peer re-arming has moved: stop waiting, and answer its LAP (which
            // proposes, most likely, the path we both left).
            self.set_phase(id, Phase::Idle);
        }
        let Some(local_qpn) = self.conns.get(&id).map(|c| c.local_qpn) else {
            return;
        };
        let responder = Responder {
            to: from,
            port,
            digest: lap_digest(&lap),
        };
        if self.lap_duplicate(id, &lap, responder).is_break() {
            return;
        }
        // Rule 3.
        if lap.receiver_qpn != local_qpn {
            self.answer_lap(id, responder, ApStatus::InvalidQpn);
            return;
        }
        let path = match self.local_view(id, &lap.alt) {
            Ok(p) => p,
            Err(status) => {
                self.answer_lap(id, responder, status);
                return;
            }
        };
        let incoming = IncomingLap {
            from,
            port,
            lap,
            responder,
        };
        if self
            .lap_naming_primary(id, &incoming, path, wait)
            .is_break()
        {
            return;
        }
        // Rule 6: a path known to be dead is accepted all the same. It is only an
        // alternate: nothing moves there while it is dead, and armed it gives the QP a
        // second retry budget when the primary fails (the sender chose it because
        // nothing that works ranks as high).
        if self.lap_while_busy(id, &incoming).is_break() {
            return;
        }
        // Rule 8.
        debug!(%id, %path, "accepting LAP");
        if let Some(c) = self.conns.get_mut(&id) {
            c.learn(path);
        }
        self.start_load(id, path, Some(responder));
    }

    /// Rule 4: a duplicate of the last LAP answered gets the same answer, one of the LAP
    /// being worked on an MRA.
    fn lap_duplicate(&mut self, id: ConnId, lap: &Lap, r: Responder) -> ControlFlow<()> {
        let Some(c) = self.conns.get(&id) else {
            return ControlFlow::Break(());
        };
        if let Some((d, status)) = c.last_lap {
            // A "success" answer stays true only while that path is still our armed
            // alternate: the same LAP sent again after a migration or another LAP is a
            // new request, and answering it from memory would leave the two sides with
            // different alternates.
            // A refusal is worked out again: what made it (a dead path, a collision) may
            // have changed since, and working it out touches nothing.
            let still_true = status == ApStatus::Success
                && c.alt.armed().is_some_and(|a| {
                    a.slid == lap.alt.dlid && a.dlid == lap.alt.slid && a.dgid == lap.alt.sgid
                });
            if d == r.digest && still_true {
                debug!(%id, ?status, "duplicate LAP: same answer again");
                self.send_apr(id, r, status);
                return ControlFlow::Break(());
            }
        }
        let working_on_it = matches!(
            c.phase(),
            Phase::Loading { responder: Some(w), .. } | Phase::Arming { responder: Some(w), .. } if w.digest == r.digest
        );
        if working_on_it {
            self.send_mra(id, r);
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Rule 5: a LAP naming our primary (`path`, in our terms) while we are armed means
    /// the peer has left it: our own PATH_MIG (or the peer's Migrate) may not have
    /// reached us yet, and loading a new alternate now would replace the one the HCA is
    /// about to migrate to. The comparison is of whole routes (LIDs too: the LMC
    /// variants of one port share its GID). Our own LAP in flight does not matter then:
    /// it proposes an alternate for a primary that is gone. Once waited for (or when
    /// not armed), it is "is current".
    fn lap_naming_primary(
        &mut self,
        id: ConnId,
        incoming: &IncomingLap,
        path: Path,
        wait: LapWait,
    ) -> ControlFlow<()> {
        let Some(c) = self.conns.get(&id) else {
            return ControlFlow::Break(());
        };
        if !path.same_route(&c.primary) {
            return ControlFlow::Continue(());
        }
        let armed = (c.alt.is_armed() || c.mig != MigState::Migrated)
            && c.alt.path().is_some()
            && c.mode == MigrationMode::Hardware;
        let own_lap = matches!(
            c.phase(),
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(_),
                ..
            }
        );
        if !((armed || c.phase().moving()) && wait == LapWait::MayWait) {
            self.answer_lap(id, incoming.responder, ApStatus::IsCurrent);
            return ControlFlow::Break(());
        }
        let busy = c.phase().busy() && !own_lap;
        if own_lap {
            self.abort_phase(id);
        }
        debug!(%id, "LAP names our primary: waiting for our PATH_MIG");
        self.defer_lap(id, incoming);
        // Mid-way through a command (a migration, typically), the LAP is answered
        // when it is done; otherwise after `lap_defer_ms` at most.
        if !busy {
            let at = self.now.plus(Policy::ms(self.policy.lap_defer_ms));
            self.set_deadline(id, Some(at));
        }
        ControlFlow::Break(())
    }

    /// Rule 7 and busy phases: a LAP crossing ours (the active side's wins), or one
    /// arriving mid-way through something else (answered when it is done).
    fn lap_while_busy(&mut self, id: ConnId, incoming: &IncomingLap) -> ControlFlow<()> {
        let Some(c) = self.conns.get(&id) else {
            return ControlFlow::Break(());
        };
        match c.phase() {
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(_),
                ..
            } if c.role == Role::Active => {
                debug!(%id, "LAP collision: ours wins (active side)");
                self.answer_lap(id, incoming.responder, ApStatus::Rejected);
                return ControlFlow::Break(());
            }
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(_),
                ..
            } => {
                debug!(%id, "LAP collision: theirs wins (we are passive)");
                self.abort_phase(id);
            }
            p if p.busy() => {
                self.defer_lap(id, incoming);
                self.send_mra(id, incoming.responder);
                return ControlFlow::Break(());
            }
            _ => self.abort_phase(id),
        }
        ControlFlow::Continue(())
    }

    /// Hold a LAP back until the connection's phase ends (or its deadline).
    fn defer_lap(&mut self, id: ConnId, incoming: &IncomingLap) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.deferred_lap = Some(Box::new((incoming.from, incoming.port, incoming.lap)));
        }
    }

    /// Turn a path written from the peer's point of view into ours, checking that its
    /// local end is one of our ports and its remote end one of the peer's.
    fn local_view(&self, id: ConnId, theirs: &Path) -> Result<Path, ApStatus> {
        let c = self.conns.get(&id).ok_or(ApStatus::InvalidCommId)?;
        if !c.is_peer_gid(&theirs.sgid) {
            return Err(ApStatus::InvalidGid);
        }
        let device = c.primary.port.device;
        let (key, lp) = self
            .ports
            .iter()
            .find(|(k, p)| k.device == device && p.info.gids.contains(&theirs.dgid))
            .ok_or(ApStatus::InvalidGid)?;
        if lp.info.link_layer == LinkLayer::InfiniBand {
            let base = lp.info.lid.get();
            let span = 1u32 << lp.info.lmc.min(7);
            let lid = theirs.dlid.get();
            if lid < base || u32::from(lid) >= u32::from(base) + span {
                return Err(ApStatus::InvalidLid);
            }
        }
        if theirs.flow_label > 0xF_FFFF {
            return Err(ApStatus::InvalidFlowLabel);
        }
        if theirs.sl > 15 {
            return Err(ApStatus::InvalidSl);
        }
        if theirs.rate > 0x3F {
            return Err(ApStatus::InvalidPacketRate);
        }
        let sgid_index = lp
            .info
            .gids
            .iter()
            .position(|g| *g == theirs.dgid)
            .and_then(|i| u8::try_from(i).ok())
            .ok_or(ApStatus::InvalidGid)?;
        let mut p = theirs.reversed(*key, sgid_index);
        // The LAP carries neither MTU nor P_Key: they must be the primary's.
        p.mtu = c.primary.mtu;
        p.pkey_index = c.primary.pkey_index;
        Ok(p)
    }

    pub(super) fn answer_lap(&mut self, id: ConnId, r: Responder, status: ApStatus) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.last_lap = Some((r.digest, status));
        }
        self.send_apr(id, r, status);
    }

    fn send_apr(&mut self, id: ConnId, r: Responder, status: ApStatus) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let apr = Apr {
            sender_comm_id: c.local_comm_id,
            receiver_comm_id: c.remote_comm_id,
            status,
        };
        self.send(r.port, r.to, PeerMsg::Apr(apr));
    }

    fn send_mra(&mut self, id: ConnId, r: Responder) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        // Ask for twice our own LAP timeout: time enough for two modify_qp calls.
        let wanted_ns = self.policy.lap_timeout_ms.saturating_mul(2_000_000);
        let mut t = 0u8;
        while t < 31 && 4096u64 << t < wanted_ns {
            t += 1;
        }
        let mra = Mra {
            sender_comm_id: c.local_comm_id,
            receiver_comm_id: c.remote_comm_id,
            service_timeout: t,
        };
        self.send(r.port, r.to, PeerMsg::Mra(mra));
    }

    fn apr_arrived(&mut self, from: PeerAddr, apr: Apr) {
        let id = match self.by_comm_id.get(&apr.receiver_comm_id) {
            Some(&id) => id,
            None => {
                debug!(
                    comm_id = apr.receiver_comm_id,
                    "APR for an unknown comm id: dropped"
                );
                return;
            }
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        // "Invalid comm ID" answers carry sender comm id 0: they come from the peer's
        // node but do not know our connection.
        let sender_ok = c.remote_comm_id == apr.sender_comm_id
            || (apr.status == ApStatus::InvalidCommId && apr.sender_comm_id == 0);
        if !sender_ok || !c.is_peer_gid(&from.gid) {
            self.stats.laps_from_strangers += 1;
            warn!(%id, from = %from.gid, "APR not from the connection's peer: dropped");
            return;
        }
        let Phase::AwaitPeer {
            msg: PeerMsg::Lap(lap),
            ..
        } = c.phase()
        else {
            debug!(%id, status = ?apr.status, "APR with no LAP outstanding: dropped");
            return;
        };
        let path = lap.alt;
        match apr.status {
            ApStatus::Success => {
                // A LAP of the peer's held back while we were busy crossed ours, and the
                // peer has since accepted ours (dropping its own): it is stale.
                if let Some(c) = self.conns.get_mut(&id) {
                    c.deferred_lap = None;
                }
                // Load, then arm (a path that died meanwhile too: see `select`).
                self.start_load(id, path, None);
            }
            status => {
                info!(%id, ?status, "peer rejected the alternate");
                let now = self.now;
                let hold = now.plus(Policy::ms(self.policy.bad_path_hold_ms));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.mark_bad(path, hold, now);
                }
                self.release_slot(id);
                self.set_phase(id, Phase::Idle);
                self.update_protection(id, UnprotectedReason::PeerRejected(status));
                if status == ApStatus::IsCurrent {
                    // The peer's primary is our proposed alternate: our views differ.
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.chores.add(Chore::Rearm);
                    }
                    self.query(id);
                } else {
                    self.need_rearm(id);
                }
            }
        }
    }

    fn mra_arrived(&mut self, from: PeerAddr, mra: Mra) {
        let Some(id) = self.peer_conn(mra.receiver_comm_id, mra.sender_comm_id, &from) else {
            debug!("MRA not matching any connection's peer: dropped");
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if !matches!(c.phase(), Phase::AwaitPeer { .. }) {
            return;
        }
        // The peer is working on it: wait its service timeout (capped) before resending.
        let wait_ns = (4096u64 << mra.service_timeout.min(24)).min(60_000_000_000);
        let at = self
            .now
            .plus(std::time::Duration::from_nanos(wait_ns))
            .plus(Policy::ms(self.policy.lap_timeout_ms));
        debug!(%id, wait_ms = wait_ns / 1_000_000, "MRA: peer needs more time");
        self.set_deadline(id, Some(at));
    }

    fn migrate_arrived(&mut self, from: PeerAddr, port: PortKey, m: Migrate) {
        let Some(id) = self.peer_conn(m.receiver_comm_id, m.sender_comm_id, &from) else {
            self.stats.laps_from_strangers += 1;
            warn!(from = %from.gid, "migrate request not from a connection's peer: dropped");
            return;
        };
        let digest = u64::from(m.sender_comm_id) << 32 | u64::from(m.receiver_comm_id);
        let r = Responder {
            to: from,
            port,
            digest,
        };
        debug!(%id, intent = ?m.intent, path = %m.path, "the peer asks to move");
        let Ok(path) = self.local_view(id, &m.path) else {
            self.refuse_move(id, r);
            return;
        };
        self.heard_over(&path, &from);
        let Some(c) = self.live(id) else {
            return;
        };
        if path.same_route(&c.primary) {
            // Already there (the HCA followed the peer's MigReq, or a retransmission).
            self.answer_moved(id, r);
            match m.intent {
                MigrateIntent::Moved => {
                    // The peer runs where we do: what `AwaitFollow` waits for, and
                    // what a provider holding its replay for the peer waits for.
                    self.peer_followed(id);
                    self.tell_peer_there(id, path);
                }
                // The peer is on its way, not there: what we replay still waits for
                // its "moved" or its first packet. Our answer tells it that we are
                // there, so its own replay goes as soon as its move is done.
                MigrateIntent::Moving | MigrateIntent::Probe => {}
            }
            return;
        }
        match c.phase() {
            Phase::SwMigrating { path: p, .. } if p.same_route(&path) => {
                if m.intent == MigrateIntent::Moved {
                    // The peer is there before our move is done: tell the provider now
                    // and again once it is. A "moving" says only that it is on its way
                    // too: its "moved" follows its move.
                    self.peer_arrived_during_move(id);
                }
                return; // Moving there already; the answer follows.
            }
            Phase::LoadingToFollow { path: p, .. } if p.same_route(&path) => {
                return; // Moving there already; the answer follows.
            }
            Phase::Migrating {
                why: MoveReason::Ours | MoveReason::PeerMoved,
                ..
            } if c.alt.path().is_some_and(|a| a.same_route(&path)) => {
                // Our own forced migration goes there: answer when it is done.
                if let Some(Phase::Migrating { why, .. }) =
                    self.conns.get_mut(&id).and_then(|c| c.phase_mut())
                {
                    *why = MoveReason::PeerAsked(r);
                }
                return;
            }
            Phase::Migrating { .. } => return,
            _ => {}
        }
        if !self.path_up(&path) {
            // Never onto a path we know is dead: moving there would stall the QP. (A
            // path held down for flapping is up: the peer runs there, or is about to.)
            self.refuse_move(id, r);
            return;
        }
        match c.mode {
            MigrationMode::Software => {
                if !c.alt.path().is_some_and(|a| a.same_route(&path)) {
                    // Only the agreed alternate may be forced on a RoCE QP.
                    self.refuse_move(id, r);
                    return;
                }
                let crossed = c.phase().asks_peer_to(&path);
                self.stats.migrations_forced += 1;
                // A "moved" comes from a peer already on the path; a "moving" from one
                // moving there as we do, which may finish after us (our replay would go
                // into its drop), so we hold ours as it holds its own, each until the
                // other is there, as for a request that crossed ours (each moves on the
                // other's); any other request comes from one that moves once we answer.
                let peer = match m.intent {
                    MigrateIntent::Moved => PeerOnPath::There,
                    MigrateIntent::Moving => PeerOnPath::Alongside,
                    MigrateIntent::Probe if crossed => PeerOnPath::Alongside,
                    MigrateIntent::Probe => PeerOnPath::Follows,
                };
                self.start_sw_migration(id, path, Some(r), peer);
            }
            MigrationMode::Hardware => self.follow_peer(id, path, r),
        }
    }

    /// The peer's HCA runs on `path` now and ours does not: move there too. Only an
    /// ARMED QP can be moved; onto its alternate directly, onto another path after
    /// loading it as the alternate (a QP keeps ARMED when its alternate is replaced),
    /// which repairs two sides whose alternates differ (an APR lost after the peer
    /// loaded our LAP's path, say).
    fn follow_peer(&mut self, id: ConnId, path: Path, r: Responder) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if !(c.alt.is_armed() || c.mig != MigState::Migrated) {
            debug!(%id, "the peer moved, our QP is not armed: it cannot follow");
            self.refuse_move(id, r);
            return;
        }
        self.stats.migrations_forced += 1;
        if c.alt.path().is_some_and(|a| a.same_route(&path)) {
            debug!(%id, %path, "the peer moves to our alternate: following");
            self.force_migration(id, MoveReason::PeerAsked(r));
            return;
        }
        info!(%id, %path, "the peer moved to a path that is not our alternate: loading it to follow");
        let cmd = self.issue_qp(id, CommandOp::LoadAlternate { conn: id, path });
        self.replace_phase(
            id,
            Phase::LoadingToFollow {
                cmd,
                path,
                responder: r,
            },
        );
    }

    /// The peer runs on the path our software move of `id` goes to: tell the provider now,
    /// so that the move replays at once when it is done instead of holding for a word
    /// that has come already, and again once the move is done (`sw_migration_done`), for
    /// a provider that heard the first before its move began.
    fn peer_arrived_during_move(&mut self, id: ConnId) {
        let Some(Phase::SwMigrating { peer, path, .. }) =
            self.conns.get_mut(&id).and_then(|c| c.phase_mut())
        else {
            return;
        };
        let (was, path) = (*peer, *path);
        peer.peer_arrived();
        if *peer != was {
            self.tell_peer_there(id, path);
        }
    }

    /// Answer the peer's `Migrate`: we run on the path it named.
    pub(super) fn answer_moved(&mut self, id: ConnId, r: Responder) {
        self.send_migrate_ack(id, r, MoveAnswer::Moved);
    }

    /// Answer the peer's `Migrate`: we did not move there.
    pub(super) fn refuse_move(&mut self, id: ConnId, r: Responder) {
        self.send_migrate_ack(id, r, MoveAnswer::Refused);
    }

    fn send_migrate_ack(&mut self, id: ConnId, r: Responder, answer: MoveAnswer) {
        if let Some(ack) = self.migrate_ack(id, answer) {
            self.send(r.port, r.to, ack);
        }
    }

    /// A software migration to `path` is done on our side.
    pub(super) fn sw_migrated(&mut self, id: ConnId, path: Path, responder: Option<Responder>) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.alt.replace(path);
        }
        // We moved first unless the peer asked us to.
        let why = responder.map_or(MoveReason::Ours, MoveReason::PeerAsked);
        let moved = match responder {
            None => Moved::Forced,
            Some(_) => Moved::Unforced,
        };
        self.migrated(id, moved, why);
    }

    /// Tell the peer where we run now (`Migrate`), retransmitted until it answers; the
    /// re-arm waits for the answer (or for the retries to run out).
    pub(super) fn announce_migration(&mut self, id: ConnId) {
        if let Some((path, msg)) = self.moved_msg(id) {
            self.await_peer(id, path.port, PeerAddr::far_end(&path), msg);
        }
    }

    /// `AwaitFollow`: ask the peer whether it runs on our primary (our `Migrate`
    /// "moved", sent once; an "ok" answer arrives as `peer_followed`).
    pub(super) fn ask_if_followed(&mut self, id: ConnId) {
        if let Some((path, msg)) = self.moved_msg(id) {
            self.send(path.port, PeerAddr::far_end(&path), msg);
        }
    }

    /// "We run on our primary now": the `Migrate` (intent moved) naming it.
    fn moved_msg(&self, id: ConnId) -> Option<(Path, PeerMsg)> {
        let path = self.conns.get(&id)?.primary;
        Some((path, self.migrate_msg(id, path, MigrateIntent::Moved)?))
    }

    /// The `Migrate` of connection `id` naming `path`, with `intent`.
    pub(super) fn migrate_msg(
        &self,
        id: ConnId,
        path: Path,
        intent: MigrateIntent,
    ) -> Option<PeerMsg> {
        let c = self.conns.get(&id)?;
        Some(PeerMsg::Migrate(Migrate {
            sender_comm_id: c.local_comm_id,
            receiver_comm_id: c.remote_comm_id,
            path,
            intent,
        }))
    }

    /// Send `msg` to the peer and wait for its answer (retransmitted at the deadline).
    pub(super) fn await_peer(&mut self, id: ConnId, port: PortKey, to: PeerAddr, msg: PeerMsg) {
        self.send(port, to, msg);
        self.set_phase(
            id,
            Phase::AwaitPeer {
                msg,
                port,
                to,
                tries: 1,
            },
        );
        let at = self.now.plus(Policy::ms(self.policy.lap_timeout_ms));
        self.set_deadline(id, Some(at));
    }

    fn migrate_ack_arrived(&mut self, from: PeerAddr, a: MigrateAck) {
        let Some(id) = self.peer_conn(a.receiver_comm_id, a.sender_comm_id, &from) else {
            debug!("migrate ack not matching any connection's peer: dropped");
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        match c.phase() {
            Phase::AwaitFollow { .. } => {
                // "I am on the path" from the peer we moved for: it followed.
                if a.ok {
                    let primary = c.primary;
                    self.peer_followed(id);
                    self.tell_peer_there(id, primary);
                }
                return;
            }
            Phase::SwMigrating {
                peer: PeerOnPath::Alongside,
                ..
            } if a.ok => {
                // The answer to our "moving", or to our request when the peer's crossed
                // it: the peer runs on the path we are moving to. Tell the provider
                // (`peer_arrived_during_move`).
                self.peer_arrived_during_move(id);
                return;
            }
            Phase::Migrating {
                why: MoveReason::PeerAsked(r),
                ..
            } if a.ok => {
                // It moved while we are following it: no need to wait for that after.
                let r = *r;
                if let Some(Phase::Migrating { why, .. }) =
                    self.conns.get_mut(&id).and_then(|c| c.phase_mut())
                {
                    *why = MoveReason::PeerAskedAndMoved(r);
                }
                return;
            }
            _ => {}
        }
        let Phase::AwaitPeer {
            msg: PeerMsg::Migrate(m),
            ..
        } = c.phase()
        else {
            return;
        };
        let probe = !m.path.same_route(&c.primary);
        let follow = probe
            && a.ok
            && c.alt.path().is_some_and(|alt| alt.same_route(&m.path))
            && (c.alt.is_armed() || c.mig != MigState::Migrated);
        if !a.ok {
            warn!(%id, "peer refused to follow the migration");
        }
        // The path died at our end since the probe went out (its answer came another
        // way): the move is off, as at the probe's deadline (the HCA decides at retry
        // exhaustion). No command moves a connection onto a path known dead.
        let follow = follow && self.path_up(&m.path);
        if follow {
            // The peer moved onto our alternate, which therefore works: follow it.
            match c.mode {
                MigrationMode::Hardware => self.force_migration(id, MoveReason::PeerMoved),
                MigrationMode::Software => {
                    self.start_sw_migration(id, m.path, None, PeerOnPath::There)
                }
            }
            return;
        }
        if !probe && a.ok {
            // The answer to our "moved": the peer runs on our primary.
            self.tell_peer_there(id, c.primary);
        }
        self.set_phase(id, Phase::Idle);
        self.after_phase(id);
    }
}
