//! `apm pingpong`: an RC ping-pong in the spirit of `ibv_rc_pingpong`, protected by apm,
//! that counts every message so a failover's cost is visible.
//!
//! Two processes (a server and a client) exchange QPN, PSN, rail addresses and their
//! apm control address over TCP, connect one RC QP pair, put it under apm's protection
//! and then send numbered messages both ways at a steady pace. On RoCE (soft-RoCE or
//! RoCE NICs) the connection is protected by software path migration (provider-rxe) with
//! apm's peer messages over UDP (cm-lap); each `--rail` is one local IP address whose
//! RoCE v2 GID is a path, the first one the primary. On InfiniBand it is protected by
//! hardware APM (provider-verbs), with the alternate path through `--alt-port` (or the
//! port's next LID with LMC > 0); that mode has not met InfiniBand hardware yet.
//!
//! Every failover apm performs is printed as it happens; at the end each side prints
//! what it sent, received, lost (numbers that never arrived), duplicated (numbers that
//! arrived twice) and the longest stall (the longest time with no message arriving), as
//! text or, with `--json`, as one JSON object on stdout.
//!
//! It is also what `cargo xtask hwtest --vm` drives to prove failover on real rxe.

// A driver with real devices and a wall clock: it paces messages and measures stalls.
#![allow(clippy::disallowed_methods)]

use crate::out::{errln, outln};
use crate::values;
use anyhow::{bail, Context as _, Result};
use apm_core::{
    ConnId, ConnSpec, Manager, MigrationMode, NotificationKind, Path, PortKey, Qpn, Role,
    StaticPaths,
};
use clap::Args as ClapArgs;
use provider_rxe::{ConnectParams, RcConn, RxeConfig, RxeQpControl};
use provider_verbs::ffi::{AddressVector, LinkLayer, Mtu, Verbs};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The long help of `apm pingpong` (main.rs puts it on the subcommand).
pub const LONG_ABOUT: &str =
    "Send numbered messages both ways over one RC connection protected by apm, \
and count what a path failure costs.\n\n\
Start the server first, then the client with --connect. Both sides exchange their QP \
number, first PSN, rail addresses and apm control address over TCP (like \
ibv_rc_pingpong), then both send --count messages (or for --duration) at --interval-ms.\n\n\
RoCE: give each rail as --rail <local IP> in the same order on both sides (the first is \
the primary path, the second the agreed alternate). apm watches the connection: when \
sends stop completing for --stall-ms, or a send fails (link down), it moves both QPs to \
the alternate in software and tells the peer over UDP (--control). Cut a rail with \
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
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Progress monitor: outstanding sends with no completion for this long mean the
    /// path is dead (RoCE).
    #[arg(long, default_value_t = 300)]
    stall_ms: u64,
    /// QP local ACK timeout exponent (4.096 us * 2^t; 14 is ~67 ms).
    #[arg(long, default_value_t = 14)]
    ack_timeout: u8,
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
}

/// What the two sides tell each other over TCP before connecting.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Hello {
    qpn: u32,
    psn: u32,
    lid: u16,
    alt_lid: u16,
    rails: Vec<IpAddr>,
    control: Option<SocketAddr>,
    comm_id: u32,
    mtu: u8,
    infiniband: bool,
}

/// Messages on the TCP control connection after the hello.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Ctl {
    Ready,
    Done { sent: u64 },
    Bye,
}

/// One failover or protection change, as printed.
#[derive(Debug, Clone, Serialize)]
struct Event {
    at_ms: f64,
    kind: String,
    path: Option<String>,
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
    let report = rt.block_on(session(&args))?;
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

fn mtu_code(m: Mtu) -> u8 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
        _ => 1,
    }
}

fn mtu_of(code: u8) -> Mtu {
    match code {
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => Mtu::Mtu256,
    }
}

async fn send_line<T: Serialize>(w: &mut tokio::net::tcp::OwnedWriteHalf, v: &T) -> Result<()> {
    let mut s = serde_json::to_string(v)?;
    s.push('\n');
    w.write_all(s.as_bytes()).await?;
    Ok(())
}

async fn session(args: &Args) -> Result<Report> {
    let t0 = Instant::now();
    let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1e3;
    let client = args.connect.is_some();
    let role = if client { "client" } else { "server" };
    let say = |line: String| {
        if args.json {
            errln!("{line}");
        } else {
            // A closed stdout does not stop the exchange (the peer counts on it); the
            // report at the end says it.
            let _ = outln!("{line}");
        }
    };

    let verbs = Verbs::load().map_err(|e| anyhow::anyhow!("{e}"))?;
    let ctx = verbs
        .open(&args.device)
        .with_context(|| format!("opening {}", args.device))?;
    let pattr = ctx.query_port(args.port).context("query port")?;
    let infiniband = pattr.link_layer != LinkLayer::Ethernet;
    if !infiniband && args.rails.is_empty() {
        bail!(
            "{} is RoCE: give its rails with --rail <local IP> (primary first)",
            args.device
        );
    }
    let port_key = PortKey::new(0, args.port);
    let rc = Arc::new(RcConn::create(
        &ctx,
        args.port,
        DEPTH,
        2 * DEPTH as usize * SLOT,
    )?);
    let psn = (std::process::id().wrapping_mul(2654435761)) & 0xFFFFFF;

    // apm's control channel: bound first so its address goes in the hello.
    let udp = cm_lap::udp::UdpPeerChannel::bind(args.control, port_key)
        .await
        .with_context(|| format!("binding the apm control socket {}", args.control))?;
    let udp = match &args.peer_key {
        Some(path) => {
            let key = cm_lap::auth::Key::from_file(path)?;
            udp.with_auth(
                cm_lap::auth::Mode::Require(key),
                cm_lap::auth::DEFAULT_MAX_SKEW,
            )
        }
        None => udp,
    };
    let peer_auth = args.peer_key.as_ref().map(|_| udp.authenticator());
    // Out-of-band exchange.
    let stream = match args.connect {
        Some(addr) => {
            // The server may still be starting: retry for a while.
            let until = Instant::now() + Duration::from_secs(30);
            loop {
                match TcpStream::connect(addr).await {
                    Ok(s) => break s,
                    Err(e) if Instant::now() < until => {
                        tracing::debug!(error = %e, "server not there yet");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("connecting to the server at {addr}"))
                    }
                }
            }
        }
        None => {
            let l = TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("listening on {}", args.listen))?;
            say(format!("server: waiting for a client on {}", args.listen));
            l.accept().await.context("accepting the client")?.0
        }
    };
    let tcp_local = stream.local_addr()?;
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    let control = {
        let a = udp.local_addr()?;
        let ip = match args.control_advertise {
            Some(ip) => ip,
            None if a.ip().is_unspecified() => tcp_local.ip(),
            None => a.ip(),
        };
        Some(SocketAddr::new(ip, a.port()))
    };
    let alt_port = args.alt_port.unwrap_or(args.port);
    let alt_lid = if infiniband {
        let p = ctx.query_port(alt_port).context("query alternate port")?;
        if alt_port == args.port {
            // Same port: the next LID of its LMC range, when it has one.
            if p.lmc == 0 {
                bail!("InfiniBand needs --alt-port or a port with LMC > 0 for an alternate path");
            }
            p.lid + 1
        } else {
            p.lid
        }
    } else {
        0
    };
    let me = Hello {
        qpn: rc.qp_num(),
        psn,
        lid: pattr.lid,
        alt_lid,
        rails: args.rails.clone(),
        control,
        comm_id: if client { 0xC11E_0001 } else { 0x5E4E_0001 },
        mtu: mtu_code(pattr.active_mtu).min(3),
        infiniband,
    };
    send_line(&mut wr, &me).await?;
    let peer: Hello = serde_json::from_str(
        &lines
            .next_line()
            .await?
            .context("the peer closed the connection before its hello")?,
    )
    .context("the peer's hello")?;
    if peer.infiniband != infiniband {
        bail!("one side is InfiniBand, the other RoCE");
    }
    if !infiniband && peer.rails.len() != args.rails.len() {
        bail!(
            "rails differ: {} here, {} at the peer (give them in the same order on both sides)",
            args.rails.len(),
            peer.rails.len()
        );
    }
    let mtu = me.mtu.min(peer.mtu).max(1);

    // Paths, from this side's point of view.
    let paths: Vec<Path> = if infiniband {
        let mk = |port: u8, slid: u16, dlid: u16| Path {
            port: PortKey::new(0, port),
            slid: apm_core::Lid::from_wire(slid),
            dlid: apm_core::Lid::from_wire(dlid),
            sgid: apm_core::Gid::default(),
            dgid: apm_core::Gid::default(),
            sgid_index: 0,
            sl: 0,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            rate: 0,
            mtu,
            pkey_index: 0,
            ack_timeout: args.ack_timeout,
        };
        let alt_slid = if alt_port == args.port {
            pattr.lid + 1
        } else {
            alt_lid
        };
        vec![
            mk(args.port, pattr.lid, peer.lid),
            mk(alt_port, alt_slid, peer.alt_lid),
        ]
    } else {
        args.rails
            .iter()
            .zip(&peer.rails)
            .map(|(l, r)| provider_rxe::roce_path(port_key, *l, *r, mtu, args.ack_timeout))
            .collect()
    };
    let primary = paths[0];
    let av = if infiniband {
        AddressVector {
            dlid: peer.lid,
            port_num: args.port,
            ..AddressVector::default()
        }
    } else {
        provider_rxe::address_vector(&ctx, &primary).map_err(|e| anyhow::anyhow!("{e}"))?
    };
    rc.connect(
        ConnectParams {
            remote_qpn: peer.qpn,
            remote_psn: peer.psn,
            local_psn: psn,
            mtu: mtu_of(mtu),
            timeout: args.ack_timeout,
            retry_cnt: 7,
            rnr_retry: 7,
        },
        av,
    )?;
    // Receives can be posted from INIT on; both sides post before saying ready.
    for i in 0..DEPTH {
        rc.post_recv(u64::from(i), i as usize * SLOT, SLOT)?;
    }

    // apm.
    let conn = ConnId(1);
    let spec = ConnSpec {
        id: conn,
        role: if client { Role::Active } else { Role::Passive },
        mode: if infiniband {
            MigrationMode::Hardware
        } else {
            MigrationMode::Software
        },
        local_qpn: Qpn::new(rc.qp_num()).context("QPN")?,
        remote_qpn: Qpn::new(peer.qpn).context("peer QPN")?,
        local_comm_id: me.comm_id,
        remote_comm_id: peer.comm_id,
        primary,
        agreed_alternate: paths.get(1).copied(),
        candidates: paths.iter().skip(1).copied().collect(),
    };
    let peer_ctl = peer
        .control
        .context("the peer sent no apm control address")?;
    // Messages for any of the peer's path GIDs go to its control address (on InfiniBand
    // the paths carry no GIDs: the one key is the zero GID).
    for p in &paths {
        udp.add_peer(p.dgid, peer_ctl);
    }
    let (handle, manager_task) = if infiniband {
        let facet = provider_verbs::VerbsQpControl::new(vec![ctx.clone()]);
        facet
            .register(conn, rc.qp().clone())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let provider = apm_core::Stack::new(facet, udp, StaticPaths::new(paths.clone()));
        let (m, h) = Manager::new(Arc::new(provider), apm_core::Policy::default())?;
        (h, tokio::spawn(m.run()))
    } else {
        let facet = RxeQpControl::new(
            vec![ctx.clone()],
            RxeConfig {
                stall_timeout: Duration::from_millis(args.stall_ms),
                ..RxeConfig::default()
            },
        );
        facet
            .register(conn, rc.clone())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let provider = apm_core::Stack::new(facet, udp, StaticPaths::new(paths.clone()));
        let (m, h) = Manager::new(Arc::new(provider), apm_core::Policy::default())?;
        (h, tokio::spawn(m.run()))
    };
    let mut notes = handle.notifications();
    // The manager reports its ports before it takes API calls; give it the moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
    handle
        .protect(spec)
        .await
        .context("protecting the connection")?;
    say(format!(
        "{role}: {} qpn {:#x} <-> qpn {:#x}, primary {primary}, {} mode",
        args.device,
        rc.qp_num(),
        peer.qpn,
        if infiniband {
            "hardware APM"
        } else {
            "software migration"
        }
    ));

    send_line(&mut wr, &Ctl::Ready).await?;
    loop {
        let l = lines
            .next_line()
            .await?
            .context("the peer left before it was ready")?;
        if matches!(serde_json::from_str(&l), Ok(Ctl::Ready)) {
            break;
        }
    }

    // Traffic.
    let stdin_closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if args.until_stdin_eof {
        let flag = stdin_closed.clone();
        // A plain thread: blocking stdin reads have no place on the runtime.
        std::thread::spawn(move || {
            // Read and forget: an endless stdin costs one buffer, not memory without end.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let start = Instant::now();
    let interval = Duration::from_secs_f64(args.interval_ms.max(0.01) / 1e3);
    let stop_at = args.duration.map(|d| start + Duration::from_secs_f64(d));
    let window = args.window.clamp(1, DEPTH);
    let (mut sent, mut in_flight, mut next_due) = (0u64, 0u32, start);
    let mut sending = true;
    let mut done_sent = false;
    let mut peer_sent: Option<u64> = None;
    let mut expected = 0u64;
    let (mut received, mut lost, mut dup, mut ooo) = (0u64, 0u64, 0u64, 0u64);
    let mut seen_high = std::collections::BTreeSet::new();
    let mut last_rx: Option<Instant> = None;
    let mut stalls: Vec<Stall> = Vec::new();
    let mut longest = Duration::ZERO;
    let mut events: Vec<Event> = Vec::new();
    let mut current = primary;
    let mut failovers = 0u64;
    let mut drain_deadline: Option<Instant> = None;
    let mut peer_left = false;
    // Keep the peer's MAC resolved on every rail, so a migration does not wait for ARP.
    let rail_pairs: Vec<(IpAddr, IpAddr)> = if infiniband {
        Vec::new()
    } else {
        args.rails
            .iter()
            .copied()
            .zip(peer.rails.iter().copied())
            .collect()
    };
    let mut warmed_at: Option<Instant> = None;

    loop {
        let now = Instant::now();
        if warmed_at.is_none_or(|t| now.saturating_duration_since(t) > Duration::from_secs(5)) {
            for (l, r) in &rail_pairs {
                provider_rxe::route::warm_neighbour(*l, *r);
            }
            warmed_at = Some(now);
        }
        if sending {
            let over = if args.until_stdin_eof {
                stdin_closed.load(std::sync::atomic::Ordering::SeqCst)
            } else {
                stop_at.map_or(sent >= args.count, |s| now >= s)
            };
            if over {
                sending = false;
            } else {
                while in_flight < window && now >= next_due {
                    let slot = (DEPTH as usize + (sent % u64::from(DEPTH)) as usize) * SLOT;
                    rc.write(slot, &sent.to_be_bytes())?;
                    rc.post_send(sent, slot, MSG, None)?;
                    sent += 1;
                    in_flight += 1;
                    next_due += interval;
                    if stop_at.is_none() && !args.until_stdin_eof && sent >= args.count {
                        break;
                    }
                }
                // After a stall, catch up at most a window's worth at once.
                let floor = now.checked_sub(interval * window).unwrap_or(now);
                if next_due < floor {
                    next_due = floor;
                }
            }
        }
        for c in rc.poll(64)? {
            if !c.recv {
                in_flight = in_flight.saturating_sub(1);
                continue;
            }
            let slot = c.wr_id as usize * SLOT;
            let mut b = [0u8; MSG];
            b.copy_from_slice(&rc.read(slot, MSG)?);
            let n = u64::from_be_bytes(b);
            rc.post_recv(c.wr_id, slot, SLOT)?;
            let t = Instant::now();
            if let Some(prev) = last_rx {
                let gap = t.saturating_duration_since(prev);
                longest = longest.max(gap);
                if gap > Duration::from_millis(100) {
                    stalls.push(Stall {
                        at_ms: ms(prev),
                        ms: gap.as_secs_f64() * 1e3,
                    });
                }
            }
            last_rx = Some(t);
            if n == expected {
                received += 1;
                expected += 1;
            } else if n > expected {
                // A gap: count it lost for now; a late arrival moves it to out-of-order.
                received += 1;
                lost += n - expected;
                for m in expected..n {
                    seen_high.insert(m);
                }
                expected = n + 1;
            } else if seen_high.remove(&n) {
                received += 1;
                lost -= 1;
                ooo += 1;
            } else {
                dup += 1;
            }
        }
        if !sending && in_flight == 0 && !done_sent {
            send_line(&mut wr, &Ctl::Done { sent }).await?;
            done_sent = true;
            drain_deadline = Some(Instant::now() + Duration::from_secs_f64(args.drain_secs));
        }
        if peer_left && peer_sent.is_none() {
            // The peer is gone without its count: nothing more will arrive or complete.
            say(format!("{role}: the peer left before it finished"));
            break;
        }
        if done_sent {
            if let Some(ps) = peer_sent {
                if expected >= ps {
                    break;
                }
            }
            if drain_deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        tokio::select! {
            line = lines.next_line(), if !peer_left => {
                match line {
                    Ok(Some(l)) => {
                        if let Ok(Ctl::Done { sent }) = serde_json::from_str(&l) {
                            peer_sent = Some(sent);
                        }
                    }
                    _ => peer_left = true,
                }
            }
            n = notes.recv() => {
                if let Ok(n) = n {
                    let at = ms(Instant::now());
                    let (kind, path) = match &n.kind {
                        NotificationKind::Migrated { primary, forced } => {
                            failovers += 1;
                            let from = current;
                            current = *primary;
                            say(format!(
                                "{role}: FAILOVER at {:.1} s: {} -> {} ({})",
                                at / 1e3,
                                from.sgid,
                                primary.sgid,
                                if *forced { "apm moved first" } else { "peer asked" }
                            ));
                            ("failover".to_owned(), Some(primary.to_string()))
                        }
                        NotificationKind::Protected { alternate, .. } => {
                            ("protected".to_owned(), Some(alternate.to_string()))
                        }
                        NotificationKind::Rearmed { alternate, .. } => {
                            say(format!("{role}: re-armed at {:.1} s: alternate {}", at / 1e3, alternate.sgid));
                            ("rearmed".to_owned(), Some(alternate.to_string()))
                        }
                        NotificationKind::Unprotected { reason } => {
                            say(format!("{role}: unprotected at {:.1} s: {reason:?}", at / 1e3));
                            (format!("unprotected: {reason:?}"), None)
                        }
                        NotificationKind::Lost { reason } => {
                            say(format!("{role}: CONNECTION LOST at {:.1} s: {reason:?}", at / 1e3));
                            (format!("lost: {reason:?}"), None)
                        }
                        other => (format!("{other:?}"), None),
                    };
                    events.push(Event { at_ms: at, kind, path });
                }
            }
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    let _ = send_line(&mut wr, &Ctl::Bye).await;
    if let Some(ps) = peer_sent {
        // Numbers never seen at all by the end.
        lost = ps.saturating_sub(expected) + seen_high.len() as u64;
    }
    let final_primary = handle
        .status(conn)
        .await
        .ok()
        .flatten()
        .map_or(current, |s| s.primary);
    handle.shutdown();
    let _ = manager_task.await;
    let st = rc.stats();
    Ok(Report {
        role,
        device: args.device.clone(),
        mode: if infiniband { "hardware" } else { "software" },
        sent,
        received,
        peer_sent,
        lost,
        duplicated: dup,
        out_of_order: ooo,
        longest_stall_ms: longest.as_secs_f64() * 1e3,
        stalls,
        failovers,
        events,
        initial_primary: primary.to_string(),
        final_primary: final_primary.to_string(),
        flushed_sends_replayed: st.flushed_sends,
        flushed_recvs_reposted: st.flushed_recvs,
        drain_migrations: st.drain_migrations,
        reinit_migrations: st.reinit_migrations,
        peer_datagrams_dropped: peer_auth.map(|a| {
            let c = a.counters().get();
            c.unauthenticated + c.bad_tag + c.other_key + c.replayed + c.stale + c.malformed
        }),
        elapsed_ms: ms(Instant::now()),
    })
}
