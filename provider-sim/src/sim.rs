//! The discrete-event simulation: the SM/SA, RC QPs with APM, MAD delivery, traffic,
//! faults, and one controller per host, all on one virtual clock.
//!
//! Sans-IO like the engine it drives: no threads, no clock reads, one seeded RNG, events
//! ordered by (time, insertion sequence), only ordered collections. The same scenario,
//! seed and policy give the same [`RunReport`] byte for byte.
//!
//! What is modelled, and how faithfully:
//! - The SM sweeps periodically and, on a trap 128 or its own port coming up, at once;
//!   a sweep activates ports (`PORT_ACTIVE`), reprograms forwarding tables and sends
//!   traps 64/65 as Reports to InformInfo subscribers, resent every
//!   `report_timeout_ms` until a ReportResp comes back. A standby SM takes over after
//!   `sm_failover_ms` with an empty subscription table and sets ClientReregister.
//! - RC QPs hold a primary and an alternate path and a migration state. A requester whose
//!   path is dead retries every local ACK timeout; when `retry_cnt` retries are spent it
//!   migrates to the alternate if ARMED (`PATH_MIG`; the peer migrates when the first
//!   packet with MigReq=1 arrives on its own alternate), raises `PATH_MIG_ERR` and keeps
//!   trying on the primary once more if the alternate is dead too, and goes to ERR when
//!   unarmed. REARM becomes ARMED only when the peer's packets carry MigReq=0. A
//!   responder drops packets that match neither its primary nor (when ARMED, MigReq=1)
//!   its alternate. Software-migration QPs (RoCE) have no alternate and report
//!   `PrimaryStalled` after `stall_timeouts` ACK timeouts without progress.
//! - Traffic is application messages numbered per direction. A message is delivered
//!   once the forward path works, acknowledged once the return path works too; a
//!   connection that dies loses what was not delivered and (when the application resends
//!   on a new connection) duplicates what was delivered but never acknowledged.
//!
//! Simplifications, deliberately: data packets are not individually timed (a message is
//! delivered at the instant it is sent when the path works: per-hop latency only matters
//! for MADs, which race with each other); when a QP goes to ERR its peer goes to ERR at
//! the same instant (it would after its own retry budget).

use crate::config::{FabricParams, Fault, Mode, Scenario};
use crate::controller::{self, Controller, PolicyKind};
use crate::fabric::{Fabric, PortId, PortState};
use crate::report::{Percentiles, RunReport, Sample};
use crate::rng::Rng;
use apm_core::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Everything a run needs besides the scenario.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The seed of the run's one RNG.
    pub seed: u64,
    /// Which controller every host runs.
    pub policy: PolicyKind,
    /// The engine's policy (for `apm`).
    pub engine_policy: Policy,
    /// Record a state sample this often (ms); 0 for none.
    pub sample_ms: u64,
    /// Check the invariants after every event and record violations.
    pub check: bool,
    /// Hosts driven from outside (by `apm_core::Manager` through [`crate::SimProvider`])
    /// instead of by an in-process controller.
    pub external_hosts: Vec<usize>,
}

impl RunConfig {
    /// A run of `policy` with `seed`, default engine policy, samples every 10 ms.
    pub fn new(policy: PolicyKind, seed: u64) -> RunConfig {
        RunConfig {
            seed,
            policy,
            engine_policy: Policy::default(),
            sample_ms: 10,
            check: false,
            external_hosts: Vec::new(),
        }
    }
}

/// Ground-truth state of a connection, for samples and the protection clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConnState {
    /// Working, both QPs ARMED on mutually agreeing, reachable alternates.
    Armed,
    /// Working, but no armed healthy alternate.
    Unprotected,
    /// Not working: a primary is dead or the two sides disagree (failing over).
    Migrating,
    /// A QP is in ERR.
    Lost,
}

impl ConnState {
    fn idx(self) -> usize {
        self as usize
    }
    fn working(self) -> bool {
        matches!(self, ConnState::Armed | ConnState::Unprotected)
    }
}

#[derive(Clone, Debug)]
struct Qp {
    host: usize,
    primary: Path,
    alt: Option<Path>,
    mig: MigState,
    err: bool,
    /// Messages posted by this side's application.
    posted: u64,
    /// Of those, delivered to the peer's application.
    delivered: u64,
    /// Of those, acknowledged back to this side.
    acked: u64,
    stalled: bool,
    retries: u32,
    retry_gen: u32,
    /// A `PATH_MIG_ERR` already gave this requester its one extra budget.
    mig_err_budget_used: bool,
}

#[derive(Clone, Debug)]
struct Conn {
    qp: [Qp; 2],
    mode: Mode,
    state: ConnState,
    since: Time,
    interrupted_at: Option<Time>,
    /// The armed alternates (side 0, side 1) when the primary failed while protected.
    guard: Option<(Path, Path)>,
    excused: bool,
}

#[derive(Debug)]
struct Host {
    ctl: Box<dyn Controller>,
    timer_at: Option<Time>,
    seen_reports: BTreeSet<(usize, u32, u64)>,
    reports_received: u64,
    report_resps_sent: u64,
    /// What this host's controller has been told is dead (for the "never migrate onto a
    /// path known dead" invariant).
    known_down_ports: BTreeSet<u8>,
    known_dead_gids: BTreeSet<Gid>,
    /// Notices about each GID delivered so far (to tell an SA answer from a stale one).
    notices: BTreeMap<Gid, u64>,
    /// Outstanding PathRecord queries: the GID asked about and `notices` at the time.
    path_queries: BTreeMap<CommandId, (Gid, u64)>,
}

#[derive(Clone, Debug)]
struct PendingReport {
    sub: PortId,
    gid: Gid,
    in_service: bool,
    tries: u32,
    /// Every transmission so far had a route and was not lost.
    all_delivered: bool,
}

#[derive(Debug)]
struct Sm {
    candidates: Vec<PortId>,
    master: Option<usize>,
    epoch: u32,
    subs: BTreeSet<PortId>,
    in_service: Vec<bool>,
    initialized: bool,
    reregister_pending: bool,
    reports: BTreeMap<u64, PendingReport>,
    next_tid: u64,
    sweep_at: Option<Time>,
}

impl Sm {
    fn master_port(&self) -> Option<PortId> {
        self.master.map(|m| self.candidates[m])
    }
}

#[derive(Clone, Debug)]
enum Action {
    PortAdmin(PortId, bool),
    Link(usize, bool),
    Switch(usize, bool),
    SmFail(usize),
    MadLoss(f64, Time),
    DeviceFatal(usize),
}

#[derive(Debug)]
enum Ev {
    Tick(u64),
    Retry {
        conn: usize,
        side: usize,
        gen: u32,
    },
    Deliver {
        host: usize,
        input: Input,
    },
    HostTimer {
        host: usize,
    },
    Action(usize),
    Sweep {
        subnet: usize,
    },
    PeriodicSweep {
        subnet: usize,
    },
    SmTakeover {
        subnet: usize,
    },
    ReportTimeout {
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    ReportArrive {
        sub: PortId,
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    ReportResp {
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    Sample,
}

impl Ev {
    fn tag(&self) -> u64 {
        match self {
            Ev::Tick(g) => 1 + (g << 8),
            Ev::Retry { conn, side, .. } => 2 + ((*conn as u64) << 8) + ((*side as u64) << 4),
            Ev::Deliver { host, .. } => 3 + ((*host as u64) << 8),
            Ev::HostTimer { host } => 4 + ((*host as u64) << 8),
            Ev::Action(i) => 5 + ((*i as u64) << 8),
            Ev::Sweep { subnet } => 6 + ((*subnet as u64) << 8),
            Ev::PeriodicSweep { subnet } => 7 + ((*subnet as u64) << 8),
            Ev::SmTakeover { subnet } => 8 + ((*subnet as u64) << 8),
            Ev::ReportTimeout { tid, .. } => 9 + (tid << 8),
            Ev::ReportArrive { tid, .. } => 10 + (tid << 8),
            Ev::ReportResp { tid, .. } => 11 + (tid << 8),
            Ev::Sample => 12,
        }
    }
}

struct Entry {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Debug, Default)]
struct Counters {
    lost: u64,
    messages_lost: u64,
    messages_duplicated: u64,
    messages_delivered: u64,
    messages_retransmitted: u64,
    failovers: u64,
    restore_ns: Vec<u64>,
    unprotected_ns: u128,
    sa_queries: u64,
    mads_sent: u64,
    reports_sent: u64,
    reports_abandoned: u64,
    notifications: u64,
    events: u64,
    messages_posted: u64,
}

/// One simulation run.
pub struct Sim {
    cfg: RunConfig,
    scenario: Scenario,
    p: FabricParams,
    now: Time,
    end: Time,
    fab: Fabric,
    rng: Rng,
    queue: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    hosts: Vec<Host>,
    conns: Vec<Conn>,
    sms: Vec<Sm>,
    actions: Vec<(Time, Action, String)>,
    loss_burst: Option<(f64, Time)>,
    counts: [usize; 4],
    c: Counters,
    samples: Vec<Sample>,
    timeline: Vec<(Time, String)>,
    violations: Vec<String>,
    digest: u64,
    /// Last time a fault happened (for the "re-armed within a bound" check).
    last_fault: Time,
    /// Hosts whose inputs go to an external driver instead of a controller: the sink
    /// once attached, and what arrived before that.
    external: BTreeMap<usize, External>,
    /// The connection specs of external hosts, for their driver to protect.
    external_specs: BTreeMap<usize, Vec<ConnSpec>>,
}

#[derive(Debug, Default)]
struct External {
    sink: Option<tokio::sync::mpsc::UnboundedSender<Input>>,
    backlog: Vec<Input>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("policy", &self.cfg.policy)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

fn ms(v: u64) -> Time {
    Time::from_millis(v)
}

fn us(v: u64) -> Time {
    Time::from_micros(v)
}

fn after(t: Time, d: Time) -> Time {
    Time(t.0.saturating_add(d.0))
}

/// Two paths describe the same wire route from opposite ends.
fn mirrors(p: &Path, q: &Path) -> bool {
    p.slid == q.dlid && p.dlid == q.slid
}

impl Sim {
    /// Build a run: the fabric, the first sweep, the hosts with their controllers, the
    /// connections (armed at connect time as the application would do), the faults.
    pub fn new(scenario: &Scenario, cfg: RunConfig) -> Result<Sim, String> {
        scenario.validate().map_err(|e| e.to_string())?;
        let fab = Fabric::build(&scenario.topology)?;
        let mut rng = Rng::new(cfg.seed);
        let p = scenario.fabric.clone();
        let mut sim = Sim {
            end: ms(scenario.duration_ms),
            scenario: scenario.clone(),
            p,
            now: Time::ZERO,
            rng: rng.fork(1),
            queue: BinaryHeap::new(),
            seq: 0,
            hosts: Vec::new(),
            conns: Vec::new(),
            sms: Vec::new(),
            actions: Vec::new(),
            loss_burst: None,
            counts: [0; 4],
            c: Counters::default(),
            samples: Vec::new(),
            timeline: Vec::new(),
            violations: Vec::new(),
            digest: 0xcbf2_9ce4_8422_2325,
            last_fault: Time::ZERO,
            external: BTreeMap::new(),
            external_specs: BTreeMap::new(),
            fab,
            cfg,
        };
        for &h in &sim.cfg.external_hosts {
            sim.external.insert(h, External::default());
        }
        sim.build_sms();
        for _ in 0..sim.fab.num_hosts() {
            let ctl = controller::make(sim.cfg.policy, &sim.cfg.engine_policy)
                .map_err(|e| e.to_string())?;
            sim.hosts.push(Host {
                ctl,
                timer_at: None,
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
            sim.sweep(s);
            let at = ms(sim.p.sweep_interval_ms);
            sim.push(at, Ev::PeriodicSweep { subnet: s });
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
    /// for it come in through [`Sim::execute_external`] (for [`crate::SimProvider`]).
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

    fn build_sms(&mut self) {
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
            let master = (!cands.is_empty()).then_some(0);
            self.sms.push(Sm {
                candidates: cands,
                master,
                epoch: 0,
                subs: BTreeSet::new(),
                in_service: vec![false; self.fab.num_ports()],
                initialized: false,
                reregister_pending: false,
                reports: BTreeMap::new(),
                next_tid: 1,
                sweep_at: None,
            });
        }
        // Physical links come up (ports to INIT) before the first sweep.
        for pid in 0..self.fab.num_ports() {
            if self.fab.port_phys_up(pid) {
                self.fab.ports[pid].state = PortState::Init;
            }
        }
    }

    fn build_conns(&mut self, rng: &mut Rng) {
        let n = self.scenario.workload.connections;
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
            let a = rng.below(hosts) as usize;
            let mut b = rng.below(hosts - 1) as usize;
            if b >= a {
                b += 1;
            }
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
                retries: 0,
                retry_gen: 0,
                mig_err_budget_used: false,
            };
            self.conns.push(Conn {
                qp: [qp(a, spec_a.primary), qp(b, spec_b.primary)],
                mode,
                state: ConnState::Unprotected,
                since: Time::ZERO,
                interrupted_at: None,
                guard: None,
                excused: false,
            });
            self.counts[ConnState::Unprotected.idx()] += 1;
            let id = self.conns.len() - 1;
            debug_assert_eq!(id, i);
            self.feed(a, Input::Protect(spec_a));
            self.feed(b, Input::Protect(spec_b));
        }
    }

    fn build_actions(&mut self) -> Result<(), String> {
        let faults = self.scenario.all_faults(self.cfg.seed);
        let mut acts: Vec<(Time, Action, String)> = Vec::new();
        for f in &faults {
            let at = ms(f.at_ms());
            match f {
                Fault::PortDown { port, .. } => {
                    let p = self.fab.port_by_name(port)?;
                    acts.push((at, Action::PortAdmin(p, false), format!("port {port} down")));
                }
                Fault::PortUp { port, .. } => {
                    let p = self.fab.port_by_name(port)?;
                    acts.push((at, Action::PortAdmin(p, true), format!("port {port} up")));
                }
                Fault::PortFlap {
                    at_ms,
                    port,
                    down_ms,
                    up_ms,
                    count,
                } => {
                    let p = self.fab.port_by_name(port)?;
                    let mut t = *at_ms;
                    for k in 0..*count {
                        acts.push((
                            ms(t),
                            Action::PortAdmin(p, false),
                            format!("port {port} flaps down ({}/{count})", k + 1),
                        ));
                        t += down_ms;
                        acts.push((ms(t), Action::PortAdmin(p, true), format!("port {port} up")));
                        t += up_ms;
                    }
                }
                Fault::LinkDown { link, .. } => {
                    let l = self.fab.link_by_name(link)?;
                    acts.push((at, Action::Link(l, false), format!("link {link} cut")));
                }
                Fault::LinkUp { link, .. } => {
                    let l = self.fab.link_by_name(link)?;
                    acts.push((at, Action::Link(l, true), format!("link {link} restored")));
                }
                Fault::SwitchDown { switch, .. } => {
                    let s = self.fab.switch_by_name(switch)?;
                    acts.push((
                        at,
                        Action::Switch(s, false),
                        format!("switch {switch} fails"),
                    ));
                }
                Fault::SwitchUp { switch, .. } => {
                    let s = self.fab.switch_by_name(switch)?;
                    acts.push((
                        at,
                        Action::Switch(s, true),
                        format!("switch {switch} returns"),
                    ));
                }
                Fault::SmFailover { subnet, .. } => {
                    acts.push((
                        at,
                        Action::SmFail(*subnet),
                        format!("master SM of subnet {subnet} dies"),
                    ));
                }
                Fault::MadLoss {
                    duration_ms, rate, ..
                } => {
                    acts.push((
                        at,
                        Action::MadLoss(*rate, after(at, ms(*duration_ms))),
                        format!("MAD loss {:.0}% for {duration_ms} ms", rate * 100.0),
                    ));
                }
                Fault::DeviceFatal { host, .. } => {
                    let h = self.fab.host_by_name(host)?;
                    acts.push((at, Action::DeviceFatal(h), format!("{host}: DEVICE_FATAL")));
                }
            }
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

    fn port_info(&self, pid: PortId) -> PortInfo {
        let p = &self.fab.ports[pid];
        PortInfo {
            key: p.key(),
            gids: vec![p.gid],
            lid: Lid::from_wire(p.lid),
            lmc: p.lmc,
            active: p.state == PortState::Active,
            link_layer: LinkLayer::InfiniBand,
        }
    }

    // ------------------------------------------------------------------ the loop

    fn push(&mut self, at: Time, ev: Ev) {
        let at = at.max(self.now);
        self.queue.push(Reverse(Entry {
            at,
            seq: self.seq,
            ev,
        }));
        self.seq += 1;
    }

    /// The time of the next event, if any is left before the end.
    pub fn next_event_time(&self) -> Option<Time> {
        self.queue
            .peek()
            .map(|Reverse(e)| e.at)
            .filter(|t| *t <= self.end)
    }

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Process one event. Returns false when the run is over.
    pub fn step(&mut self) -> bool {
        let Some(Reverse(e)) = self.queue.pop() else {
            return false;
        };
        if e.at > self.end {
            self.queue.push(Reverse(e));
            return false;
        }
        self.now = e.at;
        self.c.events += 1;
        // Costs nothing unless a subscriber enables it; puts virtual time on every log line.
        let span = tracing::debug_span!("sim", t = %self.now);
        let _g = span.enter();
        for v in [e.at.0, e.ev.tag()] {
            self.digest = (self.digest ^ v).wrapping_mul(0x0100_0000_01b3);
        }
        self.handle(e.ev);
        if self.cfg.check {
            self.check_step();
        }
        true
    }

    /// Run every event up to and including `t` (for drivers that follow another clock).
    pub fn run_until(&mut self, t: Time) {
        while self.next_event_time().is_some_and(|n| n <= t) {
            self.step();
        }
        if t > self.now && t <= self.end {
            self.now = t;
        }
    }

    /// Run to the end and report.
    pub fn run(mut self) -> RunReport {
        while self.step() {}
        self.finish()
    }

    /// Run to the end with a callback every `every` simulated ms (for progress bars).
    pub fn run_with_progress(mut self, every_ms: u64, mut f: impl FnMut(Time)) -> RunReport {
        let mut next = ms(every_ms);
        while self.step() {
            if self.now >= next {
                f(self.now);
                next = after(self.now, ms(every_ms.max(1)));
            }
        }
        self.finish()
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Tick(g) => self.tick(g),
            Ev::Retry { conn, side, gen } => self.retry(conn, side, gen),
            Ev::Deliver { host, input } => self.deliver(host, input),
            Ev::HostTimer { host } => {
                if self.hosts[host].timer_at == Some(self.now) {
                    self.hosts[host].timer_at = None;
                    let now = self.now;
                    self.hosts[host].ctl.handle_timeout(now);
                    self.pump(host);
                }
            }
            Ev::Action(i) => self.action(i),
            Ev::Sweep { subnet } => {
                if self.sms[subnet].sweep_at == Some(self.now) {
                    self.sms[subnet].sweep_at = None;
                    self.sweep(subnet);
                }
            }
            Ev::PeriodicSweep { subnet } => {
                self.sweep(subnet);
                let at = after(self.now, ms(self.p.sweep_interval_ms));
                self.push(at, Ev::PeriodicSweep { subnet });
            }
            Ev::SmTakeover { subnet } => self.takeover(subnet),
            Ev::ReportTimeout { subnet, epoch, tid } => self.report_timeout(subnet, epoch, tid),
            Ev::ReportArrive {
                sub,
                subnet,
                epoch,
                tid,
            } => self.report_arrive(sub, subnet, epoch, tid),
            Ev::ReportResp { subnet, epoch, tid } => {
                if self.sms[subnet].epoch == epoch {
                    self.sms[subnet].reports.remove(&tid);
                }
            }
            Ev::Sample => {
                self.samples.push(Sample {
                    t_ms: self.now.0 / 1_000_000,
                    armed: self.counts[0] as u32,
                    unprotected: self.counts[1] as u32,
                    migrating: self.counts[2] as u32,
                    lost: self.counts[3] as u32,
                });
                let at = after(self.now, ms(self.cfg.sample_ms));
                self.push(at, Ev::Sample);
            }
        }
    }

    // ------------------------------------------------------------------ hosts

    /// Hand an input to a host's controller (or external driver) now.
    fn feed(&mut self, host: usize, input: Input) {
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

    fn deliver(&mut self, host: usize, input: Input) {
        self.feed(host, input);
    }

    /// Raise an input at a host after `delay`.
    fn raise(&mut self, host: usize, delay: Time, input: Input) {
        let at = after(self.now, delay);
        self.push(at, Ev::Deliver { host, input });
    }

    fn ev_latency(&self) -> Time {
        us(self.p.event_latency_us)
    }

    fn pump(&mut self, host: usize) {
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

    fn side_of(&self, host: usize, conn: ConnId) -> Result<(usize, usize), ProviderError> {
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

    fn refused(op: &str, detail: &str) -> ProviderError {
        ProviderError::Refused {
            operation: op.into(),
            detail: detail.into(),
        }
    }

    fn execute(
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

    fn qp_checked(&self, host: usize, conn: ConnId) -> Result<(usize, usize), ProviderError> {
        let (i, s) = self.side_of(host, conn)?;
        if self.conns[i].qp[s].err {
            return Err(ProviderError::QpInError);
        }
        Ok((i, s))
    }

    /// A path's local end must be one of this host's ports with the path's SLID.
    fn path_local_ok(&self, host: usize, path: &Path) -> bool {
        self.fab.port_of(host, path.port.port).is_some_and(|pid| {
            path.port.device == 0 && self.fab.lid_owner(path.slid.get()) == Some(pid)
        })
    }

    fn load_alternate(
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

    fn set_rearm(&mut self, host: usize, conn: ConnId) -> Result<CommandOutcome, ProviderError> {
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

    fn known_dead(&self, host: usize, path: &Path) -> bool {
        let h = &self.hosts[host];
        h.known_down_ports.contains(&path.port.port) || h.known_dead_gids.contains(&path.dgid)
    }

    fn force_migrate(
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

    fn software_migrate(
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

    fn query_qp(&mut self, host: usize, conn: ConnId) -> Result<CommandOutcome, ProviderError> {
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

    fn path_ok(&self, p: &Path) -> bool {
        self.fab.route(p.slid.get(), p.dlid.get()).is_some()
    }

    /// The HCA (or a forced migration) moves side `s` to its alternate.
    fn hw_migrate(&mut self, i: usize, s: usize) {
        let q = &mut self.conns[i].qp[s];
        let Some(alt) = q.alt.take() else {
            return;
        };
        q.primary = alt;
        q.mig = MigState::Migrated;
        q.retries = 0;
        q.mig_err_budget_used = false;
        let host = q.host;
        if s == 0 {
            self.c.failovers += 1;
        }
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

    /// A stalled requester retries at once after its path changed.
    fn unstall_try(&mut self, i: usize, s: usize) {
        if self.conns[i].qp[s].stalled && self.transmit(i, s) {
            self.unstall(i, s);
        }
    }

    fn unstall(&mut self, i: usize, s: usize) {
        let q = &mut self.conns[i].qp[s];
        q.stalled = false;
        q.retries = 0;
        q.retry_gen = q.retry_gen.wrapping_add(1);
    }

    /// Send everything outstanding from side `x`. True when it got through and was
    /// acknowledged.
    fn transmit(&mut self, i: usize, x: usize) -> bool {
        let y = 1 - x;
        if self.conns[i].qp[x].err || self.conns[i].qp[y].err {
            return false;
        }
        let p = self.conns[i].qp[x].primary;
        if !self.path_ok(&p) {
            return false;
        }
        let migreq = self.conns[i].qp[x].mig == MigState::Migrated;
        let mut changed = false;
        {
            let yq = &self.conns[i].qp[y];
            if !mirrors(&p, &yq.primary) {
                let takes_alt = self.conns[i].mode == Mode::Hardware
                    && migreq
                    && yq.mig == MigState::Armed
                    && yq.alt.is_some_and(|a| mirrors(&p, &a));
                if !takes_alt {
                    return false;
                }
                // The responder migrates on the first MigReq=1 packet on its alternate.
                self.hw_migrate(i, y);
                changed = true;
            }
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
        // The peer's MigReq=0 arms a REARM requester and vice versa.
        if !migreq && c.qp[y].mig == MigState::Rearm {
            c.qp[y].mig = MigState::Armed;
            changed = true;
        }
        // The ACK travels on the responder's primary.
        let back = c.qp[y].primary;
        let acked = mirrors(&back, &c.qp[x].primary) && self.path_ok(&back);
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

    fn tick(&mut self, g: u64) {
        let groups = self.scenario.workload.message_interval_ms as usize;
        let mut i = g as usize;
        while i < self.conns.len() {
            for s in 0..2 {
                if self.conns[i].qp[s].err {
                    continue;
                }
                self.conns[i].qp[s].posted += 1;
                self.c.messages_posted += 1;
                if !self.conns[i].qp[s].stalled && !self.transmit(i, s) {
                    let q = &mut self.conns[i].qp[s];
                    q.stalled = true;
                    q.retries = 0;
                    q.retry_gen = q.retry_gen.wrapping_add(1);
                    let gen = q.retry_gen;
                    let at = after(self.now, Time(self.p.ack_timeout_ns()));
                    self.push(
                        at,
                        Ev::Retry {
                            conn: i,
                            side: s,
                            gen,
                        },
                    );
                }
            }
            i += groups;
        }
        let at = after(self.now, ms(self.scenario.workload.message_interval_ms));
        self.push(at, Ev::Tick(g));
    }

    fn retry(&mut self, i: usize, s: usize, gen: u32) {
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
        let gen = self.conns[i].qp[s].retry_gen;
        let at = after(self.now, Time(self.p.ack_timeout_ns()));
        self.push(
            at,
            Ev::Retry {
                conn: i,
                side: s,
                gen,
            },
        );
    }

    /// The retry budget of side `s` ran out.
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
        let host = q.host;
        let armed_alt = q
            .alt
            .filter(|_| c.mode == Mode::Hardware && q.mig == MigState::Armed);
        if let Some(alt) = armed_alt {
            if self.path_ok(&alt) {
                self.hw_migrate(i, s);
                return;
            }
            // The alternate is dead too: the migration fails.
            let q = &mut self.conns[i].qp[s];
            q.mig = MigState::Migrated;
            q.retries = 0;
            q.mig_err_budget_used = true;
            let lat = self.ev_latency();
            self.raise(
                host,
                lat,
                Input::QpEvent {
                    conn: ConnId(i as u64),
                    event: QpEvent::PathMigrationError,
                },
            );
            self.reeval(i);
            return;
        }
        self.lose(i, false);
    }

    /// Both QPs of connection `i` go to ERR.
    fn lose(&mut self, i: usize, device_fatal: bool) {
        if self.conns[i].qp[0].err && self.conns[i].qp[1].err {
            return;
        }
        let lat = self.ev_latency();
        for s in 0..2 {
            let q = &mut self.conns[i].qp[s];
            if !q.err {
                q.err = true;
                self.c.messages_lost += q.posted - q.delivered;
                self.c.messages_duplicated += q.delivered - q.acked;
                let host = q.host;
                if !device_fatal {
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
        if device_fatal {
            self.conns[i].excused = true;
        }
        self.reeval(i);
    }

    // ------------------------------------------------------------------ ground truth

    fn classify(&self, i: usize) -> ConnState {
        let c = &self.conns[i];
        let (a, b) = (&c.qp[0], &c.qp[1]);
        if a.err || b.err {
            return ConnState::Lost;
        }
        if !(mirrors(&a.primary, &b.primary)
            && self.path_ok(&a.primary)
            && self.path_ok(&b.primary))
        {
            return ConnState::Migrating;
        }
        let protected = match c.mode {
            Mode::Hardware => {
                a.mig == MigState::Armed
                    && b.mig == MigState::Armed
                    && match (a.alt, b.alt) {
                        (Some(x), Some(y)) => {
                            mirrors(&x, &y) && self.path_ok(&x) && self.path_ok(&y)
                        }
                        _ => false,
                    }
            }
            // A RoCE QP holds no alternate: what protects it is the alternate both
            // engines agreed on, so ask them.
            Mode::Software => {
                let alt = |s: usize| {
                    self.hosts[c.qp[s].host]
                        .ctl
                        .engine()
                        .and_then(|e| e.connection(ConnId(i as u64)))
                        .filter(|st| st.protection == apm_core::Protection::Armed)
                        .and_then(|st| st.alternate)
                };
                match (alt(0), alt(1)) {
                    (Some(x), Some(y)) => mirrors(&x, &y) && self.path_ok(&x) && self.path_ok(&y),
                    _ => false,
                }
            }
        };
        if protected {
            ConnState::Armed
        } else {
            ConnState::Unprotected
        }
    }

    fn reeval(&mut self, i: usize) {
        let new = self.classify(i);
        let now = self.now;
        let c = &self.conns[i];
        let old = c.state;
        // A guarded failover whose alternates died as well is a double fault: excused.
        if let Some((x, y)) = c.guard {
            if !(self.path_ok(&x) && self.path_ok(&y)) {
                self.conns[i].guard = None;
            }
        }
        if new == old {
            return;
        }
        let c = &mut self.conns[i];
        if matches!(old, ConnState::Unprotected | ConnState::Migrating) {
            self.c.unprotected_ns += u128::from(now.0 - c.since.0);
        }
        c.since = now;
        c.state = new;
        self.counts[old.idx()] -= 1;
        self.counts[new.idx()] += 1;
        if old.working() && new == ConnState::Migrating {
            c.interrupted_at = Some(now);
            c.guard = if old == ConnState::Armed {
                match (c.qp[0].alt, c.qp[1].alt) {
                    (Some(x), Some(y)) => Some((x, y)),
                    _ => None,
                }
            } else {
                None
            };
        } else if old == ConnState::Migrating && new.working() {
            if let Some(t) = c.interrupted_at.take() {
                self.c.restore_ns.push(now.0 - t.0);
            }
            c.guard = None;
        }
        if new == ConnState::Lost {
            self.c.lost += 1;
            let guard = c.guard.take();
            let excused = c.excused;
            c.interrupted_at = None;
            if guard.is_some() && !excused {
                self.violation(format!(
                    "conn{i} lost at {now} although armed with a healthy alternate when its primary failed"
                ));
            }
        }
    }

    fn reeval_all(&mut self) {
        for i in 0..self.conns.len() {
            if self.conns[i].state != ConnState::Lost {
                self.reeval(i);
            }
        }
    }

    fn violation(&mut self, what: String) {
        if self.cfg.check && self.violations.len() < 100 {
            self.violations.push(what);
        }
    }

    // ------------------------------------------------------------------ faults

    fn action(&mut self, idx: usize) {
        let (_, act, text) = self.actions[idx].clone();
        self.note(text);
        match act {
            Action::PortAdmin(p, up) => {
                self.fab.ports[p].admin_up = up;
                self.phys_changed();
            }
            Action::Link(l, up) => {
                self.fab.links[l].intact = up;
                self.phys_changed();
            }
            Action::Switch(s, up) => {
                self.fab.switches[s].up = up;
                self.phys_changed();
            }
            Action::SmFail(subnet) => self.sm_fail(subnet),
            Action::MadLoss(rate, until) => self.loss_burst = Some((rate, until)),
            Action::DeviceFatal(h) => {
                let lat = self.ev_latency();
                self.raise(h, lat, Input::DeviceFatal { device: 0 });
                for i in 0..self.conns.len() {
                    if self.conns[i].qp.iter().any(|q| q.host == h) {
                        self.lose(i, true);
                    }
                }
            }
        }
    }

    fn note(&mut self, text: String) {
        if self.timeline.len() < 10_000 {
            self.timeline.push((self.now, text));
        }
    }

    /// Links changed: ports lose or gain their physical link; the switches next to the
    /// change send trap 128 and the SM sweeps (or, when its own port came back, it
    /// notices that and sweeps).
    fn phys_changed(&mut self) {
        let lat = self.ev_latency();
        let mut touched = vec![false; self.sms.len()];
        for pid in 0..self.fab.num_ports() {
            let up = self.fab.port_phys_up(pid);
            let st = self.fab.ports[pid].state;
            let subnet = self.fab.ports[pid].subnet;
            if !up && st != PortState::Down {
                self.fab.ports[pid].state = PortState::Down;
                touched[subnet] = true;
                if st == PortState::Active {
                    let (h, key) = (self.fab.ports[pid].host, self.fab.ports[pid].key());
                    self.raise(
                        h,
                        lat,
                        Input::PortEvent {
                            port: key,
                            event: PortEvent::Down,
                        },
                    );
                }
            } else if up && st == PortState::Down {
                self.fab.ports[pid].state = PortState::Init;
                touched[subnet] = true;
            }
        }
        // Switch-to-switch links changing do not touch a host port but still trap.
        touched.iter_mut().for_each(|t| *t = true);
        for (s, t) in touched.into_iter().enumerate() {
            let reachable = self.sms[s]
                .master_port()
                .is_some_and(|m| self.fab.port_phys_up(m));
            if t && reachable {
                let d = ms(self.p.trap_sweep_delay_ms);
                self.schedule_sweep(s, d);
            }
        }
        self.reeval_all();
    }

    fn schedule_sweep(&mut self, s: usize, delay: Time) {
        let at = after(self.now, delay);
        if self.sms[s].sweep_at.is_none_or(|t| t > at) {
            self.sms[s].sweep_at = Some(at);
            self.push(at, Ev::Sweep { subnet: s });
        }
    }

    fn mad_lost(&mut self) -> bool {
        let rate = match self.loss_burst {
            Some((r, until)) if self.now < until => r,
            _ => self.p.mad_loss,
        };
        self.rng.chance(rate)
    }

    /// A MAD from LID `slid` to `dlid`: its one-way latency when it arrives.
    fn mad(&mut self, slid: u16, dlid: u16) -> Option<Time> {
        self.c.mads_sent += 1;
        let hops = self.fab.route(slid, dlid)?;
        if self.mad_lost() {
            return None;
        }
        Some(us(
            u64::from(hops) * self.p.hop_latency_us + self.p.mad_processing_us
        ))
    }

    // ------------------------------------------------------------------ SM and SA

    fn sweep(&mut self, s: usize) {
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

    fn send_report(&mut self, s: usize, sub: PortId, gid: Gid, in_service: bool) {
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

    fn transmit_report(&mut self, s: usize, tid: u64) {
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

    fn report_timeout(&mut self, s: usize, epoch: u32, tid: u64) {
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

    fn report_arrive(&mut self, sub: PortId, s: usize, epoch: u32, tid: u64) {
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

    fn sm_fail(&mut self, s: usize) {
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

    fn takeover(&mut self, s: usize) {
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
    fn sa_query(
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

    fn send_peer(&mut self, host: usize, port: PortKey, to: PeerAddr, msg: PeerMsg) {
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

    // ------------------------------------------------------------------ invariants

    fn check_step(&mut self) {
        // Every Report a host received was answered (the umad-sa contract).
        for (h, host) in self.hosts.iter().enumerate() {
            if host.reports_received != host.report_resps_sent {
                let what = format!("h{h} left a Report unanswered");
                if self.violations.len() < 100 {
                    self.violations.push(what);
                }
                return;
            }
        }
    }

    /// Connections that are not armed although a healthy alternate exists for them, as
    /// of now (for the "re-armed within a bound after the faults stop" invariant).
    pub fn unarmed_with_healthy_alternate(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, c) in self.conns.iter().enumerate() {
            if c.state != ConnState::Unprotected {
                continue;
            }
            let (a, b) = (&c.qp[0], &c.qp[1]);
            let (Some(pa), Some(pb)) = (
                self.fab.port_by_gid(&a.primary.sgid),
                self.fab.port_by_gid(&b.primary.sgid),
            ) else {
                continue;
            };
            let (ha, hb) = (self.fab.ports[pa].host, self.fab.ports[pb].host);
            let mut healthy = false;
            for num in 1..=self.fab.ports_per_host() {
                let (Some(x), Some(y)) = (self.fab.port_of(ha, num), self.fab.port_of(hb, num))
                else {
                    continue;
                };
                for p in self.fab.all_paths(x, y, self.p.ack_timeout) {
                    if !p.same_route(&a.primary)
                        && self.path_ok(&p)
                        && self.fab.route(p.dlid.get(), p.slid.get()).is_some()
                    {
                        healthy = true;
                    }
                }
            }
            if healthy {
                out.push(i);
            }
        }
        out
    }

    /// When the last scheduled fault happens (the end of the last outage or burst).
    pub fn last_fault(&self) -> Time {
        self.last_fault
    }

    /// Violations found so far (with `check`).
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// The controller of a host (tests use the engine's getters).
    pub fn controller(&self, host: usize) -> &dyn Controller {
        self.hosts[host].ctl.as_ref()
    }

    /// Ground truth of connection `i`.
    pub fn conn_state(&self, i: usize) -> Option<ConnState> {
        self.conns.get(i).map(|c| c.state)
    }

    /// The hosts of connection `i` (active side first).
    pub fn conn_hosts(&self, i: usize) -> Option<(usize, usize)> {
        self.conns.get(i).map(|c| (c.qp[0].host, c.qp[1].host))
    }

    /// The current primary port numbers of connection `i` (active side first).
    pub fn conn_ports(&self, i: usize) -> Option<(u8, u8)> {
        self.conns
            .get(i)
            .map(|c| (c.qp[0].primary.port.port, c.qp[1].primary.port.port))
    }

    /// Migration states of connection `i` (active side first).
    pub fn conn_mig(&self, i: usize) -> Option<(MigState, MigState)> {
        self.conns.get(i).map(|c| (c.qp[0].mig, c.qp[1].mig))
    }

    /// Number of connections.
    pub fn num_conns(&self) -> usize {
        self.conns.len()
    }

    /// The fabric (read-only, for tests and providers).
    pub fn fabric(&self) -> &Fabric {
        &self.fab
    }

    /// The run's parameters.
    pub fn params(&self) -> &FabricParams {
        &self.p
    }

    /// Finish: close the protection clock and build the report.
    pub fn finish(mut self) -> RunReport {
        let now = self.now.max(self.end);
        for c in &self.conns {
            if matches!(c.state, ConnState::Unprotected | ConnState::Migrating) {
                self.c.unprotected_ns += u128::from(now.0.saturating_sub(c.since.0));
            }
        }
        if self.cfg.check {
            // Invariant: once the faults stop, every connection that has a healthy
            // alternate is armed again within the bound.
            let bound = self.settle_bound();
            if now >= after(self.last_fault, bound) {
                let unarmed = self.unarmed_with_healthy_alternate();
                for i in unarmed.iter().take(5) {
                    self.violations.push(format!(
                        "conn{i} still unprotected {} after the last fault although a healthy alternate exists",
                        Time(now.0 - self.last_fault.0)
                    ));
                }
            }
        }
        let mut restore = std::mem::take(&mut self.c.restore_ns);
        restore.sort_unstable();
        let pct = |q: f64| -> f64 {
            if restore.is_empty() {
                0.0
            } else {
                let idx = ((restore.len() as f64 - 1.0) * q).round() as usize;
                restore[idx.min(restore.len() - 1)] as f64 / 1e6
            }
        };
        RunReport {
            policy: self.cfg.policy.name().to_string(),
            connections: self.conns.len() as u64,
            lost: self.c.lost,
            messages_lost: self.c.messages_lost,
            messages_duplicated: self.c.messages_duplicated,
            failovers: self.c.failovers,
            restore_ms: Percentiles {
                p50: pct(0.5),
                p99: pct(0.99),
                max: pct(1.0),
                samples: restore.len() as u64,
            },
            unprotected_ms_total: self.c.unprotected_ns as f64 / 1e6,
            sa_queries: self.c.sa_queries,
            mads_sent: self.c.mads_sent,
            messages_posted: self.c.messages_posted,
            messages_delivered: self.c.messages_delivered,
            messages_retransmitted: self.c.messages_retransmitted,
            reports_sent: self.c.reports_sent,
            reports_abandoned: self.c.reports_abandoned,
            notifications: self.c.notifications,
            events: self.c.events,
            digest: self.digest,
            violations: std::mem::take(&mut self.violations),
            samples: std::mem::take(&mut self.samples),
            timeline: self
                .timeline
                .iter()
                .map(|(t, s)| (t.0 as f64 / 1e6, s.clone()))
                .collect(),
            end_state: [
                self.counts[0] as u64,
                self.counts[1] as u64,
                self.counts[2] as u64,
                self.counts[3] as u64,
            ],
        }
    }

    /// How long after the last fault every connection with a healthy alternate must be
    /// armed again: the longest hold-down, the longest re-arm backoff, a whole LAP
    /// exchange with its retries, an SA query with its retries, a sweep period and the
    /// Report retries, the longest interval between SA rechecks of an out-of-service
    /// GID (for a host that missed the SM's last notice) with its query, plus a second
    /// of slack.
    pub fn settle_bound(&self) -> Time {
        let p = &self.cfg.engine_policy;
        let lap_total: u64 = (0..p.lap_max_tries)
            .map(|k| p.lap_timeout_ms << k.min(20))
            .sum();
        let sa = self.p.sa_timeout_ms * u64::from(self.p.sa_tries);
        let reports = self.p.report_timeout_ms * u64::from(self.p.report_retries + 1);
        ms(p.hold_down_max_ms
            + p.rearm_retry_max_ms
            + lap_total
            + sa
            + self.p.sweep_interval_ms
            + reports
            + p.subscribe_retry_ms
            + if p.remote_recheck_ms > 0 {
                p.remote_recheck_max_ms + sa
            } else {
                0
            }
            + 1000)
    }
}
