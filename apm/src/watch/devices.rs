//! `apm watch` on this machine's devices: provider-verbs' QP facet started on a private
//! sink for the port events, a port query after each, and umad-sa clients for the SA's
//! traps 64/65 on the InfiniBand ports; the SA-only sources ([`super::sa_only`]) share
//! the notice plumbing here. Observes only: never modifies a port or a QP.

use super::exec::Stop;
use super::{read_back, sa_only, wall_clock, Args, EventKind, PortNow, Raw, Sink, Source};
use crate::out::errln;
use anyhow::{bail, Context as _};
use apm_core::{Gid, Input, QpControl};
use provider_verbs::ffi::{Context, LinkLayer, Verbs, VerbsError};
use provider_verbs::VerbsQpControl;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a source hands the watch loop.
pub(super) enum Msg {
    Verbs(Input),
    Sa {
        device: String,
        port: u8,
        gid: Gid,
        /// `GidInService` or `GidOutOfService`.
        kind: EventKind,
    },
}

/// An SA client of one InfiniBand port, kept alive while watching.
pub(super) struct SaPort {
    pub(super) device: String,
    pub(super) port: u8,
    pub(super) client: umad_sa::SaClient,
}

/// libibverbs and the names of its devices, or why there are none (the errors the
/// verbs path has always given).
fn open_verbs() -> anyhow::Result<(Verbs, Vec<String>)> {
    let verbs = Verbs::load().map_err(|e| match e {
        VerbsError::LibraryMissing { .. } => anyhow::anyhow!(
            "{e}\nno RDMA stack here: `apm watch --sim` watches the simulated fabric instead"
        ),
        other => anyhow::Error::new(other).context("loading libibverbs"),
    })?;
    let all: Vec<String> = verbs
        .devices()
        .map_err(|e| {
            anyhow::anyhow!(
                "no RDMA devices usable here ({e}): this kernel has no RDMA support or no \
                 device; `apm watch --sim` watches the simulated fabric instead"
            )
        })?
        .into_iter()
        .map(|d| d.name)
        .collect();
    if all.is_empty() {
        bail!(
            "no RDMA device found (ibv_get_device_list is empty): load a driver or create a \
             soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`), or try \
             `apm watch --sim` for the simulated fabric"
        );
    }
    Ok((verbs, all))
}

pub(super) async fn watch_devices(args: &Args, stop: Stop) -> anyhow::Result<()> {
    if args.ibsim_bed {
        if args.source == Source::Verbs {
            bail!(
                "--ibsim-bed watches SA notices alone: it cannot be combined with --source verbs"
            );
        }
        return sa_only::watch(args, None, stop).await;
    }
    if args.source == Source::Sa {
        return sa_only::watch(args, None, stop).await;
    }
    let (verbs, all) = match open_verbs() {
        Ok(v) => v,
        Err(e) if args.source == Source::Auto => return sa_only::fallback(args, e, stop).await,
        Err(e) => return Err(e),
    };
    for d in &args.devices {
        if !all.contains(d) {
            bail!("no RDMA device {d:?}; devices here: {}", all.join(", "));
        }
    }
    let names: Vec<&String> = all
        .iter()
        .filter(|n| args.devices.is_empty() || args.devices.contains(n))
        .collect();
    let mut contexts = Vec::new();
    for n in &names {
        contexts.push(verbs.open(n).with_context(|| format!("opening {n}"))?);
    }
    let facet = VerbsQpControl::new(contexts.clone());
    let (tx, mut rx) = mpsc::unbounded_channel::<Input>();
    facet
        .start(tx)
        .await
        .map_err(|e| anyhow::anyhow!("watching async events: {e}"))?;
    let (msg_tx, mut msgs) = mpsc::unbounded_channel::<Msg>();
    // The facet's inputs: ports at start (skipped), then events.
    {
        let msg_tx = msg_tx.clone();
        tokio::spawn(async move {
            while let Some(i) = rx.recv().await {
                if msg_tx.send(Msg::Verbs(i)).is_err() {
                    return;
                }
            }
        });
    }
    let sa_ports = watch_ports(args, &contexts, &msg_tx).await?;
    drop(msg_tx);

    #[allow(clippy::disallowed_methods)] // the watcher measures real time
    let start = std::time::Instant::now();
    let deadline = args.timeout.map(Duration::from_secs_f64);
    let mut sink = Sink::new(args, stop.clone());
    let mut stop = stop;
    loop {
        let Some(msg) = next_msg(&mut msgs, start, deadline, &mut stop).await else {
            break;
        };
        let Some((raw, now)) = device_event(msg, &contexts, &sa_ports) else {
            continue;
        };
        if !sink.event(raw, now, wall_clock(), start.elapsed()).await {
            break;
        }
    }
    unsubscribe_all(&sa_ports).await;
    sink.finish()
}

/// A message of the device sources as an event with its port read back; `None` for
/// inputs that are no event (the ports reported at start). A client reregister or an
/// SM change has the port subscribe again first.
fn device_event(
    msg: Msg,
    contexts: &[Context],
    sa_ports: &[Arc<SaPort>],
) -> Option<(Raw, PortNow)> {
    Some(match msg {
        Msg::Verbs(Input::PortEvent { port, event }) => {
            let ctx = contexts.get(usize::from(port.device))?;
            let kind = EventKind::of_port_event(event);
            if matches!(kind, EventKind::ClientReregister | EventKind::SmChange) {
                resubscribe(sa_ports, ctx.name(), port.port);
            }
            (
                Raw {
                    device: ctx.name().to_owned(),
                    port: Some(port.port),
                    kind,
                    gid: None,
                    path: None,
                    source: "verbs",
                },
                read_back(ctx, port.port),
            )
        }
        Msg::Verbs(Input::DeviceFatal { device }) => {
            let ctx = contexts.get(usize::from(device))?;
            (
                Raw {
                    device: ctx.name().to_owned(),
                    port: None,
                    kind: EventKind::DeviceFatal,
                    gid: None,
                    path: None,
                    source: "verbs",
                },
                PortNow::default(),
            )
        }
        Msg::Verbs(_) => return None,
        Msg::Sa {
            device,
            port,
            gid,
            kind,
        } => {
            let now = contexts
                .iter()
                .find(|c| c.name() == device)
                .map(|c| read_back(c, port))
                .unwrap_or_default();
            (sa_raw(device, port, gid, kind), now)
        }
    })
}

/// Name the ports watched and subscribe for SA notices on each InfiniBand one (unless
/// `--no-sa`); say on stderr what is watched and where notices cannot come from.
async fn watch_ports(
    args: &Args,
    contexts: &[Context],
    msg_tx: &mpsc::UnboundedSender<Msg>,
) -> anyhow::Result<Vec<Arc<SaPort>>> {
    let mut watched = Vec::new();
    let mut sa_ports: Vec<Arc<SaPort>> = Vec::new();
    let mut sa_notes = Vec::new();
    for ctx in contexts {
        let ports = ctx
            .query_device()
            .with_context(|| format!("querying {}", ctx.name()))?
            .phys_port_cnt;
        for port in 1..=ports {
            if !args.ports.is_empty() && !args.ports.contains(&port) {
                continue;
            }
            watched.push(format!("{} port {port}", ctx.name()));
            if args.no_sa {
                continue;
            }
            let Ok(p) = ctx.query_port(port) else {
                continue;
            };
            if p.link_layer != LinkLayer::InfiniBand {
                sa_notes.push(format!("{} port {port}: RoCE, no SA", ctx.name()));
                continue;
            }
            match sa_port(ctx.name(), port, msg_tx.clone()).await {
                Ok(sa) => sa_ports.push(Arc::new(sa)),
                Err(e) => {
                    sa_notes.push(format!("{} port {port}: no SA notices ({e:#})", ctx.name()))
                }
            }
        }
    }
    errln!("apm watch: watching {}", watched.join(", "));
    for n in &sa_notes {
        errln!("apm watch: {n}");
    }
    if !sa_ports.is_empty() {
        let list: Vec<String> = sa_ports
            .iter()
            .map(|s| format!("{} port {}", s.device, s.port))
            .collect();
        errln!(
            "apm watch: SA notices (traps 64/65) through {}",
            list.join(", ")
        );
    }
    Ok(sa_ports)
}

/// The next message, or `None` when every source ended, `--timeout` passed or a signal
/// asked the watch to stop.
pub(super) async fn next_msg<T>(
    msgs: &mut mpsc::UnboundedReceiver<T>,
    start: std::time::Instant,
    deadline: Option<Duration>,
    stop: &mut Stop,
) -> Option<T> {
    let recv = async {
        match deadline {
            Some(d) => tokio::time::timeout(d.saturating_sub(start.elapsed()), msgs.recv())
                .await
                .ok()
                .flatten(),
            None => msgs.recv().await,
        }
    };
    tokio::select! {
        m = recv => m,
        _ = stop.wait() => None,
    }
}

/// An SA notice as an event of the port it arrived on.
pub(super) fn sa_raw(device: String, port: u8, gid: Gid, kind: EventKind) -> Raw {
    Raw {
        device,
        port: Some(port),
        kind,
        gid: Some(gid),
        path: None,
        source: "sa",
    }
}

/// Unsubscribe every SA client before leaving.
pub(super) async fn unsubscribe_all(sa_ports: &[Arc<SaPort>]) {
    for sa in sa_ports {
        // Best effort: the SA drops subscriptions of ports that leave anyway.
        let _ =
            tokio::time::timeout(Duration::from_secs(1), sa.client.unsubscribe_gid_traps()).await;
    }
}

/// Open `device`/`port` for SA MADs, subscribe for traps 64/65 and forward notices.
async fn sa_port(device: &str, port: u8, tx: mpsc::UnboundedSender<Msg>) -> anyhow::Result<SaPort> {
    let sa = open_sa_port(device, port, umad::TestBedMode::Off, tx)?;
    sa.client
        .subscribe_gid_traps()
        .await
        .map_err(anyhow::Error::new)?;
    Ok(sa)
}

/// Open `device`/`port` for SA MADs (in `testbed` mode) and forward its notices to `tx`;
/// not subscribed yet.
pub(super) fn open_sa_port(
    device: &str,
    port: u8,
    testbed: umad::TestBedMode,
    tx: mpsc::UnboundedSender<Msg>,
) -> anyhow::Result<SaPort> {
    let opts = umad::PortOptions {
        agents: vec![umad_sa::SA_AGENT],
        testbed,
        ..Default::default()
    };
    let sel = umad::PortSelector::CaPort {
        ca: device.to_owned(),
        port,
    };
    let (p, unsolicited) = umad::Port::open(&sel, opts).map_err(anyhow::Error::new)?;
    let (client, mut notes) =
        umad_sa::SaClient::new(Arc::new(p), unsolicited, umad_sa::SaOptions::default());
    let dev = device.to_owned();
    tokio::spawn(async move {
        while let Some(ev) = notes.recv().await {
            let (gid, kind) = match ev {
                umad_sa::SaEvent::Gid { gid, service } => (gid, EventKind::of_gid_service(service)),
                other => {
                    tracing::debug!(?other, "notice apm watch does not report");
                    continue;
                }
            };
            let msg = Msg::Sa {
                device: dev.clone(),
                port,
                gid: Gid(gid.0),
                kind,
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
    Ok(SaPort {
        device: device.to_owned(),
        port,
        client,
    })
}

/// After a client reregister or SM change the SA has forgotten us: subscribe again.
fn resubscribe(sa_ports: &[Arc<SaPort>], device: &str, port: u8) {
    for sa in sa_ports {
        if sa.device == device && sa.port == port {
            let sa = Arc::clone(sa);
            tokio::spawn(async move {
                if let Err(e) = sa.client.subscribe_gid_traps().await {
                    errln!(
                        "apm watch: subscribing again through {} port {} failed: {e}",
                        sa.device,
                        sa.port
                    );
                }
            });
        }
    }
}
