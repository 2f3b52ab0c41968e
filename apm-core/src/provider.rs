//! The `Provider` trait: how the driver carries out commands and receives inputs, and the
//! facets a deployment composes it from.
//!
//! A deployment mixes crates: on InfiniBand, QP control and local events from
//! provider-verbs, notices and paths from umad-sa, peer messages from cm-lap; on RoCE,
//! provider-rxe plus cm-lap over UDP and static paths; in the simulator, provider-sim for
//! everything; in unit tests, mocks. [`Stack`] glues three facets into one `Provider`.
//!
//! Providers never read the engine's clock: they push bare [`Input`]s into the
//! [`InputSink`] and the driver stamps them with the time it receives them.
//!
//! The contract, both ways:
//! - start-up: every local port is reported before `start` returns, so the engine knows
//!   them before the first API call (callers need not wait for anything);
//! - at most one command naming a connection's QP is in flight at a time: an override
//!   (a migration replacing a re-arm, say) waits for the answer to what is in flight,
//!   so commands on one QP run one after the other, in the order the engine decided;
//! - every command is answered exactly once, or counts as failed at its deadline
//!   (`Policy::command_timeout_ms`), after which the driver drops the call.

use crate::io::*;
use crate::types::*;
use async_trait::async_trait;

/// Where providers push inputs (events, notices, peer messages) for the driver.
pub type InputSink = tokio::sync::mpsc::UnboundedSender<Input>;

/// Everything the driver needs from the world.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// A short name for logs.
    fn name(&self) -> String;
    /// Begin delivering inputs into `sink`: a [`Input::PortInfo`] for every local port
    /// is in the sink before `start` returns (the driver feeds them to the engine
    /// before any API call, so a connection protected right after start finds its
    /// ports known), then events as they happen.
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError>;
    /// Carry out one command.
    ///
    /// The engine hands over at most one command naming a connection's QP
    /// (`LoadAlternate`, `SetRearm`, `ForceMigrate`, `SoftwareMigrate`, `QueryQp`) at a
    /// time: when it overrides what a connection was doing (a migration replacing a
    /// re-arm, say), the new command waits until the one in flight is answered, so
    /// commands on one QP never run concurrently and take effect in the order the
    /// engine decided them. Sends, path queries, subscriptions and `PeerThere` hints
    /// (which change no QP state of their own) may run concurrently. A call not answered within `Policy::command_timeout_ms` is
    /// treated as failed ([`ProviderError::NoAnswer`]) and the driver drops it; a
    /// provider should bound its own operations well within that.
    async fn execute(&self, op: CommandOp) -> Result<CommandOutcome, ProviderError>;
}

/// QP operations and local (affiliated and unaffiliated) async events.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait QpControl: Send + Sync + 'static {
    /// Begin delivering local port info and async events: a [`Input::PortInfo`] for
    /// every local port is in the sink before it returns (see [`Provider::start`]).
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError>;
    /// Load `path` as the alternate path.
    async fn load_alternate(&self, conn: ConnId, path: Path) -> Result<(), ProviderError>;
    /// Set REARM; returns the migration state read back.
    async fn set_rearm(&self, conn: ConnId) -> Result<MigState, ProviderError>;
    /// Force MIGRATED.
    async fn force_migrate(&self, conn: ConnId) -> Result<(), ProviderError>;
    /// Move the primary address vector to `path` (software migration); `peer` as in
    /// [`CommandOp::SoftwareMigrate`].
    async fn software_migrate(
        &self,
        conn: ConnId,
        path: Path,
        peer: PeerMove,
    ) -> Result<(), ProviderError>;
    /// The peer runs on `path`, the connection's primary or where its move in flight
    /// goes ([`CommandOp::PeerThere`]).
    async fn peer_there(&self, conn: ConnId, path: Path) -> Result<(), ProviderError>;
    /// Post apm's zero-length RDMA WRITE on the QP, which arms it and its peer's
    /// from REARM ([`CommandOp::ArmingWrite`]). By default unsupported: only a facet
    /// that may post on the connection's QP does it.
    async fn arming_write(&self, conn: ConnId) -> Result<(), ProviderError> {
        let _ = conn;
        Err(ProviderError::Unsupported {
            provider: "qp facet",
            operation: crate::provider_error::Operation::ArmingWrite,
            why: Some(crate::provider_error::Reason::Because(
                "apm does not post on this QP",
            )),
        })
    }
    /// Read the QP back.
    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError>;
}

/// The channel to peers for LAP/APR/MRA and software-migration messages.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait PeerChannel: Send + Sync + 'static {
    /// Begin delivering received peer messages as [`Input::PeerMessage`].
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError>;
    /// Send one message.
    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError>;
}

/// The subnet administrator: notices about remote ports, path records.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait FabricService: Send + Sync + 'static {
    /// Begin delivering notices as [`Input::RemoteGid`].
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError>;
    /// Every path from `port` to `dgid`.
    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError>;
    /// Subscribe for traps 64/65 through `port`.
    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError>;
}

/// A `Provider` made of three facets.
#[derive(Debug)]
pub struct Stack<Q, C, F> {
    /// QP control and local events.
    pub qp: Q,
    /// Peer messages.
    pub peer: C,
    /// SA notices and paths.
    pub fabric: F,
}

impl<Q, C, F> Stack<Q, C, F> {
    /// Compose a provider.
    pub fn new(qp: Q, peer: C, fabric: F) -> Self {
        Stack { qp, peer, fabric }
    }
}

#[async_trait]
impl<Q: QpControl, C: PeerChannel, F: FabricService> Provider for Stack<Q, C, F> {
    fn name(&self) -> String {
        "stack".into()
    }

    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        self.qp.start(sink.clone()).await?;
        self.peer.start(sink.clone()).await?;
        self.fabric.start(sink).await
    }

    async fn execute(&self, op: CommandOp) -> Result<CommandOutcome, ProviderError> {
        match op {
            CommandOp::LoadAlternate { conn, path } => self
                .qp
                .load_alternate(conn, path)
                .await
                .map(|()| CommandOutcome::Done),
            CommandOp::SetRearm { conn } => {
                self.qp.set_rearm(conn).await.map(CommandOutcome::MigState)
            }
            CommandOp::ForceMigrate { conn } => self
                .qp
                .force_migrate(conn)
                .await
                .map(|()| CommandOutcome::Done),
            // The word after the move is the driver's to send (`Manager`), not the QP's.
            CommandOp::SoftwareMigrate {
                conn, path, peer, ..
            } => self
                .qp
                .software_migrate(conn, path, peer)
                .await
                .map(|()| CommandOutcome::Done),
            CommandOp::PeerThere { conn, path } => self
                .qp
                .peer_there(conn, path)
                .await
                .map(|()| CommandOutcome::Done),
            CommandOp::ArmingWrite { conn } => self
                .qp
                .arming_write(conn)
                .await
                .map(|()| CommandOutcome::Done),
            CommandOp::QueryQp { conn } => self.qp.query_qp(conn).await.map(CommandOutcome::Qp),
            CommandOp::SendPeer { port, to, msg } => self
                .peer
                .send(port, to, msg)
                .await
                .map(|()| CommandOutcome::Done),
            CommandOp::ResolvePaths { port, dgid } => self
                .fabric
                .resolve_paths(port, dgid)
                .await
                .map(CommandOutcome::Paths),
            CommandOp::Subscribe { port } => self
                .fabric
                .subscribe(port)
                .await
                .map(|()| CommandOutcome::Done),
        }
    }
}

/// A shared QP facet is a QP facet: a deployment keeps one handle to register QPs with
/// and gives the other to its [`Stack`].
#[async_trait]
impl<T: QpControl + ?Sized> QpControl for std::sync::Arc<T> {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        (**self).start(sink).await
    }
    async fn load_alternate(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        (**self).load_alternate(conn, path).await
    }
    async fn set_rearm(&self, conn: ConnId) -> Result<MigState, ProviderError> {
        (**self).set_rearm(conn).await
    }
    async fn force_migrate(&self, conn: ConnId) -> Result<(), ProviderError> {
        (**self).force_migrate(conn).await
    }
    async fn software_migrate(
        &self,
        conn: ConnId,
        path: Path,
        peer: PeerMove,
    ) -> Result<(), ProviderError> {
        (**self).software_migrate(conn, path, peer).await
    }
    async fn peer_there(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        (**self).peer_there(conn, path).await
    }
    async fn arming_write(&self, conn: ConnId) -> Result<(), ProviderError> {
        (**self).arming_write(conn).await
    }
    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError> {
        (**self).query_qp(conn).await
    }
}

/// A fabric facet for deployments without an SA (RoCE, static paths): resolves the
/// paths it was given and reports subscriptions as unsupported (the engine then stops
/// asking). Clones share one table, so a deployment can [`StaticPaths::add`] the paths
/// of each connection it protects.
#[derive(Debug, Default, Clone)]
pub struct StaticPaths {
    paths: std::sync::Arc<std::sync::Mutex<Vec<Path>>>,
}

impl StaticPaths {
    /// A fabric that knows exactly `paths`.
    pub fn new(paths: Vec<Path>) -> Self {
        StaticPaths {
            paths: std::sync::Arc::new(std::sync::Mutex::new(paths)),
        }
    }

    /// Learn more paths (ones already known are not repeated).
    pub fn add(&self, paths: impl IntoIterator<Item = Path>) {
        let mut known = self.lock();
        for p in paths {
            if !known.contains(&p) {
                known.push(p);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Path>> {
        // Whole pushes only: a poisoned table is still consistent.
        self.paths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl FabricService for StaticPaths {
    async fn start(&self, _sink: InputSink) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        Ok(self
            .lock()
            .iter()
            .filter(|p| p.port == port && p.dgid == dgid)
            .copied()
            .collect())
    }

    async fn subscribe(&self, _port: PortKey) -> Result<(), ProviderError> {
        Err(ProviderError::unsupported(
            "static paths",
            Operation::Subscribe,
        ))
    }
}
