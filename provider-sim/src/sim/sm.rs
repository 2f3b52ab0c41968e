//! The subnet managers, after OpenSM: heavy sweeps (started by traps 128, by a light
//! sweep that sees a change, or by a new master) that take time and lose SMPs, traps
//! 64/65 as Reports to InformInfo subscribers, and the standby's takeover when its polls
//! of the master fail.
//!
//! What a sweep costs and what it drops follows OpenSM's defaults (`max_wire_smps`,
//! `transaction_timeout`, `transaction_retries`, the drop manager removing ports it did
//! not reach); the takeover follows `osm_sm_state_mgr.c`'s polling: the standby polls
//! every `sminfo_polling_timeout`, counts failed polls from the one after the last
//! answer, and declares the master dead when the count exceeds `polling_retry_number`.

use super::*;

/// One subnet's SMs: the candidates (master first), who is master, and its state.
#[derive(Debug)]
pub(super) struct Sm {
    pub(super) candidates: Vec<PortId>,
    /// The SM process on each candidate is alive (an `sm_failover` kills the master's,
    /// a `device_fatal` every SM of the host).
    pub(super) alive: Vec<bool>,
    pub(super) master: Option<usize>,
    /// Bumped whenever a master dies: events of the dead one are ignored.
    pub(super) epoch: u32,
    pub(super) subs: BTreeSet<PortId>,
    /// The SM's view of which ports are in service (for traps 64/65 and PathRecords).
    pub(super) in_service: Vec<bool>,
    /// What the last heavy sweep saw: each port's and each link's physical state (a
    /// light sweep compares against it).
    known_ports: Vec<bool>,
    known_links: Vec<bool>,
    /// The master has swept once: later sweeps send traps for what changed.
    pub(super) initialized: bool,
    /// The master's first sweep is not done: the SA answers nothing meanwhile, and the
    /// sweep's end sets ClientReregister on every port.
    pub(super) first_sweep: bool,
    sweeping: bool,
    resweep: bool,
    sweep_at: Option<Time>,
    pub(super) reports: BTreeMap<u64, PendingReport>,
    next_tid: u64,
    /// A trap 128 not yet answered, by generation.
    trap_gen: u64,
    trap_pending: bool,
    /// The master has been unreachable from the standby since then.
    unreachable_since: Option<Time>,
    /// When the standby's polls happen (`poll_phase + k * sminfo_polling_timeout`).
    poll_phase: Time,
    /// The SA is busy until then.
    pub(super) sa_busy: Time,
}

#[derive(Clone, Debug)]
pub(super) struct PendingReport {
    sub: PortId,
    gid: Gid,
    service: GidService,
    tries: u32,
    /// Every transmission so far had a route and was not lost.
    all_delivered: bool,
}

impl Sm {
    pub(super) fn new(candidates: Vec<PortId>, ports: usize, links: usize, phase: Time) -> Sm {
        let n = candidates.len();
        Sm {
            master: (n > 0).then_some(0),
            alive: vec![true; n],
            candidates,
            epoch: 0,
            subs: BTreeSet::new(),
            in_service: vec![false; ports],
            known_ports: vec![false; ports],
            known_links: vec![false; links],
            initialized: false,
            first_sweep: false,
            sweeping: false,
            resweep: false,
            sweep_at: None,
            reports: BTreeMap::new(),
            next_tid: 1,
            trap_gen: 0,
            trap_pending: false,
            unreachable_since: None,
            poll_phase: phase,
            sa_busy: Time::ZERO,
        }
    }

    pub(super) fn master_port(&self) -> Option<PortId> {
        self.master.map(|m| self.candidates[m])
    }
}

/// What one heavy sweep costs: how long it takes and which host ports it failed to
/// reach.
struct SweepCost {
    duration: Time,
    dropped: Vec<PortId>,
}

impl Sim {
    // ------------------------------------------------------------------ who runs

    /// The master SM is alive and its port has a link: it can sweep and answer.
    pub(super) fn sm_running(&self, s: usize) -> bool {
        let sm = &self.sms[s];
        sm.master.is_some_and(|m| {
            let port = sm.candidates[m];
            sm.alive[m]
                && !self.hosts[self.fab.ports[port].host].dead
                && self.fab.port_phys_up(port)
        })
    }

    /// The SA answers requests: the master runs and its first sweep is done.
    pub(super) fn sa_serving(&self, s: usize) -> bool {
        self.sm_running(s) && !self.sms[s].first_sweep
    }

    /// After anything that may change who can reach whom: start the standby's polling
    /// clock when the master became unreachable, stop it when it is back, and let an SM
    /// take over a subnet that has none.
    pub(super) fn check_sms(&mut self) {
        for s in 0..self.sms.len() {
            let running = self.sm_running(s);
            let sm = &mut self.sms[s];
            match (sm.master, running) {
                (Some(_), true) => sm.unreachable_since = None,
                (Some(_), false) if sm.unreachable_since.is_none() => {
                    let since = self.now;
                    sm.unreachable_since = Some(since);
                    let at = self.takeover_time(s, since);
                    self.push(at, Ev::PollTimeout { subnet: s, since });
                }
                (Some(_), false) => {}
                // An SM that starts on a subnet without a master finds none in its
                // discovery and becomes master itself.
                (None, _) => self.elect(s, 0),
            }
        }
    }

    /// When the standby gives up on a master unreachable since `since`.
    fn takeover_time(&self, s: usize, since: Time) -> Time {
        if let Some(d) = self.p.sm_failover_ms {
            return after(since, ms(d));
        }
        let period = ms(self.p.sminfo_polling_timeout_ms).0.max(1);
        let phase = self.sms[s].poll_phase.0;
        // The last poll the master answered: the last one at or before `since`.
        let last = if since.0 >= phase {
            phase + (since.0 - phase) / period * period
        } else {
            phase.saturating_sub(period)
        };
        let polls = u64::from(self.p.polling_retry_number) + 2;
        Time(last.saturating_add(polls.saturating_mul(period))).max(since)
    }

    pub(super) fn poll_timeout(&mut self, s: usize, since: Time) {
        if self.sms[s].unreachable_since != Some(since) {
            return; // the master answered again meanwhile
        }
        let old = self.sms[s].master;
        let name = self.sms[s]
            .master_port()
            .map(|p| self.fab.port_name(p))
            .unwrap_or_default();
        self.note(format!(
            "SM of subnet {s}: the standby's polls of the master on {name} failed: it is declared dead"
        ));
        self.sm_dies(s);
        self.elect(s, old.map_or(0, |m| m + 1));
    }

    /// The master is gone: its subscriptions, Reports and sweep with it.
    fn sm_dies(&mut self, s: usize) {
        let sm = &mut self.sms[s];
        sm.master = None;
        sm.epoch += 1;
        sm.subs.clear();
        sm.reports.clear();
        sm.sweeping = false;
        sm.resweep = false;
        sm.sweep_at = None;
        sm.unreachable_since = None;
    }

    /// The first candidate from `start` on (cyclically) whose SM is alive and whose port
    /// has a link becomes master and runs its first, heavy sweep.
    fn elect(&mut self, s: usize, start: usize) {
        let n = self.sms[s].candidates.len();
        let pick = (0..n).map(|k| (start + k) % n).find(|&k| {
            let port = self.sms[s].candidates[k];
            self.sms[s].alive[k]
                && !self.hosts[self.fab.ports[port].host].dead
                && self.fab.port_phys_up(port)
        });
        let Some(k) = pick else {
            return;
        };
        let sm = &mut self.sms[s];
        sm.master = Some(k);
        sm.initialized = false;
        sm.first_sweep = true;
        sm.unreachable_since = None;
        let name = self.fab.port_name(self.sms[s].candidates[k]);
        self.note(format!(
            "SM on {name} becomes master of subnet {s}: heavy sweep, then ClientReregister to every port"
        ));
        self.schedule_sweep(s, Time::ZERO);
    }

    /// The master SM process of subnet `s` dies (the `sm_failover` fault).
    pub(super) fn sm_fail(&mut self, s: usize) {
        let Some(m) = self.sms[s].master else {
            return;
        };
        self.sms[s].alive[m] = false;
        let epoch_bump = &mut self.sms[s];
        // Its Reports and sweep stop; the standby notices by polling.
        epoch_bump.epoch += 1;
        epoch_bump.reports.clear();
        epoch_bump.sweeping = false;
        epoch_bump.resweep = false;
        epoch_bump.sweep_at = None;
        self.check_sms();
    }

    /// Every SM on `host` dies with its HCA.
    pub(super) fn host_sms_die(&mut self, host: usize) {
        for s in 0..self.sms.len() {
            for k in 0..self.sms[s].candidates.len() {
                if self.fab.ports[self.sms[s].candidates[k]].host == host {
                    self.sms[s].alive[k] = false;
                }
            }
        }
        self.check_sms();
    }

    // ------------------------------------------------------------------ traps 128

    /// Something changed in subnet `s`: a switch next to it sends trap 128 to the SM,
    /// and resends it every subnet timeout until it gets through.
    pub(super) fn raise_trap(&mut self, s: usize) {
        let sm = &mut self.sms[s];
        sm.trap_gen += 1;
        sm.trap_pending = true;
        let gen = sm.trap_gen;
        let lat = self.ev_latency();
        self.push(after(self.now, lat), Ev::Trap { subnet: s, gen });
    }

    pub(super) fn trap(&mut self, s: usize, gen: u64) {
        let sm = &self.sms[s];
        if sm.trap_gen != gen || !sm.trap_pending {
            return;
        }
        let delivered = self.sm_running(s) && {
            self.c.smps_sent += 1;
            !self.smp_lost()
        };
        if delivered {
            self.sms[s].trap_pending = false;
            let d = ms(self.p.trap_sweep_delay_ms);
            self.schedule_sweep(s, d);
        } else {
            let at = after(self.now, Time(self.p.trap_resend_ns()));
            self.push(at, Ev::Trap { subnet: s, gen });
        }
    }

    // ------------------------------------------------------------------ sweeps

    pub(super) fn schedule_sweep(&mut self, s: usize, delay: Time) {
        let at = after(self.now, delay);
        if self.sms[s].sweep_at.is_none_or(|t| t > at) {
            self.sms[s].sweep_at = Some(at);
            self.push(at, Ev::SweepStart { subnet: s });
        }
    }

    pub(super) fn sweep_start(&mut self, s: usize) {
        if self.sms[s].sweep_at != Some(self.now) {
            return; // superseded by an earlier one
        }
        self.sms[s].sweep_at = None;
        if !self.sm_running(s) {
            return;
        }
        if self.sms[s].sweeping {
            self.sms[s].resweep = true;
            return;
        }
        let Some(m) = self.sms[s].master_port() else {
            return;
        };
        self.sms[s].sweeping = true;
        let cost = self.sweep_cost(m);
        let epoch = self.sms[s].epoch;
        self.push(
            after(self.now, cost.duration),
            Ev::SweepEnd {
                subnet: s,
                epoch,
                dropped: cost.dropped.into_boxed_slice(),
            },
        );
    }

    /// The duration of a heavy sweep from the SM on `m` and the host ports it fails to
    /// reach. About two SMPs per host port (NodeInfo, PortInfo), two per switch plus one
    /// per switch port, and one per 64-LID block of each switch's forwarding table,
    /// `max_wire_smps` at a time, each `smp_rtt_us`; every lost transmission costs a
    /// `transaction_timeout` of its wire slot, and a host port whose SMPs are lost
    /// `transaction_retries + 1` times is not reached.
    fn sweep_cost(&mut self, m: PortId) -> SweepCost {
        let (ports, switches) = self.fab.discover(m);
        let host_ports: Vec<PortId> = (0..ports.len()).filter(|&p| ports[p]).collect();
        let nswitch = switches.iter().filter(|x| **x).count() as u64;
        let switch_ports: u64 = (0..switches.len())
            .filter(|&k| switches[k])
            .map(|k| self.fab.switches[k].links.len() as u64)
            .sum();
        let lft_blocks = self.fab.lid_space().div_ceil(64) as u64;
        let mut smps =
            2 * host_ports.len() as u64 + 2 * nswitch + switch_ports + nswitch * lft_blocks;
        let tries = self.p.transaction_retries + 1;
        let mut timeouts = 0u64;
        let mut dropped = Vec::new();
        let lossy = self.loss_rate() > 0.0;
        if lossy {
            for &p in &host_ports {
                // The SM's own port answers locally; the others' SMPs may be lost.
                if p == m {
                    continue;
                }
                let mut reached = true;
                for _ in 0..2 {
                    let mut lost = 0;
                    while lost < tries && self.smp_lost() {
                        lost += 1;
                    }
                    timeouts += u64::from(lost);
                    if lost == tries {
                        reached = false;
                    }
                }
                if !reached {
                    dropped.push(p);
                }
            }
            let other = smps - 2 * host_ports.len() as u64;
            for _ in 0..other {
                let mut lost = 0;
                while lost < self.p.transaction_retries && self.smp_lost() {
                    lost += 1;
                }
                timeouts += u64::from(lost);
            }
        }
        self.c.smps_sent += smps + timeouts;
        smps = smps.div_ceil(u64::from(self.p.max_wire_smps.max(1)));
        let wire = us(self.p.smp_rtt_us).0.saturating_mul(smps);
        let waits = ms(self.p.transaction_timeout_ms)
            .0
            .saturating_mul(timeouts.div_ceil(u64::from(self.p.max_wire_smps.max(1))));
        SweepCost {
            duration: Time(wire.saturating_add(waits)),
            dropped,
        }
    }

    pub(super) fn sweep_end(&mut self, s: usize, epoch: u32, dropped: &[PortId]) {
        if self.sms[s].epoch != epoch {
            return; // its SM died meanwhile
        }
        self.sms[s].sweeping = false;
        if !self.sm_running(s) {
            return;
        }
        self.apply_sweep(s, dropped);
        // OpenSM's drop manager forces another heavy sweep when it dropped a port that
        // was still up (a "hiccup").
        if !dropped.is_empty() || std::mem::take(&mut self.sms[s].resweep) {
            self.schedule_sweep(s, Time::ZERO);
        }
    }

    /// Periodic light sweep: a heavy sweep when the fabric differs from what the last
    /// heavy sweep saw (OpenSM's light sweep reads the switches' port states).
    pub(super) fn light_sweep(&mut self, s: usize) {
        let at = after(self.now, ms(self.p.sweep_interval_ms));
        self.push(at, Ev::LightSweep { subnet: s });
        if !self.sm_running(s) || self.sms[s].sweeping {
            return;
        }
        let (ports, links) = self.phys_snapshot(s);
        if ports != self.sms[s].known_ports || links != self.sms[s].known_links {
            self.schedule_sweep(s, Time::ZERO);
        }
    }

    /// Each port's and link's physical state, as far as subnet `s` is concerned.
    fn phys_snapshot(&self, s: usize) -> (Vec<bool>, Vec<bool>) {
        let ports = (0..self.fab.num_ports())
            .map(|p| self.fab.ports[p].subnet == s && self.fab.port_phys_up(p))
            .collect();
        let links = (0..self.fab.num_links())
            .map(|l| self.fab.link_subnet(l) == Some(s) && self.fab.link_up(l))
            .collect();
        (ports, links)
    }

    /// What a heavy sweep's end changes: ports activated, forwarding tables, traps.
    /// `dropped` ports were not reached: they are out of the subnet until found again.
    pub(super) fn apply_sweep(&mut self, s: usize, dropped: &[PortId]) {
        let Some(m) = self.sms[s].master_port() else {
            return;
        };
        let (mut ports, switches) = self.fab.discover(m);
        for &p in dropped {
            ports[p] = false;
        }
        let (known_ports, known_links) = self.phys_snapshot(s);
        self.sms[s].known_ports = known_ports;
        self.sms[s].known_links = known_links;
        self.sms[s].trap_pending = false;
        let lat = self.ev_latency();
        let rereg = std::mem::take(&mut self.sms[s].first_sweep) && self.now > Time::ZERO;
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
                self.fab_gen += 1;
                activated += 1;
                if self.now > Time::ZERO {
                    self.raise(h, lat, port_event(key, PortEvent::Active));
                }
            }
            if rereg {
                self.raise(h, lat, port_event(key, PortEvent::SmChange));
                self.raise(h, lat, port_event(key, PortEvent::ClientReregister));
            }
        }
        self.fab.program_lfts(&ports, &switches);
        self.fab_gen += 1;
        let mut traps: Vec<(Gid, GidService, PortId)> = Vec::new();
        // Indexing: three parallel tables (fabric ports, discovery, the SM's view).
        #[allow(clippy::needless_range_loop)]
        for pid in 0..self.fab.num_ports() {
            if self.fab.ports[pid].subnet != s {
                continue;
            }
            let now_in = ports[pid] && self.fab.ports[pid].state == PortState::Active;
            let was = self.sms[s].in_service[pid];
            if self.sms[s].initialized && now_in != was {
                let service = if now_in {
                    GidService::InService
                } else {
                    GidService::OutOfService
                };
                traps.push((self.fab.ports[pid].gid, service, pid));
            }
            self.sms[s].in_service[pid] = now_in;
        }
        self.sms[s].initialized = true;
        if activated > 0 && self.now > Time::ZERO {
            self.note(format!(
                "SM of subnet {s}: heavy sweep activates {activated} port(s)"
            ));
        }
        if !dropped.is_empty() {
            self.note(format!(
                "SM of subnet {s}: {} port(s) not reached (SMPs lost): dropped",
                dropped.len()
            ));
        }
        for (gid, service, pid) in traps {
            let subs: Vec<PortId> = self.sms[s].subs.iter().copied().collect();
            let name = self.fab.port_name(pid);
            self.note(format!(
                "SM of subnet {s}: trap {} ({name} {service}) to {} subscriber(s)",
                service.trap(),
                subs.len()
            ));
            for sub in subs {
                self.send_report(s, sub, gid, service);
            }
        }
        self.reeval_all();
    }

    // ------------------------------------------------------------------ Reports

    fn send_report(&mut self, s: usize, sub: PortId, gid: Gid, service: GidService) {
        let tid = self.sms[s].next_tid;
        self.sms[s].next_tid += 1;
        self.sms[s].reports.insert(
            tid,
            PendingReport {
                sub,
                gid,
                service,
                tries: 1,
                all_delivered: true,
            },
        );
        self.c.reports_sent += 1;
        // OpenSM's drop manager and state manager send a trap's Reports holding the
        // subnet lock exclusively (`osm_drop_mgr_process`, `osm_report_notice`), and
        // the SA takes it to answer anything: a Report waits for the SA's queue, and
        // the requests behind it wait for the Report. Its resends are the kernel MAD
        // layer's (`umad_send` with `transaction_timeout` and `transaction_retries`,
        // `osm_vendor_send`) and queue for nothing.
        let done = self.sa_enqueue(s);
        let epoch = self.sms[s].epoch;
        self.push(
            done,
            Ev::ReportSend {
                subnet: s,
                epoch,
                tid,
            },
        );
    }

    pub(super) fn transmit_report(&mut self, s: usize, tid: u64) {
        let Some(m) = self.sms[s].master_port() else {
            return;
        };
        let Some(r) = self.sms[s].reports.get(&tid).cloned() else {
            return;
        };
        self.load.reports_out += 1;
        let epoch = self.sms[s].epoch;
        let (mlid, slid) = (self.fab.ports[m].lid, self.fab.ports[r.sub].lid);
        match self.mad(mlid, slid) {
            Some(d) => {
                let host = self.fab.ports[r.sub].host;
                let mad = Mad::Report {
                    sub: r.sub,
                    subnet: s,
                    epoch,
                    tid,
                };
                let mad = self.mads.put(mad);
                self.push(after(self.now, d), Ev::MadArrive { host, mad });
            }
            None => {
                if let Some(r) = self.sms[s].reports.get_mut(&tid) {
                    r.all_delivered = false;
                }
            }
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
        let Some(r) = self.sms[s].reports.remove(&tid) else {
            return;
        };
        self.c.reports_abandoned += 1;
        // The host missed the SM's last word about r.gid for good; its engine finds out
        // by asking the SA again (`remote_recheck_ms`), which the settle bound covers.
        // OpenSM logs ERR 1A06 here and keeps the subscription. When every transmission
        // reached the subscriber and its answers had a route back, with no MAD loss and
        // a host agent that keeps up, the host did not answer a Report it received.
        let m = self.sms[s].master_port();
        let back = m.is_some_and(|m| {
            let (a, b) = (self.fab.ports[r.sub].lid, self.fab.ports[m].lid);
            self.fab.route(a, b).is_some()
        });
        let lossless = self.p.mad_loss == 0.0 && self.loss_burst.is_none();
        let host = self.fab.ports[r.sub].host;
        let agent_idle = self.hosts[host].mad_busy <= self.now;
        if r.all_delivered && back && lossless && agent_idle && !self.hosts[host].dead {
            let name = self.fab.port_name(r.sub);
            self.violation(format!("Report {tid} to {name} never answered"));
        }
    }

    /// A ReportResp reaches the SM: the kernel MAD layer matches it to its Report and
    /// stops the resends at once; OpenSM's receiver then retires the transaction (a
    /// lookup in its table of outstanding MADs, `get_madw` in `osm_vendor_ibumad.c`),
    /// one MAD of the SA's queue like any other it receives.
    pub(super) fn report_resp(&mut self, s: usize, epoch: u32, tid: u64) {
        if self.sms[s].epoch != epoch {
            return;
        }
        self.sms[s].reports.remove(&tid);
        self.load.report_resps_in += 1;
        self.sa_enqueue(s);
    }

    /// A Report the subscriber's agent has processed: answer it, hand the notice on.
    pub(super) fn report_ready(&mut self, sub: PortId, s: usize, epoch: u32, tid: u64) {
        let host = self.fab.ports[sub].host;
        // The host's SA client answers every Report, duplicates and those of a dead SM
        // included (it cannot know), and hands each notice on once.
        self.hosts[host].reports_received += 1;
        self.hosts[host].report_resps_sent += 1;
        self.c.reports_received += 1;
        self.c.report_resps_sent += 1;
        let Some(r) = self.sms[s]
            .reports
            .get(&tid)
            .cloned()
            .filter(|_| self.sms[s].epoch == epoch)
        else {
            self.c.mads_sent += 1;
            return;
        };
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
                    service: r.service,
                },
            );
        }
    }
}

fn port_event(port: PortKey, event: PortEvent) -> Input {
    Input::PortEvent { port, event }
}
