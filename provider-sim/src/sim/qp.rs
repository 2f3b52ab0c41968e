//! RC QPs and their traffic: the QP commands, transmission and ACKs, the retry budget,
//! migration and loss, after rdmavt (see the module above for the rules and sources).

use super::*;

impl Sim {
    // ------------------------------------------------------------------ QP commands

    pub(super) fn qp_checked(
        &self,
        host: usize,
        conn: ConnId,
    ) -> Result<(usize, usize), ProviderError> {
        let (i, s) = self.side_of(host, conn)?;
        if self.conns[i].qp[s].err {
            return Err(ProviderError::QpInError);
        }
        Ok((i, s))
    }

    /// A path's local end must be one of this host's ports with the path's SLID.
    pub(super) fn path_local_ok(&self, host: usize, path: &Path) -> bool {
        self.fab.port_of(host, path.port.port).is_some_and(|pid| {
            path.port.device == 0 && self.fab.lid_owner(path.slid.get()) == Some(pid)
        })
    }

    pub(super) fn load_alternate(
        &mut self,
        host: usize,
        conn: ConnId,
        path: Path,
    ) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.qp_checked(host, conn)?;
        if self.conns[i].mode == Mode::Software {
            return Err(ProviderError::Unsupported {
                provider: "provider-sim",
                operation: Operation::LoadAlternate,
                why: Some(Reason::Because("a RoCE QP has no alternate path")),
            });
        }
        if !self.path_local_ok(host, &path) {
            return Err(ProviderError::refused(
                Operation::LoadAlternate,
                Reason::NotLocalPath,
            ));
        }
        if path.mtu != self.conns[i].qp[s].primary.mtu {
            return Err(ProviderError::refused(
                Operation::LoadAlternate,
                Reason::MtuDiffers,
            ));
        }
        // IBA allows a new alternate while ARMED; the state is kept (rdmavt copies the
        // address vector and leaves `s_mig_state` alone).
        let q = &mut self.conns[i].qp[s];
        q.alt = Some(path);
        q.mig_err_raised = false;
        self.reeval(i);
        Ok(CommandOutcome::Done)
    }

    pub(super) fn set_rearm(
        &mut self,
        host: usize,
        conn: ConnId,
    ) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.qp_checked(host, conn)?;
        if self.conns[i].mode == Mode::Software {
            return Err(ProviderError::Unsupported {
                provider: "provider-sim",
                operation: Operation::SetRearm,
                why: Some(Reason::Because("a RoCE QP has no alternate path")),
            });
        }
        let q = &mut self.conns[i].qp[s];
        if q.alt.is_none() {
            return Err(ProviderError::refused(
                Operation::SetRearm,
                Reason::NoAlternate,
            ));
        }
        // Software may ask for REARM from MIGRATED (or again in REARM); an ARMED QP
        // refuses it (rdmavt's `rvt_modify_qp`: EINVAL). A new alternate loaded while
        // ARMED is armed already: the state is the QP's, not the path's.
        if q.mig == MigState::Armed {
            return Err(ProviderError::refused(
                Operation::SetRearm,
                Reason::MigState(MigState::Armed),
            ));
        }
        q.mig = MigState::Rearm;
        q.mig_err_raised = false;
        let m = q.mig;
        self.reeval(i);
        Ok(CommandOutcome::MigState(m))
    }

    pub(super) fn force_migrate(
        &mut self,
        host: usize,
        conn: ConnId,
    ) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.qp_checked(host, conn)?;
        let q = &self.conns[i].qp[s];
        if q.mig != MigState::Armed {
            return Err(ProviderError::refused(
                Operation::ForceMigrate,
                Reason::MigState(q.mig),
            ));
        }
        let Some(alt) = q.alt else {
            return Err(ProviderError::refused(
                Operation::ForceMigrate,
                Reason::NoAlternate,
            ));
        };
        let _ = alt;
        self.hw_migrate(i, s, Trigger::Forced);
        Ok(CommandOutcome::Done)
    }

    pub(super) fn software_migrate(
        &mut self,
        host: usize,
        conn: ConnId,
        path: Path,
    ) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.qp_checked(host, conn)?;
        if !self.path_local_ok(host, &path) {
            return Err(ProviderError::refused(
                Operation::SoftwareMigrate,
                Reason::NotLocalPath,
            ));
        }
        let old = std::mem::replace(&mut self.conns[i].qp[s].primary, path);
        self.count_failover(s, &old);
        self.conns[i].moved_unarmed = Some(self.now);
        self.unstall_try(i, s);
        self.reeval(i);
        Ok(CommandOutcome::Done)
    }

    /// apm's zero-length RDMA WRITE on `host`'s QP of `conn`, where the workload lets
    /// apm post (`workload.apm_may_post`): a work request the QP carries like the
    /// application's messages (retried on a dead path, arming the peer on arrival and
    /// this side on its acknowledgement), carrying no message of the application's.
    pub(super) fn arming_write(
        &mut self,
        host: usize,
        conn: ConnId,
    ) -> Result<CommandOutcome, ProviderError> {
        let unsupported = |why| ProviderError::Unsupported {
            provider: "provider-sim",
            operation: Operation::ArmingWrite,
            why: Some(Reason::Because(why)),
        };
        if !self.scenario.workload.apm_may_post {
            return Err(unsupported(
                "the application's QP: apm does not post on it (workload.apm_may_post)",
            ));
        }
        let (i, s) = self.qp_checked(host, conn)?;
        if self.conns[i].mode == Mode::Software {
            return Err(unsupported("a RoCE QP has no alternate to arm"));
        }
        if !self.conns[i].qp[s].stalled && !self.transmit(i, s) {
            self.stall(i, s);
            self.reeval(i);
        }
        Ok(CommandOutcome::Done)
    }

    pub(super) fn query_qp(
        &mut self,
        host: usize,
        conn: ConnId,
    ) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.side_of(host, conn)?;
        let q = &self.conns[i].qp[s];
        Ok(CommandOutcome::Qp(QpSnapshot {
            operational: !q.err,
            mig_state: q.mig,
            primary_port: q.primary.port,
            primary_dlid: q.primary.dlid,
            primary_dgid: q.primary.dgid,
        }))
    }

    // ------------------------------------------------------------------ QPs and traffic

    /// The local ACK timeout side `s` retries at: the QP's own under rdmavt, whatever
    /// path it runs on; its current path's under mlx5, where each path carries its own
    /// ([`Migration`]).
    fn ack_timeout(&self, i: usize, s: usize) -> Time {
        let q = &self.conns[i].qp[s];
        let t = match self.p.migration {
            Migration::Rdmavt => q.timeout,
            Migration::Mlx5 => q.primary.ack_timeout,
        };
        Time(4096u64 << t.min(31))
    }

    /// `p` works now, as connection `i`'s path in memo slot `slot` (0, 1: the two
    /// sides' primaries; 2, 3: their alternates): a connection's routes are walked
    /// once per change of the fabric, not at every re-evaluation (each walk is a
    /// handful of forwarding-table lookups spread over megabytes of tables).
    pub(super) fn conn_path_ok(&self, i: usize, slot: usize, p: &Path) -> bool {
        let key = (u32::from(p.slid.get()) << 16) | u32::from(p.dlid.get());
        let mut memo = self.conns[i].route_memo.get();
        if memo.gen == self.fab_gen && memo.keys[slot] == key {
            return memo.ok[slot];
        }
        let ok = self.path_ok(p);
        if memo.gen != self.fab_gen {
            memo = RouteMemo {
                gen: self.fab_gen,
                ..RouteMemo::default()
            };
        }
        memo.keys[slot] = key;
        memo.ok[slot] = ok;
        self.conns[i].route_memo.set(memo);
        ok
    }

    pub(super) fn path_ok(&self, p: &Path) -> bool {
        self.fab.route(p.slid.get(), p.dlid.get()).is_some()
    }

    /// Side `s` moves to its alternate (`trigger` says what moved it): the alternate
    /// becomes the primary, the QP is MIGRATED, PATH_MIG is raised. A requester starts
    /// a fresh retry budget on the new path after a migration on exhaustion (rdmavt's
    /// `hfi1_restart_rc`), and under mlx5 after any migration ([`Migration`]).
    pub(super) fn hw_migrate(&mut self, i: usize, s: usize, trigger: Trigger) {
        let restart = trigger == Trigger::Exhausted || self.p.migration == Migration::Mlx5;
        let q = &mut self.conns[i].qp[s];
        let Some(alt) = q.alt.take() else {
            return;
        };
        let old = std::mem::replace(&mut q.primary, alt);
        q.mig = MigState::Migrated;
        if restart {
            q.retries = 0;
        }
        q.mig_err_raised = false;
        let host = q.host;
        self.count_failover(s, &old);
        self.conns[i].moved_unarmed = Some(self.now);
        let lat = self.ev_latency();
        self.raise(
            host,
            lat,
            Input::QpEvent {
                conn: ConnId(i as u64),
                event: QpEvent::PathMigrated,
            },
        );
        self.unstall_try(i, s);
        self.reeval(i);
    }

    /// Side `s` of a connection left `old`: a failover, counted once per connection
    /// (on the active side), and a false one when `old` still worked both ways.
    fn count_failover(&mut self, s: usize, old: &Path) {
        if s != 0 {
            return;
        }
        self.c.failovers += 1;
        if self.path_ok(old) && self.fab.route(old.dlid.get(), old.slid.get()).is_some() {
            self.c.false_failovers += 1;
        }
    }

    /// A stalled requester retries at once after its path changed.
    pub(super) fn unstall_try(&mut self, i: usize, s: usize) {
        if self.conns[i].qp[s].stalled && self.transmit(i, s) {
            self.unstall(i, s);
        }
    }

    pub(super) fn unstall(&mut self, i: usize, s: usize) {
        let q = &mut self.conns[i].qp[s];
        q.stalled = false;
        q.retries = 0;
        q.retry_gen = q.retry_gen.wrapping_add(1);
    }

    /// What a responder does with a packet from its peer on `p` carrying `migreq`
    /// (`*_ruc_check_hdr`): accept it on the primary, migrate when ARMED and it arrives
    /// on the alternate with MigReq=1, otherwise drop it. Returns whether it was
    /// accepted and whether the responder changed state.
    fn receive(&mut self, i: usize, y: usize, p: &Path, migreq: bool) -> (bool, bool) {
        let hardware = self.conns[i].mode == Mode::Hardware;
        let yq = &self.conns[i].qp[y];
        if mirrors(p, &yq.primary) {
            // A valid packet with MigReq=0 on the primary arms a REARM QP.
            if !migreq && yq.mig == MigState::Rearm {
                self.conns[i].qp[y].mig = MigState::Armed;
                return (true, true);
            }
            return (true, false);
        }
        let on_alt = hardware && yq.alt.is_some_and(|a| mirrors(p, &a));
        if !(on_alt && migreq) {
            return (false, false);
        }
        if yq.mig == MigState::Armed {
            self.hw_migrate(i, y, Trigger::Pulled);
            return (true, true);
        }
        // A migration request the QP cannot take: PATH_MIG_ERR, once per alternate.
        if !yq.mig_err_raised {
            let host = yq.host;
            self.conns[i].qp[y].mig_err_raised = true;
            let lat = self.ev_latency();
            self.raise(
                host,
                lat,
                Input::QpEvent {
                    conn: ConnId(i as u64),
                    event: QpEvent::PathMigrationError,
                },
            );
        }
        (false, false)
    }

    /// Send everything outstanding from side `x`. True when it got through and was
    /// acknowledged.
    pub(super) fn transmit(&mut self, i: usize, x: usize) -> bool {
        let y = 1 - x;
        if self.conns[i].qp[x].err || self.conns[i].qp[y].err {
            return false;
        }
        let p = self.conns[i].qp[x].primary;
        if !self.conn_path_ok(i, x, &p) {
            return false;
        }
        // A requester in MIGRATED sends MigReq=1.
        let migreq = self.conns[i].qp[x].mig == MigState::Migrated;
        let (accepted, mut changed) = self.receive(i, y, &p, migreq);
        if !accepted {
            if changed {
                self.reeval(i);
            }
            return false;
        }
        // Delivered to the peer's application.
        let c = &mut self.conns[i];
        if c.qp[x].stalled {
            // Everything not acknowledged goes out again after the timeout.
            self.c.messages_retransmitted += c.qp[x].posted - c.qp[x].acked;
        }
        let newly = c.qp[x].posted - c.qp[x].delivered;
        c.qp[x].delivered = c.qp[x].posted;
        self.c.messages_delivered += newly;
        // The ACK travels on the responder's primary and carries its MigReq.
        let back = c.qp[y].primary;
        let acked = mirrors(&back, &c.qp[x].primary) && self.conn_path_ok(i, y, &back);
        let c = &mut self.conns[i];
        if acked {
            c.qp[x].acked = c.qp[x].posted;
            if c.qp[y].mig != MigState::Migrated && c.qp[x].mig == MigState::Rearm {
                c.qp[x].mig = MigState::Armed;
                changed = true;
            }
        }
        if changed {
            self.reeval(i);
        }
        acked
    }

    pub(super) fn tick(&mut self, g: u64) {
        let at = after(self.now, ms(self.scenario.workload.message_interval_ms));
        // Between bursts nobody sends: the tick is not one (quiet connections do not
        // count it either).
        if let Some(b) = self.scenario.workload.bursts {
            if !b.sending(self.now.0) {
                self.push(at, Ev::Tick(g));
                return;
            }
        }
        // Quiet connections are counted, not visited (`quiet.rs`).
        for i in self.tick_group(g as usize) {
            for s in 0..2 {
                // The application offers its message whatever became of the connection:
                // on a dead one it is never delivered.
                self.conns[i].qp[s].posted += 1;
                self.c.messages_posted += 1;
                if self.conns[i].qp[s].err {
                    continue;
                }
                if !self.conns[i].qp[s].stalled && !self.transmit(i, s) {
                    self.stall(i, s);
                }
            }
            self.settle(i);
        }
        self.push(at, Ev::Tick(g));
    }

    /// Side `s` sent and heard nothing back: it retries every ACK timeout from now.
    fn stall(&mut self, i: usize, s: usize) {
        let q = &mut self.conns[i].qp[s];
        q.stalled = true;
        q.retries = 0;
        q.retry_gen = q.retry_gen.wrapping_add(1);
        self.schedule_retry(i, s);
    }

    /// Side `s`'s next retry, one ACK timeout from now.
    fn schedule_retry(&mut self, i: usize, s: usize) {
        let gen = self.conns[i].qp[s].retry_gen;
        let at = after(self.now, self.ack_timeout(i, s));
        self.push(
            at,
            Ev::Retry {
                conn: i,
                side: s,
                gen,
            },
        );
    }

    pub(super) fn retry(&mut self, i: usize, s: usize, gen: u32) {
        if self.cfg.trace_conn == Some(i) {
            self.trace(i);
        }
        let q = &self.conns[i].qp[s];
        if q.retry_gen != gen || !q.stalled || q.err {
            return;
        }
        if self.transmit(i, s) {
            self.unstall(i, s);
            return;
        }
        let q = &mut self.conns[i].qp[s];
        q.retries += 1;
        let retries = q.retries;
        let host = q.host;
        if self.conns[i].mode == Mode::Software && retries == self.p.stall_timeouts {
            let lat = self.ev_latency();
            self.raise(
                host,
                lat,
                Input::QpEvent {
                    conn: ConnId(i as u64),
                    event: QpEvent::PrimaryStalled,
                },
            );
        }
        if retries > self.p.retry_cnt {
            self.exhausted(i, s);
            if self.conns[i].qp[s].err || !self.conns[i].qp[s].stalled {
                return;
            }
        }
        self.schedule_retry(i, s);
    }

    /// The retry budget of side `s` ran out (`hfi1_restart_rc`/`qib_restart_rc` with
    /// `s_retry == 0`): an ARMED QP migrates to its alternate, whatever state that path
    /// is in, and retries there with a new budget; any other QP completes with
    /// RETRY_EXC_ERR and goes to ERR.
    fn exhausted(&mut self, i: usize, s: usize) {
        let c = &self.conns[i];
        let q = &c.qp[s];
        tracing::debug!(
            conn = i,
            side = s,
            primary = %q.primary,
            alt = ?q.alt.map(|a| (a.slid, a.dlid)),
            mig = ?q.mig,
            peer_primary = %c.qp[1 - s].primary,
            peer_alt = ?c.qp[1 - s].alt.map(|a| (a.slid, a.dlid)),
            peer_mig = ?c.qp[1 - s].mig,
            "retry budget exhausted"
        );
        let armed = c.mode == Mode::Hardware && q.mig == MigState::Armed && q.alt.is_some();
        if armed {
            self.hw_migrate(i, s, Trigger::Exhausted);
            return;
        }
        self.lose(i, Loss::RetriesExhausted);
    }

    /// Both QPs of connection `i` go to ERR.
    pub(super) fn lose(&mut self, i: usize, why: Loss) {
        if self.conns[i].qp[0].err && self.conns[i].qp[1].err {
            return;
        }
        let lat = self.ev_latency();
        for s in 0..2 {
            let q = &mut self.conns[i].qp[s];
            if !q.err {
                q.err = true;
                // Delivered but never acknowledged: the application sends it again on
                // its next connection, and the receiver gets it twice.
                self.c.messages_duplicated += q.delivered - q.acked;
                let host = q.host;
                if why == Loss::RetriesExhausted {
                    self.raise(
                        host,
                        lat,
                        Input::QpEvent {
                            conn: ConnId(i as u64),
                            event: QpEvent::Fatal,
                        },
                    );
                }
            }
        }
        if why == Loss::DeviceFatal {
            self.conns[i].excused = true;
        }
        self.reeval(i);
    }
}

/// Why both QPs of a connection went to ERR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// A QP ran out of retries with nothing to migrate to: each host hears of its QP
    /// (an asynchronous `QP_FATAL`).
    RetriesExhausted,
    /// The HCA died (`DEVICE_FATAL`, raised for the device, not per QP): no alternate
    /// could have kept the connection, so its loss breaks no invariant (`excused`).
    DeviceFatal,
}

/// What moved a QP to its alternate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Trigger {
    /// Its retries on the primary ran out while ARMED.
    Exhausted,
    /// Software forced it (`ForceMigrate`).
    Forced,
    /// Its peer's packet with MigReq=1 arrived on its alternate while ARMED.
    Pulled,
}
