//! `apm watch --sim`: the simulated fabric of provider-sim, one `apm_core::Manager` per
//! watched host and its unaffiliated event stream, played in virtual time on tokio's
//! paused clock (a whole scenario plays in moments). Events go through the same
//! [`Sink`] as real ones; the port read back comes from the simulation.
//!
//! apm runs as in `apm simulate` (the simulator's policy: liveness probes on every
//! path), so the probes' verdicts show too: a silent failure (a black-holing switch, a
//! cut between switches) as `path_down` of kind `fabric`, a far end's port on RoCE as
//! `peer_port`. Each Manager's prober is seeded from `--seed` and its host: same seed,
//! same events.

use super::exec::Stop;
use super::{Args, EventKind, PortNow, Raw, Sink};
use crate::out::errln;
use anyhow::{bail, Context as _};
use apm_core::{FabricEventKind, Time};
use provider_sim::{PolicyKind, RunConfig, Scenario, Sim, SimProvider};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// `--sim`: the scenario under tokio's paused clock, a Manager per watched host.
pub(super) fn watch(args: &Args) -> anyhow::Result<()> {
    let scenario = scenario(args)?;
    let hosts = scenario.topology.hosts;
    let names: Vec<String> = (0..hosts).map(|h| format!("h{h}")).collect();
    let watched = watched_hosts(args, &names)?;
    let mut cfg = RunConfig::new(PolicyKind::Apm, args.seed);
    cfg.external_hosts = watched.clone();
    cfg.sample_ms = 0;
    let mut policy = provider_sim::controller::sim_policy();
    if args.no_sa {
        policy.subscribe = false;
    }
    cfg.engine_policy = policy.clone();
    let end = Time::from_millis(match args.timeout {
        Some(t) if t >= 0.0 => scenario.duration_ms.min((t * 1000.0) as u64),
        _ => scenario.duration_ms,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        // IO too: the SIGINT/SIGTERM handlers need it.
        .enable_all()
        .start_paused(true)
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        let mut stop = Stop::install().context("handling signals")?;
        let sim = Sim::new(&scenario, cfg)?;
        let shared = SimProvider::share(sim);
        let (handles, mut rx) = start_managers(&shared, &watched, &policy, args.seed).await?;
        errln!(
            "apm watch: simulated fabric \"{}\" ({} virtual s), watching {}",
            scenario.name,
            end.as_nanos() as f64 / 1e9,
            watched
                .iter()
                .map(|h| names[*h].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut driver = {
            let shared = shared.clone();
            tokio::spawn(async move { shared.drive(end).await })
        };
        let mut sink = Sink::new(args, stop.clone());
        let mut stopped = false;
        loop {
            tokio::select! {
                biased;
                ev = rx.recv() => {
                    let Some((h, ev)) = ev else { break };
                    let Some((raw, now)) = sim_event(&shared, &names, h, &ev.kind) else {
                        continue;
                    };
                    let elapsed = Duration::from_nanos(ev.time.as_nanos());
                    let time = format!("+{:.6}s", elapsed.as_secs_f64());
                    if !sink.event(raw, now, time, elapsed).await {
                        stopped = true;
                        break;
                    }
                }
                _ = &mut driver => break,
                _ = stop.wait() => {
                    stopped = true;
                    break;
                }
            }
        }
        if !stopped {
            // Events the Managers published at the very end.
            while let Ok((h, ev)) = rx.try_recv() {
                let Some((raw, now)) = sim_event(&shared, &names, h, &ev.kind) else {
                    continue;
                };
                let elapsed = Duration::from_nanos(ev.time.as_nanos());
                let time = format!("+{:.6}s", elapsed.as_secs_f64());
                if !sink.event(raw, now, time, elapsed).await {
                    break;
                }
            }
        }
        for h in &handles {
            h.shutdown();
        }
        driver.abort();
        sink.finish()
    })
}

/// One `Manager` per watched host on the shared simulation, its fabric events relayed
/// with the host's index, its connections protected once it runs.
async fn start_managers(
    shared: &SimProvider,
    watched: &[usize],
    policy: &apm_core::Policy,
    seed: u64,
) -> anyhow::Result<(
    Vec<apm_core::ManagerHandle>,
    mpsc::UnboundedReceiver<(usize, apm_core::FabricEvent)>,
)> {
    let (tx, rx) = mpsc::unbounded_channel::<(usize, apm_core::FabricEvent)>();
    let mut handles = Vec::new();
    for &h in watched {
        let provider = Arc::new(shared.for_host(h).stack());
        let (mgr, handle) = apm_core::Manager::new(provider, policy.clone())?;
        let mgr = mgr.with_probe_seed(provider_sim::controller::probe_seed(seed, h));
        let mut events = handle.fabric_events();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(ev) = events.recv().await {
                if tx.send((h, ev)).is_err() {
                    return;
                }
            }
        });
        tokio::spawn(mgr.run());
        handles.push(handle);
    }
    drop(tx);
    // The watched hosts run apm as a deployment would: their connections protected,
    // once each manager runs with its host's ports taken (it answers only then).
    for handle in &handles {
        handle.stats().await?;
    }
    for (i, &h) in watched.iter().enumerate() {
        for spec in shared.with_sim(|sim| sim.external_specs(h)) {
            handles[i].protect(spec).await?;
        }
    }
    Ok((handles, rx))
}

/// The scenario `--scenario` names (the built-in one without), its connections capped:
/// they play no part in what is watched, and a few keep the simulation light.
fn scenario(args: &Args) -> anyhow::Result<Scenario> {
    let mut scenario = match &args.scenario {
        Some(path) => apm::scenario_file::read(path)?,
        None => Scenario::demo(),
    };
    scenario.workload.connections = scenario.workload.connections.min(64);
    Ok(scenario)
}

/// The hosts `--device` names (every host without), refusing a name that is no host.
fn watched_hosts(args: &Args, names: &[String]) -> anyhow::Result<Vec<usize>> {
    for d in &args.devices {
        if !names.contains(d) {
            bail!(
                "no host {d:?} in the scenario: devices are hosts h0 .. h{}",
                names.len().saturating_sub(1)
            );
        }
    }
    Ok((0..names.len())
        .filter(|h| args.devices.is_empty() || args.devices.contains(&names[*h]))
        .collect())
}

/// A simulated host's fabric event, with its port read back from the simulation.
fn sim_event(
    shared: &SimProvider,
    names: &[String],
    host: usize,
    kind: &FabricEventKind,
) -> Option<(Raw, PortNow)> {
    let device = names.get(host)?.clone();
    let (port, kind, gid, path) = match kind {
        FabricEventKind::Port { port, event } => (
            Some(port.port),
            EventKind::of_port_event(*event),
            None,
            None,
        ),
        FabricEventKind::DeviceFatal { .. } => (None, EventKind::DeviceFatal, None, None),
        FabricEventKind::RemoteGid { gid, service } => {
            (None, EventKind::of_gid_service(*service), Some(*gid), None)
        }
        FabricEventKind::Path { ends, verdict } => {
            // The host's port holding the path's local GID.
            let port = shared.with_sim(|sim| {
                let fab = sim.fabric();
                let id = fab.port_by_gid(&ends.local)?;
                Some(fab.ports.get(id)?.key().port)
            });
            let kind = EventKind::of_verdict(*verdict);
            (port, kind, None, Some((*ends, *verdict)))
        }
        _ => return None,
    };
    let now = port.map_or_else(PortNow::default, |p| {
        shared.with_sim(|sim| sim_port(sim, host, p))
    });
    Some((
        Raw {
            device,
            port,
            kind,
            gid,
            path,
            source: "sim",
        },
        now,
    ))
}

fn sim_port(sim: &Sim, host: usize, port: u8) -> PortNow {
    let fab = sim.fabric();
    let Some(p) = fab.port_of(host, port).and_then(|id| fab.ports.get(id)) else {
        return PortNow::default();
    };
    PortNow {
        state: Some(
            match p.state {
                provider_sim::fabric::PortState::Down => "down",
                provider_sim::fabric::PortState::Init => "init",
                provider_sim::fabric::PortState::Active => "active",
            }
            .to_owned(),
        ),
        lid: Some(p.lid),
        // The simulation does not expose which SM a port knows.
        sm_lid: None,
        lmc: Some(p.lmc),
        gid: Some(p.gid),
    }
}
