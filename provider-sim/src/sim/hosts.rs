//! The hosts: feeding inputs to each host's controller (or external driver), and
//! carrying out the commands it issues on the simulated QPs.

use super::*;

impl Sim {
    // ------------------------------------------------------------------ hosts

    /// Hand an input to a host's controller (or external driver) now.
    pub(super) fn feed(&mut self, host: usize, input: Input) {
        match &input {
            Input::PortEvent {
                port,
                event: PortEvent::Down,
            } => {
                self.hosts[host].known_down_ports.insert(port.port);
            }
            Input::PortEvent {
                port,
                event: event @ (PortEvent::Active | PortEvent::ClientReregister),
            } => {
                if *event == PortEvent::Active {
                    self.hosts[host].known_down_ports.remove(&port.port);
                }
                // The engine forgets out-of-service verdicts learnt through a port that
                // was down or deregistered (it may have missed the trap 64): so does
                // the record of what it was told.
                if let Some(pid) = self.fab.port_of(host, port.port) {
                    let prefix = self.fab.ports[pid].gid.0[..8].to_vec();
                    self.hosts[host]
                        .known_dead_gids
                        .retain(|g| g.0[..8] != prefix[..]);
                }
            }
            Input::PeerMessage { from, .. } => {
                // The engine takes a message from a GID as proof that it is in service.
                self.hosts[host].known_dead_gids.remove(&from.gid);
            }
            Input::CommandDone { id, result } => {
                // The SA routing to a GID, in an answer to a question asked after the
                // last notice about it, tells the host it is back (the engine's recheck
                // takes it so).
                if let Some((gid, seq)) = self.hosts[host].path_queries.remove(id) {
                    let routed = matches!(result, Ok(CommandOutcome::Paths(p)) if p.iter().any(|p| p.dgid == gid));
                    let h = &mut self.hosts[host];
                    if routed && h.notices.get(&gid).copied().unwrap_or(0) == seq {
                        h.known_dead_gids.remove(&gid);
                    }
                }
            }
            Input::RemoteGid { gid, in_service } => {
                *self.hosts[host].notices.entry(*gid).or_insert(0) += 1;
                if *in_service {
                    self.hosts[host].known_dead_gids.remove(gid);
                } else {
                    self.hosts[host].known_dead_gids.insert(*gid);
                }
            }
            _ => {}
        }
        if let Some(ext) = self.external.get_mut(&host) {
            // API calls and port enumeration come from the driver itself.
            if matches!(input, Input::Protect(_) | Input::PortInfo(_)) {
                if let Input::Protect(spec) = input {
                    self.external_specs.entry(host).or_default().push(spec);
                }
                return;
            }
            match &ext.sink {
                // A driver that went away simply stops listening.
                Some(sink) => {
                    let _ = sink.send(input);
                }
                None => ext.backlog.push(input),
            }
            return;
        }
        let now = self.now;
        let span = tracing::debug_span!("host", h = host);
        let _g = span.enter();
        self.hosts[host].ctl.handle_input(now, input);
        self.pump(host);
    }

    pub(super) fn deliver(&mut self, host: usize, input: Input) {
        self.feed(host, input);
    }

    /// Raise an input at a host after `delay`.
    pub(super) fn raise(&mut self, host: usize, delay: Time, input: Input) {
        let at = after(self.now, delay);
        self.push(at, Ev::Deliver { host, input });
    }

    pub(super) fn ev_latency(&self) -> Time {
        us(self.p.event_latency_us)
    }

    pub(super) fn pump(&mut self, host: usize) {
        while let Some(out) = self.hosts[host].ctl.poll_output() {
            match out {
                Output::Command(cmd) => {
                    if let CommandOp::ResolvePaths { dgid, .. } = cmd.op {
                        let h = &mut self.hosts[host];
                        let seq = h.notices.get(&dgid).copied().unwrap_or(0);
                        h.path_queries.insert(cmd.id, (dgid, seq));
                    }
                    let (delay, result) = self.execute(host, cmd.op);
                    self.raise(host, delay, Input::CommandDone { id: cmd.id, result });
                }
                Output::Notify(_) => self.c.notifications += 1,
            }
        }
        if let Some(t) = self.hosts[host].ctl.poll_timeout() {
            let t = t.max(self.now);
            if self.hosts[host].timer_at.is_none_or(|x| t < x) {
                self.hosts[host].timer_at = Some(t);
                self.push(t, Ev::HostTimer { host });
            }
        }
    }

    /// Carry out a command for an external driver (see [`crate::SimProvider`]): the
    /// result and how long it takes in virtual time.
    pub fn execute_external(
        &mut self,
        host: usize,
        op: CommandOp,
    ) -> (Time, Result<CommandOutcome, ProviderError>) {
        let r = self.execute(host, op);
        if self.cfg.check {
            self.check_step();
        }
        r
    }

    pub(super) fn side_of(&self, host: usize, conn: ConnId) -> Result<(usize, usize), ProviderError> {
        let i = usize::try_from(conn.0).unwrap_or(usize::MAX);
        let c = self
            .conns
            .get(i)
            .ok_or(ProviderError::UnknownConnection(conn))?;
        if c.qp[0].host == host {
            Ok((i, 0))
        } else if c.qp[1].host == host {
            Ok((i, 1))
        } else {
            Err(ProviderError::UnknownConnection(conn))
        }
    }

    pub(super) fn refused(op: &str, detail: &str) -> ProviderError {
        ProviderError::Refused {
            operation: op.into(),
            detail: detail.into(),
        }
    }

    pub(super) fn execute(
        &mut self,
        host: usize,
        op: CommandOp,
    ) -> (Time, Result<CommandOutcome, ProviderError>) {
        let qp_delay = us(self.p.command_latency_us);
        match op {
            CommandOp::LoadAlternate { conn, path } => {
                (qp_delay, self.load_alternate(host, conn, path))
            }
            CommandOp::SetRearm { conn } => (qp_delay, self.set_rearm(host, conn)),
            CommandOp::ForceMigrate { conn } => (qp_delay, self.force_migrate(host, conn)),
            CommandOp::SoftwareMigrate { conn, path } => {
                (qp_delay, self.software_migrate(host, conn, path))
            }
            CommandOp::QueryQp { conn } => (qp_delay, self.query_qp(host, conn)),
            CommandOp::SendPeer { port, to, msg } => {
                self.send_peer(host, port, to, msg);
                (qp_delay, Ok(CommandOutcome::Done))
            }
            CommandOp::ResolvePaths { port, dgid } => self.sa_query(host, port, Some(dgid)),
            CommandOp::Subscribe { port } => self.sa_query(host, port, None),
            _ => (
                qp_delay,
                Err(ProviderError::Unsupported {
                    provider: "provider-sim".into(),
                    operation: op.name().into(),
                }),
            ),
        }
    }

    pub(super) fn qp_checked(&self, host: usize, conn: ConnId) -> Result<(usize, usize), ProviderError> {
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
                provider: "provider-sim (RoCE QP)".into(),
                operation: "alternate path".into(),
            });
        }
        if !self.path_local_ok(host, &path) {
            return Err(Self::refused(
                "modify_qp(ALT_PATH)",
                "EINVAL: SLID/port not ours",
            ));
        }
        if path.mtu != self.conns[i].qp[s].primary.mtu {
            return Err(Self::refused("modify_qp(ALT_PATH)", "EINVAL: MTU differs"));
        }
        // IBA allows a new alternate while ARMED; the state is kept.
        self.conns[i].qp[s].alt = Some(path);
        self.reeval(i);
        Ok(CommandOutcome::Done)
    }

    pub(super) fn set_rearm(&mut self, host: usize, conn: ConnId) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.qp_checked(host, conn)?;
        if self.conns[i].mode == Mode::Software {
            return Err(ProviderError::Unsupported {
                provider: "provider-sim (RoCE QP)".into(),
                operation: "path migration state".into(),
            });
        }
        let q = &mut self.conns[i].qp[s];
        if q.alt.is_none() {
            return Err(Self::refused(
                "modify_qp(PATH_MIG_STATE)",
                "EINVAL: no alternate",
            ));
        }
        // DOMAIN.md §1: software sets REARM from MIGRATED; an ARMED QP stays ARMED (a new
        // alternate may be loaded while armed, seed 001, and arming it again changes
        // nothing). The state read back tells the caller which it was.
        if q.mig == MigState::Migrated {
            q.mig = MigState::Rearm;
        }
        let m = q.mig;
        self.reeval(i);
        Ok(CommandOutcome::MigState(m))
    }

    pub(super) fn known_dead(&self, host: usize, path: &Path) -> bool {
        let h = &self.hosts[host];
        h.known_down_ports.contains(&path.port.port) || h.known_dead_gids.contains(&path.dgid)
    }

    pub(super) fn force_migrate(
        &mut self,
        host: usize,
        conn: ConnId,
    ) -> Result<CommandOutcome, ProviderError> {
        let (i, s) = self.qp_checked(host, conn)?;
        let q = &self.conns[i].qp[s];
        if q.mig != MigState::Armed {
            return Err(Self::refused(
                "modify_qp(PATH_MIG_STATE=MIGRATED)",
                "EINVAL: not ARMED",
            ));
        }
        let Some(alt) = q.alt else {
            return Err(Self::refused(
                "modify_qp(PATH_MIG_STATE=MIGRATED)",
                "EINVAL: no alternate",
            ));
        };
        if self.cfg.policy == PolicyKind::Apm && self.known_dead(host, &alt) {
            self.violation(format!(
                "conn{i}: forced migration on h{host} onto {alt}, a path it was told is dead"
            ));
        }
        self.hw_migrate(i, s);
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
            return Err(Self::refused(
                "modify_qp(SQD->SQD, AV)",
                "EINVAL: SLID/port not ours",
            ));
        }
        if self.cfg.policy == PolicyKind::Apm && self.known_dead(host, &path) {
            self.violation(format!(
                "conn{i}: software migration on h{host} onto {path}, a path it was told is dead"
            ));
        }
        self.conns[i].qp[s].primary = path;
        if s == 0 {
            self.c.failovers += 1;
        }
        self.unstall_try(i, s);
        self.reeval(i);
        Ok(CommandOutcome::Done)
    }

    pub(super) fn query_qp(&mut self, host: usize, conn: ConnId) -> Result<CommandOutcome, ProviderError> {
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

}
