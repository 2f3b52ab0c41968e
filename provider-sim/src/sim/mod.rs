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

mod build;
mod faults;
mod hosts;
mod qp;
mod sm;
mod truth;

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
