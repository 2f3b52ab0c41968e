//! [`Apm`]: a running apm for one deployment, built from a [`Config`].
//!
//! An application protects its RC connections with four calls: [`Apm::start`],
//! [`Apm::protect`], [`Apm::notifications`] and [`Apm::shutdown`] (plus
//! [`Apm::unprotect`] and [`Apm::fabric_events`], the unaffiliated event stream
//! `apm watch` prints). Underneath is `apm_core`'s [`Manager`], driving the engine with
//! the providers the configuration names.
//!
//! Which deployments can be built here:
//! - `provider = "sim"`: the simulated fabric of provider-sim ([`SimFabric`]). Fully
//!   working; it follows tokio's clock, so run it on a runtime with a paused clock to
//!   play a scenario in moments (see the examples in `apm/examples/`).
//! - `provider = "verbs"` and `provider = "rxe"`: [`StartError::Unsupported`] for now,
//!   after checking that the RDMA stack is there at all ([`StartError::Unavailable`]).
//!   provider-verbs, umad-sa and cm-lap each provide their facet, but protecting a QP
//!   needs the QP's handle registered with the QP facet, which this API does not take
//!   yet. Nothing is faked: a deployment that cannot be built says so.
//!
//! This module never reads a clock itself: time is tokio's (and the simulation follows
//! it).

use crate::config::{sim_host, Config, ProviderKind};
use apm_core::{
    ConnId, ConnSpec, ConnStatus, FabricEvent, Manager, ManagerError, ManagerHandle, Notification,
    Time,
};
use provider_sim::{PolicyKind, RunConfig, Scenario, Sim, SimProvider};
use std::sync::Arc;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// Why a deployment could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration names no device.
    #[error("the configuration names no device")]
    NoDevice,
    /// A deployment of this kind cannot be built by this library (yet).
    #[error("{provider} deployments cannot be built by the apm library yet: {reason}")]
    Unsupported {
        /// The provider kind (`verbs`, `rxe`).
        provider: &'static str,
        /// What is missing.
        reason: String,
    },
    /// What the deployment needs is not on this machine (libibverbs, a device).
    #[error("{0}")]
    Unavailable(String),
    /// The simulated fabric could not be built (scenario file, unknown host).
    #[error("simulated fabric: {0}")]
    Sim(String),
    /// The manager refused to start (policy, provider start).
    #[error(transparent)]
    Manager(#[from] ManagerError),
}

/// A simulated fabric shared by the [`Apm`]s of some of its hosts.
///
/// Built inside a tokio runtime; virtual time 0 is tokio's "now" at
/// [`SimFabric::new`]. The simulation advances only while [`SimFabric::run_for`] (or
/// [`SimFabric::run_until`]) runs: drive it from the task that awaits the Apms' streams.
#[derive(Clone, Debug)]
pub struct SimFabric {
    shared: SimProvider,
    hosts: Vec<usize>,
    duration: Time,
}

impl SimFabric {
    /// The fabric of `scenario` with `seed`; `hosts` are run by [`Apm`]s (the others by
    /// the simulation's own apm controller). Call inside a tokio runtime.
    pub fn new(scenario: &Scenario, seed: u64, hosts: &[usize]) -> Result<SimFabric, StartError> {
        let n = scenario.topology.hosts;
        if let Some(h) = hosts.iter().find(|h| **h >= n) {
            return Err(StartError::Sim(format!(
                "host h{h} is not in the scenario (hosts h0 .. h{})",
                n.saturating_sub(1)
            )));
        }
        let mut cfg = RunConfig::new(PolicyKind::Apm, seed);
        cfg.external_hosts = hosts.to_vec();
        cfg.sample_ms = 0;
        let sim = Sim::new(scenario, cfg).map_err(StartError::Sim)?;
        Ok(SimFabric {
            shared: SimProvider::share(sim),
            hosts: hosts.to_vec(),
            duration: Time::from_millis(scenario.duration_ms),
        })
    }

    /// The fabric a configuration's `[sim]` table names, with its simulated devices as
    /// the hosts run by [`Apm`]s.
    pub fn from_config(config: &Config) -> Result<SimFabric, StartError> {
        let scenario = match &config.sim.scenario {
            Some(path) => {
                let path = path.get_ref();
                let text = std::fs::read_to_string(path)
                    .map_err(|e| StartError::Sim(format!("reading {path}: {e}")))?;
                Scenario::from_toml(&text).map_err(|e| StartError::Sim(format!("{path}: {e}")))?
            }
            None => Scenario::default(),
        };
        let hosts = sim_hosts(config)?;
        SimFabric::new(&scenario, config.sim.seed.unwrap_or(1), &hosts)
    }

    /// The connections the scenario's workload opened on `host`, as the application
    /// would describe them to [`Apm::protect`] (paths, QPNs, comm ids, role).
    pub fn connections(&self, host: usize) -> Vec<ConnSpec> {
        self.shared.with_sim(|sim| sim.external_specs(host))
    }

    /// The scenario's length in virtual time.
    pub fn duration(&self) -> Time {
        self.duration
    }

    /// The hosts run by [`Apm`]s.
    pub fn hosts(&self) -> &[usize] {
        &self.hosts
    }

    /// Advance the simulation to virtual time `t` (from the fabric's creation), in step
    /// with tokio's clock.
    pub async fn run_until(&self, t: Time) {
        self.shared.drive(t).await;
    }

    /// Advance the simulation by `d` of tokio time.
    pub async fn run_for(&self, d: std::time::Duration) {
        let now = self.shared.with_sim(|sim| sim.now());
        let until = Time(
            now.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        );
        self.shared.drive(until).await;
    }

    /// Use the simulation directly (figures, ground truth), brought up to tokio's now.
    pub fn with_sim<R>(&self, f: impl FnOnce(&mut Sim) -> R) -> R {
        self.shared.with_sim(f)
    }
}

fn sim_hosts(config: &Config) -> Result<Vec<usize>, StartError> {
    config
        .devices
        .iter()
        .map(|d| {
            sim_host(d.name.get_ref()).ok_or_else(|| {
                StartError::Sim(format!(
                    "device {:?} is not a scenario host (h0, h1, ...)",
                    d.name.get_ref()
                ))
            })
        })
        .collect()
}

/// A running apm: a [`Manager`] on the deployment's providers, and its handle.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use apm::{Apm, Config};
/// use apm::apm_core::NotificationKind;
///
/// let config = Config::parse("[[device]]\nname = \"h2\"\nprovider = \"sim\"\n")
///     .map_err(|e| format!("{e:?}"))?;
/// let apm = Apm::start(&config).await?;
/// let mut notes = apm.notifications();
/// let fabric = apm.sim().expect("a simulated deployment").clone();
/// for conn in fabric.connections(2) {
///     apm.protect(conn).await?;
/// }
/// fabric.run_for(std::time::Duration::from_millis(100)).await;
/// let n = notes.recv().await?;
/// assert!(matches!(n.kind, NotificationKind::Protected { .. }));
/// apm.shutdown().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Apm {
    handle: ManagerHandle,
    task: JoinHandle<Result<(), ManagerError>>,
    sim: Option<SimFabric>,
}

impl Apm {
    /// Start apm for `config`: compose its providers, start a [`Manager`] on the
    /// current tokio runtime, and wait until it has taken the ports' state. A simulated
    /// deployment with one device gets its own [`SimFabric`] (see [`Apm::sim`]); for
    /// several simulated hosts in one process use [`Apm::start_on`].
    pub async fn start(config: &Config) -> Result<Apm, StartError> {
        let first = config.devices.first().ok_or(StartError::NoDevice)?;
        match first.provider.get_ref() {
            ProviderKind::Sim => {
                let fabric = SimFabric::from_config(config)?;
                let mut apm = Apm::start_on(config, &fabric).await?;
                apm.sim = Some(fabric);
                Ok(apm)
            }
            ProviderKind::Verbs => {
                check_rdma_stack()?;
                Err(StartError::Unsupported {
                    provider: "verbs",
                    reason: "protecting an InfiniBand QP needs its handle registered with \
                             provider-verbs' QP facet (VerbsQpControl::register) next to \
                             umad-sa and cm-lap; compose apm_core::Stack from those crates \
                             directly"
                        .into(),
                })
            }
            ProviderKind::Rxe => {
                check_rdma_stack()?;
                Err(StartError::Unsupported {
                    provider: "rxe",
                    reason: "software migration needs each connection as a provider-rxe \
                             RcConn registered with RxeQpControl next to cm-lap's UDP \
                             channel; compose apm_core::Stack from those crates directly"
                        .into(),
                })
            }
        }
    }

    /// Start apm for the simulated host `config` names (one device) on a shared
    /// `fabric` (which must run that host: [`SimFabric::new`]'s `hosts`).
    pub async fn start_on(config: &Config, fabric: &SimFabric) -> Result<Apm, StartError> {
        let hosts = sim_hosts(config)?;
        let [host] = hosts[..] else {
            return Err(StartError::Sim(format!(
                "one simulated device per Apm (got {}): start one Apm per host on a shared \
                 SimFabric",
                hosts.len()
            )));
        };
        if !fabric.hosts.contains(&host) {
            return Err(StartError::Sim(format!(
                "the fabric does not run h{host} from outside: list it in SimFabric::new's hosts"
            )));
        }
        let provider = Arc::new(fabric.shared.for_host(host).stack());
        let (manager, handle) = Manager::new(provider, config.engine_policy())?;
        let task = tokio::spawn(manager.run());
        // The manager takes the ports' state before it serves any request: a stats call
        // that returns means it is running (or it failed to start, which the task says).
        if handle.stats().await.is_err() {
            return match task.await {
                Ok(Err(e)) => Err(e.into()),
                _ => Err(ManagerError::Stopped.into()),
            };
        }
        Ok(Apm {
            handle,
            task,
            sim: None,
        })
    }

    /// Put a connection under protection. `spec` is the connection as the application
    /// set it up: its id, role, QPNs, CM comm ids, the primary path, an alternate
    /// already agreed at connect time if any, and candidate paths.
    pub async fn protect(&self, spec: ConnSpec) -> Result<(), ManagerError> {
        self.handle.protect(spec).await
    }

    /// Stop protecting a connection. The QP is left as it is.
    pub async fn unprotect(&self, id: ConnId) -> Result<(), ManagerError> {
        self.handle.unprotect(id).await
    }

    /// How a connection stands (`None`: not protected).
    pub async fn status(&self, id: ConnId) -> Result<Option<ConnStatus>, ManagerError> {
        self.handle.status(id).await
    }

    /// Notifications from now on: protected, rearmed, migrated, unprotected, lost. A
    /// receiver more than 4096 behind loses the oldest.
    pub fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.handle.notifications()
    }

    /// Unaffiliated events from now on (port up/down, LID and SM changes, client
    /// reregister, device fatal, remote GID in/out of service).
    pub fn fabric_events(&self) -> broadcast::Receiver<FabricEvent> {
        self.handle.fabric_events()
    }

    /// The manager's handle, for everything else (stats, more clones).
    pub fn handle(&self) -> &ManagerHandle {
        &self.handle
    }

    /// The simulated fabric this Apm created ([`Apm::start`] with a simulated device).
    pub fn sim(&self) -> Option<&SimFabric> {
        self.sim.as_ref()
    }

    /// Stop the manager and wait for it. QPs are left as they are.
    pub async fn shutdown(self) -> Result<(), ManagerError> {
        self.handle.shutdown();
        match self.task.await {
            Ok(r) => r,
            Err(_) => Err(ManagerError::Stopped),
        }
    }
}

/// Whether libibverbs loads and lists a device.
fn check_rdma_stack() -> Result<(), StartError> {
    let verbs =
        provider_verbs::Verbs::load().map_err(|e| StartError::Unavailable(e.to_string()))?;
    match verbs.devices() {
        Ok(d) if !d.is_empty() => Ok(()),
        Ok(_) => Err(StartError::Unavailable(
            "no RDMA device on this machine".into(),
        )),
        Err(e) => Err(StartError::Unavailable(format!(
            "no RDMA device usable on this machine: {e}"
        ))),
    }
}
