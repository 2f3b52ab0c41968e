//! `apm watch` on SA notices alone: remote GIDs in and out of service (traps 64/65)
//! through the umad ports libibumad lists, without libibverbs.
//!
//! Used with `--source sa`, and by `--source auto` where libibverbs lists no device but
//! umad ports exist (a node with the kernel's MAD interface and no verbs library, or the
//! ibsim bed, whose umad2sim fakes umad and nothing else). Every selected port gets an
//! SA client subscribed for traps 64 and 65; the output, filters, de-duplication and
//! `--exec` are the verbs path's ([`Sink`]), the port read back after a notice comes from
//! libibumad (state, LID, SM LID, LMC). There are no port events here: nothing reports a
//! port going down or an SM change. Instead each port is looked at every second and
//! subscribed again when it becomes active or its LID or SM LID changes (the SA may have
//! forgotten us); umad-sa's periodic refresh covers what a poll cannot see.
//!
//! `--ibsim-bed` opens the ports in umad's test-bed mode (a NOT_ACTIVE IsSM client, the
//! only way stock ibsim delivers unsolicited Reports); umad refuses that mode unless
//! umad2sim is loaded in this process and the bed's environment is set, and this module
//! never asks for it without the flag.

use super::devices::{next_msg, open_sa_port, sa_raw, unsubscribe_all, Msg, SaPort};
use super::exec::Stop;
use super::{wall_clock, Args, PortNow, Sink};
use crate::out::errln;
use anyhow::{bail, Context as _};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use umad::{PortInfo, TestBedMode};

/// How often the ports are looked at for a change that calls for subscribing again.
const POLL: Duration = Duration::from_secs(1);

/// `IB_PORT_ACTIVE` in libibumad's port state.
const STATE_ACTIVE: u8 = 4;

/// `--source auto` found no libibverbs device (`verbs_error` says why): watch SA notices
/// through the umad ports if there are any, else fail with both reasons.
pub(super) async fn fallback(
    args: &Args,
    verbs_error: anyhow::Error,
    stop: Stop,
) -> anyhow::Result<()> {
    if args.no_sa {
        return Err(verbs_error);
    }
    match umad_ports() {
        Ok(ports) if !ports.is_empty() => {
            let why = format!(
                "no libibverbs device ({}): watching SA notices (traps 64/65) alone, through \
                 the umad ports; no port events",
                first_line(&verbs_error)
            );
            watch_ports(args, ports, Some(why), stop).await
        }
        Ok(_) => Err(nothing(
            &verbs_error,
            "it lists no port (no ib_umad device)",
        )),
        Err(e) => Err(nothing(&verbs_error, &e.to_string())),
    }
}

/// Neither libibverbs devices nor umad ports: both reasons.
fn nothing(verbs_error: &anyhow::Error, umad: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "nothing to watch: no libibverbs device for port events and no umad port for SA \
         notices\nlibibumad: {umad}\nlibibverbs: {verbs_error:#}"
    )
}

/// `--source sa` or `--ibsim-bed`: SA notices alone.
pub(super) async fn watch(args: &Args, why: Option<String>, stop: Stop) -> anyhow::Result<()> {
    if args.no_sa {
        bail!("--no-sa leaves nothing to watch with SA notices alone (--source sa)");
    }
    if args.ibsim_bed {
        umad::testbed::check_allowed(TestBedMode::IbsimOnly)
            .map_err(|e| anyhow::anyhow!("--ibsim-bed: {e}"))?;
    }
    let ports = umad_ports().map_err(|e| {
        anyhow::anyhow!(
            "no InfiniBand port for SA notices ({e}); `apm watch --sim` watches the \
             simulated fabric instead"
        )
    })?;
    if ports.is_empty() {
        bail!(
            "libibumad lists no InfiniBand port (no ib_umad device): no SA to subscribe to; \
             `apm watch --sim` watches the simulated fabric instead"
        );
    }
    watch_ports(args, ports, why, stop).await
}

/// Every port of every CA libibumad lists (ports 1 up to the first that is missing).
fn umad_ports() -> Result<Vec<PortInfo>, umad::Error> {
    let lib = umad::ffi::Lib::load()?;
    let mut out = Vec::new();
    for ca in lib.ca_names()? {
        // A switch's CA has only its management port 0, which carries no SA client.
        for p in 1..=u8::MAX {
            match lib.port_info(&ca, p) {
                Ok(info) => out.push(info),
                Err(_) => break,
            }
        }
    }
    Ok(out)
}

fn first_line(e: &anyhow::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

/// libibumad's port state as `apm watch` names states.
fn state_name(state: u8) -> String {
    match state {
        0 => "nop".into(),
        1 => "down".into(),
        2 => "init".into(),
        3 => "armed".into(),
        4 => "active".into(),
        5 => "active_defer".into(),
        other => format!("unknown({other})"),
    }
}

/// The port read back through libibumad after a notice.
fn read_back(sa: &SaPort) -> PortNow {
    match sa.client.port().refresh_info() {
        Ok(i) => PortNow {
            state: Some(state_name(i.state)),
            lid: Some(i.lid),
            sm_lid: Some(i.sm_lid),
            lmc: Some(i.lmc),
            gid: Some(apm_core::Gid(i.gid)),
        },
        Err(e) => {
            tracing::warn!(device = sa.device, port = sa.port, error = %e, "reading the port back failed");
            PortNow::default()
        }
    }
}

/// Watch the selected ports' SA notices until the sources end, `--timeout` passes or
/// a signal stops the watch.
async fn watch_ports(
    args: &Args,
    all: Vec<PortInfo>,
    why: Option<String>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let selected = select_ports(args, &all)?;
    let testbed = if args.ibsim_bed {
        TestBedMode::IbsimOnly
    } else {
        TestBedMode::Off
    };
    if let Some(why) = why {
        errln!("apm watch: {why}");
    }
    let (msg_tx, mut msgs) = mpsc::unbounded_channel::<Msg>();
    let sa_ports = subscribe_ports(selected, testbed, msg_tx).await?;
    let poller = tokio::spawn(poll_ports(sa_ports.clone()));

    #[allow(clippy::disallowed_methods)] // the watcher measures real time
    let start = std::time::Instant::now();
    let deadline = args.timeout.map(Duration::from_secs_f64);
    let mut sink = Sink::new(args, stop.clone());
    while let Some(msg) = next_msg(&mut msgs, start, deadline, &mut stop).await {
        let Msg::Sa {
            device,
            port,
            gid,
            kind,
        } = msg
        else {
            continue;
        };
        let now = sa_ports
            .iter()
            .find(|s| s.device == device && s.port == port)
            .map(|s| read_back(s))
            .unwrap_or_default();
        let raw = sa_raw(device, port, gid, kind);
        if !sink.event(raw, now, wall_clock(), start.elapsed()).await {
            break;
        }
    }
    poller.abort();
    unsubscribe_all(&sa_ports).await;
    sink.finish()
}

/// The umad ports `--device`/`--port` select (every one without them); an error naming
/// the ports there are when a device is unknown or nothing matches.
fn select_ports<'a>(args: &Args, all: &'a [PortInfo]) -> anyhow::Result<Vec<&'a PortInfo>> {
    let mut cas: Vec<&str> = all.iter().map(|p| p.ca.as_str()).collect();
    cas.dedup();
    for d in &args.devices {
        if !cas.contains(&d.as_str()) {
            bail!("no umad device {d:?}; devices here: {}", cas.join(", "));
        }
    }
    let selected: Vec<&PortInfo> = all
        .iter()
        .filter(|p| args.devices.is_empty() || args.devices.contains(&p.ca))
        .filter(|p| args.ports.is_empty() || args.ports.contains(&p.port))
        .collect();
    if selected.is_empty() {
        let here: Vec<String> = all
            .iter()
            .map(|p| format!("{} port {}", p.ca, p.port))
            .collect();
        bail!(
            "no umad port matches --device/--port; ports here: {}",
            here.join(", ")
        );
    }
    Ok(selected)
}

/// Open each selected port for SA MADs and subscribe for traps 64/65 (a port whose
/// subscription fails is kept: the poll tries again); say on stderr what came of each.
/// An error when no port could be opened.
async fn subscribe_ports(
    selected: Vec<&PortInfo>,
    testbed: TestBedMode,
    msg_tx: mpsc::UnboundedSender<Msg>,
) -> anyhow::Result<Vec<Arc<SaPort>>> {
    let mut sa_ports: Vec<Arc<SaPort>> = Vec::new();
    let mut subscribed = Vec::new();
    let mut notes = Vec::new();
    for p in selected {
        let name = format!("{} port {}", p.ca, p.port);
        let sa = open_sa_port(&p.ca, p.port, testbed, msg_tx.clone())
            .with_context(|| format!("opening {name} for SA MADs"));
        let sa = match sa {
            Ok(sa) => Arc::new(sa),
            Err(e) => {
                notes.push(format!("{name}: no SA notices ({e:#})"));
                continue;
            }
        };
        // Kept even when this fails: the poll and umad-sa's refresh try again.
        match sa.client.subscribe_gid_traps().await {
            Ok(()) => subscribed.push(name),
            Err(e) => notes.push(format!(
                "{name}: not subscribed yet ({e}); trying again when the port becomes \
                 active or its SM changes, and every 60 s"
            )),
        }
        sa_ports.push(sa);
    }
    drop(msg_tx);
    for n in &notes {
        errln!("apm watch: {n}");
    }
    if sa_ports.is_empty() {
        bail!("no umad port could be opened for SA notices");
    }
    if !subscribed.is_empty() {
        errln!(
            "apm watch: SA notices (traps 64/65) through {}",
            subscribed.join(", ")
        );
    }
    Ok(sa_ports)
}

/// Subscribe again through a port that became active or whose LID or SM LID changed:
/// without libibverbs no CLIENT_REREGISTER or SM_CHANGE event says the SA forgot us.
async fn poll_ports(ports: Vec<Arc<SaPort>>) {
    let mut last: Vec<(u8, u16, u16)> = ports
        .iter()
        .map(|s| {
            let i = s.client.port().info();
            (i.state, i.lid, i.sm_lid)
        })
        .collect();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + POLL, POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for (sa, seen) in ports.iter().zip(last.iter_mut()) {
            let Ok(i) = sa.client.port().refresh_info() else {
                continue;
            };
            let now = (i.state, i.lid, i.sm_lid);
            if *seen == now {
                continue;
            }
            *seen = now;
            if i.state != STATE_ACTIVE || i.sm_lid == 0 {
                continue;
            }
            tracing::info!(
                device = sa.device,
                port = sa.port,
                lid = i.lid,
                sm_lid = i.sm_lid,
                "port changed: subscribing again"
            );
            match sa.client.subscribe_gid_traps().await {
                Ok(()) => {
                    errln!(
                    "apm watch: SA notices (traps 64/65) through {} port {} (subscribed again: \
                     port active, LID {}, SM LID {})",
                    sa.device, sa.port, i.lid, i.sm_lid
                )
                }
                Err(e) => errln!(
                    "apm watch: subscribing again through {} port {} failed: {e}",
                    sa.device,
                    sa.port
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umad_states_are_named_like_verbs_states() {
        assert_eq!(state_name(1), "down");
        assert_eq!(state_name(STATE_ACTIVE), "active");
        assert_eq!(state_name(9), "unknown(9)");
    }
}
