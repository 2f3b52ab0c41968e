//! `apm watch --agent`: the verdicts of this host's apm agent (the one `apm run` starts,
//! or `apm agent`), as a watcher attached to its local socket
//! (`apm_agent::client::AgentWatch`): its liveness probes' (a path down, of which kind;
//! up; held for flapping) and operators' rail-downs, each as the agent makes it.
//!
//! On a real host the probes run in the agent (or in a library deployment's Manager,
//! which `apm watch` cannot reach): this is the way to see them. Nothing is asked of the
//! protected programs, an agent with no watcher does no work for one, and with no agent
//! running the watch fails at once saying so. A path event is named by the local device
//! port that holds the path's GID (sysfs), its state read back from sysfs; `agent` and
//! no port when no device here holds it.

use super::devices::next_msg;
use super::exec::Stop;
use super::{wall_clock, Args, EventKind, PortNow, Raw, Sink};
use crate::out::errln;
use anyhow::{bail, Context as _};
use apm_agent::client::AgentWatch;
use apm_agent::wire::FromAgent;
use apm_core::probe::SessionState;
use apm_core::Gid;
use std::collections::BTreeMap;
use std::time::Duration;

/// The device name of an event whose GID no local device port holds.
const NO_DEVICE: &str = "agent";

/// `--agent`: print the agent's verdicts until `--count`, `--timeout`, a signal, or the
/// agent going away (an error: nothing will come any more).
pub(super) async fn watch(args: &Args, stop: Stop) -> anyhow::Result<()> {
    let socket =
        apm_agent::access::AgentSocket::locate(args.agent_port, args.runtime_dir.as_deref());
    let mut attached = AgentWatch::attach(&socket)
        .await
        .context("apm watch --agent")?;
    say_attached(args.agent_port, &attached);
    #[allow(clippy::disallowed_methods)] // the watcher measures real time
    let start = std::time::Instant::now();
    let deadline = args.timeout.map(Duration::from_secs_f64);
    let mut sink = Sink::new(args, stop.clone());
    let mut stop = stop;
    let mut ports = Ports::default();
    let mut enough = false;
    while let Some(msg) = next_msg(&mut attached.events, start, deadline, &mut stop).await {
        let Some((raw, now)) = agent_event(msg, &mut ports) else {
            continue;
        };
        if !sink.event(raw, now, wall_clock(), start.elapsed()).await {
            enough = true;
            break;
        }
    }
    if !enough && stop.signal().is_none() && attached.events.is_closed() {
        sink.finish()?;
        bail!("the apm agent went away (it exits when no protected process is left)");
    }
    sink.finish()
}

/// What the agent watches, on stderr: the output stays events only.
fn say_attached(port: u16, w: &AgentWatch) {
    if !w.probing {
        errln!(
            "apm watch: attached to the apm agent (port {port}); it does not probe (start it \
             with `apm agent --probes`, or `[policy.probe] enabled = true` for `apm run`): \
             only rail_down verdicts will show"
        );
        return;
    }
    let down: Vec<String> = w
        .sessions
        .iter()
        .filter(|(_, s)| *s != SessionState::Up)
        .map(|(e, _)| format!("{} -> {}", e.local, e.remote))
        .collect();
    errln!(
        "apm watch: attached to the apm agent (port {port}): {} paths probed, {} not up{}",
        w.sessions.len(),
        down.len(),
        if down.is_empty() {
            String::new()
        } else {
            format!(" ({})", down.join(", "))
        }
    );
}

/// Local GIDs to the device port holding them, looked up once each (sysfs).
#[derive(Default)]
struct Ports(BTreeMap<Gid, Option<(String, u8)>>);

impl Ports {
    fn of(&mut self, gid: Gid) -> Option<(String, u8)> {
        self.0
            .entry(gid)
            .or_insert_with(|| apm_agent::local::port_of(&gid))
            .clone()
    }
}

/// An agent's message as an event, with its port read back; `None` for the rest.
fn agent_event(msg: FromAgent, ports: &mut Ports) -> Option<(Raw, PortNow)> {
    let (kind, path, gid, local) = match msg {
        FromAgent::Path { ends, verdict } => (
            EventKind::of_verdict(verdict),
            Some((ends, verdict)),
            None,
            ends.local,
        ),
        FromAgent::RailDown { gid } => (EventKind::RailDown, None, Some(gid), gid),
        _ => return None,
    };
    let at = ports.of(local);
    let now = at
        .as_ref()
        .map_or_else(PortNow::default, |(dev, port)| sysfs_port(dev, *port));
    let (device, port) = at.map_or((NO_DEVICE.to_owned(), None), |(d, p)| (d, Some(p)));
    Some((
        Raw {
            device,
            port,
            kind,
            gid,
            path,
            source: "agent",
        },
        now,
    ))
}

/// A device port's state as sysfs says it (`4: ACTIVE` -> `active`).
fn sysfs_port(device: &str, port: u8) -> PortNow {
    let file = format!("/sys/class/infiniband/{device}/ports/{port}/state");
    let state = std::fs::read_to_string(file).ok().map(|s| {
        let name = s.trim().rsplit(": ").next().unwrap_or_default();
        name.to_ascii_lowercase()
    });
    PortNow {
        state,
        ..PortNow::default()
    }
}
