//! Building a run: the SMs, the connections and their specs, the fault schedule.

use super::*;
use crate::config::Target;
use crate::fabric::FabricError;

/// Why a simulation cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The scenario is invalid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The fabric cannot be built or a fault names nothing in it.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The engine policy is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl Sim {
    /// Build a run: the fabric, the first sweep, the hosts with their controllers, the
    /// connections (armed at connect time as the application would do), the faults.
    pub fn new(scenario: &Scenario, cfg: RunConfig) -> Result<Sim, SimError> {
        scenario.validate()?;
        let fab = Fabric::build(&scenario.topology)?;
        let mut rng = Rng::new(cfg.seed);
        let p = scenario.fabric.clone();
        let mut sim = Sim {
            end: ms(scenario.duration_ms),
            scenario: scenario.clone(),
            p,
            now: Time::ZERO,
            rng: rng.fork(1),
            rng_sm: rng.fork(2),
            queue: BinaryHeap::new(),
            seq: 0,
            hosts: Vec::new(),
            conns: Vec::with_capacity(scenario.workload.count(scenario.topology.hosts)),
            sms: Vec::new(),
            actions: Vec::new(),
            loss_burst: None,
            counts: [0; Bucket::ALL],
            sa_txns: BTreeMap::new(),
            next_txn: 1,
            external_replies: BTreeMap::new(),
            next_external: 1,
            c: Counters::default(),
            samples: Vec::new(),
            timeline: Vec::new(),
            violations: Vec::new(),
            digest: 0xcbf2_9ce4_8422_2325,
            last_fault: Time::ZERO,
            load: Default::default(),
            traffic: quiet::Traffic::new(scenario.workload.message_interval_ms as usize),
            fab_gen: 1,
            inputs: Default::default(),
            mads: Default::default(),
            traced: String::new(),
            windows: Default::default(),
            external: BTreeMap::new(),
            external_specs: BTreeMap::new(),
            fab,
            cfg,
        };
        sim.windows
            .open(Time::ZERO, "start".into(), Default::default());
        for &h in &sim.cfg.external_hosts {
            sim.external.insert(h, External::default());
        }
        sim.build_sms();
        for h in 0..sim.fab.num_hosts() {
            let probe_seed = controller::probe_seed(sim.cfg.seed, h);
            let ctl = controller::make(sim.cfg.policy, &sim.cfg.engine_policy, probe_seed)?;
            sim.hosts.push(Host {
                ctl,
                timer_at: None,
                device_busy: Time::ZERO,
                device: Default::default(),
                mad_busy: Time::ZERO,
                dead: false,
                seen_reports: BTreeSet::new(),
                reports_received: 0,
                report_resps_sent: 0,
                known_down_ports: BTreeSet::new(),
                known_dead_gids: BTreeSet::new(),
                notices: BTreeMap::new(),
                path_queries: BTreeMap::new(),
            });
        }
        // The subnets come up before anything else happens.
        for s in 0..sim.sms.len() {
            sim.apply_sweep(s, &[]);
            let at = ms(sim.p.sweep_interval_ms);
            sim.push(at, Ev::LightSweep { subnet: s });
        }
        sim.timeline.clear();
        sim.build_conns(&mut rng);
        sim.build_actions()?;
        let groups = scenario.workload.message_interval_ms;
        for g in 0..groups {
            sim.push(ms(g), Ev::Tick(g));
        }
        if sim.cfg.sample_ms > 0 {
            sim.push(Time::ZERO, Ev::Sample);
        }
        Ok(sim)
    }

    /// Route the inputs of `host` to `sink` instead of its controller, and let commands
    /// for it come in through [`Sim::submit_external`] (for [`crate::SimProvider`]).
    pub fn attach_external(
        &mut self,
        host: usize,
        sink: tokio::sync::mpsc::UnboundedSender<Input>,
    ) {
        let ext = self.external.entry(host).or_default();
        for input in ext.backlog.drain(..) {
            let _ = sink.send(input);
        }
        ext.sink = Some(sink);
    }

    /// The connections an external host must protect (see [`RunConfig::external_hosts`]).
    pub fn external_specs(&self, host: usize) -> Vec<ConnSpec> {
        self.external_specs.get(&host).cloned().unwrap_or_default()
    }

    /// The `PortInfo` of every port of `host`, as a provider reports them at start.
    pub fn port_infos(&self, host: usize) -> Vec<PortInfo> {
        (1..=self.fab.ports_per_host())
            .filter_map(|n| self.fab.port_of(host, n))
            .map(|pid| self.port_info(pid))
            .collect()
    }

    pub(super) fn build_sms(&mut self) {
        let subnets = self.fab.subnets();
        for s in 0..subnets {
            let mut cands: Vec<PortId> = Vec::new();
            if let Some(spec) = self.scenario.topology.sm.iter().find(|x| x.subnet == s) {
                for name in &spec.ports {
                    if let Ok(p) = self.fab.port_by_name(name) {
                        if self.fab.ports[p].subnet == s {
                            cands.push(p);
                        }
                    }
                }
            }
            if cands.is_empty() {
                // Default: the first two hosts' ports in the subnet.
                cands = (0..self.fab.num_ports())
                    .filter(|&p| self.fab.ports[p].subnet == s && self.fab.ports[p].link.is_some())
                    .take(2)
                    .collect();
            }
            // The standby polls on its own clock: where in its period the master
            // dies is a matter of chance.
            let period = ms(self.p.sminfo_polling_timeout_ms).0.max(1);
            let phase = Time(self.rng_sm.below(period));
            self.sms.push(Sm::new(
                cands,
                self.fab.num_ports(),
                self.fab.num_links(),
                phase,
            ));
        }
        // Physical links come up (ports to INIT) before the first sweep.
        for pid in 0..self.fab.num_ports() {
            if self.fab.port_phys_up(pid) {
                self.fab.ports[pid].state = PortState::Init;
                self.fab_gen += 1;
            }
        }
    }

    pub(super) fn build_conns(&mut self, rng: &mut Rng) {
        let n = self.scenario.workload.count(self.fab.num_hosts());
        let pattern = self.scenario.workload.pattern;
        let hosts = self.fab.num_hosts() as u64;
        let nports = self.fab.ports_per_host();
        let at = self.p.ack_timeout;
        let mode = self.scenario.workload.mode;
        // Every host learns its ports first, as the Manager's provider start does.
        for h in 0..self.hosts.len() {
            for num in 1..=nports {
                if let Some(pid) = self.fab.port_of(h, num) {
                    let info = self.port_info(pid);
                    self.feed(h, Input::PortInfo(info));
                }
            }
        }
        for i in 0..n {
            let (a, b) = match pattern.place(i, hosts as usize) {
                Some(pair) => pair,
                None => {
                    let a = rng.below(hosts) as usize;
                    let mut b = rng.below(hosts - 1) as usize;
                    if b >= a {
                        b += 1;
                    }
                    (a, b)
                }
            };
            let rail = (i % usize::from(nports)) as u8 + 1;
            let other = if nports == 2 { 3 - rail } else { rail };
            let (Some(pa), Some(pb)) = (self.fab.port_of(a, rail), self.fab.port_of(b, rail))
            else {
                continue;
            };
            let primary = self.fab.path(pa, 0, pb, 0, at);
            let lmc_alt = self.fab.ports[pa].lmc > 0 && self.fab.ports[pb].lmc > 0;
            let alternate = if other != rail {
                match (self.fab.port_of(a, other), self.fab.port_of(b, other)) {
                    (Some(qa), Some(qb)) => Some(self.fab.path(qa, 0, qb, 0, at)),
                    _ => None,
                }
            } else if lmc_alt {
                Some(self.fab.path(pa, 1, pb, 1, at))
            } else {
                None
            };
            let mut cands = Vec::new();
            for num in 1..=nports {
                if let (Some(x), Some(y)) = (self.fab.port_of(a, num), self.fab.port_of(b, num)) {
                    cands.extend(self.fab.all_paths(x, y, at));
                }
            }
            let rev = |p: &Path| p.reversed(PortKey::new(0, p.dgid.guid() as u8), 0);
            let qpn_a = Qpn::new(0x100 + 2 * i as u32).unwrap_or(Qpn::new(1).expect("1 fits"));
            let qpn_b = Qpn::new(0x101 + 2 * i as u32).unwrap_or(Qpn::new(2).expect("2 fits"));
            let mig_mode = match mode {
                Mode::Hardware => MigrationMode::Hardware,
                Mode::Software => MigrationMode::Software,
            };
            let spec_a = ConnSpec {
                id: ConnId(i as u64),
                role: Role::Active,
                mode: mig_mode,
                local_qpn: qpn_a,
                remote_qpn: qpn_b,
                local_comm_id: 2 * i as u32 + 1,
                remote_comm_id: 2 * i as u32 + 2,
                primary,
                agreed_alternate: alternate,
                candidates: cands.clone(),
            };
            let spec_b = ConnSpec {
                id: ConnId(i as u64),
                role: Role::Passive,
                mode: mig_mode,
                local_qpn: qpn_b,
                remote_qpn: qpn_a,
                local_comm_id: 2 * i as u32 + 2,
                remote_comm_id: 2 * i as u32 + 1,
                primary: rev(&primary),
                agreed_alternate: alternate.as_ref().map(rev),
                candidates: cands.iter().map(rev).collect(),
            };
            self.conns
                .push(fresh_conn((a, spec_a.primary), (b, spec_b.primary), mode));
            self.counts[Bucket::Unprotected.idx()] += 1;
            let id = self.conns.len() - 1;
            debug_assert_eq!(id, i);
            self.settle(id);
            self.protect(a, spec_a);
            self.protect(b, spec_b);
        }
    }

    /// The fault schedule: every fault of the scenario (the seed's random ones too) as
    /// timed actions, queued in time order.
    pub(super) fn build_actions(&mut self) -> Result<(), SimError> {
        let faults = self.scenario.all_faults(self.cfg.seed);
        let mut acts: Vec<(Time, Action, String)> = Vec::new();
        for f in &faults {
            self.fault_actions(f, &mut acts)?;
        }
        acts.sort_by_key(|a| a.0);
        for (i, a) in acts.iter().enumerate() {
            self.queue.push(Reverse(Entry {
                at: a.0,
                seq: self.seq,
                ev: Ev::Action(i),
            }));
            self.seq += 1;
        }
        self.last_fault = acts
            .iter()
            .map(|a| match a.1 {
                Action::MadLoss(_, until) => until,
                _ => a.0,
            })
            .max()
            .unwrap_or(Time::ZERO);
        self.actions = acts;
        Ok(())
    }

    /// The actions of one fault, each with its time and its line in the timeline.
    fn fault_actions(
        &self,
        f: &Fault,
        acts: &mut Vec<(Time, Action, String)>,
    ) -> Result<(), SimError> {
        let at = ms(f.at_ms());
        // Names resolve in one place, as the scenario's validation resolved them.
        let (act, text) = match (f, f.target(&self.fab)?) {
            (Fault::PortDown { port, .. }, Target::Port(p)) => {
                (Action::PortAdmin(p, Turn::Off), format!("port {port} down"))
            }
            (Fault::PortUp { port, .. }, Target::Port(p)) => {
                (Action::PortAdmin(p, Turn::On), format!("port {port} up"))
            }
            (
                Fault::PortFlap {
                    at_ms,
                    port,
                    down_ms,
                    up_ms,
                    count,
                },
                Target::Port(p),
            ) => {
                let mut t = *at_ms;
                for k in 0..*count {
                    acts.push((
                        ms(t),
                        Action::PortAdmin(p, Turn::Off),
                        format!("port {port} flaps down ({}/{count})", k + 1),
                    ));
                    t += down_ms;
                    acts.push((
                        ms(t),
                        Action::PortAdmin(p, Turn::On),
                        format!("port {port} up"),
                    ));
                    t += up_ms;
                }
                return Ok(());
            }
            (Fault::LinkDown { link, .. }, Target::Link(l)) => {
                (Action::Link(l, Turn::Off), format!("link {link} cut"))
            }
            (Fault::LinkUp { link, .. }, Target::Link(l)) => {
                (Action::Link(l, Turn::On), format!("link {link} restored"))
            }
            (Fault::SwitchDown { switch, .. }, Target::Switch(s)) => (
                Action::Switch(s, Turn::Off),
                format!("switch {switch} fails"),
            ),
            (Fault::SwitchUp { switch, .. }, Target::Switch(s)) => (
                Action::Switch(s, Turn::On),
                format!("switch {switch} returns"),
            ),
            (Fault::SmFailover { .. }, Target::Subnet(subnet)) => (
                Action::SmFail(subnet),
                format!("master SM of subnet {subnet} dies"),
            ),
            (
                Fault::MadLoss {
                    duration_ms, rate, ..
                },
                _,
            ) => (
                Action::MadLoss(*rate, after(at, ms(*duration_ms))),
                format!("MAD loss {:.0}% for {duration_ms} ms", rate * 100.0),
            ),
            (Fault::SwitchBlackHole { switch, .. }, Target::Switch(s)) => (
                Action::BlackHole(s, Turn::On),
                format!("switch {switch} black-holes (ports up, nothing forwarded)"),
            ),
            (Fault::SwitchBlackHoleEnd { switch, .. }, Target::Switch(s)) => (
                Action::BlackHole(s, Turn::Off),
                format!("switch {switch} forwards again"),
            ),
            (Fault::DeviceFatal { host, .. }, Target::Host(h)) => {
                (Action::DeviceFatal(h), format!("{host}: DEVICE_FATAL"))
            }
            // `Fault::target` gives each kind of fault its own kind of target.
            (f, t) => unreachable!("{f:?} resolved to {t:?}"),
        };
        acts.push((at, act, text));
        Ok(())
    }

    pub(super) fn port_info(&self, pid: PortId) -> PortInfo {
        let p = &self.fab.ports[pid];
        PortInfo {
            key: p.key(),
            gids: vec![p.gid],
            lid: Lid::from_wire(p.lid),
            lmc: p.lmc,
            active: p.state == PortState::Active,
            // RoCE has no SA: an Ethernet port tells the engine not to subscribe to
            // traps or ask for PathRecords, so a far end's failure reaches it only from
            // the peer, its QPs' retries or its probes.
            link_layer: match self.scenario.workload.mode {
                Mode::Hardware => LinkLayer::InfiniBand,
                Mode::Software => LinkLayer::Ethernet,
            },
        }
    }
}

/// A connection as the application opened it: both QPs on their primaries, MIGRATED
/// (nothing armed), unprotected.
fn fresh_conn((a, primary_a): (usize, Path), (b, primary_b): (usize, Path), mode: Mode) -> Conn {
    let qp = |host: usize, primary: Path| Qp {
        host,
        primary,
        alt: None,
        mig: MigState::Migrated,
        err: false,
        posted: 0,
        delivered: 0,
        acked: 0,
        stalled: false,
        timeout: primary.ack_timeout,
        retries: 0,
        retry_gen: 0,
        mig_err_raised: false,
    };
    Conn {
        qp: [qp(a, primary_a), qp(b, primary_b)],
        mode,
        state: ConnState::Unprotected,
        bucket: Bucket::Unprotected,
        guard_disjoint: false,
        since: Time::ZERO,
        interrupted_at: None,
        moved_unarmed: None,
        in_rearm_window: false,
        lost_in_total_outage: false,
        outage_since_working: false,
        lost_after_total_outage: false,
        guard: None,
        excused: false,
        quiet: None,
        synced: 0,
        route_memo: Default::default(),
    }
}
