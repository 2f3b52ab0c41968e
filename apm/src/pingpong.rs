//! `apm pingpong`: an RC ping-pong in the spirit of `ibv_rc_pingpong`, protected by apm,
//! that counts every message so a failover's cost is visible.
//!
//! Two processes (a server and a client) exchange QPN, PSN, rail addresses and their
//! apm control address over TCP, connect one RC QP pair, put it under apm's protection
//! and then send numbered messages both ways at a steady pace. On RoCE (soft-RoCE or
//! RoCE NICs) each `--rail` is one local IP address whose RoCE v2 GID is a path, the
//! first one the primary, and apm's peer messages go over UDP (cm-lap). There the
//! connection is protected by hardware APM (provider-verbs) when the device and the
//! kernel do it (the kernel accepts alternate paths on the port: the patched soft-RoCE
//! of `kernel/rxe-apm`), else by software path migration (provider-rxe); `--mode`
//! chooses. On InfiniBand it is protected by hardware APM, with the alternate path
//! through `--alt-port` (or the port's next LID with LMC > 0); that mode has not met
//! InfiniBand hardware yet.
//!
//! Every failover apm performs is printed as it happens; at the end each side prints
//! what it sent, received, lost (numbers that never arrived), duplicated (numbers that
//! arrived twice) and the longest stall (the longest time with no message arriving), as
//! text or, with `--json`, as one JSON object on stdout.
//!
//! It is also what `cargo xtask hwtest --vm` drives to prove failover on real rxe.
//!
//! `setup.rs` meets the peer and protects the connection; `traffic.rs` sends, counts
//! and reports.

// A driver with real devices and a wall clock: it paces messages and measures stalls.
#![allow(clippy::disallowed_methods)]

use crate::out::outln;
use crate::values;
use anyhow::{bail, Context as _, Result};
use clap::Args as ClapArgs;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

mod rail_channels;
mod setup;
mod traffic;

/// The long help of `apm pingpong` (main.rs puts it on the subcommand).
pub const LONG_ABOUT: &str =
    "Send numbered messages both ways over one RC connection protected by apm, \
and count what a path failure costs.\n\n\
Start the server first, then the client with --connect. Both sides exchange their QP \
number, first PSN, rail addresses and apm control address over TCP (like \
ibv_rc_pingpong), then both send --count messages (or for --duration) at --interval-ms.\n\n\
RoCE: give each rail as --rail <local IP> in the same order on both sides (the first is \
the primary path, the second the agreed alternate). Where the device and kernel do hardware \
APM (the kernel accepts alternate paths on the port), the QP holds the alternate and \
migrates by itself when its retries on a dead path run out; apm then arms the path it \
left and talks to the peer over UDP (--control). Elsewhere apm watches the connection: \
when sends stop completing for --stall-ms, or a send fails (link down), it asks the peer \
over the alternate to move there and follows in software once it has. --mode chooses \
(both sides must agree). Cut a rail with \
`tc qdisc add dev <rail> root netem loss 100%` or `ip link set <rail> down` to see it.\n\n\
InfiniBand: hardware APM; the alternate path leaves through --alt-port.\n\n\
At the end each side prints sent, received, lost, duplicated and the longest stall \
(--json: one JSON object on stdout; failover lines go to stderr).";

/// Arguments of `apm pingpong`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Connect to a server at this TCP address (client); without it, be the server.
    #[arg(long, value_name = "HOST:PORT")]
    connect: Option<SocketAddr>,
    /// TCP address the server listens on.
    #[arg(long, default_value = "0.0.0.0:18515", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// RDMA device (e.g. rxe0, mlx5_0).
    #[arg(long, short = 'd')]
    device: String,
    /// Port of the device.
    #[arg(long, default_value_t = 1)]
    port: u8,
    /// RoCE: a local IP address whose GID is one path; repeat, primary first.
    #[arg(long = "rail", value_name = "IP")]
    rails: Vec<IpAddr>,
    /// InfiniBand: the local port of the alternate path (default: --port, next LID).
    #[arg(long)]
    alt_port: Option<u8>,
    /// UDP address for apm's peer messages (RoCE); port 0 picks one, told to the peer.
    #[arg(long, default_value = "0.0.0.0:0", value_name = "ADDR:PORT")]
    control: SocketAddr,
    /// IP address the peer should send apm messages to (default: the control address,
    /// or the address of the TCP connection when that is unspecified).
    #[arg(long)]
    control_advertise: Option<IpAddr>,
    /// Messages to send each way.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Send for this many seconds instead of --count messages.
    #[arg(long, value_name = "SECS", value_parser = values::seconds)]
    duration: Option<f64>,
    /// Keep sending until standard input is closed (scripts that decide when to stop).
    #[arg(long)]
    until_stdin_eof: bool,
    /// Pace: one message every this many milliseconds.
    #[arg(long, default_value_t = 1.0, value_parser = values::milliseconds)]
    interval_ms: f64,
    /// Sends in flight at most.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    window: u32,
    /// Progress monitor: outstanding sends with no completion for this long mean the
    /// path is dead (RoCE).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    stall_ms: u64,
    /// QP local ACK timeout exponent (4.096 us * 2^t; 14 is ~67 ms).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    ack_timeout: u8,
    /// QP transport retry count (hardware APM migrates when the retries run out).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    retry_cnt: u8,
    /// How the connection is protected on RoCE: `hardware` APM (the device migrates; the
    /// kernel must accept alternate paths on the port), `software` path migration, or
    /// `auto`: hardware where the kernel accepts alternate paths. InfiniBand is always
    /// hardware. `none` protects nothing: the same traffic on a plain RC QP, a baseline
    /// (one `--rail` is enough).
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    mode: ModeArg,
    /// Run apm's liveness probes on the paths (`[policy.probe] enabled`): a silent cut
    /// is found in `--probe-multiplier` x `--probe-interval-ms`, not by the stall
    /// monitor or the QP's retry budget. Both sides must.
    #[arg(long)]
    probes: bool,
    /// With --probes: the interval between probes on each path.
    #[arg(long, value_name = "MS", default_value_t = apm_core::probe::ProbePolicy::default().interval_ms)]
    probe_interval_ms: u32,
    /// With --probes: probes missed in a row before a path is down.
    #[arg(long, value_name = "N", default_value_t = apm_core::probe::ProbePolicy::default().multiplier)]
    probe_multiplier: u8,
    /// After sending, wait this long at most for the peer's last messages.
    #[arg(long, default_value_t = 20.0, value_parser = values::seconds)]
    drain_secs: f64,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Authenticate apm's peer datagrams with the shared secret in this file (both
    /// sides; mode 0600): unauthenticated, forged or replayed ones are dropped and
    /// counted in the report.
    #[arg(long, value_name = "FILE")]
    peer_key: Option<std::path::PathBuf>,
    /// Run apm's control threads (engine, device events, probes, peer messages, moves)
    /// in the kernel's real-time class, SCHED_FIFO at this priority (1-99), ahead of
    /// the traffic and of every ordinary thread: on busy CPUs a failover's steps then
    /// do not wait for time slices. Needs CAP_SYS_NICE; refused, they run at ordinary
    /// priority and a line says so.
    #[arg(long, value_name = "PRIORITY", value_parser = clap::value_parser!(u8).range(1..=99))]
    realtime: Option<u8>,
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModeArg {
    Auto,
    Hardware,
    Software,
    /// No protection (a baseline).
    None,
}

/// One failover or protection change, as printed.
#[derive(Debug, Clone, Serialize)]
struct Event {
    at_ms: f64,
    kind: String,
    path: Option<String>,
    /// For a failover: `device` (the QP migrated by itself), `forced` (apm forced it),
    /// `peer` (software migration the peer asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    how: Option<&'static str>,
    /// For a failover or a loss of protection with a dead primary: what this side saw
    /// kill the primary (`local_port`, `peer_port`, `fabric`, `stall`).
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'static str>,
}

/// A time with no message arriving.
#[derive(Debug, Clone, Serialize)]
struct Stall {
    at_ms: f64,
    ms: f64,
}

/// The final count.
#[derive(Debug, Clone, Serialize)]
struct Report {
    role: &'static str,
    device: String,
    mode: &'static str,
    sent: u64,
    received: u64,
    peer_sent: Option<u64>,
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
    longest_stall_ms: f64,
    /// When the last message arrived (a connection that died stops there).
    last_arrival_ms: Option<f64>,
    stalls: Vec<Stall>,
    failovers: u64,
    events: Vec<Event>,
    initial_primary: String,
    final_primary: String,
    flushed_sends_replayed: u64,
    flushed_recvs_reposted: u64,
    drain_migrations: u64,
    reinit_migrations: u64,
    /// Peer datagrams the authentication dropped (with --peer-key).
    peer_datagrams_dropped: Option<u64>,
    elapsed_ms: f64,
    /// The wall-clock time (ms since the Unix epoch) every `*_ms` field counts from, so
    /// that another process can put this report's times on its own clock.
    clock_origin_unix_ms: f64,
}

const DEPTH: u32 = 64;
const SLOT: usize = 64;
const MSG: usize = 8;

/// Run `apm pingpong`.
pub fn run(args: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // apm's own work runs on a runtime of its own (see `control_runtime`); it is
    // dropped after the session, outside any async context.
    let control =
        apm::control_runtime::start(args.realtime).context("starting apm's control runtime")?;
    if let Some(why) = &control.priority_refused {
        setup::say(
            &args,
            format!("pingpong: apm's control threads run at ordinary priority: {why}"),
        );
    }
    let args = Arc::new(args);
    let report = rt.block_on(session(Arc::clone(&args), control.runtime.handle().clone()))?;
    drop(control);
    if args.json {
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        outln!(
            "{}: sent {}, received {}, lost {}, duplicated {}, longest stall {:.1} ms, \
             {} failover(s); primary {} (was {})",
            report.role,
            report.sent,
            report.received,
            report.lost,
            report.duplicated,
            report.longest_stall_ms,
            report.failovers,
            report.final_primary,
            report.initial_primary
        )?;
    }
    if report.lost > 0 || report.duplicated > 0 {
        bail!(
            "{} message(s) lost, {} duplicated",
            report.lost,
            report.duplicated
        );
    }
    Ok(())
}

fn mode_name(hardware: bool) -> &'static str {
    if hardware {
        "hardware APM"
    } else {
        "software migration"
    }
}

impl Args {
    /// The engine's policy: the defaults, with the probes `--probes` asks for.
    fn policy(&self) -> Result<apm_core::Policy> {
        let mut policy = apm_core::Policy::default();
        policy.probe = apm_core::probe::ProbePolicy {
            enabled: self.probes,
            interval_ms: self.probe_interval_ms,
            multiplier: self.probe_multiplier,
            down_interval_ms: policy.probe.down_interval_ms.max(self.probe_interval_ms),
            ..policy.probe
        };
        policy.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(policy)
    }
}

/// Set up on the control runtime (the sockets, the device's event pumps and the Manager
/// belong to it), then run the traffic here.
async fn session(args: Arc<Args>, control: tokio::runtime::Handle) -> Result<Report> {
    let setup_args = Arc::clone(&args);
    let s = control
        .spawn(async move { setup::start(&setup_args).await })
        .await
        .context("the set-up task failed")??;
    traffic::run(&args, s).await
}
