//! The engine's facets over the host's agent, for one device of a process: peer
//! messages ([`AgentPeer`]) and, on InfiniBand, the SA's paths and notices
//! ([`AgentFabric`]), each asked of the agent, which asks the SA once per host.

use crate::client::AgentClient;
use crate::AgentError;
use apm_core::{
    FabricService, Gid, GidService, Input, InputSink, Operation, Path, PeerAddr, PeerChannel,
    PeerMsg, PortKey, ProviderError, Reason,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The GIDs of a device's ports, by the engine's port key: how a facet names the port
/// to the agent (the agent finds its port by a local address). Clones share them.
#[derive(Debug, Clone, Default)]
pub struct Ports(Arc<Mutex<BTreeMap<PortKey, Gid>>>);

impl Ports {
    /// Port `port`'s own GID is `gid`.
    pub fn set(&self, port: PortKey, gid: Gid) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(port, gid);
    }

    /// Port `port`'s GID, if known.
    pub fn gid(&self, port: PortKey) -> Option<Gid> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&port)
            .copied()
    }
}

/// The engine's peer facet over the agent, for one device of the process.
///
/// The engine names a message's destination by the peer's GID; the agent also needs the
/// local address to send from, which is the one on the same rail: the source GID of the
/// connection path that leads to that peer GID ([`AgentPeer::learn`]).
///
/// Clones share one facet (a deployment keeps one to deliver and learn with, and gives
/// the other to the engine's stack).
#[derive(Debug, Clone)]
pub struct AgentPeer {
    client: Arc<AgentClient>,
    sink: Arc<Mutex<Option<InputSink>>>,
    /// Peer GID -> the local GID of the path to it.
    source: Arc<Mutex<BTreeMap<Gid, Gid>>>,
    /// The device's ports' own GIDs (InfiniBand: a message to a peer no path names yet
    /// leaves from the port the engine names).
    ports: Ports,
    port: PortKey,
}

impl AgentPeer {
    /// A facet for the device whose engine port is `port`.
    pub fn new(client: Arc<AgentClient>, port: PortKey) -> AgentPeer {
        AgentPeer {
            client,
            sink: Arc::default(),
            source: Arc::default(),
            ports: Ports::default(),
            port,
        }
    }

    /// Remember the GID of one of the device's ports (shared with the device's
    /// [`AgentFabric`], which may hold the same [`Ports`]).
    pub fn with_ports(mut self, ports: Ports) -> AgentPeer {
        self.ports = ports;
        self
    }

    /// Remember the rails of a connection: `(local GID, peer GID)` per path.
    pub fn learn(&self, rails: impl IntoIterator<Item = (Gid, Gid)>) {
        let mut m = self.source.lock().unwrap_or_else(PoisonError::into_inner);
        for (local, peer) in rails {
            m.insert(peer, local);
        }
    }

    /// Hand a message the agent routed here to the engine.
    pub fn deliver(&self, from: PeerAddr, msg: PeerMsg) -> bool {
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        sink.as_ref().is_some_and(|s| {
            s.send(Input::PeerMessage {
                from,
                port: self.port,
                msg,
            })
            .is_ok()
        })
    }
}

#[async_trait]
impl PeerChannel for AgentPeer {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        *self.sink.lock().unwrap_or_else(PoisonError::into_inner) = Some(sink);
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        let learned = self
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&to.gid)
            .copied();
        let from = learned
            .or_else(|| self.ports.gid(port))
            .ok_or(ProviderError::refused(
                Operation::SendPeer,
                Reason::NoRouteTo(to.gid),
            ))?;
        self.client.send_to(from, to, msg).map_err(|e| {
            let why = match &e {
                AgentError::Io(io) => Reason::of_io(io),
                AgentError::NotRunning(_)
                | AgentError::NotAllowed(_)
                | AgentError::Untrusted(_)
                | AgentError::Refused(_)
                | AgentError::Gone
                | AgentError::NoWatch(_) => Reason::Closed,
                AgentError::NoAnswer(_) => Reason::TimedOut("the apm agent"),
            };
            ProviderError::io(Operation::SendPeer, why)
        })
    }
}

/// The engine's fabric facet over the agent (InfiniBand): paths from the SA, asked once
/// per host through the agent, and the SA's notices, which the agent subscribes for
/// once per port and fans out. Clones share one facet.
#[derive(Debug, Clone)]
pub struct AgentFabric {
    client: Arc<AgentClient>,
    sink: Arc<Mutex<Option<InputSink>>>,
    ports: Ports,
}

impl AgentFabric {
    /// A facet for one device whose ports' GIDs are (or will be) in `ports`.
    pub fn new(client: Arc<AgentClient>, ports: Ports) -> AgentFabric {
        AgentFabric {
            client,
            sink: Arc::default(),
            ports,
        }
    }

    /// Hand a notice the agent fanned out to the engine.
    pub fn deliver(&self, gid: Gid, service: GidService) -> bool {
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        sink.as_ref()
            .is_some_and(|s| s.send(Input::RemoteGid { gid, service }).is_ok())
    }

    fn port_gid(&self, port: PortKey, op: Operation) -> Result<Gid, ProviderError> {
        self.ports
            .gid(port)
            .ok_or(ProviderError::refused(op, Reason::NotOurPort(port)))
    }
}

fn agent_error(op: Operation, e: &AgentError) -> ProviderError {
    let why = match e {
        AgentError::Io(io) => Reason::of_io(io),
        AgentError::NoAnswer(_) => Reason::TimedOut("the apm agent"),
        _ => Reason::Closed,
    };
    ProviderError::io(op, why)
}

#[async_trait]
impl FabricService for AgentFabric {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        *self.sink.lock().unwrap_or_else(PoisonError::into_inner) = Some(sink);
        Ok(())
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        let op = Operation::ResolvePaths;
        let sgid = self.port_gid(port, op)?;
        let answer = self
            .client
            .paths(sgid, Some(dgid), None)
            .await
            .map_err(|e| {
                tracing::debug!(%dgid, error = %e, "no paths from the agent");
                match e {
                    crate::client::PathsError::Agent(a) => agent_error(op, &a),
                    crate::client::PathsError::TimedOut(_) => {
                        ProviderError::io(op, Reason::TimedOut("the apm agent's SA query"))
                    }
                    _ => ProviderError::io(op, Reason::Because("the SA gave the agent no paths")),
                }
            })?;
        // The agent's port keys are its own: the paths leave from this port.
        Ok(answer
            .paths
            .into_iter()
            .map(|p| Path { port, ..p })
            .collect())
    }

    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError> {
        let op = Operation::Subscribe;
        let sgid = self.port_gid(port, op)?;
        self.client.subscribe(sgid).map_err(|e| agent_error(op, &e))
    }
}

/// How an InfiniBand QP names its peer port: by GID when its address vector carries a
/// GRH, else by LID alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IbPeer {
    /// The peer port's GID.
    Gid(Gid),
    /// The peer port's LID (the SA tells its GID).
    Lid(u16),
}

/// What the agent knows of an InfiniBand connection's other end, from every local port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbConnection {
    /// The peer port's GID.
    pub dgid: Gid,
    /// Every path the SA gave from each of `ports` to the peer's node (its ports all),
    /// each keyed by the local port it leaves from.
    pub paths: Vec<Path>,
    /// Every port of the peer's node: `(port GID, base LID)`.
    pub peer_ports: Vec<(Gid, u16)>,
}

/// The paths of an InfiniBand connection whose QP leaves from `from` (one of `ports`,
/// the device's InfiniBand ports and their GIDs) towards `peer`: asked from `from`
/// first (which names the peer port's GID and its node's ports), then from each other
/// port towards that GID. Only the first answer is required: another port the SA
/// cannot route (down, another subnet) adds nothing and is said in the log.
pub async fn ib_connection(
    client: &AgentClient,
    ports: &[(PortKey, Gid)],
    from: PortKey,
    peer: IbPeer,
) -> Result<IbConnection, crate::client::PathsError> {
    let sgid = ports
        .iter()
        .find(|(k, _)| *k == from)
        .map(|(_, g)| *g)
        .ok_or_else(|| {
            crate::client::PathsError::Unknown(format!("port {from} has no GID apm knows"))
        })?;
    let (dgid, dlid) = match peer {
        IbPeer::Gid(g) => (Some(g), None),
        IbPeer::Lid(l) => (None, Some(l)),
    };
    let first = client.paths(sgid, dgid, dlid).await?;
    let keyed =
        |key: PortKey, paths: Vec<Path>| paths.into_iter().map(move |p| Path { port: key, ..p });
    let mut paths: Vec<Path> = keyed(from, first.paths).collect();
    for (key, gid) in ports.iter().filter(|(k, _)| *k != from) {
        match client.paths(*gid, Some(first.dgid), None).await {
            Ok(more) => paths.extend(keyed(*key, more.paths)),
            Err(e) => tracing::debug!(port = %key, error = %e, "no paths from this port"),
        }
    }
    Ok(IbConnection {
        dgid: first.dgid,
        paths,
        peer_ports: first.peer_ports,
    })
}
