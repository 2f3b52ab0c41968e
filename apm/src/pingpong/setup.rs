//! `apm pingpong`'s set-up: the device and protection mode, apm's control channel, the
//! out-of-band hello over TCP, the paths, the connected RC QP and the running apm
//! `Manager` that protects it. Nothing here sends a numbered message: that is
//! `traffic.rs`, once both sides said they are ready.

// A driver with real devices and a wall clock (it waits for a starting server).
#![allow(clippy::disallowed_methods)]

use super::rail_channels::RailChannels;
use super::{mode_name, Args, ModeArg, DEPTH, SLOT};
use anyhow::{bail, Context as _, Result};
use apm_core::{
    ConnId, ConnSpec, Manager, ManagerHandle, MigrationMode, Notification, Path, PortKey, Qpn,
    Role, StaticPaths,
};
use provider_rxe::{ConnectParams, RcConn, RxeConfig, RxeQpControl};
use provider_verbs::ffi::{AddressVector, Context, LinkLayer, Mtu, PortAttr, Verbs};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What the two sides tell each other over TCP before connecting.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Hello {
    qpn: u32,
    psn: u32,
    lid: u16,
    alt_lid: u16,
    pub(super) rails: Vec<IpAddr>,
    control: Option<SocketAddr>,
    comm_id: u32,
    mtu: u8,
    infiniband: bool,
    /// Protected by hardware APM (else software migration).
    hardware: bool,
}

/// Messages on the TCP control connection after the hello.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(super) enum Ctl {
    Ready,
    Done { sent: u64 },
    Bye,
}

/// The task apm's `Manager` runs on.
pub(super) type ManagerTask = tokio::task::JoinHandle<Result<(), apm_core::ManagerError>>;

/// A connected, protected ping-pong, ready for traffic.
pub(super) struct Session {
    pub(super) t0: Instant,
    pub(super) role: &'static str,
    pub(super) infiniband: bool,
    pub(super) hardware: bool,
    /// apm protects the connection (not `--mode none`).
    pub(super) protected: bool,
    pub(super) rc: Arc<RcConn>,
    pub(super) conn: ConnId,
    pub(super) primary: Path,
    pub(super) peer: Hello,
    pub(super) lines: Lines<BufReader<OwnedReadHalf>>,
    pub(super) wr: OwnedWriteHalf,
    pub(super) handle: ManagerHandle,
    pub(super) manager_task: ManagerTask,
    pub(super) notes: tokio::sync::broadcast::Receiver<Notification>,
    /// The peer channels' authenticators (control and rails), with `--peer-key`.
    pub(super) peer_auth: Option<Vec<Arc<cm_lap::auth::Authenticator>>>,
}

impl Session {
    /// Milliseconds since the session started.
    pub(super) fn ms(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64() * 1e3
    }
}

/// Print a progress line: on stdout, or on stderr with `--json` (stdout is the report).
pub(super) fn say(args: &Args, line: String) {
    if args.json {
        crate::out::errln!("{line}");
    } else {
        // A closed stdout does not stop the exchange (the peer counts on it); the report
        // at the end says it.
        let _ = crate::out::outln!("{line}");
    }
}

/// Whether this side protects the connection with hardware APM: always on InfiniBand;
/// on RoCE as `--mode` says, `auto` asking the kernel whether it accepts alternate paths
/// on the port (the capability bit and the link layer cannot tell: stock soft-RoCE
/// advertises APM and the stock kernel refuses alternate paths on RoCE).
fn hardware_mode(ctx: &Context, args: &Args, infiniband: bool) -> Result<bool> {
    if infiniband {
        if args.mode == ModeArg::Software {
            bail!("software path migration is for RoCE; InfiniBand uses hardware APM");
        }
        return Ok(true);
    }
    if args.mode == ModeArg::None {
        return Ok(false);
    }
    let available = provider_verbs::hw_apm::available(ctx, args.port);
    match (args.mode, available) {
        (ModeArg::Software | ModeArg::None, _) => Ok(false),
        (ModeArg::Hardware, Err(e)) => Err(anyhow::anyhow!("--mode hardware: {e}")),
        (_, Ok(())) => Ok(true),
        (ModeArg::Auto, Err(e)) => {
            tracing::info!(reason = %e, "no hardware APM here: software path migration");
            Ok(false)
        }
    }
}

/// One JSON line on the TCP control connection.
pub(super) async fn send_line<T: Serialize>(w: &mut OwnedWriteHalf, v: &T) -> Result<()> {
    let mut s = serde_json::to_string(v)?;
    s.push('\n');
    w.write_all(s.as_bytes()).await?;
    Ok(())
}

/// apm's control channel (cm-lap over UDP), authenticated with `--peer-key`.
/// The control address the hello advertises: `--control-advertise`, else the channel's
/// own, an unspecified one replaced by the address the TCP connection left from.
fn control_address(
    args: &Args,
    udp: &cm_lap::udp::UdpPeerChannel,
    tcp_local: SocketAddr,
) -> Result<SocketAddr> {
    let a = udp.local_addr()?;
    let ip = match args.control_advertise {
        Some(ip) => ip,
        None if a.ip().is_unspecified() => tcp_local.ip(),
        None => a.ip(),
    };
    Ok(SocketAddr::new(ip, a.port()))
}

/// Protect the connection once the manager runs: it takes the ports its provider
/// reported at start before it serves any request, so its answer says it is ready.
async fn protect_when_ready(handle: &apm_core::ManagerHandle, spec: ConnSpec) -> Result<()> {
    handle
        .stats()
        .await
        .context("apm's manager did not start")?;
    handle
        .protect(spec)
        .await
        .context("protecting the connection")
}

/// Protect the connection unless `--mode none` asks for the bare QP; whether it did.
async fn protect_unless_none(
    args: &Args,
    handle: &apm_core::ManagerHandle,
    spec: ConnSpec,
) -> Result<bool> {
    if args.mode == ModeArg::None {
        return Ok(false);
    }
    protect_when_ready(handle, spec).await?;
    Ok(true)
}

async fn control_channel(
    args: &Args,
    port: PortKey,
) -> Result<(cm_lap::udp::UdpPeerChannel, Option<cm_lap::auth::Key>)> {
    let udp = cm_lap::udp::UdpPeerChannel::bind(args.control, port)
        .await
        .with_context(|| format!("binding the apm control socket {}", args.control))?;
    let key = args
        .peer_key
        .as_ref()
        .map(|path| cm_lap::auth::Key::from_file(path))
        .transpose()?;
    Ok((authenticated(udp, key.as_ref()), key))
}

/// `udp` authenticating with `key` (`--peer-key`), or as it is without one.
fn authenticated(
    udp: cm_lap::udp::UdpPeerChannel,
    key: Option<&cm_lap::auth::Key>,
) -> cm_lap::udp::UdpPeerChannel {
    match key {
        Some(k) => udp.with_auth(
            cm_lap::auth::Mode::Require(k.clone()),
            cm_lap::auth::DEFAULT_MAX_SKEW,
        ),
        None => udp,
    }
}

/// The TCP connection to the peer: connect as the client (retrying while the server
/// starts), or accept one as the server.
async fn tcp_stream(args: &Args) -> Result<TcpStream> {
    let Some(addr) = args.connect else {
        let l = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        say(
            args,
            format!("server: waiting for a client on {}", args.listen),
        );
        return Ok(l.accept().await.context("accepting the client")?.0);
    };
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < until => {
                tracing::debug!(error = %e, "server not there yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to the server at {addr}")),
        }
    }
}

/// The LID of the alternate path's local end on InfiniBand (0 on RoCE).
fn alternate_lid(ctx: &Context, args: &Args, infiniband: bool) -> Result<u16> {
    if !infiniband {
        return Ok(0);
    }
    let alt_port = args.alt_port.unwrap_or(args.port);
    let p = ctx.query_port(alt_port).context("query alternate port")?;
    if alt_port != args.port {
        return Ok(p.lid);
    }
    // Same port: the next LID of its LMC range, when it has one.
    if p.lmc == 0 {
        bail!("InfiniBand needs --alt-port or a port with LMC > 0 for an alternate path");
    }
    Ok(p.lid + 1)
}

/// Send our hello, read the peer's, and check that the two sides agree.
async fn greet(
    me: &Hello,
    wr: &mut OwnedWriteHalf,
    lines: &mut Lines<BufReader<OwnedReadHalf>>,
    rails: usize,
) -> Result<Hello> {
    send_line(wr, me).await?;
    let peer: Hello = serde_json::from_str(
        &lines
            .next_line()
            .await?
            .context("the peer closed the connection before its hello")?,
    )
    .context("the peer's hello")?;
    if peer.infiniband != me.infiniband {
        bail!("one side is InfiniBand, the other RoCE");
    }
    if peer.hardware != me.hardware {
        bail!(
            "this side protects with {}, the peer with {}: give both the same --mode",
            mode_name(me.hardware),
            mode_name(peer.hardware)
        );
    }
    if !me.infiniband && peer.rails.len() != rails {
        bail!(
            "rails differ: {rails} here, {} at the peer (give them in the same order on both \
             sides)",
            peer.rails.len()
        );
    }
    Ok(peer)
}

/// The paths, from this side's point of view: the primary first.
fn paths(args: &Args, pattr: &PortAttr, me: &Hello, peer: &Hello, mtu: u8) -> Vec<Path> {
    if !me.infiniband {
        let port_key = PortKey::new(0, args.port);
        return args
            .rails
            .iter()
            .zip(&peer.rails)
            .map(|(l, r)| provider_rxe::roce_path(port_key, *l, *r, mtu, args.ack_timeout))
            .collect();
    }
    let mk = |port: u8, slid: u16, dlid: u16| {
        Path::ib(
            PortKey::new(0, port),
            (apm_core::Lid::from_wire(slid), apm_core::Gid::default()),
            (apm_core::Lid::from_wire(dlid), apm_core::Gid::default()),
            mtu,
            args.ack_timeout,
        )
    };
    let alt_port = args.alt_port.unwrap_or(args.port);
    let alt_slid = if alt_port == args.port {
        pattr.lid + 1
    } else {
        me.alt_lid
    };
    vec![
        mk(args.port, pattr.lid, peer.lid),
        mk(alt_port, alt_slid, peer.alt_lid),
    ]
}

/// apm's `Manager` over the QP, running on its own task: provider-verbs' facet (hardware
/// APM) or provider-rxe's (software migration), the UDP channel, and the two paths as
/// the fabric.
fn start_manager(
    args: &Args,
    ctx: &Context,
    rc: &Arc<RcConn>,
    conn: ConnId,
    hardware: bool,
    udp: RailChannels,
    paths: Vec<Path>,
) -> Result<(ManagerHandle, ManagerTask)> {
    let fabric = StaticPaths::new(paths.clone());
    let policy = args.policy()?;
    if hardware {
        let facet = provider_verbs::VerbsQpControl::new(vec![ctx.clone()]);
        facet
            .register(conn, rc.qp().clone())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let (m, h) = Manager::new(Arc::new(apm_core::Stack::new(facet, udp, fabric)), policy)?;
        return Ok((h, tokio::spawn(m.run())));
    }
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
    // Each path's source GID index known before a move needs it (a scan of the table
    // otherwise, on the move's critical path).
    facet.keep_warm(paths);
    let (m, h) = Manager::new(Arc::new(apm_core::Stack::new(facet, udp, fabric)), policy)?;
    Ok((h, tokio::spawn(m.run())))
}

/// Connect the RC QP to the peer on `primary`, and post every receive (receives can be
/// posted from INIT on; both sides post before saying ready).
fn connect_qp(
    args: &Args,
    ctx: &Context,
    rc: &RcConn,
    peer: &Hello,
    psn: u32,
    mtu: u8,
    primary: &Path,
) -> Result<()> {
    let av = if peer.infiniband {
        AddressVector {
            dlid: peer.lid,
            port_num: args.port,
            ..AddressVector::default()
        }
    } else {
        provider_rxe::address_vector(ctx, primary).map_err(|e| anyhow::anyhow!("{e}"))?
    };
    rc.connect(
        ConnectParams {
            remote_qpn: peer.qpn,
            remote_psn: peer.psn,
            local_psn: psn,
            mtu: Mtu::from_code(mtu),
            timeout: args.ack_timeout,
            retry_cnt: args.retry_cnt,
            rnr_retry: 7,
        },
        av,
    )?;
    for i in 0..DEPTH {
        rc.post_recv(u64::from(i), i as usize * SLOT, SLOT)?;
    }
    Ok(())
}

/// The connection as apm protects it: `paths[0]` the primary, the rest candidates, the
/// first of them agreed with the peer.
fn conn_spec(
    id: ConnId,
    client: bool,
    hardware: bool,
    rc: &RcConn,
    me: &Hello,
    peer: &Hello,
    paths: &[Path],
) -> Result<ConnSpec> {
    Ok(ConnSpec {
        id,
        role: if client { Role::Active } else { Role::Passive },
        mode: if hardware {
            MigrationMode::Hardware
        } else {
            MigrationMode::Software
        },
        local_qpn: Qpn::new(rc.qp_num()).context("QPN")?,
        remote_qpn: Qpn::new(peer.qpn).context("peer QPN")?,
        local_comm_id: me.comm_id,
        remote_comm_id: peer.comm_id,
        primary: paths[0],
        agreed_alternate: paths.get(1).copied(),
        candidates: paths.iter().skip(1).copied().collect(),
    })
}

/// Say ready and wait until the peer says so too.
async fn wait_ready(
    wr: &mut OwnedWriteHalf,
    lines: &mut Lines<BufReader<OwnedReadHalf>>,
) -> Result<()> {
    send_line(wr, &Ctl::Ready).await?;
    loop {
        let l = lines
            .next_line()
            .await?
            .context("the peer left before it was ready")?;
        if matches!(serde_json::from_str(&l), Ok(Ctl::Ready)) {
            return Ok(());
        }
    }
}

/// The channels to the peer: the control channel, which carries messages for every path
/// GID to the peer's control address, and a channel per rail, so that each rail's
/// messages (its probes) take that rail; with `key`, the authenticators of them all.
async fn peer_channels(
    args: &Args,
    role: &str,
    udp: cm_lap::udp::UdpPeerChannel,
    key: Option<cm_lap::auth::Key>,
    paths: &[Path],
    peer_ctl: SocketAddr,
) -> (RailChannels, Option<Vec<Arc<cm_lap::auth::Authenticator>>>) {
    for p in paths {
        udp.add_peer(p.dgid, peer_ctl);
    }
    let (peers, notes) = RailChannels::bind(udp, paths, peer_ctl.port(), |ch| {
        authenticated(ch, key.as_ref())
    })
    .await;
    for n in notes {
        say(args, format!("{role}: {n}"));
    }
    let auth = key.as_ref().map(|_| peers.authenticators());
    (peers, auth)
}

/// Open the device, meet the peer, connect the QP, protect it, and wait until the peer
/// is ready too.
pub(super) async fn start(args: &Args) -> Result<Session> {
    let t0 = Instant::now();
    let client = args.connect.is_some();
    let role = if client { "client" } else { "server" };
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
    let hardware = hardware_mode(&ctx, args, infiniband)?;
    let port_key = PortKey::new(0, args.port);
    let rc = Arc::new(RcConn::create(
        &ctx,
        args.port,
        DEPTH,
        2 * DEPTH as usize * SLOT,
    )?);
    let psn = (std::process::id().wrapping_mul(2654435761)) & 0xFFFFFF;

    // apm's control channel: bound first so its address goes in the hello.
    let (udp, key) = control_channel(args, port_key).await?;
    let stream = tcp_stream(args).await?;
    let tcp_local = stream.local_addr()?;
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    let control = Some(control_address(args, &udp, tcp_local)?);
    let me = Hello {
        qpn: rc.qp_num(),
        psn,
        lid: pattr.lid,
        alt_lid: alternate_lid(&ctx, args, infiniband)?,
        rails: args.rails.clone(),
        control,
        comm_id: if client { 0xC11E_0001 } else { 0x5E4E_0001 },
        mtu: pattr.active_mtu.code().clamp(1, 3),
        infiniband,
        hardware,
    };
    let peer = greet(&me, &mut wr, &mut lines, args.rails.len()).await?;
    let mtu = me.mtu.min(peer.mtu).max(1);
    let paths = paths(args, &pattr, &me, &peer, mtu);
    let primary = paths[0];
    connect_qp(args, &ctx, &rc, &peer, psn, mtu, &primary)?;

    let conn = ConnId(1);
    let spec = conn_spec(conn, client, hardware, &rc, &me, &peer, &paths)?;
    let peer_ctl = peer
        .control
        .context("the peer sent no apm control address")?;
    // Messages for any of the peer's path GIDs go to its control address (on InfiniBand
    // the paths carry no GIDs: the one key is the zero GID).
    let (peers, peer_auth) = peer_channels(args, role, udp, key, &paths, peer_ctl).await;
    let (handle, manager_task) = start_manager(args, &ctx, &rc, conn, hardware, peers, paths)?;
    let notes = handle.notifications();
    let protected = protect_unless_none(args, &handle, spec).await?;
    say(
        args,
        format!(
            "{role}: {} qpn {:#x} <-> qpn {:#x}, primary {primary}, {} mode",
            args.device,
            rc.qp_num(),
            peer.qpn,
            if protected {
                mode_name(hardware)
            } else {
                "unprotected"
            }
        ),
    );
    wait_ready(&mut wr, &mut lines).await?;
    Ok(Session {
        t0,
        role,
        infiniband,
        hardware,
        protected,
        rc,
        conn,
        primary,
        peer,
        lines,
        wr,
        handle,
        manager_task,
        notes,
        peer_auth,
    })
}
