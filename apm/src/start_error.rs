//! Why a deployment cannot start: [`StartError`] and, for what this machine lacks,
//! [`Unavailable`], with the check every device deployment shares (one provider kind).
//!
//! A leaf module: the deployments (`deployment.rs`) and the umad half of InfiniBand
//! deployments (`ib.rs`) both return these errors; it depends on neither.

use crate::config::{Config, ProviderKind};
use apm_core::ManagerError;
use provider_verbs::VerbsError;
use std::net::SocketAddr;

/// Why a deployment could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration names no device.
    #[error("the configuration names no device")]
    NoDevice,
    /// This library cannot build the deployment as configured (mixed provider kinds,
    /// a LAP transport the link layer cannot carry, ...).
    #[error("this {provider} deployment cannot be built by the apm library: {reason}")]
    Unsupported {
        /// The provider kind (`verbs`, `rxe`).
        provider: &'static str,
        /// What is missing.
        reason: String,
    },
    /// What the deployment needs is not on this machine (libibverbs, a device).
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The simulated fabric could not be built (scenario file, unknown host).
    #[error("simulated fabric: {0}")]
    Sim(#[from] SimUnavailable),
    /// The manager refused to start (policy, provider start).
    #[error(transparent)]
    Manager(#[from] ManagerError),
}

/// What a device deployment needs and this machine does not have.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// libibverbs could not be loaded.
    #[error(transparent)]
    Verbs(VerbsError),
    /// A configured device does not open.
    #[error("cannot open RDMA device {name:?}: {source} (devices here: {here})")]
    Device {
        /// The configured name.
        name: String,
        /// Why it does not open.
        source: VerbsError,
        /// The devices libibverbs lists, or "none".
        here: String,
    },
    /// A device cannot be queried.
    #[error("{device}: {source}")]
    DeviceQuery {
        /// The device.
        device: String,
        /// Why.
        source: VerbsError,
    },
    /// A port cannot be queried.
    #[error("{device} port {port}: {source}")]
    PortQuery {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Why.
        source: VerbsError,
    },
    /// RoCE deployments carry peer messages over UDP and need an address for it.
    #[error("RoCE needs [lap] udp_listen for apm's peer messages")]
    NoUdpListen,
    /// The UDP peer channel does not bind.
    #[error("binding udp_listen {listen}: {source}")]
    UdpBind {
        /// The configured address.
        listen: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The `[lap] key_file` is unusable.
    #[error(transparent)]
    PeerKey(#[from] cm_lap::auth::KeyError),
    /// libibumad could not be loaded.
    #[error("InfiniBand deployments send SA and LAP MADs through libibumad: {0}")]
    Umad(umad::Error),
    /// libibumad cannot list the CAs.
    #[error("libibumad cannot list the local CAs: {0}")]
    UmadListing(umad::Error),
    /// A device has no umad port at all.
    #[error(
        "no umad port for device {device:?} (libibumad lists: {listed}): the SA and LAP MADs \
         go through /dev/infiniband/umad*; is the ib_umad module loaded and the device an \
         InfiniBand HCA?"
    )]
    NoUmadPort {
        /// The device.
        device: String,
        /// What libibumad lists.
        listed: String,
    },
    /// A configured port has no umad port.
    #[error("device {device:?} has no umad port {port} (its umad ports: {have})")]
    NoSuchUmadPort {
        /// The device.
        device: String,
        /// The configured port.
        port: u8,
        /// The device's umad ports.
        have: String,
    },
    /// None of a device's umad ports in use opened.
    #[error("no umad port of device {device:?} could be opened for SA and LAP MADs ({why})")]
    UmadPortsUnopened {
        /// The device.
        device: String,
        /// Why, port by port.
        why: String,
    },
    /// The ibsim test-bed mode was asked for outside the bed.
    #[error(transparent)]
    TestBed(umad::Error),
    /// An opened umad port gave no stream for the SA or LAP class.
    #[error("umad: no stream for the SA or LAP class")]
    NoUmadStream,
}

/// Why the simulated fabric could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimUnavailable {
    /// The scenario file cannot be read or is invalid; the message names the file and
    /// every problem's line.
    #[error(transparent)]
    Scenario(#[from] crate::scenario_file::ScenarioFileError),
    /// The simulation cannot be built from the scenario.
    #[error(transparent)]
    Build(#[from] provider_sim::SimError),
    /// A host beyond the scenario's.
    #[error("host h{host} is not in the scenario (hosts h0 .. h{last})")]
    NoSuchHost {
        /// The host asked for.
        host: usize,
        /// The scenario's last host.
        last: usize,
    },
    /// A device name that is no scenario host.
    #[error("device {0:?} is not a scenario host (h0, h1, ...)")]
    NotAHost(String),
    /// An `Apm` runs one simulated host.
    #[error(
        "one simulated device per Apm (got {0}): start one Apm per host on a shared SimFabric"
    )]
    DevicesPerApm(usize),
    /// The shared fabric runs this host itself.
    #[error("the fabric does not run h{0} from outside: list it in SimFabric::new's hosts")]
    HostNotExternal(usize),
}

/// Refuse a deployment whose devices are not all of `kind` (`Config::parse` already
/// does; a `Config` built in code may not have been through it).
pub(crate) fn one_kind(
    config: &Config,
    kind: ProviderKind,
    name: &'static str,
) -> Result<(), StartError> {
    match config
        .devices
        .iter()
        .find(|d| *d.provider.get_ref() != kind)
    {
        Some(d) => Err(StartError::Unsupported {
            provider: name,
            reason: format!(
                "device {:?} is not {name}: one provider kind per deployment (run one apm per \
                 kind)",
                d.name.get_ref()
            ),
        }),
        None => Ok(()),
    }
}
