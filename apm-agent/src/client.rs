//! The process side: a connection to the host's agent, and [`AgentPeer`], the engine's
//! peer facet over it.
//!
//! What arrives from the agent goes to one receiver the process owns (`events`): peer
//! messages (to be handed to the engine of the connection's device through
//! [`AgentPeer::deliver`]), rail-down verdicts, and the end of the stream when the
//! agent goes away.

use crate::wire::{self, FromAgent, Route, ToAgent};
use crate::AgentError;
use apm_core::{
    Gid, Input, InputSink, Operation, PeerAddr, PeerChannel, PeerMsg, PortKey, ProviderError,
    Reason,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::os::linux::net::SocketAddrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

type Pending = Arc<Mutex<BTreeMap<u64, oneshot::Sender<Result<Vec<(Gid, Gid)>, String>>>>>;

/// How long a candidates request may take (the agent asks the peer's agent, with retries).
const CANDIDATES_TIMEOUT: Duration = Duration::from_secs(15);

/// A process's connection to its host's agent.
#[derive(Debug)]
pub struct AgentClient {
    tx: mpsc::UnboundedSender<ToAgent>,
    pending: Pending,
    next: AtomicU64,
}

impl AgentClient {
    /// Connect to the agent of `peer_port`. Everything the agent sends but candidate
    /// answers goes to `events`, which closes when the agent goes away. Call inside a
    /// tokio runtime.
    pub async fn connect(
        peer_port: u16,
        events: mpsc::UnboundedSender<FromAgent>,
    ) -> Result<AgentClient, AgentError> {
        let name = crate::socket_name(peer_port);
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let stream = match std::os::unix::net::UnixStream::connect_addr(&addr) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(AgentError::NotRunning(name))
            }
            Err(e) => return Err(e.into()),
        };
        stream.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(stream)?;
        let (read, mut write) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<ToAgent>();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if write.write_all(&wire::line(&m)).await.is_err() {
                    return;
                }
            }
        });
        let pending: Pending = Arc::default();
        let answers = pending.clone();
        tokio::spawn(async move {
            let mut lines = wire::Lines::new(BufReader::new(read));
            while let Ok(Some(l)) = lines.next_line().await {
                match serde_json::from_slice::<FromAgent>(l) {
                    Ok(FromAgent::Candidates { req, result }) => {
                        let w = answers
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&req);
                        if let Some(w) = w {
                            let _ = w.send(result);
                        }
                    }
                    Ok(other) => {
                        if events.send(other).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "unreadable line from the agent"),
                }
            }
            // Dropping `events` here tells the process the agent is gone.
        });
        Ok(AgentClient {
            tx,
            pending,
            next: AtomicU64::new(1),
        })
    }

    fn put(&self, m: ToAgent) -> Result<(), AgentError> {
        self.tx.send(m).map_err(|_| AgentError::Gone)
    }

    /// The alternate rails from the device of `sgid` (addresses `local_gids`) to the
    /// host of `dgid`, as `(local, peer)` address pairs; `Err` says why there are none.
    pub async fn candidates(
        &self,
        sgid: Gid,
        dgid: Gid,
        local_gids: Vec<Gid>,
    ) -> Result<Vec<(Gid, Gid)>, String> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(req, tx);
        self.put(ToAgent::Candidates {
            req,
            sgid,
            dgid,
            local_gids,
        })
        .map_err(|e| e.to_string())?;
        match tokio::time::timeout(CANDIDATES_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(AgentError::Gone.to_string()),
            Err(_) => Err("the apm agent did not answer in time".into()),
        }
    }

    /// Route the peer messages of `route` to this process.
    pub fn register(&self, route: Route) -> Result<(), AgentError> {
        self.put(ToAgent::Register { route })
    }

    /// Stop routing a connection's messages here.
    pub fn unregister(&self, local_qpn: u32, remote_qpn: u32) -> Result<(), AgentError> {
        self.put(ToAgent::Unregister {
            local_qpn,
            remote_qpn,
        })
    }

    /// Tell every process on this host that `gid` is unreachable.
    pub fn rail_down(&self, gid: Gid) -> Result<(), AgentError> {
        self.put(ToAgent::RailDown { gid })
    }

    /// Send a peer message from local address `from` to peer address `to`.
    pub fn send(&self, from: Gid, to: Gid, msg: PeerMsg) -> Result<(), AgentError> {
        self.put(ToAgent::Send { from, to, msg })
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
    port: PortKey,
}

impl AgentPeer {
    /// A facet for the device whose engine port is `port`.
    pub fn new(client: Arc<AgentClient>, port: PortKey) -> AgentPeer {
        AgentPeer {
            client,
            sink: Arc::default(),
            source: Arc::default(),
            port,
        }
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

    async fn send(&self, _port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        let from = self
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&to.gid)
            .copied()
            .ok_or(ProviderError::refused(
                Operation::SendPeer,
                Reason::NoRouteTo(to.gid),
            ))?;
        self.client.send(from, to.gid, msg).map_err(|e| {
            let why = match &e {
                AgentError::Io(io) => Reason::of_io(io),
                AgentError::NotRunning(_) | AgentError::Gone => Reason::Closed,
            };
            ProviderError::io(Operation::SendPeer, why)
        })
    }
}
