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
//! 5. A LAP naming our current primary while we are armed waits `lap_defer_ms` for a
//!    `PATH_MIG` we may not have seen yet (seed 001's race), then gets "is current".
//! 6. A path known to be dead: "rejected".
//! 7. Collision (both sides sent a LAP): the active side's LAP wins. The passive side
//!    drops its own and answers; the active side answers the passive's with "rejected".
//! 8. Otherwise: load it, set REARM, answer "success".

use super::conn::{lap_digest, Phase, Responder};
use super::*;

impl Engine {
    pub(super) fn peer_message(&mut self, from: PeerAddr, port: PortKey, msg: PeerMsg) {
        // A message from a GID proves it is in service. Held out of service, it was put
        // there by a stale Report: the SM resends each Report on its own schedule, so a
        // retransmitted trap 65 can arrive after the trap 64 that followed it, and no
        // later notice would ever correct it.
        if self.remotes.get(&from.gid).is_some_and(|h| !h.up) {
            debug!(gid = %from.gid, "message from a GID held out of service: it is back");
            self.remote_gid(from.gid, true);
        }
        match msg {
            PeerMsg::Lap(lap) => self.lap_arrived(from, port, lap),
            PeerMsg::Apr(apr) => self.apr_arrived(from, apr),
            PeerMsg::Mra(mra) => self.mra_arrived(from, mra),
            PeerMsg::Migrate(m) => self.migrate_arrived(from, port, m),
            PeerMsg::MigrateAck(a) => self.migrate_ack_arrived(from, a),
        }
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
        if self.conns.get(&id).is_some_and(|c| c.lost) {
            return;
        }
        self.lap_received(id, from, port, lap, false);
    }

    /// The LAP of rules 3-8, from a verified peer. `deferred` is true when it already
    /// waited for a `PATH_MIG` (rule 5).
    pub(super) fn lap_received(
        &mut self,
        id: ConnId,
        from: PeerAddr,
        port: PortKey,
        lap: Lap,
        deferred: bool,
    ) {
        let digest = lap_digest(&lap);
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let responder = Responder {
            to: from,
            port,
            digest,
        };
        // Rule 4: duplicates.
        if let Some((d, status)) = c.last_lap {
            // A "success" answer stays true only while that path is still our armed
            // alternate: the same LAP sent again after a migration or another LAP is a
            // new request, and answering it from memory would leave the two sides with
            // different alternates.
            // A refusal is worked out again: what made it (a dead path, a collision) may
            // have changed since, and working it out touches nothing.
            let still_true = status == ApStatus::Success
                && c.armed
                && c.alternate.is_some_and(|a| {
                    a.slid == lap.alt.dlid && a.dlid == lap.alt.slid && a.dgid == lap.alt.sgid
                });
            if d == digest && still_true {
                debug!(%id, ?status, "duplicate LAP: same answer again");
                self.send_apr(id, responder, status);
                return;
            }
        }
        let working_on_it = matches!(
            c.phase(),
            Phase::Loading { responder: Some(r), .. } | Phase::Arming { responder: Some(r), .. } if r.digest == digest
        );
        if working_on_it {
            self.send_mra(id, responder);
            return;
        }
        if lap.receiver_qpn != c.local_qpn {
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
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        // Rule 5: has the peer migrated before our own PATH_MIG reached us? Either its
        // LAP comes from our alternate's far end, or it proposes our primary (its old
        // primary, now its candidate alternate). Loading a new alternate now would
        // replace the one the HCA is about to migrate to.
        // The QP's own state counts, not only our agreement with the peer: after a LAP
        // given up on, the alternate is no longer known to be agreed but the HCA still
        // holds it armed and will migrate to it.
        let armed_alt = c.alternate.filter(|_| {
            (c.armed || c.mig != MigState::Migrated) && c.mode == MigrationMode::Hardware
        });
        let from_alt_end =
            armed_alt.is_some_and(|a| from.gid == a.dgid && from.gid != c.primary.dgid);
        let names_primary = path.same_route(&c.primary);
        // Our own LAP in flight does not matter if the peer has migrated: it proposes
        // an alternate for a primary that is gone. Drop it rather than let the
        // collision rules load the peer's LAP over the alternate it migrated to.
        let own_lap = matches!(
            c.phase(),
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(_),
                ..
            }
        );
        if (from_alt_end || names_primary && armed_alt.is_some()) && (!c.phase().busy() || own_lap)
        {
            if own_lap {
                self.abort_phase(id);
            }
            if !deferred {
                debug!(%id, "LAP suggests the peer migrated: waiting for our PATH_MIG");
                let at = self.now.plus(Policy::ms(self.policy.lap_defer_ms));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.deferred_lap = Some(Box::new((from, port, lap)));
                }
                self.set_deadline(id, Some(at));
                return;
            }
            if from_alt_end && armed_alt.is_some_and(|a| self.path_usable(&a)) {
                // No PATH_MIG came: the peer moved, so move too, then answer.
                debug!(%id, "peer migrated without us noticing: forcing migration");
                if let Some(c) = self.conns.get_mut(&id) {
                    c.deferred_lap = Some(Box::new((from, port, lap)));
                }
                self.primary_failed(id);
                return;
            }
        }
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if names_primary {
            self.answer_lap(id, responder, ApStatus::IsCurrent);
            return;
        }
        // Rule 6.
        if !self.path_usable(&path) {
            debug!(%id, %path, "LAP proposes a path known to be dead");
            self.answer_lap(id, responder, ApStatus::Rejected);
            return;
        }
        // Rule 7 and busy phases.
        match c.phase() {
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(_),
                ..
            } if c.role == Role::Active => {
                debug!(%id, "LAP collision: ours wins (active side)");
                self.answer_lap(id, responder, ApStatus::Rejected);
                return;
            }
            Phase::AwaitPeer {
                msg: PeerMsg::Lap(_),
                ..
            } => {
                debug!(%id, "LAP collision: theirs wins (we are passive)");
                self.abort_phase(id);
            }
            p if p.busy() => {
                // Mid-way through something else: answer when it is done.
                if let Some(c) = self.conns.get_mut(&id) {
                    c.deferred_lap = Some(Box::new((from, port, lap)));
                }
                self.send_mra(id, responder);
                return;
            }
            _ => self.abort_phase(id),
        }
        // Rule 8.
        debug!(%id, %path, "accepting LAP");
        if let Some(c) = self.conns.get_mut(&id) {
            c.learn(path);
        }
        self.start_load(id, path, Some(responder));
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
                if !self.usable_for(c, &path) {
                    debug!(%id, "APR success for a path that died meanwhile");
                    self.release_slot(id);
                    self.set_phase(id, Phase::Idle);
                    self.need_rearm(id);
                    return;
                }
                // Seed 001 steps 2-3: load, then arm.
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
                        c.want_rearm = true;
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
        let Ok(path) = self.local_view(id, &m.path) else {
            self.send_migrate_ack(id, r, false);
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.lost {
            return;
        }
        if path.same_route(&c.primary) {
            // Already there (a retransmitted request): say so again.
            self.send_migrate_ack(id, r, true);
            return;
        }
        if let Phase::SwMigrating { path: p, .. } = c.phase() {
            if p.same_route(&path) {
                return; // Moving there already; the ack follows.
            }
        }
        if !c.alternate.is_some_and(|a| a.same_route(&path)) || !self.path_usable(&path) {
            // Only the agreed alternate may be forced on us, and never onto a path we
            // know is dead (moving there would stall the QP for nothing).
            self.send_migrate_ack(id, r, false);
            return;
        }
        self.stats.migrations_forced += 1;
        self.start_sw_migration(id, path, Some(r));
    }

    pub(super) fn send_migrate_ack(&mut self, id: ConnId, r: Responder, ok: bool) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let ack = MigrateAck {
            sender_comm_id: c.local_comm_id,
            receiver_comm_id: c.remote_comm_id,
            ok,
        };
        self.send(r.port, r.to, PeerMsg::MigrateAck(ack));
    }

    /// A software migration to `path` is done on our side.
    pub(super) fn sw_migrated(&mut self, id: ConnId, path: Path, responder: Option<Responder>) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.alternate = Some(path);
        }
        match responder {
            Some(r) => {
                self.send_migrate_ack(id, r, true);
                self.migrated(id, false);
            }
            None => {
                // We moved first: the peer must move too before anything else happens.
                self.migrated_then(id, true, false);
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                c.want_rearm = true;
                let msg = PeerMsg::Migrate(Migrate {
                    sender_comm_id: c.local_comm_id,
                    receiver_comm_id: c.remote_comm_id,
                    path,
                });
                let port = path.port;
                let to = PeerAddr {
                    gid: path.dgid,
                    lid: path.dlid,
                };
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
        }
    }

    fn migrate_ack_arrived(&mut self, from: PeerAddr, a: MigrateAck) {
        let Some(id) = self.peer_conn(a.receiver_comm_id, a.sender_comm_id, &from) else {
            debug!("migrate ack not matching any connection's peer: dropped");
            return;
        };
        let awaiting = self.conns.get(&id).is_some_and(|c| {
            matches!(
                c.phase(),
                Phase::AwaitPeer {
                    msg: PeerMsg::Migrate(_),
                    ..
                }
            )
        });
        if !awaiting {
            return;
        }
        if !a.ok {
            warn!(%id, "peer refused to follow the software migration");
        }
        self.set_phase(id, Phase::Idle);
        self.after_phase(id);
    }
}
