//! The fabric's timing and protocol constants, each with the hardware or OpenSM default
//! it follows and where that comes from. Plain data; [`super::Scenario::validate`] checks
//! the ranges.

use serde::{Deserialize, Serialize};

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
    /// MADs the master SM's SA serves per second, one at a time in arrival order: SA
    /// requests (answered when served), the first transmission of each Report (OpenSM
    /// sends a trap's Reports holding the subnet lock the SA needs), and each
    /// ReportResp (OpenSM's receiver retires its transaction). Default 50000 (the figure
    /// Mellanox's scalable-SA design work assumes for one OpenSM).
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
    /// QP retry count (3 bits: 0..=7). Default 7: 8 x 67 ms = 537 ms before a dead path
    /// errors.
    pub retry_cnt: u32,
    /// How long traffic must be stalled before a software-migration QP reports
    /// `PrimaryStalled`, in ACK timeouts (1..=`retry_cnt` + 1). Default 2.
    pub stall_timeouts: u32,
    /// How the HCAs migrate a QP, where the drivers differ: whose ACK timeout applies
    /// after a migration and whether a forced one restarts the retry count. Default
    /// `rdmavt`, the driver every other rule of the QP model follows.
    pub migration: Migration,
}

/// How a device migrates a hardware-APM QP, where the Linux drivers differ. Either way
/// a migration copies the alternate's address vector, port and P_Key into the primary
/// and leaves the QP MIGRATED.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Migration {
    /// rdmavt (hfi1, qib, the kernel's software transport). The QP retries at its one
    /// `timeout`, set only by `IB_QP_TIMEOUT` (`rvt_modify_qp`: `qp->timeout_jiffies`);
    /// a migration copies the alternate's address vector, port and P_Key index
    /// (`rvt_modify_qp` for a forced one, `hfi1_migrate_qp` otherwise) and never its
    /// `alt_timeout`, so the alternate's timeout is not applied. The retry count
    /// restarts on a migration on retry exhaustion only (`hfi1_restart_rc` sets
    /// `s_retry` from `s_retry_cnt` after migrating); a forced migration and one pulled
    /// by the peer's MigReq=1 leave it where it stood.
    #[default]
    Rdmavt,
    /// mlx5 (ConnectX). Each path carries its own ACK timeout in the QP context
    /// (`mlx5_set_path` writes `alt_timeout` into the alternate's address path), so
    /// after a migration the alternate's timeout applies. Whether the firmware restarts
    /// the retry count on a forced or pulled migration is not visible in the driver: the
    /// model restarts it on every migration.
    Mlx5,
}

impl Migration {
    /// The name a scenario writes.
    pub fn name(self) -> &'static str {
        match self {
            Migration::Rdmavt => "rdmavt",
            Migration::Mlx5 => "mlx5",
        }
    }
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
            migration: Migration::Rdmavt,
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
