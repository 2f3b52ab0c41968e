//! The discrete-event simulation: the SM/SA, RC QPs with APM, MAD delivery, traffic,
//! faults, and one controller per host, all on one virtual clock.
//!
//! Sans-IO like the engine it drives: no threads, no clock reads, one seeded RNG, events
//! ordered by (time, insertion sequence), only ordered collections. The same scenario,
//! seed and policy give the same [`RunReport`] byte for byte.
//!
//! What is modelled, and where each rule comes from (the fabric constants and their
//! OpenSM defaults are documented on [`FabricParams`]):
//! - **QPs** (`qp.rs`) follow rdmavt, the kernel's software implementation of the IBA
//!   transport (`rvt_rc_timeout`, `hfi1_restart_rc`/`qib_restart_rc`,
//!   `*_ruc_check_hdr`, `*_migrate_qp`): a requester whose path is dead retries every
//!   local ACK timeout; when `retry_cnt` retries are spent it migrates to the alternate
//!   if ARMED, without checking whether the alternate works, and starts a new retry
//!   budget there; unarmed, it completes with RETRY_EXC_ERR and goes to ERR. A
//!   responder that is ARMED migrates when a packet with MigReq=1 arrives on its
//!   alternate path; a packet matching neither path is dropped; REARM becomes ARMED
//!   when a packet with MigReq=0 arrives on the primary. PATH_MIG is raised on each
//!   side that migrates (a forced migration included). PATH_MIG_ERR ("an incoming path
//!   migration request was not accepted", IBA's affiliated error; mlx5 maps its
//!   PATH_MIG_FAILED event to it) is raised at a responder whose loaded alternate
//!   receives MigReq=1 while it is not ARMED. Software-migration QPs (RoCE) have no
//!   alternate and report `PrimaryStalled` after `stall_timeouts` ACK timeouts.
//!   Where the drivers differ, the scenario says which one the devices follow
//!   ([`Migration`], `fabric.migration`): under rdmavt a QP retries at its own timeout
//!   on whatever path it runs and only a migration on exhaustion restarts the retry
//!   count; under mlx5 each path's own timeout applies once the QP runs on it, and
//!   every migration restarts the count.
//! - **Devices** (`hosts.rs`): QP commands are firmware commands carried out one at a
//!   time per device, each taking effect when it completes; each host's MAD agent
//!   handles arriving MADs one at a time.
//! - **SMs** (`sm.rs`) follow OpenSM: a trap 128 (resent until it gets through) or a
//!   light sweep that sees a change starts a heavy sweep, whose duration grows with the
//!   fabric and with lost SMPs; a host port whose SMPs are all lost is dropped (trap 65,
//!   LIDs out of the forwarding tables). The sweep's end activates ports, reprograms the
//!   forwarding tables and sends traps 64/65 as Reports to InformInfo subscribers,
//!   resent until answered. A standby takes over when its polls of the master fail for
//!   OpenSM's polling timeout and retries, with no subscriptions, setting
//!   ClientReregister in its first sweep; an SM whose host died is dead.
//! - **The SA** (`sa.rs`) serves its MADs one at a time at `sa_rate_per_s`: requests,
//!   Reports' first transmissions and ReportResps in one queue (OpenSM sends Reports
//!   holding the lock the SA needs); it drops requests that would wait longer than
//!   `sa_fifo_timeout_ms`, and answers nothing until a new master's first sweep is done;
//!   clients time out and retry. What each failure event costs the SMs and SAs is
//!   counted by window (`load.rs`).
//! - **Silent failures**: a black-holing switch keeps its ports up and answers the SM's
//!   directed-route SMPs but forwards nothing (no port event, no trap 128, no sweep);
//!   a cut between switches raises no port event at a host (the switches' trap 128
//!   starts a sweep; the SM's trap 65 names only the ports a split left unreachable).
//!   RoCE (software-migration) ports have no SA: Ethernet ports for the engine.
//! - **Probes** (apm only): each host's `ProbeDriver` sends through `SendPeer`; a probe
//!   travels as a datagram routed like data (`hosts.rs`), never through the MAD agent
//!   and never lost to MAD loss, and reaches the peer's prober after its hops.
//! - **Traffic** is application messages numbered per direction. A message is delivered
//!   once the forward path works, acknowledged once the return path works too. The
//!   application keeps offering messages on a connection that died (they count as not
//!   delivered), and would resend on a new connection what was delivered but never
//!   acknowledged (duplicates).
//!
//! Simplifications, deliberately: data packets are not individually timed (a message is
//! delivered at the instant it is sent when the path works: per-hop latency only matters
//! for MADs, which race with each other); when a QP goes to ERR its peer goes to ERR at
//! the same instant (it would after its own retry budget); SMPs of a sweep that are lost
//! on every try only ever drop host ports, never switches.

use crate::config::{FabricParams, Fault, Migration, Mode, Scenario, ScenarioError};
use crate::controller::{self, Controller, PolicyKind};
use crate::fabric::{Fabric, PortId, PortState};
use crate::report::{Percentiles, RunReport, Sample};
use crate::rng::Rng;
use apm_core::probe::Probe;
use apm_core::*;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

mod build;
pub use build::SimError;
mod faults;
mod hosts;
mod load;
mod qp;
mod quiet;
mod sa;
mod slab;
mod sm;
mod truth;

use sa::SaTxn;
use sm::Sm;

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
    /// Log every change of this connection's QPs (target `provider_sim::trace`, level
    /// info), for finding out why it was lost.
    pub trace_conn: Option<usize>,
}

impl RunConfig {
    /// A run of `scenario` under `policy` with `seed`, with the scenario's engine
    /// policy ([`Scenario::engine_policy`]), samples every 10 ms.
    pub fn for_scenario(scenario: &Scenario, policy: PolicyKind, seed: u64) -> RunConfig {
        RunConfig {
            engine_policy: scenario.engine_policy(),
            ..RunConfig::new(policy, seed)
        }
    }

    /// A run of `policy` with `seed`, the simulator's engine policy
    /// ([`crate::controller::sim_policy`]: the defaults with probes on), samples every
    /// 10 ms.
    pub fn new(policy: PolicyKind, seed: u64) -> RunConfig {
        RunConfig {
            seed,
            policy,
            engine_policy: controller::sim_policy(),
            sample_ms: 10,
            check: false,
            external_hosts: Vec::new(),
            trace_conn: None,
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
    fn working(self) -> bool {
        matches!(self, ConnState::Armed | ConnState::Unprotected)
    }
}

/// Where the protection clock and the samples put a connection: its state, with armed
/// split by what the alternate survives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bucket {
    /// Armed on an alternate through another local port and another remote port.
    ArmedDisjoint,
    /// Armed on an alternate that shares a port (or both) with the primary.
    ArmedShared,
    Unprotected,
    Migrating,
    Lost,
}

impl Bucket {
    const ALL: usize = 5;

    fn idx(self) -> usize {
        match self {
            Bucket::ArmedDisjoint => 0,
            Bucket::ArmedShared => 1,
            Bucket::Unprotected => 2,
            Bucket::Migrating => 3,
            Bucket::Lost => 4,
        }
    }
}

#[derive(Clone, Debug)]
struct Qp {
    host: usize,
    primary: Path,
    alt: Option<Path>,
    mig: MigState,
    err: bool,
    /// Messages the application offered on this side (it keeps offering after the
    /// connection died: those are never delivered).
    posted: u64,
    /// Of those, delivered to the peer's application.
    delivered: u64,
    /// Of those, acknowledged back to this side.
    acked: u64,
    stalled: bool,
    /// The QP's own local ACK timeout (`IB_QP_TIMEOUT`, set at connect): what rdmavt
    /// retries at whatever path it runs on ([`Migration::Rdmavt`]).
    timeout: u8,
    retries: u32,
    retry_gen: u32,
    /// A PATH_MIG_ERR was raised for the current alternate (raised once per alternate).
    mig_err_raised: bool,
}

#[derive(Clone, Debug)]
struct Conn {
    qp: [Qp; 2],
    mode: Mode,
    state: ConnState,
    bucket: Bucket,
    since: Time,
    interrupted_at: Option<Time>,
    /// The armed alternates (side 0, side 1) when the primary failed while protected
    /// (boxed: set only while a connection fails over).
    guard: Option<Box<(Path, Path)>>,
    /// The connection moved then and has not been armed since (the re-arm window: after
    /// a migration a QP arms again only once its peer's packets arrive).
    moved_unarmed: Option<Time>,
    /// Its primary died inside that window: a loss that follows is a loss in the
    /// re-arm window after a move (see `RunReport::lost_in_rearm_window`).
    in_rearm_window: bool,
    /// It was lost while no path between its two hosts worked (see
    /// `RunReport::lost_in_total_outage`).
    lost_in_total_outage: bool,
    /// Since it last worked there was a moment when no path between its two hosts
    /// worked (for `RunReport::lost_after_total_outage`).
    outage_since_working: bool,
    /// It was lost with `outage_since_working` set.
    lost_after_total_outage: bool,
    /// The guard was a port-disjoint alternate (for the disjoint restore figure).
    guard_disjoint: bool,
    /// Lost with its HCA (`Loss::DeviceFatal`): no invariant asks to have kept it.
    excused: bool,
    /// Counted instead of simulated at its ticks (`quiet.rs`), since tick `synced` of
    /// its group.
    quiet: Option<quiet::Quiet>,
    synced: u64,
    /// Its routes' fates as last walked (`Sim::conn_path_ok`).
    route_memo: std::cell::Cell<RouteMemo>,
}

/// Whether four routes of a connection worked, as of a generation of the fabric:
/// keyed by each route's LID pair, void once the fabric changes.
#[derive(Clone, Copy, Debug, Default)]
struct RouteMemo {
    gen: u64,
    keys: [u32; 4],
    ok: [bool; 4],
}

/// What a completed command answers: the engine (an `Input::CommandDone`) or an
/// external driver waiting on a channel.
#[derive(Debug)]
enum Reply {
    Engine(CommandId),
    External(u64),
}

#[derive(Debug)]
struct Host {
    ctl: Box<dyn Controller>,
    timer_at: Option<Time>,
    /// The device's command queue is busy until then.
    device_busy: Time,
    /// Its commands waiting and in progress, in order.
    device: std::collections::VecDeque<hosts::Queued>,
    /// The MAD agent is busy until then.
    mad_busy: Time,
    /// The HCA died (`DEVICE_FATAL`): nothing it sends or receives happens.
    dead: bool,
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

/// A MAD on its way to a host's MAD agent.
#[derive(Debug)]
enum Mad {
    Peer {
        from: PeerAddr,
        port: PortKey,
        msg: PeerMsg,
    },
    Report {
        sub: PortId,
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    SaAnswer {
        txn: u64,
        result: Result<CommandOutcome, ProviderError>,
    },
}

/// One timed change of the fault schedule.
#[derive(Clone, Debug)]
enum Action {
    /// A port administratively down (`Off`) or up.
    PortAdmin(PortId, Turn),
    /// A link cut (`Off`) or restored.
    Link(usize, Turn),
    /// A switch failing (`Off`) or returning.
    Switch(usize, Turn),
    SmFail(usize),
    MadLoss(f64, Time),
    DeviceFatal(usize),
    /// A switch starting to black-hole (`On`) or forwarding again.
    BlackHole(usize, Turn),
}

/// What an [`Action`] does to the element it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    Off,
    On,
}

impl Turn {
    fn on(self) -> bool {
        self == Turn::On
    }
}

#[derive(Debug)]
enum Ev {
    Tick(u64),
    Retry {
        conn: usize,
        side: usize,
        gen: u32,
    },
    /// An input reaches a host's controller (kept in `Sim::inputs`).
    Deliver {
        host: usize,
        input: u32,
    },
    HostTimer {
        host: usize,
    },
    Action(usize),
    /// The QP command at the head of a device's queue completes.
    QpCommand {
        host: usize,
    },
    /// A MAD reaches a host's agent (queued there).
    MadArrive {
        host: usize,
        /// In `Sim::mads`.
        mad: u32,
    },
    /// The host's agent has processed a MAD.
    MadReady {
        host: usize,
        mad: u32,
    },
    /// A switch sends (or resends) trap 128 to its SM.
    Trap {
        subnet: usize,
        gen: u64,
    },
    SweepStart {
        subnet: usize,
    },
    SweepEnd {
        subnet: usize,
        epoch: u32,
        dropped: Box<[PortId]>,
    },
    LightSweep {
        subnet: usize,
    },
    /// The standby's polls of an unreachable master ran out.
    PollTimeout {
        subnet: usize,
        since: Time,
    },
    ReportTimeout {
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    ReportResp {
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    /// A Report's first transmission reaches the head of the SA's queue.
    ReportSend {
        subnet: usize,
        epoch: u32,
        tid: u64,
    },
    /// An SA request reaches the SA.
    SaArrive {
        subnet: usize,
        epoch: u32,
        txn: u64,
    },
    /// The SA has served a request.
    SaServed {
        subnet: usize,
        epoch: u32,
        txn: u64,
    },
    /// A client's SA request attempt timed out.
    SaTimeout {
        txn: u64,
        attempt: u32,
    },
    Sample,
}

impl Ev {
    fn tag(&self) -> u64 {
        let small = |v: usize| (v as u64) << 8;
        match self {
            Ev::Tick(g) => 1 + (g << 8),
            Ev::Retry { conn, side, .. } => 2 + small(*conn) + ((*side as u64) << 4),
            Ev::Deliver { host, .. } => 3 + small(*host),
            Ev::HostTimer { host } => 4 + small(*host),
            Ev::Action(i) => 5 + small(*i),
            Ev::QpCommand { host, .. } => 6 + small(*host),
            Ev::MadArrive { host, .. } => 7 + small(*host),
            Ev::MadReady { host, .. } => 8 + small(*host),
            Ev::Trap { subnet, .. } => 9 + small(*subnet),
            Ev::SweepStart { subnet } => 10 + small(*subnet),
            Ev::SweepEnd { subnet, .. } => 11 + small(*subnet),
            Ev::LightSweep { subnet } => 12 + small(*subnet),
            Ev::PollTimeout { subnet, .. } => 13 + small(*subnet),
            Ev::ReportTimeout { tid, .. } => 14 + (tid << 8),
            Ev::ReportResp { tid, .. } => 15 + (tid << 8),
            Ev::ReportSend { tid, .. } => 20 + (tid << 8),
            Ev::SaArrive { txn, .. } => 16 + (txn << 8),
            Ev::SaServed { txn, .. } => 17 + (txn << 8),
            Ev::SaTimeout { txn, .. } => 18 + (txn << 8),
            Ev::Sample => 19,
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
    messages_duplicated: u64,
    messages_delivered: u64,
    messages_retransmitted: u64,
    failovers: u64,
    false_failovers: u64,
    restore_ns: Vec<u64>,
    /// The connection of each `restore_ns` sample.
    restore_conns: Vec<u32>,
    restore_disjoint_ns: Vec<u64>,
    /// Connection-nanoseconds per [`Bucket`].
    bucket_ns: [u128; Bucket::ALL],
    sa_queries: u64,
    mads_sent: u64,
    smps_sent: u64,
    reports_sent: u64,
    reports_abandoned: u64,
    notifications: u64,
    events: u64,
    messages_posted: u64,
    probes_sent: u64,
    /// Reports the hosts received and the ReportResps they sent, over every host.
    reports_received: u64,
    report_resps_sent: u64,
}

/// One simulation run.
pub struct Sim {
    cfg: RunConfig,
    scenario: Scenario,
    p: FabricParams,
    now: Time,
    end: Time,
    fab: Fabric,
    /// Draws for everything hosts send and for the traffic.
    rng: Rng,
    /// Draws for the SMs' own MADs (sweep SMPs, traps 128), apart so that the fabric's
    /// evolution is the same whichever policy the hosts run.
    rng_sm: Rng,
    queue: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    hosts: Vec<Host>,
    conns: Vec<Conn>,
    sms: Vec<Sm>,
    sa_txns: BTreeMap<u64, SaTxn>,
    next_txn: u64,
    actions: Vec<(Time, Action, String)>,
    loss_burst: Option<(f64, Time)>,
    counts: [usize; Bucket::ALL],
    c: Counters,
    samples: Vec<Sample>,
    timeline: Vec<(Time, String)>,
    violations: Vec<String>,
    digest: u64,
    /// Last time a fault happened (for the "re-armed within a bound" check).
    last_fault: Time,
    /// What the SMs and SAs handled, and its windows by failure event.
    load: load::SmLoad,
    windows: load::Windows,
    traffic: quiet::Traffic,
    /// Bumped at every change of the fabric (a port, link or switch, a forwarding
    /// table): route memos of an older generation are void.
    fab_gen: u64,
    /// The payloads of queued events: inputs for controllers, MADs on their way.
    inputs: slab::Slab<Input>,
    mads: slab::Slab<Mad>,
    /// The last traced description of `RunConfig::trace_conn`.
    traced: String,
    /// Hosts whose inputs go to an external driver instead of a controller: the sink
    /// once attached, and what arrived before that.
    external: BTreeMap<usize, External>,
    /// The connection specs of external hosts, for their driver to protect.
    external_specs: BTreeMap<usize, Vec<ConnSpec>>,
    /// External commands waiting for their result.
    external_replies: BTreeMap<u64, ExternalReply>,
    next_external: u64,
}

type ExternalReply = tokio::sync::oneshot::Sender<Result<CommandOutcome, ProviderError>>;

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
        let seq = self.seq;
        self.seq += 1;
        self.push_with_seq(at, seq, ev);
    }

    /// Queue an event under a sequence number taken earlier (an event held back
    /// outside the queue keeps its place among those of its instant).
    fn push_with_seq(&mut self, at: Time, seq: u64, ev: Ev) {
        let at = at.max(self.now);
        self.queue.push(Reverse(Entry { at, seq, ev }));
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
            Ev::Deliver { host, input } => {
                if let Some(input) = self.inputs.take(input) {
                    self.feed(host, input);
                }
            }
            Ev::HostTimer { host } => {
                if self.hosts[host].timer_at == Some(self.now) {
                    self.hosts[host].timer_at = None;
                    let now = self.now;
                    self.hosts[host].ctl.handle_timeout(now);
                    self.pump(host);
                }
            }
            Ev::Action(i) => self.action(i),
            Ev::QpCommand { host } => self.qp_command_done(host),
            Ev::MadArrive { host, mad } => self.mad_arrive(host, mad),
            Ev::MadReady { host, mad } => {
                if let Some(mad) = self.mads.take(mad) {
                    self.mad_ready(host, mad);
                }
            }
            Ev::Trap { subnet, gen } => self.trap(subnet, gen),
            Ev::SweepStart { subnet } => self.sweep_start(subnet),
            Ev::SweepEnd {
                subnet,
                epoch,
                dropped,
            } => self.sweep_end(subnet, epoch, &dropped),
            Ev::LightSweep { subnet } => self.light_sweep(subnet),
            Ev::PollTimeout { subnet, since } => self.poll_timeout(subnet, since),
            Ev::ReportTimeout { subnet, epoch, tid } => self.report_timeout(subnet, epoch, tid),
            Ev::ReportResp { subnet, epoch, tid } => self.report_resp(subnet, epoch, tid),
            Ev::ReportSend { subnet, epoch, tid } => {
                if self.sms[subnet].epoch == epoch {
                    self.transmit_report(subnet, tid);
                }
            }
            Ev::SaArrive { subnet, epoch, txn } => self.sa_arrive(subnet, epoch, txn),
            Ev::SaServed { subnet, epoch, txn } => self.sa_served(subnet, epoch, txn),
            Ev::SaTimeout { txn, attempt } => self.sa_timeout(txn, attempt),
            Ev::Sample => {
                let n = |b: Bucket| self.counts[b.idx()] as u32;
                self.samples.push(Sample {
                    t_ms: self.now.0 / 1_000_000,
                    armed: n(Bucket::ArmedDisjoint) + n(Bucket::ArmedShared),
                    armed_disjoint: n(Bucket::ArmedDisjoint),
                    unprotected: n(Bucket::Unprotected),
                    migrating: n(Bucket::Migrating),
                    lost: n(Bucket::Lost),
                });
                let at = after(self.now, ms(self.cfg.sample_ms));
                self.push(at, Ev::Sample);
            }
        }
    }

    // ------------------------------------------------------------------ getters

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

    /// True when connection `i` is armed on a port-disjoint alternate.
    pub fn conn_armed_disjoint(&self, i: usize) -> bool {
        self.conns
            .get(i)
            .is_some_and(|c| c.bucket == Bucket::ArmedDisjoint)
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
}
