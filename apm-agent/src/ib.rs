//! The agent's InfiniBand side: what it needs of the host's InfiniBand ports, as a
//! trait ([`InfiniBand`]) that `apm agent` implements with umad (one SA client and one
//! vendor-class MAD channel per port, `apm::ib`) and tests implement on the ibsim bed.
//!
//! On InfiniBand the agents need no IP at all: an alternate is a PathRecord of the SA,
//! a remote port's failure a Report of trap 65, and peer messages (LAP/APR, Migrate)
//! vendor MADs on QP1 through the ports themselves, which reach the peer's agent over
//! the same fabric the connection uses. IPoIB is neither needed nor used: where a host
//! has it, it rides the same ports (a dead port takes it down with the path), and
//! where it has none nothing changes.
//!
//! What the agent does with it, once per host for all its processes:
//!
//! - **PathRecords**: a process asks for the paths from one of its ports to a peer
//!   (`ToAgent::Paths`); the agent learns the peer node's every port from the SA's
//!   NodeRecords (the peer HCA's other port is the port-disjoint alternate) and asks the
//!   PathRecords to each, once per (port, destination), keeps the answer
//!   ([`PATHS_TTL`]), and a question asked while the same one is under way waits for
//!   its answer: N processes x M QPs to D destinations cost D questions to the SA.
//! - **Notices**: the agent subscribes for traps 64/65 through every port, and again
//!   when a process asks (after CLIENT_REREGISTER every process asks at once: requests
//!   that come while a port's subscription runs make it run once more, no more), and
//!   every process that subscribed gets every notice (`FromAgent::RemoteGid`): a port's
//!   coming and going is the fabric's public news.
//! - **Peer messages**: sent through the port holding the local address the process
//!   names, to the peer's LID; received ones routed like UDP ones, the sender named by
//!   its GID (from the SA) and LID.

use apm_core::{Gid, InputSink, Lid, Path, PeerAddr, PeerMsg, PortKey, ProviderError};
use async_trait::async_trait;
use std::fmt::Debug;
use std::time::Duration;

/// How long the agent reuses the SA's answer about the paths to a destination.
pub const PATHS_TTL: Duration = Duration::from_secs(30);

/// One InfiniBand port of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbPort {
    /// The key the agent's [`InfiniBand`] knows it by.
    pub key: PortKey,
    /// The device.
    pub device: String,
    /// The port number.
    pub port: u8,
}

/// The host's InfiniBand ports as the agent uses them.
#[async_trait]
pub trait InfiniBand: Send + Sync + Debug + 'static {
    /// Every port it serves.
    fn ports(&self) -> Vec<IbPort>;

    /// Begin delivering SA notices as `Input::RemoteGid` and peer messages as
    /// `Input::PeerMessage` to `sink`.
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError>;

    /// Every path from `port` to `dgid`, as the SA answers.
    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError>;

    /// The GID of the port answering to `lid` (a QP without a GRH names its peer by LID
    /// only); `None` when the SA knows no path there.
    async fn gid_of_lid(&self, port: PortKey, lid: Lid) -> Result<Option<Gid>, ProviderError>;

    /// Every port of the node behind `lid` (the peer's HCA): `(port GID, base LID, port
    /// number)`, as the SA's NodeRecords say, through `port`.
    async fn node_ports(
        &self,
        port: PortKey,
        lid: Lid,
    ) -> Result<Vec<(Gid, Lid, u8)>, ProviderError>;

    /// Subscribe for traps 64/65 through `port`.
    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError>;

    /// Send a peer message through `port` to `to` (its LID; its GID when it is
    /// another subnet's).
    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError>;

    /// SA queries asked so far (PathRecords and LID lookups), for tests and status.
    fn sa_queries(&self) -> u64;
}
