//! [`Apm`]: a running apm for one deployment, built from a [`Config`].
//!
//! An application protects its RC connections with four calls: [`Apm::start`],
//! [`Apm::protect`], [`Apm::notifications`] and [`Apm::shutdown`] (plus
//! [`Apm::unprotect`] and [`Apm::fabric_events`], the unaffiliated event stream
//! `apm watch` prints). Underneath is `apm_core`'s [`Manager`], driving the engine with
//! the providers the configuration names.
//!
//! Which deployments can be built here:
//! - `provider = "sim"`: the simulated fabric of provider-sim ([`SimFabric`]). It
//!   follows tokio's clock, so run it on a runtime with a paused clock to play a
//!   scenario in moments (see the examples in `apm/examples/`).
//! - `provider = "rxe"` (RoCE): provider-rxe's QP facet on every configured device,
//!   cm-lap's UDP channel on `[lap] udp_listen` (peers from `[[lap.peer]]`), and the
//!   protected connections' own paths as the fabric (RoCE has no SA). The application
//!   keeps its QPs and hands each to [`Apm::protect_qp`] ([`Qp::adopt`] wraps an
//!   `ibv_qp`); apm moves a QP's path with the SQ drain when its port goes down, when
//!   the peer moves, or when the application reports a stall ([`Apm::report_stall`]).
//!   Runs in real time: use a normal (multi-thread) runtime.
//! - `provider = "verbs"` (InfiniBand, hardware APM): provider-verbs' QP facet
//!   ([`VerbsQpControl`]) on every configured device, and the umad half of
//!   [`crate::ib`]: one umad-sa client per configured port (or every port) as the fabric
//!   (trap 64/65 subscriptions when `[sa] subscribe`, PathRecord queries when
//!   `[sa] resolve_paths`) and cm-lap's LAP/APR MADs on the `[lap]` channel (a vendor
//!   class with apm's OUI by default, or CM class 0x07). The application registers each
//!   QP with [`Apm::protect_qp`]; apm loads alternates, sets REARM and forces
//!   migrations in the HCA. An SA that cannot be reached at start is not an error: the
//!   engine retries. Runs in real time: use a normal (multi-thread) runtime. Tested
//!   without an HCA: the umad half against OpenSM on the ibsim bed, with a test QP
//!   facet in provider-verbs' place (`apm/tests/ibsim.rs`); provider-verbs' hardware
//!   APM has its own tests in the hardware suite (`cargo xtask hwtest`), which skip
//!   without an InfiniBand HCA. A `verbs` deployment on a real HCA has not run on this
//!   project's machines (none has one).
//! - `provider = "verbs"` on RoCE (hardware APM where the kernel accepts alternate
//!   paths: the patched soft-RoCE of `kernel/rxe-apm`): provider-verbs' QP facet, cm-lap's
//!   UDP channel (`[lap] transport = "udp"`, `udp_listen`, `[[lap.peer]]`) and the
//!   protected connections' paths as the fabric, as for `rxe`. Every configured port
//!   must do hardware APM (asked of the kernel, [`provider_verbs::roce_apm`]): a stock
//!   RoCE device is refused with the reason (use `rxe`). Run in the VM suite.
//! - Any QP facet of the caller's with the InfiniBand umad half:
//!   [`Apm::start_with_qp`] / [`Apm::start_with_facets`] (deployments mixing provider
//!   crates: an application's own QP control, a test facet).
//!
//! Nothing is faked: a deployment that cannot be built says so
//! ([`StartError::Unavailable`], [`StartError::Unsupported`]).
//!
//! This module never reads a clock itself: time is tokio's (and the simulation follows
//! it).

use crate::config::{sim_host, Config, LapTransport, ProviderKind};
use crate::ib::{UmadFacets, UmadOptions};
use crate::start_error::{one_kind, SimUnavailable, StartError, Unavailable};
use apm_core::{
    ConnId, ConnSpec, ConnStatus, FabricEvent, Gid, Manager, ManagerError, ManagerHandle,
    MigrationMode, Notification, Operation, PortKey, ProviderError, QpControl, Reason, Stack,
    StaticPaths, Time,
};
use provider_rxe::{RxeConfig, RxeQpControl};
use provider_sim::{PolicyKind, RunConfig, Scenario, Sim, SimProvider};
use provider_verbs::ffi::{Context, Qp};
use provider_verbs::VerbsQpControl;
use std::sync::Arc;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

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
            return Err(SimUnavailable::NoSuchHost {
                host: *h,
                last: n.saturating_sub(1),
            }
            .into());
        }
        let mut cfg = RunConfig::new(PolicyKind::Apm, seed);
        cfg.external_hosts = hosts.to_vec();
        cfg.sample_ms = 0;
        let sim = Sim::new(scenario, cfg).map_err(SimUnavailable::Build)?;
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
            Some(path) => crate::scenario_file::read(std::path::Path::new(path.get_ref()))
                .map_err(SimUnavailable::Scenario)?,
            None => Scenario::demo(),
        };
        let hosts = sim_hosts(config)?;
        SimFabric::new(&scenario, config.sim.seed.unwrap_or(1), &hosts)
    }

    /// The connections the scenario's workload opened on `host`, as the application
    /// would describe them to [`Apm::protect`] (paths, QPNs, comm ids, role). Like
    /// [`SimFabric::with_sim`] it brings the simulation up to tokio's now: call it inside
    /// the runtime that drives the fabric (outside one, tokio's now is the wall clock).
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
            sim_host(d.name.get_ref())
                .ok_or_else(|| SimUnavailable::NotAHost(d.name.get_ref().clone()).into())
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
/// let config = Config::parse("[[device]]\nname = \"h2\"\nprovider = \"sim\"\n")?;
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
    devices: Option<Devices>,
}

/// Why a connection could not be put under protection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtectError {
    /// The deployment has no QP facet of apm's to hand a QP to (a simulated one, or
    /// one started with the caller's own QP facet, [`Apm::start_with_qp`], where QPs
    /// are registered with that facet): use [`Apm::protect`].
    #[error(
        "this deployment has no QP facet of apm's to hand a QP to (simulated fabric, or the \
         application's own QP facet): use protect"
    )]
    NoQpFacet,
    /// The QP facet refused the QP (not in RTS, in ERR, unknown device, ...).
    #[error("{0}")]
    Qp(ProviderError),
    /// The manager refused the connection.
    #[error(transparent)]
    Manager(#[from] ManagerError),
}

/// What a device deployment keeps to register QPs with.
#[derive(Debug)]
struct Devices {
    contexts: Vec<Context>,
    facet: QpFacet,
    /// The fabric facet's path table, where it is one (RoCE): each protected
    /// connection's paths. InfiniBand asks the SA.
    paths: Option<StaticPaths>,
    /// The UDP peer channel's authentication (RoCE), for its counters.
    peer_auth: Option<Arc<cm_lap::auth::Authenticator>>,
}

/// The deployment's QP facet (the other handle is in the manager's [`Stack`]).
#[derive(Debug)]
enum QpFacet {
    Rxe(Arc<RxeQpControl>),
    /// provider-verbs (hardware APM).
    Verbs(Arc<VerbsQpControl>),
    /// The caller's own QP facet ([`Apm::start_with_qp`]): QPs are registered there.
    External,
}

impl QpFacet {
    fn forget(&self, id: ConnId) {
        match self {
            QpFacet::Rxe(f) => f.unregister(id),
            QpFacet::Verbs(f) => f.unregister(id),
            QpFacet::External => {}
        }
    }
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
            ProviderKind::Verbs => Apm::start_verbs(config).await,
            ProviderKind::Rxe => Apm::start_rxe(config).await,
        }
    }

    /// A hardware-APM deployment: provider-verbs' QP facet on every configured device
    /// (opened through libibverbs), and on InfiniBand the umad half of [`crate::ib`] (one
    /// SA client and LAP channel per configured port) as the fabric and peer facets; on
    /// RoCE the UDP channel and the connections' own paths ([`Apm::start_verbs_roce`]).
    async fn start_verbs(config: &Config) -> Result<Apm, StartError> {
        one_kind(config, ProviderKind::Verbs, "verbs")?;
        let contexts = open_devices(config)?;
        if roce_devices(config, &contexts)? {
            return Apm::start_verbs_roce(config, contexts).await;
        }
        let umad = UmadFacets::open(config, &UmadOptions::default())?;
        let facet = Arc::new(VerbsQpControl::new(contexts.clone()));
        let (peer, fabric) = umad.into_facets();
        let provider = Arc::new(Stack::new(Arc::clone(&facet), peer, fabric));
        let (manager, handle) = Manager::new(provider, config.engine_policy())?;
        let mut apm = Apm::run(manager, handle).await?;
        apm.devices = Some(Devices {
            contexts,
            facet: QpFacet::Verbs(facet),
            paths: None,
            peer_auth: None,
        });
        Ok(apm)
    }

    /// Start an InfiniBand deployment on a QP facet of the caller's: `qp` (port events,
    /// QP operations; its [`PortKey`]s number the devices in the configuration's order)
    /// with the umad half of [`crate::ib`] for `config`'s devices (which must be
    /// `provider = "verbs"`: their names are the umad CAs). For deployments that mix
    /// provider crates, e.g. an application's own QP control. QPs are registered with
    /// `qp` by the caller, not with [`Apm::protect_qp`]; protect them with
    /// [`Apm::protect`]. [`Apm::report_stall`] works as on `verbs`.
    pub async fn start_with_qp<Q: QpControl>(config: &Config, qp: Q) -> Result<Apm, StartError> {
        let umad = UmadFacets::open(config, &UmadOptions::default())?;
        Apm::start_with_facets(config, qp, umad).await
    }

    /// [`Apm::start_with_qp`] with a umad half opened by the caller
    /// ([`UmadFacets::open`] with its [`UmadOptions`]: umad's test-bed mode, ports
    /// carried by another port, routes), e.g. on the ibsim bed.
    pub async fn start_with_facets<Q: QpControl>(
        config: &Config,
        qp: Q,
        umad: UmadFacets,
    ) -> Result<Apm, StartError> {
        let (peer, fabric) = umad.into_facets();
        let provider = Arc::new(Stack::new(qp, peer, fabric));
        let (manager, handle) = Manager::new(provider, config.engine_policy())?;
        let mut apm = Apm::run(manager, handle).await?;
        apm.devices = Some(Devices {
            contexts: Vec::new(),
            facet: QpFacet::External,
            paths: None,
            peer_auth: None,
        });
        Ok(apm)
    }

    /// Hardware APM on RoCE: provider-verbs' facet, cm-lap's UDP channel and the
    /// protected connections' paths (RoCE has no SA), once every configured port is
    /// known to do hardware APM.
    async fn start_verbs_roce(config: &Config, contexts: Vec<Context>) -> Result<Apm, StartError> {
        for (i, ctx) in contexts.iter().enumerate() {
            for port in configured_ports(config, i, ctx)? {
                provider_verbs::hw_apm::available(ctx, port).map_err(|e| {
                    StartError::Unsupported {
                        provider: "verbs",
                        reason: format!("{e} (provider = \"rxe\" migrates in software)"),
                    }
                })?;
            }
        }
        if config.lap_transport() != LapTransport::Udp {
            return Err(StartError::Unsupported {
                provider: "verbs",
                reason: "RoCE devices carry LAP/APR over UDP: [lap] transport = \"udp\"".into(),
            });
        }
        let facet = Arc::new(VerbsQpControl::new(contexts.clone()));
        Apm::start_roce(config, contexts, Arc::clone(&facet), QpFacet::Verbs(facet)).await
    }

    /// A RoCE deployment: provider-rxe's facet on every configured device, cm-lap's UDP
    /// channel on `[lap] udp_listen` with the `[[lap.peer]]` table, and the paths of the
    /// protected connections as the fabric (RoCE has no SA).
    async fn start_rxe(config: &Config) -> Result<Apm, StartError> {
        one_kind(config, ProviderKind::Rxe, "rxe")?;
        let contexts = open_devices(config)?;
        let facet = Arc::new(RxeQpControl::new(contexts.clone(), RxeConfig::default()));
        Apm::start_roce(config, contexts, Arc::clone(&facet), QpFacet::Rxe(facet)).await
    }

    /// The RoCE half both RoCE deployments share: `qp` (the facet `keep` holds too),
    /// cm-lap's UDP channel ([`bind_udp`]) and the protected connections' paths as the
    /// fabric.
    async fn start_roce<Q: QpControl + 'static>(
        config: &Config,
        contexts: Vec<Context>,
        qp: Arc<Q>,
        keep: QpFacet,
    ) -> Result<Apm, StartError> {
        let udp = bind_udp(config).await?;
        let peer_auth = Some(udp.authenticator());
        let paths = StaticPaths::default();
        let provider = Arc::new(Stack::new(qp, udp, paths.clone()));
        let (manager, handle) = Manager::new(provider, config.engine_policy())?;
        let mut apm = Apm::run(manager, handle).await?;
        apm.devices = Some(Devices {
            contexts,
            facet: keep,
            paths: Some(paths),
            peer_auth,
        });
        Ok(apm)
    }

    /// Start apm for the simulated host `config` names (one device) on a shared
    /// `fabric` (which must run that host: [`SimFabric::new`]'s `hosts`).
    pub async fn start_on(config: &Config, fabric: &SimFabric) -> Result<Apm, StartError> {
        let hosts = sim_hosts(config)?;
        let [host] = hosts[..] else {
            return Err(SimUnavailable::DevicesPerApm(hosts.len()).into());
        };
        if !fabric.hosts.contains(&host) {
            return Err(SimUnavailable::HostNotExternal(host).into());
        }
        let provider = Arc::new(fabric.shared.for_host(host).stack());
        // Probes as the configuration says (off by default): the fabric's other hosts
        // run the simulator's policy, which answers them, and a probe rides a datagram
        // of its own on the rail (`[policy.probe] infiniband = true` on the simulated
        // InfiniBand rails).
        let (manager, handle) = Manager::new(provider, config.engine_policy())?;
        // A simulation plays the same for the same seed, its probes' jitter too.
        let seed = provider_sim::controller::probe_seed(config.sim.seed.unwrap_or(1), host);
        Apm::run(manager.with_probe_seed(seed), handle).await
    }

    /// Run `manager` and wait until it has taken the ports' state.
    async fn run<P: apm_core::Provider>(
        manager: Manager<P>,
        handle: ManagerHandle,
    ) -> Result<Apm, StartError> {
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
            devices: None,
        })
    }

    /// Put a connection under protection. `spec` is the connection as the application
    /// set it up: its id, role, QPNs, CM comm ids, the primary path, an alternate
    /// already agreed at connect time if any, and candidate paths.
    pub async fn protect(&self, spec: ConnSpec) -> Result<(), ManagerError> {
        self.handle.protect(spec).await
    }

    /// Put a connection whose QP the application owns under protection: `qp` (from
    /// [`Qp::adopt`], on one of [`Apm::contexts`]) is registered with the deployment's
    /// QP facet as `spec.id`, then protected. On RoCE apm moves it with the SQ drain
    /// ([`provider_rxe::AdoptedQp`]: nothing asked of its access flags, no completion
    /// of apm's in its CQ); a QP already in ERR when a path fails is reported lost. With hardware APM (`verbs`: InfiniBand,
    /// or RoCE where the kernel accepts alternate paths) the device migrates it
    /// (`spec.mode` must be [`MigrationMode::Hardware`]); apm loads its alternate path,
    /// sets REARM and forces a migration when a path dies. The QP must have been created
    /// on apm's own context ([`Apm::contexts`]): libibverbs delivers a QP's async events
    /// (`PATH_MIG`, `PATH_MIG_ERR`) to the context it was created on only. Refused
    /// ([`ProtectError::NoQpFacet`]) on simulated deployments and on those started with
    /// the caller's own QP facet.
    pub async fn protect_qp(&self, spec: ConnSpec, qp: Arc<Qp>) -> Result<(), ProtectError> {
        let devices = self.devices.as_ref().ok_or(ProtectError::NoQpFacet)?;
        let id = spec.id;
        match &devices.facet {
            QpFacet::Rxe(f) => {
                f.adopt(id, qp).map_err(ProtectError::Qp)?;
                // A move onto an unresolved neighbour waits for ARP (~1 s on rxe).
                f.keep_warm(
                    std::iter::once(spec.primary)
                        .chain(spec.agreed_alternate)
                        .chain(spec.candidates.iter().copied()),
                );
            }
            QpFacet::Verbs(facet) => {
                if spec.mode != MigrationMode::Hardware {
                    return Err(ProtectError::Qp(ProviderError::Unsupported {
                        provider: "provider-verbs",
                        operation: Operation::SoftwareMigrate,
                        why: Some(Reason::Because(
                            "on InfiniBand the HCA migrates: protect with mode Hardware",
                        )),
                    }));
                }
                facet.register(id, qp).map_err(|e| {
                    ProtectError::Qp(ProviderError::refused(
                        Operation::Register,
                        provider_verbs::facet::reason(&e),
                    ))
                })?;
            }
            QpFacet::External => return Err(ProtectError::NoQpFacet),
        }
        if let Some(paths) = &devices.paths {
            paths.add(
                std::iter::once(spec.primary)
                    .chain(spec.agreed_alternate)
                    .chain(spec.candidates.iter().copied()),
            );
        }
        if let Err(e) = self.handle.protect(spec).await {
            devices.facet.forget(id);
            return Err(ProtectError::Manager(e));
        }
        Ok(())
    }

    /// The application saw the sends of `id` stop completing (no completion for longer
    /// than it tolerates while work is outstanding): apm moves the connection to its
    /// agreed alternate, as when it detects a dead path itself
    /// ([`ManagerHandle::report_stall`]). For QPs the application owns
    /// ([`Apm::protect_qp`]), whose completions apm cannot see. On RoCE that is the
    /// SQ-drain migration; on InfiniBand a forced migration to the armed alternate (the
    /// HCA would only migrate by itself once its retries on the primary run out). With
    /// no armed, healthy alternate the connection is reported unprotected and apm looks
    /// for one. Refused for connections that are not protected, and on simulated
    /// deployments (their QPs are the simulation's).
    pub async fn report_stall(&self, id: ConnId) -> Result<(), ProtectError> {
        self.devices.as_ref().ok_or(ProtectError::NoQpFacet)?;
        Ok(self.handle.report_stall(id).await?)
    }

    /// The device contexts apm opened (index = the device index of [`PortKey`]s, in the
    /// configuration's order); empty for a simulated deployment and for one on the
    /// caller's own QP facet ([`Apm::start_with_qp`]).
    pub fn contexts(&self) -> &[Context] {
        self.devices.as_ref().map_or(&[], |d| &d.contexts)
    }

    /// Stop protecting a connection. The QP is left as it is (and an application's QP
    /// is no longer touched by apm).
    pub async fn unprotect(&self, id: ConnId) -> Result<(), ManagerError> {
        let r = self.handle.unprotect(id).await;
        if let Some(d) = &self.devices {
            d.facet.forget(id);
        }
        r
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

    /// Peer datagrams accepted and dropped by the UDP channel's authentication (RoCE
    /// deployments; `None` elsewhere).
    pub fn peer_auth_counters(&self) -> Option<cm_lap::auth::CounterValues> {
        let auth = self.devices.as_ref()?.peer_auth.as_ref()?;
        Some(auth.counters().get())
    }

    /// The simulated fabric this Apm created ([`Apm::start`] with a simulated device).
    pub fn sim(&self) -> Option<&SimFabric> {
        self.sim.as_ref()
    }

    /// Stop the manager and wait for it. QPs are left as they are. On InfiniBand the
    /// umad ports stay open until the tokio runtime ends (their SA clients keep
    /// answering Reports) and the SA subscriptions are not withdrawn.
    pub async fn shutdown(self) -> Result<(), ManagerError> {
        self.handle.shutdown();
        match self.task.await {
            Ok(r) => r,
            Err(_) => Err(ManagerError::Stopped),
        }
    }
}

/// cm-lap's UDP channel on `[lap] udp_listen`, with the `[[lap.peer]]` table and the
/// `[lap] key_file` authentication if any (RoCE).
async fn bind_udp(config: &Config) -> Result<cm_lap::udp::UdpPeerChannel, StartError> {
    let listen = config
        .lap
        .udp_listen
        .as_ref()
        .map(|a| *a.get_ref())
        .ok_or(Unavailable::NoUdpListen)?;
    let first_port = config.devices[0]
        .ports
        .as_ref()
        .and_then(|p| p.get_ref().first().copied())
        .unwrap_or(1);
    let auth = config.peer_auth().map_err(Unavailable::PeerKey)?;
    let udp = cm_lap::udp::UdpPeerChannel::bind(listen, PortKey::new(0, first_port))
        .await
        .map_err(|source| Unavailable::UdpBind { listen, source })?
        .with_auth(auth, cm_lap::auth::DEFAULT_MAX_SKEW);
    for peer in &config.lap.peers {
        // `Config::parse` checked every GID.
        if let Ok(gid) = peer.gid.get_ref().parse::<Gid>() {
            udp.add_peer(gid, *peer.addr.get_ref());
        }
    }
    Ok(udp)
}

/// The ports of device `i` the configuration names (every port when it names none).
fn configured_ports(config: &Config, i: usize, ctx: &Context) -> Result<Vec<u8>, StartError> {
    if let Some(p) = config.devices[i]
        .ports
        .as_ref()
        .filter(|p| !p.get_ref().is_empty())
    {
        return Ok(p.get_ref().clone());
    }
    let n = ctx
        .query_device()
        .map_err(|source| Unavailable::DeviceQuery {
            device: ctx.name().to_string(),
            source,
        })?
        .phys_port_cnt;
    Ok((1..=n).collect())
}

/// Whether the configured ports are RoCE (all of them) or InfiniBand (all of them); a
/// mix is refused: LAP/APR travel as MADs on one and over UDP on the other.
fn roce_devices(config: &Config, contexts: &[Context]) -> Result<bool, StartError> {
    let mut kinds = Vec::new();
    for (i, ctx) in contexts.iter().enumerate() {
        for port in configured_ports(config, i, ctx)? {
            let p = ctx
                .query_port(port)
                .map_err(|source| Unavailable::PortQuery {
                    device: ctx.name().to_string(),
                    port,
                    source,
                })?;
            kinds.push(p.link_layer == provider_verbs::ffi::LinkLayer::Ethernet);
        }
    }
    match (kinds.iter().all(|r| *r), kinds.iter().any(|r| *r)) {
        (true, _) => Ok(true),
        (false, false) => Ok(false),
        (false, true) => Err(StartError::Unsupported {
            provider: "verbs",
            reason: "the devices mix RoCE and InfiniBand ports: run one apm per link layer".into(),
        }),
    }
}

/// Open every configured device (in order: device index `i` is `devices[i]`).
fn open_devices(config: &Config) -> Result<Vec<Context>, StartError> {
    let verbs = provider_verbs::Verbs::load().map_err(Unavailable::Verbs)?;
    config
        .devices
        .iter()
        .map(|d| {
            let name = d.name.get_ref();
            verbs.open(name).map_err(|source| {
                let have = verbs
                    .devices()
                    .map(|v| {
                        v.iter()
                            .map(|d| d.name.clone())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                StartError::from(Unavailable::Device {
                    name: name.clone(),
                    source,
                    here: if have.is_empty() { "none".into() } else { have },
                })
            })
        })
        .collect()
}
