//! The hosts: feeding inputs to each host's controller (or external driver), and
//! carrying out the commands it issues on the simulated QPs.

use super::*;

/// A QP command waiting on its device: a firmware command, in the form it takes
/// there (a fraction of a `CommandOp`'s size: a million connections queue two million
/// of them at their start).
#[derive(Debug)]
pub(super) enum QpOp {
    Load(ConnId, Path),
    Rearm(ConnId),
    Force(ConnId),
    Software(ConnId, Path),
    Query(ConnId),
}

impl QpOp {
    /// The QP command `op` is, if it is one.
    fn of(op: CommandOp) -> Option<QpOp> {
        Some(match op {
            CommandOp::LoadAlternate { conn, path } => QpOp::Load(conn, path),
            CommandOp::SetRearm { conn } => QpOp::Rearm(conn),
            CommandOp::ForceMigrate { conn } => QpOp::Force(conn),
            CommandOp::SoftwareMigrate { conn, path, .. } => QpOp::Software(conn, path),
            CommandOp::QueryQp { conn } => QpOp::Query(conn),
            _ => return None,
        })
    }
}

/// A command in a device's queue: when it completes and the sequence number its event
/// has.
#[derive(Debug)]
pub(super) struct Queued {
    done: Time,
    seq: u64,
    reply: Reply,
    op: QpOp,
}

impl Sim {
    // ------------------------------------------------------------------ hosts

    /// Hand an input to a host's controller (or external driver) now.
    ///
    /// On the way it keeps the record of what the host was told is dead
    /// (`known_down_ports`, `known_dead_gids`), which the move invariant
    /// (`Sim::check_move_target`) judges the engine by. The record follows the engine's
    /// own rules, each written here a second time on purpose, so that a slip in the
    /// engine's bookkeeping shows instead of being agreed with: a port is down from
    /// `PORT_ERR` to `PORT_ACTIVE` (`Engine::port_event`); a port back or re-registered
    /// forgets the out-of-service verdicts of its subnet
    /// (`Engine::forget_stale_remote_verdicts`); a peer message proves its GID in
    /// service (`Engine::peer_message`); an SA answer routing to a GID, asked after the
    /// last notice about it, does too (`Engine::recheck_done`). A change to one of those
    /// rules in apm-core changes this record too.
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
            // Probes are the prober's: the engine never sees them.
            Input::PeerMessage {
                msg: PeerMsg::Probe(_),
                ..
            } => {}
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
            Input::RemoteGid { gid, service } => {
                *self.hosts[host].notices.entry(*gid).or_insert(0) += 1;
                match service {
                    GidService::InService => self.hosts[host].known_dead_gids.remove(gid),
                    GidService::OutOfService => self.hosts[host].known_dead_gids.insert(*gid),
                };
            }
            _ => {}
        }
        if let Some(ext) = self.external.get_mut(&host) {
            // Port enumeration comes from the driver itself.
            if matches!(input, Input::PortInfo(_)) {
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

    /// Protect a connection on `host` (the API call), or leave it to the external
    /// driver of that host.
    pub(super) fn protect(&mut self, host: usize, spec: ConnSpec) {
        if self.external.contains_key(&host) {
            self.external_specs.entry(host).or_default().push(spec);
            return;
        }
        let now = self.now;
        let span = tracing::debug_span!("host", h = host);
        let _g = span.enter();
        self.hosts[host].ctl.protect(now, spec);
        self.pump(host);
    }

    /// Raise an input at a host after `delay`.
    pub(super) fn raise(&mut self, host: usize, delay: Time, input: Input) {
        let at = after(self.now, delay);
        let input = self.inputs.put(input);
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
                    self.submit(host, Reply::Engine(cmd.id), cmd.op);
                }
                Output::Notify(n) => {
                    self.c.notifications += 1;
                    // A RoCE QP's protection is what the engines agreed (the QP holds no
                    // alternate): their word changes the ground truth.
                    let i = usize::try_from(n.conn.0).unwrap_or(usize::MAX);
                    if self.conns.get(i).is_some_and(|c| c.mode == Mode::Software) {
                        self.reeval(i);
                    }
                }
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

    // ------------------------------------------------------------------ commands

    /// Carry out a command of `host`: QP commands queue on the device, peer messages
    /// leave at once, SA requests go to the SA. The result comes back through `reply`.
    fn submit(&mut self, host: usize, reply: Reply, op: CommandOp) {
        match op {
            CommandOp::LoadAlternate { .. }
            | CommandOp::SetRearm { .. }
            | CommandOp::ForceMigrate { .. }
            | CommandOp::SoftwareMigrate { .. }
            | CommandOp::QueryQp { .. } => {
                if self.cfg.policy.is_apm_engine() {
                    self.check_move_target(host, &op);
                }
                let Some(op) = QpOp::of(op) else {
                    return;
                };
                let h = &mut self.hosts[host];
                let done = after(h.device_busy.max(self.now), us(self.p.command_latency_us));
                h.device_busy = done;
                // Only the head of the queue has its event in the queue of events; the
                // others keep the sequence number they would have had there, so they
                // come out in the same order among events of the same instant.
                let seq = self.seq;
                self.seq += 1;
                let idle = h.device.is_empty();
                h.device.push_back(Queued {
                    done,
                    seq,
                    reply,
                    op,
                });
                if idle {
                    self.push_with_seq(done, seq, Ev::QpCommand { host });
                }
            }
            CommandOp::SendPeer {
                port,
                to,
                msg: PeerMsg::Probe(probe),
            } => {
                self.send_probe(host, port, to, probe);
                // A controller's prober never waits for its sends; a driver's does.
                if matches!(reply, Reply::External(_)) {
                    self.complete(host, reply, Ok(CommandOutcome::Done));
                }
            }
            CommandOp::SendPeer { port, to, msg } => {
                self.send_peer(host, port, to, msg);
                self.complete(host, reply, Ok(CommandOutcome::Done));
            }
            // A post, not a firmware command: the device's queue of modifies does not
            // hold it up.
            CommandOp::ArmingWrite { conn } => {
                let result = self.arming_write(host, conn);
                self.complete(host, reply, result);
            }
            // The simulated QP moves at once and drops nothing, so it never holds
            // sends for a peer: the hint has nothing to release.
            CommandOp::PeerThere { .. } => self.complete(host, reply, Ok(CommandOutcome::Done)),
            CommandOp::ResolvePaths { port, dgid } => {
                self.sa_request(host, reply, port, Some(dgid))
            }
            CommandOp::Subscribe { port } => self.sa_request(host, reply, port, None),
            other => {
                let e = ProviderError::unsupported("provider-sim", Operation::from(&other));
                self.complete(host, reply, Err(e));
            }
        }
    }

    /// Hand a command's result to whoever issued it.
    pub(super) fn complete(
        &mut self,
        host: usize,
        reply: Reply,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        match reply {
            Reply::Engine(id) => self.raise(host, Time::ZERO, Input::CommandDone { id, result }),
            Reply::External(ticket) => {
                if let Some(tx) = self.external_replies.remove(&ticket) {
                    // A driver that stopped waiting simply does not hear.
                    let _ = tx.send(result);
                }
            }
        }
    }

    /// The QP command at the head of `host`'s device queue completes: it takes effect
    /// now, and the next one's completion is due.
    pub(super) fn qp_command_done(&mut self, host: usize) {
        let Some(Queued { reply, op, .. }) = self.hosts[host].device.pop_front() else {
            return;
        };
        if let Some(next) = self.hosts[host].device.front() {
            let (at, seq) = (next.done, next.seq);
            self.push_with_seq(at, seq, Ev::QpCommand { host });
        }
        let result = match op {
            QpOp::Load(conn, path) => self.load_alternate(host, conn, path),
            QpOp::Rearm(conn) => self.set_rearm(host, conn),
            QpOp::Force(conn) => self.force_migrate(host, conn),
            QpOp::Software(conn, path) => self.software_migrate(host, conn, path),
            QpOp::Query(conn) => self.query_qp(host, conn),
        };
        self.complete(host, reply, result);
    }

    /// Submit a command for an external driver (see [`crate::SimProvider`]): its result
    /// arrives on the returned channel when the simulation gets there.
    pub fn submit_external(
        &mut self,
        host: usize,
        op: CommandOp,
    ) -> tokio::sync::oneshot::Receiver<Result<CommandOutcome, ProviderError>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ticket = self.next_external;
        self.next_external += 1;
        self.external_replies.insert(ticket, tx);
        self.submit(host, Reply::External(ticket), op);
        if self.cfg.check {
            self.check_step();
        }
        rx
    }

    // ------------------------------------------------------------------ MAD agents

    /// A MAD reaches `host`'s agent, which handles one at a time in arrival order.
    pub(super) fn mad_arrive(&mut self, host: usize, mad: u32) {
        if self.hosts[host].dead {
            self.mads.take(mad);
            return;
        }
        let h = &mut self.hosts[host];
        let done = after(h.mad_busy.max(self.now), us(self.p.mad_processing_us));
        h.mad_busy = done;
        self.push(done, Ev::MadReady { host, mad });
    }

    pub(super) fn mad_ready(&mut self, host: usize, mad: Mad) {
        match mad {
            Mad::Peer { from, port, msg } => {
                self.feed(host, Input::PeerMessage { from, port, msg })
            }
            Mad::Report {
                sub,
                subnet,
                epoch,
                tid,
            } => self.report_ready(sub, subnet, epoch, tid),
            Mad::SaAnswer { txn, result } => self.sa_answer_ready(txn, result),
        }
    }

    /// A peer message (LAP, APR, MRA, `Migrate`, probe) from `host`'s `port` to `to`: a
    /// MAD on InfiniBand, a datagram on the rail on RoCE.
    fn send_peer(&mut self, host: usize, port: PortKey, to: PeerAddr, msg: PeerMsg) {
        let Some(pid) = self.fab.port_of(host, port.port) else {
            self.c.mads_sent += 1;
            return;
        };
        let slid = self.fab.ports[pid].lid;
        // On RoCE the peer channel is UDP over the rail itself: the datagrams need a
        // route, and MAD loss (the management plane's) does not touch them.
        let sent = match self.scenario.workload.mode {
            Mode::Hardware => self.mad(slid, to.lid.get()),
            Mode::Software => self.datagram(slid, to.lid.get()),
        };
        let Some(d) = sent else {
            return;
        };
        let Some(dst) = self.fab.lid_owner(to.lid.get()) else {
            return;
        };
        let from = PeerAddr {
            gid: self.fab.ports[pid].gid,
            lid: Lid::from_wire(slid),
        };
        let (h, key) = (self.fab.ports[dst].host, self.fab.ports[dst].key());
        let mad = Mad::Peer {
            from,
            port: key,
            msg,
        };
        let mad = self.mads.put(mad);
        self.push(after(self.now, d), Ev::MadArrive { host: h, mad });
    }

    /// A liveness probe from `host`'s `port` to `to`, carried as apm carries it. On
    /// InfiniBand it is one of apm's vendor MADs on QP1 (cm-lap's `apm_msg`, attribute
    /// 0xA003), sent as the LAPs are: counted with the MADs, lost with MAD loss, and
    /// queued at the receiving host's MAD agent behind every other MAD (an agent busy
    /// with a burst of Reports delays it, and a late probe can take a path down). On
    /// RoCE it is a UDP datagram on the rail itself, routed like data, untouched by MAD
    /// loss. Either way it dies where the connections' packets die (a cut, a
    /// black-holing switch).
    fn send_probe(&mut self, host: usize, port: PortKey, to: PeerAddr, probe: Probe) {
        self.c.probes_sent += 1;
        self.send_peer(host, port, to, PeerMsg::Probe(probe));
    }

    pub(super) fn side_of(
        &self,
        host: usize,
        conn: ConnId,
    ) -> Result<(usize, usize), ProviderError> {
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
}
