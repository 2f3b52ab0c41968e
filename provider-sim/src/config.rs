//! Scenarios: the fabric, the workload and the faults, as users write them in TOML.
//!
//! Every key has a default (the built-in scenario is `Scenario::default()`), unknown keys
//! are errors, and every error names the line it comes from. See `scenarios/*.toml` in
//! this crate for documented examples. Nothing here runs anything: [`crate::Sim`] turns
//! a scenario into a simulation.

use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// Why a scenario file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// Not valid TOML, or a key/value of the wrong shape (the message has the line).
    #[error("{0}")]
    Parse(String),
    /// A value that cannot work, with the line it is on when known.
    #[error("{}{what}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Invalid {
        /// The offending line (1-based), if known.
        line: Option<usize>,
        /// What is wrong.
        what: String,
    },
}

fn invalid(what: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        line: None,
        what: what.into(),
    }
}

/// A whole scenario.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// A name for reports (a file without one is called "scenario").
    #[serde(default = "default_name")]
    pub name: String,
    /// Simulated time to run, in milliseconds.
    pub duration_ms: u64,
    /// The fabric's shape.
    pub topology: Topology,
    /// Timing and protocol constants of the fabric.
    pub fabric: FabricParams,
    /// The connections and their traffic.
    pub workload: Workload,
    /// Faults at fixed times, applied in time order. A file without any has none (it
    /// does not inherit the built-in demonstration's).
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Faults generated from the seed, added to `faults`.
    pub random_faults: Option<RandomFaults>,
}

fn default_name() -> String {
    "scenario".into()
}

impl Default for Scenario {
    /// The built-in demonstration: a dual-rail fabric of 16 hosts loses rail A's switch
    /// and gets it back, a remote port on rail B flaps (traps 65/64 reach the far ends),
    /// then rail B's master SM dies and its standby takes over.
    fn default() -> Scenario {
        Scenario {
            name: "dual-rail: rail A fails and returns, a remote port flaps, an SM fails over"
                .into(),
            duration_ms: 8000,
            topology: Topology::default(),
            // OpenSM's standby polling tuned down as a site that cares about failover
            // would: takeover 2-2.5 s after the master dies (50-60 s with the defaults).
            fabric: FabricParams {
                sminfo_polling_timeout_ms: 500,
                polling_retry_number: 2,
                ..FabricParams::default()
            },
            workload: Workload::default(),
            faults: vec![
                Fault::SwitchDown {
                    at_ms: 500,
                    switch: "A".into(),
                },
                Fault::SwitchUp {
                    at_ms: 1500,
                    switch: "A".into(),
                },
                Fault::PortFlap {
                    at_ms: 2500,
                    port: "h3:2".into(),
                    down_ms: 600,
                    up_ms: 400,
                    count: 2,
                },
                Fault::SmFailover {
                    at_ms: 5000,
                    subnet: 1,
                },
            ],
            random_faults: None,
        }
    }
}

/// The fabric: hosts with HCA ports, switches, links.
///
/// Without `switches`/`links`, a rail fabric is generated: one switch per port number
/// (`A` for port 1, `B` for port 2), each its own subnet, every host's port `r` cabled
/// to switch `r`: the classic dual-rail layout where the two planes share nothing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Topology {
    /// Number of hosts, named `h0`, `h1`, ...
    pub hosts: usize,
    /// HCA ports per host (1 or 2); all on one HCA, so APM can move between them.
    pub ports: u8,
    /// LID mask control of every host port (0..=2): each port answers to 2^lmc LIDs.
    pub lmc: u8,
    /// Explicit switches (leave empty for the generated rails).
    pub switches: Vec<SwitchSpec>,
    /// Explicit links, `"h3:1"` for a host port or a switch name at each end.
    pub links: Vec<LinkSpec>,
    /// SM placement per subnet: master first, then standbys. Default: the subnet's port
    /// on `h0`, standby on `h1`.
    pub sm: Vec<SmSpec>,
}

impl Default for Topology {
    fn default() -> Topology {
        Topology {
            hosts: 16,
            ports: 2,
            lmc: 1,
            switches: Vec::new(),
            links: Vec::new(),
            sm: Vec::new(),
        }
    }
}

/// An explicit switch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    /// Its name, used by links and faults.
    pub name: String,
    /// The subnet (rail) it belongs to, 0-based.
    pub subnet: usize,
}

/// An explicit link.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// One end: `"h3:1"` or a switch name.
    pub a: String,
    /// The other end.
    pub b: String,
}

/// Where a subnet's SMs run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SmSpec {
    /// The subnet.
    pub subnet: usize,
    /// Host ports running an SM, master first (`"h0:1"`).
    pub ports: Vec<String>,
}

/// Timing and protocol constants. Defaults follow real hardware and OpenSM's own
/// defaults (opensm/osm_base.h, OpenSM 3.3); each says where it comes from, and the
/// few that are shortened to keep simulated runs short say so.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FabricParams {
    /// Latency per link hop for MADs, in microseconds. Default 1.
    pub hop_latency_us: u64,
    /// Processing time of one MAD at a receiving host (its umad agent: CM, SA client),
    /// in microseconds. The host handles its MADs one at a time in arrival order, so a
    /// burst of Reports or LAPs queues. Default 20.
    pub mad_processing_us: u64,
    /// Service time of one modify_qp/query_qp on a device, in microseconds. Every QP
    /// command is a firmware command (mlx5: one RTS2RTS_QP command per transition,
    /// through the driver's command queue), and a device carries them out one after
    /// another: a failover that touches 500 QPs of one HCA waits for 500 commands. A
    /// command takes effect when it completes. Default 50: a connection's set-up
    /// (several such commands) is measured in milliseconds on ConnectX-class HCAs, and
    /// a slower device only makes apm's job (two commands per re-arm) harder.
    pub command_latency_us: u64,
    /// Time from a hardware event to the async event reaching software, in microseconds.
    /// Default 10.
    pub event_latency_us: u64,
    /// Period of the SM's light sweeps, in milliseconds: each checks the switches' port
    /// states and runs a heavy sweep when something changed. Default 10000 (OpenSM
    /// `sweep_interval` 10 s).
    pub sweep_interval_ms: u64,
    /// Delay from a trap 128 reaching the SM (or the SM's own port coming up) to the
    /// heavy sweep it triggers (OpenSM `sweep_on_trap`), in milliseconds. Default 5.
    pub trap_sweep_delay_ms: u64,
    /// Round trip of one SMP of a heavy sweep (switch or HCA SMA processing included),
    /// in microseconds. A heavy sweep sends about two SMPs per host port, two per switch
    /// plus one per switch port, and one per 64-LID block of every switch's forwarding
    /// table, at most `max_wire_smps` at a time, so its duration grows with the
    /// fabric. Default 100.
    pub smp_rtt_us: u64,
    /// SMPs on the wire at once during a sweep. Default 4 (OpenSM `max_wire_smps`).
    pub max_wire_smps: u32,
    /// Timeout of one SMP transmission, in milliseconds. Default 200 (OpenSM
    /// `transaction_timeout`).
    pub transaction_timeout_ms: u64,
    /// Resends of an SMP that timed out. A host port whose SMPs are all lost is left
    /// out of the sweep: OpenSM's drop manager removes it (trap 65, its LIDs leave the
    /// forwarding tables) until a later sweep finds it again. Default 3 (OpenSM
    /// `transaction_retries`).
    pub transaction_retries: u32,
    /// PortInfo:SubnetTimeOut the SM programs (4.096 us * 2^t): a switch resends an
    /// unanswered trap 128 this often until the SM represses it. Default 18, ~1.07 s
    /// (OpenSM `subnet_timeout`).
    pub subnet_timeout: u8,
    /// A Report not answered by a ReportResp is resent after this. Default 200 (OpenSM
    /// sends Reports with `transaction_timeout`).
    pub report_timeout_ms: u64,
    /// Resends of an unanswered Report. Default 3 (OpenSM `transaction_retries`).
    pub report_retries: u32,
    /// How often a standby SM polls the master's SMInfo, in milliseconds. Default 10000
    /// (OpenSM `sminfo_polling_timeout`).
    pub sminfo_polling_timeout_ms: u64,
    /// Failed polls after which the standby declares the master dead and takes over:
    /// OpenSM counts a poll as failed from the one after the last answered poll and
    /// gives up when the count exceeds this, so takeover comes `(n + 2)` polling
    /// periods after the last answered poll (50-60 s with the defaults). Default 4
    /// (OpenSM `polling_retry_number`).
    pub polling_retry_number: u32,
    /// When set, a standby takes over exactly this long after the master became
    /// unreachable instead of by polling (for experiments; unset by default).
    pub sm_failover_ms: Option<u64>,
    /// Timeout of one SA request attempt (PathRecord, InformInfo). Default 100.
    pub sa_timeout_ms: u64,
    /// SA request attempts before the query fails. Default 3.
    pub sa_tries: u32,
    /// SA requests the master SM serves per second, one at a time in arrival order.
    /// Default 50000 (the figure Mellanox's scalable-SA design work assumes for one
    /// OpenSM).
    pub sa_rate_per_s: u64,
    /// A request that would wait longer than this behind others is dropped unanswered
    /// (OpenSM `max_msg_fifo_timeout`, 10000 ms; OpenSM drops, its BUSY answer is
    /// disabled). Default 10000.
    pub sa_fifo_timeout_ms: u64,
    /// Probability that any MAD is lost (SMPs, traps, Reports, SA, CM), outside loss
    /// bursts. Default 0.
    pub mad_loss: f64,
    /// QP local ACK timeout (IBA encoding: 4.096 us * 2^t). Default 14 (67 ms).
    pub ack_timeout: u8,
    /// QP retry count. Default 7: 8 x 67 ms = 537 ms before a dead path errors.
    pub retry_cnt: u32,
    /// How long traffic must be stalled before a software-migration QP reports
    /// `PrimaryStalled`, in ACK timeouts. Default 2.
    pub stall_timeouts: u32,
}

impl Default for FabricParams {
    fn default() -> FabricParams {
        FabricParams {
            hop_latency_us: 1,
            mad_processing_us: 20,
            command_latency_us: 50,
            event_latency_us: 10,
            sweep_interval_ms: 10_000,
            trap_sweep_delay_ms: 5,
            smp_rtt_us: 100,
            max_wire_smps: 4,
            transaction_timeout_ms: 200,
            transaction_retries: 3,
            subnet_timeout: 18,
            report_timeout_ms: 200,
            report_retries: 3,
            sminfo_polling_timeout_ms: 10_000,
            polling_retry_number: 4,
            sm_failover_ms: None,
            sa_timeout_ms: 100,
            sa_tries: 3,
            sa_rate_per_s: 50_000,
            sa_fifo_timeout_ms: 10_000,
            mad_loss: 0.0,
            ack_timeout: 14,
            retry_cnt: 7,
            stall_timeouts: 2,
        }
    }
}

impl FabricParams {
    /// One local ACK timeout in nanoseconds.
    pub fn ack_timeout_ns(&self) -> u64 {
        4096u64 << self.ack_timeout.min(31)
    }

    /// The interval at which a switch resends an unanswered trap, in nanoseconds.
    pub fn trap_resend_ns(&self) -> u64 {
        4096u64 << self.subnet_timeout.min(31)
    }
}

/// How paths change on the simulated QPs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// InfiniBand hardware APM.
    Hardware,
    /// RoCE-style: no alternate in the QP, the engine moves the primary itself.
    Software,
}

/// The connections.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Number of RC connections between random pairs of hosts.
    pub connections: usize,
    /// Each side of each connection sends one numbered message this often (ms).
    pub message_interval_ms: u64,
    /// Hardware APM or software migration.
    pub mode: Mode,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            connections: 2000,
            message_interval_ms: 10,
            mode: Mode::Hardware,
        }
    }
}

/// A fault at a fixed time. Ports are `"h3:2"`, switches by name, links by their two
/// ends `"h3:2-B"` (or by one host port: its only link).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// A host port goes down (HCA port failure, cable pulled at the host).
    PortDown {
        /// When.
        at_ms: u64,
        /// Which port.
        port: String,
    },
    /// A host port comes back.
    PortUp {
        /// When.
        at_ms: u64,
        /// Which port.
        port: String,
    },
    /// A port flaps: down for `down_ms`, up for `up_ms`, `count` times.
    PortFlap {
        /// When the first down happens.
        at_ms: u64,
        /// Which port.
        port: String,
        /// Down time of each flap.
        down_ms: u64,
        /// Up time between flaps.
        up_ms: u64,
        /// Number of flaps.
        count: u32,
    },
    /// A link is cut.
    LinkDown {
        /// When.
        at_ms: u64,
        /// Which link.
        link: String,
    },
    /// A cut link is restored.
    LinkUp {
        /// When.
        at_ms: u64,
        /// Which link.
        link: String,
    },
    /// A whole switch fails (with one switch per rail: the rail).
    SwitchDown {
        /// When.
        at_ms: u64,
        /// Which switch.
        switch: String,
    },
    /// A failed switch returns.
    SwitchUp {
        /// When.
        at_ms: u64,
        /// Which switch.
        switch: String,
    },
    /// The master SM process of a subnet dies (for the rest of the run); a standby takes
    /// over when its polls of the master have failed (`fabric.sminfo_polling_timeout_ms`,
    /// `polling_retry_number`).
    SmFailover {
        /// When.
        at_ms: u64,
        /// Which subnet.
        subnet: usize,
    },
    /// Every MAD is lost with probability `rate` for `duration_ms`.
    MadLoss {
        /// When.
        at_ms: u64,
        /// How long.
        duration_ms: u64,
        /// Loss probability.
        rate: f64,
    },
    /// A host's HCA dies (`DEVICE_FATAL`): its connections are lost.
    DeviceFatal {
        /// When.
        at_ms: u64,
        /// Which host (`"h3"`).
        host: String,
    },
}

impl Fault {
    /// When the fault (first) happens.
    pub fn at_ms(&self) -> u64 {
        match self {
            Fault::PortDown { at_ms, .. }
            | Fault::PortUp { at_ms, .. }
            | Fault::PortFlap { at_ms, .. }
            | Fault::LinkDown { at_ms, .. }
            | Fault::LinkUp { at_ms, .. }
            | Fault::SwitchDown { at_ms, .. }
            | Fault::SwitchUp { at_ms, .. }
            | Fault::SmFailover { at_ms, .. }
            | Fault::MadLoss { at_ms, .. }
            | Fault::DeviceFatal { at_ms, .. } => *at_ms,
        }
    }

    /// When the fault's last effect happens (the end of a flap or loss burst).
    pub fn end_ms(&self) -> u64 {
        match self {
            Fault::PortFlap {
                at_ms,
                down_ms,
                up_ms,
                count,
                ..
            } => at_ms
                .saturating_add(u64::from(*count).saturating_mul(*down_ms))
                .saturating_add(u64::from(count.saturating_sub(1)).saturating_mul(*up_ms)),
            Fault::MadLoss {
                at_ms, duration_ms, ..
            } => at_ms.saturating_add(*duration_ms),
            f => f.at_ms(),
        }
    }
}

/// Faults generated from the seed: `count` faults between `start_ms` and `end_ms`, each
/// undone (port up, link restored, switch back) within `max_outage_ms`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RandomFaults {
    /// Number of faults.
    pub count: u32,
    /// Earliest fault.
    pub start_ms: u64,
    /// Latest fault (every outage ends by then too).
    pub end_ms: u64,
    /// Longest outage.
    pub max_outage_ms: u64,
    /// Include `device_fatal` faults (they lose connections by design).
    pub device_fatal: bool,
}

impl Default for RandomFaults {
    fn default() -> RandomFaults {
        RandomFaults {
            count: 6,
            start_ms: 300,
            end_ms: 3000,
            max_outage_ms: 1500,
            device_fatal: false,
        }
    }
}

impl Scenario {
    /// Parse a scenario from TOML text. Errors name the line.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        if let Err(ScenarioError::Invalid { line: None, what }) = s.validate() {
            // Point at the line that holds the offending value when it can be found.
            let line = find_line(text, &what);
            return Err(ScenarioError::Invalid { line, what });
        }
        s.validate()?;
        Ok(s)
    }

    /// Check that names resolve and numbers are in range.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let t = &self.topology;
        if t.hosts < 2 {
            return Err(invalid(format!(
                "topology.hosts = {}: need at least 2 hosts",
                t.hosts
            )));
        }
        if t.hosts > 4096 {
            return Err(invalid(format!(
                "topology.hosts = {}: at most 4096 hosts",
                t.hosts
            )));
        }
        if !(1..=2).contains(&t.ports) {
            return Err(invalid(format!(
                "topology.ports = {}: hosts have 1 or 2 ports",
                t.ports
            )));
        }
        if t.lmc > 2 {
            return Err(invalid(format!("topology.lmc = {}: use 0, 1 or 2", t.lmc)));
        }
        if self.workload.message_interval_ms == 0 {
            return Err(invalid(
                "workload.message_interval_ms = 0: must be at least 1",
            ));
        }
        if self.workload.connections > 1_000_000 {
            return Err(invalid("workload.connections: at most 1000000"));
        }
        if self.duration_ms == 0 {
            return Err(invalid("duration_ms = 0: nothing to simulate"));
        }
        // Times are kept in nanoseconds: cap every duration far below where that
        // overflows (a million seconds is eleven days of simulated time).
        const MAX_MS: u64 = 1_000_000_000;
        let f = &self.fabric;
        let times: [(&str, u64); 21] = [
            ("duration_ms", self.duration_ms),
            (
                "workload.message_interval_ms",
                self.workload.message_interval_ms,
            ),
            ("fabric.hop_latency_us", f.hop_latency_us),
            ("fabric.mad_processing_us", f.mad_processing_us),
            ("fabric.command_latency_us", f.command_latency_us),
            ("fabric.event_latency_us", f.event_latency_us),
            ("fabric.sweep_interval_ms", f.sweep_interval_ms),
            ("fabric.trap_sweep_delay_ms", f.trap_sweep_delay_ms),
            ("fabric.report_timeout_ms", f.report_timeout_ms),
            ("fabric.sm_failover_ms", f.sm_failover_ms.unwrap_or(0)),
            ("fabric.smp_rtt_us", f.smp_rtt_us),
            ("fabric.transaction_timeout_ms", f.transaction_timeout_ms),
            (
                "fabric.transaction_retries",
                u64::from(f.transaction_retries),
            ),
            (
                "fabric.sminfo_polling_timeout_ms",
                f.sminfo_polling_timeout_ms,
            ),
            (
                "fabric.polling_retry_number",
                u64::from(f.polling_retry_number),
            ),
            ("fabric.sa_fifo_timeout_ms", f.sa_fifo_timeout_ms),
            ("fabric.max_wire_smps", u64::from(f.max_wire_smps)),
            ("fabric.sa_timeout_ms", f.sa_timeout_ms),
            ("fabric.report_retries", u64::from(f.report_retries)),
            ("fabric.sa_tries", u64::from(f.sa_tries)),
            ("fabric.sa_rate_per_s", f.sa_rate_per_s),
        ];
        for (name, v) in times {
            if v > MAX_MS {
                return Err(invalid(format!("{name} = {v}: too large for a simulation")));
            }
        }
        for fault in &self.faults {
            if fault.end_ms() > MAX_MS {
                return Err(invalid(format!(
                    "a fault at {} ms ends after {MAX_MS} ms: too late for a simulation",
                    fault.at_ms()
                )));
            }
        }
        if f.ack_timeout > 31 || f.ack_timeout == 0 {
            return Err(invalid(format!(
                "fabric.ack_timeout = {}: use 1..=31",
                f.ack_timeout
            )));
        }
        if !(0.0..=1.0).contains(&f.mad_loss) {
            return Err(invalid(format!(
                "fabric.mad_loss = {}: a probability in 0..=1",
                f.mad_loss
            )));
        }
        let at_least_one: [(&str, u64); 7] = [
            ("fabric.sweep_interval_ms", f.sweep_interval_ms),
            ("fabric.sa_tries", u64::from(f.sa_tries)),
            ("fabric.report_timeout_ms", f.report_timeout_ms),
            ("fabric.sa_rate_per_s", f.sa_rate_per_s),
            ("fabric.max_wire_smps", u64::from(f.max_wire_smps)),
            ("fabric.transaction_timeout_ms", f.transaction_timeout_ms),
            (
                "fabric.sminfo_polling_timeout_ms",
                f.sminfo_polling_timeout_ms,
            ),
        ];
        for (name, v) in at_least_one {
            if v == 0 {
                return Err(invalid(format!("{name} = 0: must be at least 1")));
            }
        }
        if f.subnet_timeout > 31 {
            return Err(invalid(format!(
                "fabric.subnet_timeout = {}: use 0..=31",
                f.subnet_timeout
            )));
        }
        // Names are resolved against the built fabric.
        let fabric = crate::fabric::Fabric::build(t).map_err(invalid)?;
        for fault in &self.faults {
            check_fault(&fabric, fault).map_err(invalid)?;
        }
        if let Some(r) = &self.random_faults {
            if r.end_ms < r.start_ms {
                return Err(invalid("random_faults.end_ms is before start_ms"));
            }
            if r.end_ms > MAX_MS || r.max_outage_ms > MAX_MS || r.count > 100_000 {
                return Err(invalid(
                    "random_faults: too many or too late for a simulation",
                ));
            }
        }
        Ok(())
    }

    /// Every fault to apply: the fixed ones and those generated from `seed`.
    pub fn all_faults(&self, seed: u64) -> Vec<Fault> {
        let mut faults = self.faults.clone();
        if let Some(r) = &self.random_faults {
            // Built from a sub-stream so the faults of a seed do not depend on anything
            // else the simulation draws.
            let fabric = match crate::fabric::Fabric::build(&self.topology) {
                Ok(f) => f,
                Err(_) => return faults,
            };
            faults.extend(generate_faults(&fabric, r, seed));
        }
        faults.sort_by_key(Fault::at_ms);
        faults
    }
}

fn check_fault(fabric: &crate::fabric::Fabric, fault: &Fault) -> Result<(), String> {
    match fault {
        Fault::PortDown { port, .. } | Fault::PortUp { port, .. } => {
            fabric.port_by_name(port).map(|_| ())
        }
        Fault::PortFlap { port, count, .. } => {
            if *count == 0 {
                return Err(format!("port_flap of {port}: count must be at least 1"));
            }
            fabric.port_by_name(port).map(|_| ())
        }
        Fault::LinkDown { link, .. } | Fault::LinkUp { link, .. } => {
            fabric.link_by_name(link).map(|_| ())
        }
        Fault::SwitchDown { switch, .. } | Fault::SwitchUp { switch, .. } => {
            fabric.switch_by_name(switch).map(|_| ())
        }
        Fault::SmFailover { subnet, .. } => {
            if *subnet >= fabric.subnets() {
                Err(format!(
                    "sm_failover: subnet {subnet} does not exist (the fabric has {})",
                    fabric.subnets()
                ))
            } else {
                Ok(())
            }
        }
        Fault::MadLoss { rate, .. } => {
            if (0.0..=1.0).contains(rate) {
                Ok(())
            } else {
                Err(format!("mad_loss rate {rate}: a probability in 0..=1"))
            }
        }
        Fault::DeviceFatal { host, .. } => fabric.host_by_name(host).map(|_| ()),
    }
}

/// The 1-based line of the first line of `text` that contains a quoted name or number
/// mentioned in `what` (best effort: validation works on parsed values).
fn find_line(text: &str, what: &str) -> Option<usize> {
    let needles: Vec<&str> = what
        .split(['"', ' ', ':', ','])
        .filter(|w| w.len() >= 2 && !w.chars().all(|c| c.is_ascii_lowercase()))
        .collect();
    for needle in needles {
        if let Some((i, _)) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(needle) && !l.trim_start().starts_with('#'))
        {
            return Some(i + 1);
        }
    }
    // Fall back on a `key = value` from the message.
    let key = what.split([' ', '=']).next()?.rsplit('.').next()?;
    text.lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with(key))
        .map(|(i, _)| i + 1)
}

/// Random faults over the fabric's ports, links, switches and SMs, each undone later.
fn generate_faults(fabric: &crate::fabric::Fabric, r: &RandomFaults, seed: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed).fork(0xfa17);
    let mut out = Vec::new();
    let span = r.end_ms.saturating_sub(r.start_ms).max(1);
    for _ in 0..r.count {
        let at = r.start_ms + rng.below(span);
        let outage = rng.range(20, r.max_outage_ms.max(20));
        let back = (at + outage).min(r.end_ms.max(at + 1));
        let kinds = if r.device_fatal { 7 } else { 6 };
        match rng.below(kinds) {
            0 | 1 => {
                let port = fabric.port_name(rng.below(fabric.num_ports() as u64) as usize);
                out.push(Fault::PortDown {
                    at_ms: at,
                    port: port.clone(),
                });
                out.push(Fault::PortUp { at_ms: back, port });
            }
            2 => {
                let port = fabric.port_name(rng.below(fabric.num_ports() as u64) as usize);
                let down = rng.range(10, 400);
                let up = rng.range(10, 400);
                let count = rng.range(2, 4) as u32;
                out.push(Fault::PortFlap {
                    at_ms: at,
                    port,
                    down_ms: down,
                    up_ms: up,
                    count,
                });
            }
            3 if fabric.num_links() > 0 => {
                let link = fabric.link_name(rng.below(fabric.num_links() as u64) as usize);
                out.push(Fault::LinkDown {
                    at_ms: at,
                    link: link.clone(),
                });
                out.push(Fault::LinkUp { at_ms: back, link });
            }
            4 if fabric.num_switches() > 0 => {
                let switch = fabric.switch_name(rng.below(fabric.num_switches() as u64) as usize);
                out.push(Fault::SwitchDown {
                    at_ms: at,
                    switch: switch.clone(),
                });
                out.push(Fault::SwitchUp {
                    at_ms: back,
                    switch,
                });
            }
            5 => {
                if rng.chance(0.5) {
                    out.push(Fault::SmFailover {
                        at_ms: at,
                        subnet: rng.below(fabric.subnets() as u64) as usize,
                    });
                } else {
                    out.push(Fault::MadLoss {
                        at_ms: at,
                        duration_ms: outage,
                        rate: [0.1, 0.5, 1.0][rng.below(3) as usize],
                    });
                }
            }
            6 => out.push(Fault::DeviceFatal {
                at_ms: at,
                host: format!("h{}", rng.below(fabric.num_hosts() as u64)),
            }),
            // A link or switch fault drawn for a fabric without any: nothing to break.
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_validates() {
        Scenario::default().validate().unwrap();
    }

    #[test]
    fn absurd_numbers_are_errors_not_overflows() {
        for text in [
            "duration_ms = 18446744073709551615\n",
            "[fabric]\nhop_latency_us = 18446744073709551615\n",
            "[[faults]]\nkind = \"port_flap\"\nat_ms = 1\nport = \"h1:1\"\ndown_ms = 18446744073709551615\nup_ms = 1\ncount = 9\n",
            "[random_faults]\nend_ms = 18446744073709551615\n",
        ] {
            assert!(Scenario::from_toml(text).is_err(), "{text}");
        }
    }

    #[test]
    fn bad_toml_names_the_line() {
        let e = Scenario::from_toml("name = \"x\"\nduration_ms = \"long\"\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = Scenario::from_toml("[topology]\nhostz = 3\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let text = "[[faults]]\nkind = \"switch_down\"\nat_ms = 5\nswitch = \"Q\"\n";
        let e = Scenario::from_toml(text).unwrap_err();
        assert!(e.to_string().contains("line 4"), "{e}");
    }
}
