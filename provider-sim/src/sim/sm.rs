//! The subnet managers: sweeps, traps 64/65 as Reports to subscribers, failover, and
//! the SA answering PathRecord and InformInfo requests; peer MADs between hosts.

use super::*;

impl Sim {
    // ------------------------------------------------------------------ SM and SA

    pub(super) fn sweep(&mut self, s: usize) {
        let Some(m) = self.sms[s].master_port() else {
            return;
        };
        if !self.fab.port_phys_up(m) {
            // The SM's own port has no link: it sees nothing until it comes back.
            return;
        }
        let (ports, switches) = self.fab.discover(m);
        let lat = self.ev_latency();
        let rereg = std::mem::take(&mut self.sms[s].reregister_pending);
        let mut activated = 0;
        // Indexing: the loop body mutates the fabric and raises events, so it cannot
        // hold an iterator over the ports.
        #[allow(clippy::needless_range_loop)]
        for pid in 0..self.fab.num_ports() {
            if !ports[pid] || self.fab.ports[pid].subnet != s {
                continue;
            }
            let (h, key) = (self.fab.ports[pid].host, self.fab.ports[pid].key());
            if self.fab.ports[pid].state != PortState::Active {
                self.fab.ports[pid].state = PortState::Active;
                activated += 1;
                if self.sms[s].initialized || self.now > Time::ZERO {
                    self.raise(
                        h,
                        lat,
                        Input::PortEvent {
                            port: key,
                            event: PortEvent::Active,
                        },
                    );
                }
            }
            if rereg {
                self.raise(
                    h,
                    lat,
                    Input::PortEvent {
                        port: key,
                        event: PortEvent::SmChange,
                    },
                );
                self.raise(
                    h,
                    lat,
                    Input::PortEvent {
                        port: key,
                        event: PortEvent::ClientReregister,
                    },
                );
            }
        }
        self.fab.program_lfts(&ports, &switches);
        let mut traps: Vec<(Gid, bool, PortId)> = Vec::new();
        // Indexing: three parallel tables (fabric ports, discovery, the SM's view).
        #[allow(clippy::needless_range_loop)]
        for pid in 0..self.fab.num_ports() {
            if self.fab.ports[pid].subnet != s {
                continue;
            }
            let now_in = ports[pid] && self.fab.ports[pid].state == PortState::Active;
            let was = self.sms[s].in_service[pid];
            if self.sms[s].initialized && now_in != was {
                traps.push((self.fab.ports[pid].gid, now_in, pid));
            }
            self.sms[s].in_service[pid] = now_in;
        }
        self.sms[s].initialized = true;
        if activated > 0 && self.now > Time::ZERO {
            self.note(format!(
                "SM of subnet {s}: heavy sweep activates {activated} port(s)"
            ));
        }
        for (gid, in_service, pid) in traps {
            let subs: Vec<PortId> = self.sms[s].subs.iter().copied().collect();
            let name = self.fab.port_name(pid);
            self.note(format!(
                "SM of subnet {s}: trap {} ({name} {}) to {} subscriber(s)",
                if in_service { 64 } else { 65 },
                if in_service {
                    "in service"
                } else {
                    "out of service"
                },
                subs.len()
            ));
            for sub in subs {
                self.send_report(s, sub, gid, in_service);
            }
        }
        self.reeval_all();
    }

    pub(super) fn send_report(&mut self, s: usize, sub: PortId, gid: Gid, in_service: bool) {
        let tid = self.sms[s].next_tid;
        self.sms[s].next_tid += 1;
        self.sms[s].reports.insert(
            tid,
            PendingReport {
                sub,
                gid,
                in_service,
                tries: 1,
                all_delivered: true,
            },
        );
        self.c.reports_sent += 1;
        self.transmit_report(s, tid);
    }

    pub(super) fn transmit_report(&mut self, s: usize, tid: u64) {
        let Some(m) = self.sms[s].master_port() else {
            return;
        };
        let Some(r) = self.sms[s].reports.get(&tid).cloned() else {
            return;
        };
        let epoch = self.sms[s].epoch;
        let (mlid, slid) = (self.fab.ports[m].lid, self.fab.ports[r.sub].lid);
        let sent = self.mad(mlid, slid);
        if sent.is_none() {
            if let Some(r) = self.sms[s].reports.get_mut(&tid) {
                r.all_delivered = false;
            }
        }
        if let Some(d) = sent {
            self.push(
                after(self.now, d),
                Ev::ReportArrive {
                    sub: r.sub,
                    subnet: s,
                    epoch,
                    tid,
                },
            );
        }
        let at = after(self.now, ms(self.p.report_timeout_ms));
        self.push(
            at,
            Ev::ReportTimeout {
                subnet: s,
                epoch,
                tid,
            },
        );
    }

    pub(super) fn report_timeout(&mut self, s: usize, epoch: u32, tid: u64) {
        if self.sms[s].epoch != epoch {
            return;
        }
        let Some(r) = self.sms[s].reports.get_mut(&tid) else {
            return;
        };
        if r.tries <= self.p.report_retries {
            r.tries += 1;
            self.transmit_report(s, tid);
            return;
        }
        let r = self.sms[s].reports.remove(&tid).expect("present above");
        self.c.reports_abandoned += 1;
        // The host missed the SM's last word about r.gid for good; its engine finds out
        // by asking the SA again (`remote_recheck_ms`), which the settle bound covers.
        // OpenSM would log ERR 1A06 here. When every transmission reached the subscriber
        // and its answers had a route back, a host did not answer a Report it received.
        let m = self.sms[s].master_port();
        let back = m.is_some_and(|m| {
            let (a, b) = (self.fab.ports[r.sub].lid, self.fab.ports[m].lid);
            self.fab.route(a, b).is_some()
        });
        let lossless = self.p.mad_loss == 0.0 && self.loss_burst.is_none();
        if r.all_delivered && back && lossless {
            let name = self.fab.port_name(r.sub);
            self.violation(format!("Report {tid} to {name} never answered"));
        }
    }

    pub(super) fn report_arrive(&mut self, sub: PortId, s: usize, epoch: u32, tid: u64) {
        let host = self.fab.ports[sub].host;
        let Some(r) = self.sms[s]
            .reports
            .get(&tid)
            .cloned()
            .filter(|_| self.sms[s].epoch == epoch)
        else {
            // The SM that sent it is gone; the host still answers (it cannot know).
            self.hosts[host].reports_received += 1;
            self.hosts[host].report_resps_sent += 1;
            self.c.mads_sent += 1;
            return;
        };
        // The host's SA client answers every Report, duplicates included, and hands
        // each notice on once.
        self.hosts[host].reports_received += 1;
        self.hosts[host].report_resps_sent += 1;
        if let Some(m) = self.sms[s].master_port() {
            let (a, b) = (self.fab.ports[sub].lid, self.fab.ports[m].lid);
            if let Some(d) = self.mad(a, b) {
                self.push(
                    after(self.now, d),
                    Ev::ReportResp {
                        subnet: s,
                        epoch,
                        tid,
                    },
                );
            }
        }
        // A resend overtaken by a newer Report about the same GID is stale, and the host
        // believes it: its engine's SA recheck corrects an out-of-service GID that is
        // back (the settle bound covers it).
        if self.hosts[host].seen_reports.insert((s, epoch, tid)) {
            self.feed(
                host,
                Input::RemoteGid {
                    gid: r.gid,
                    in_service: r.in_service,
                },
            );
        }
    }

    pub(super) fn sm_fail(&mut self, s: usize) {
        let sm = &mut self.sms[s];
        if sm.master.is_none() {
            return;
        }
        sm.master = None;
        sm.epoch += 1;
        sm.subs.clear();
        sm.reports.clear();
        sm.sweep_at = None;
        let at = after(self.now, ms(self.p.sm_failover_ms));
        self.push(at, Ev::SmTakeover { subnet: s });
    }

    pub(super) fn takeover(&mut self, s: usize) {
        if self.sms[s].master.is_some() {
            return;
        }
        let n = self.sms[s].candidates.len();
        // The next candidate after the old master whose port has a link; the old master
        // restarts as a standby, so a later failover has somewhere to go.
        let old = (self.sms[s].epoch as usize + n - 1) % n.max(1);
        let pick = (1..=n)
            .map(|k| (old + k) % n)
            .find(|&k| self.fab.port_phys_up(self.sms[s].candidates[k]));
        let Some(k) = pick else {
            let at = after(self.now, ms(self.p.sm_failover_ms));
            self.push(at, Ev::SmTakeover { subnet: s });
            return;
        };
        let sm = &mut self.sms[s];
        sm.master = Some(k);
        sm.initialized = false;
        sm.reregister_pending = true;
        let name = self.fab.port_name(self.sms[s].candidates[k]);
        self.note(format!(
            "SM on {name} takes over subnet {s}: ClientReregister to every port"
        ));
        self.sweep(s);
    }

    /// An SA request (PathRecord when `dgid` is given, else InformInfo Set) with its
    /// retries: how long the client waits and what it gets.
    pub(super) fn sa_query(
        &mut self,
        host: usize,
        port: PortKey,
        dgid: Option<Gid>,
    ) -> (Time, Result<CommandOutcome, ProviderError>) {
        self.c.sa_queries += 1;
        let Some(pid) = self
            .fab
            .port_of(host, port.port)
            .filter(|_| port.device == 0)
        else {
            return (
                Time::ZERO,
                Err(ProviderError::Io(format!("no port {port}"))),
            );
        };
        let s = self.fab.ports[pid].subnet;
        let mut waited = Time::ZERO;
        for _ in 0..self.p.sa_tries {
            let master = self.sms[s].master_port();
            let rtt = master.and_then(|m| {
                let (a, b) = (self.fab.ports[pid].lid, self.fab.ports[m].lid);
                let there = self.mad(a, b)?;
                let back = self.mad(b, a)?;
                Some(after(there, back))
            });
            if let Some(rtt) = rtt {
                let done = after(waited, rtt);
                return match dgid {
                    Some(dgid) => {
                        let paths = self
                            .fab
                            .port_by_gid(&dgid)
                            .filter(|&d| self.sms[s].in_service[d] && self.fab.ports[d].subnet == s)
                            .map(|d| self.fab.all_paths(pid, d, self.p.ack_timeout))
                            .unwrap_or_default();
                        (done, Ok(CommandOutcome::Paths(paths)))
                    }
                    None => {
                        self.sms[s].subs.insert(pid);
                        (done, Ok(CommandOutcome::Done))
                    }
                };
            }
            waited = after(waited, ms(self.p.sa_timeout_ms));
        }
        (waited, Err(ProviderError::Timeout("SA request".into())))
    }

    pub(super) fn send_peer(&mut self, host: usize, port: PortKey, to: PeerAddr, msg: PeerMsg) {
        let Some(pid) = self.fab.port_of(host, port.port) else {
            self.c.mads_sent += 1;
            return;
        };
        let slid = self.fab.ports[pid].lid;
        let Some(d) = self.mad(slid, to.lid.get()) else {
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
        self.push(
            after(self.now, d),
            Ev::Deliver {
                host: h,
                input: Input::PeerMessage {
                    from,
                    port: key,
                    msg,
                },
            },
        );
    }

}
