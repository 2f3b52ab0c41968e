//! [`SimProvider`]: the apm-core Provider facets over a shared simulation, so that the
//! real driver (`apm_core::Manager`) can run against the simulated fabric.
//!
//! The simulation stays sans-IO; this module is the only place it meets tokio. Virtual
//! time follows tokio's clock (use `tokio::time::pause()` in tests: the runtime then
//! jumps straight to the next timer and whole scenarios run in milliseconds of wall
//! time). [`SimProvider::drive`] advances the simulation to tokio's "now" whenever an
//! event is due; a command is submitted at the moment it arrives and its call drives the
//! simulation until the result comes back.

use crate::sim::Sim;
use apm_core::{
    CommandOp, CommandOutcome, ConnId, FabricService, Gid, Input, InputSink, MigState, Operation,
    Path, PeerAddr, PeerChannel, PeerMove, PeerMsg, PortKey, ProviderError, QpControl, QpSnapshot,
    Reason, Stack, Time,
};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot::error::TryRecvError;
use tokio::time::Instant;

#[derive(Debug)]
struct Shared {
    sim: Sim,
    origin: Instant,
}

/// One simulated host's view of a shared [`Sim`], implementing [`QpControl`],
/// [`PeerChannel`] and [`FabricService`]. Clone it once per facet.
#[derive(Clone, Debug)]
pub struct SimProvider {
    shared: Arc<Mutex<Shared>>,
    host: usize,
}

/// A provider that can drive the shared simulation; see [`SimProvider::drive`].
pub type SimStack = Stack<SimProvider, SimProvider, SimProvider>;

impl SimProvider {
    /// Share `sim` (built with `RunConfig::external_hosts`) from now on: virtual time 0
    /// is tokio's "now" at this call. Returns a handle for [`SimProvider::for_host`].
    pub fn share(sim: Sim) -> SimProvider {
        SimProvider {
            shared: Arc::new(Mutex::new(Shared {
                sim,
                origin: Instant::now(),
            })),
            host: 0,
        }
    }

    /// The provider of `host` over the same simulation.
    pub fn for_host(&self, host: usize) -> SimProvider {
        SimProvider {
            shared: Arc::clone(&self.shared),
            host,
        }
    }

    /// The three facets composed into one `Provider` for the Manager.
    pub fn stack(&self) -> SimStack {
        Stack::new(self.clone(), self.clone(), self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        // A panic while holding the lock is already a test failure; keep going with the
        // data as it is rather than cascading panics.
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Virtual time now: tokio's clock since the origin. Outside a runtime (a caller
    /// between two `block_on`s, as the C API's are) `Instant::now()` reads the wall
    /// clock, not the runtime's paused one, and would jump the simulation ahead by
    /// however long the caller took: there the simulation stays where it is.
    fn now_of(sh: &Shared) -> Time {
        if tokio::runtime::Handle::try_current().is_err() {
            return sh.sim.now();
        }
        let d = Instant::now().saturating_duration_since(sh.origin);
        Time(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Use the simulation (after bringing it up to tokio's now).
    pub fn with_sim<R>(&self, f: impl FnOnce(&mut Sim) -> R) -> R {
        let mut sh = self.lock();
        let now = Self::now_of(&sh);
        sh.sim.run_until(now);
        f(&mut sh.sim)
    }

    /// Advance the simulation in step with tokio's clock until virtual time `until`.
    /// Run it as a task next to the Managers.
    pub async fn drive(&self, until: Time) {
        loop {
            let (next, origin) = {
                let mut sh = self.lock();
                let now = Self::now_of(&sh);
                sh.sim.run_until(now.min(until));
                (sh.sim.next_event_time(), sh.origin)
            };
            let Some(next) = next.filter(|t| *t <= until) else {
                let end = origin + std::time::Duration::from_nanos(until.0);
                tokio::time::sleep_until(end).await;
                return;
            };
            tokio::time::sleep_until(origin + std::time::Duration::from_nanos(next.0)).await;
        }
    }

    /// Submit `op` and drive the simulation in step with tokio's clock until its result
    /// comes back (a device command queues behind others; an SA request waits for the
    /// SA and its retries).
    async fn exec(&self, op: CommandOp) -> Result<CommandOutcome, ProviderError> {
        let operation = Operation::from(&op);
        let (mut rx, origin) = {
            let mut sh = self.lock();
            let now = Self::now_of(&sh);
            sh.sim.run_until(now);
            (sh.sim.submit_external(self.host, op), sh.origin)
        };
        loop {
            let next = {
                let mut sh = self.lock();
                let now = Self::now_of(&sh);
                sh.sim.run_until(now);
                match rx.try_recv() {
                    Ok(result) => return result,
                    Err(TryRecvError::Closed) => {
                        return Err(ProviderError::io(operation, Reason::Closed))
                    }
                    Err(TryRecvError::Empty) => sh.sim.next_event_time(),
                }
            };
            let Some(next) = next else {
                return Err(ProviderError::Timeout { operation });
            };
            tokio::time::sleep_until(origin + std::time::Duration::from_nanos(next.0)).await;
        }
    }
}

/// The simulator answered a command with an outcome of another command.
fn unexpected(operation: Operation) -> ProviderError {
    ProviderError::io(operation, Reason::BadAnswer)
}

#[async_trait]
impl QpControl for SimProvider {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        let mut sh = self.lock();
        for info in sh.sim.port_infos(self.host) {
            // The Manager owns the receiver; it cannot be gone while it starts us.
            let _ = sink.send(Input::PortInfo(info));
        }
        sh.sim.attach_external(self.host, sink);
        Ok(())
    }

    async fn load_alternate(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        self.exec(CommandOp::LoadAlternate { conn, path })
            .await
            .map(|_| ())
    }

    async fn set_rearm(&self, conn: ConnId) -> Result<MigState, ProviderError> {
        match self.exec(CommandOp::SetRearm { conn }).await? {
            CommandOutcome::MigState(m) => Ok(m),
            _ => Err(unexpected(Operation::SetRearm)),
        }
    }

    async fn force_migrate(&self, conn: ConnId) -> Result<(), ProviderError> {
        self.exec(CommandOp::ForceMigrate { conn })
            .await
            .map(|_| ())
    }

    async fn software_migrate(
        &self,
        conn: ConnId,
        path: Path,
        peer: PeerMove,
    ) -> Result<(), ProviderError> {
        // The Manager above sends the word after the move itself.
        let announce = None;
        self.exec(CommandOp::SoftwareMigrate {
            conn,
            path,
            peer,
            announce,
        })
        .await
        .map(|_| ())
    }

    async fn peer_there(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        self.exec(CommandOp::PeerThere { conn, path })
            .await
            .map(|_| ())
    }

    async fn arming_write(&self, conn: ConnId) -> Result<(), ProviderError> {
        self.exec(CommandOp::ArmingWrite { conn }).await.map(|_| ())
    }

    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError> {
        match self.exec(CommandOp::QueryQp { conn }).await? {
            CommandOutcome::Qp(q) => Ok(q),
            _ => Err(unexpected(Operation::QueryQp)),
        }
    }
}

#[async_trait]
impl PeerChannel for SimProvider {
    async fn start(&self, _sink: InputSink) -> Result<(), ProviderError> {
        // Peer messages arrive through the sink QpControl::start registered.
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        self.exec(CommandOp::SendPeer { port, to, msg })
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl FabricService for SimProvider {
    async fn start(&self, _sink: InputSink) -> Result<(), ProviderError> {
        // Notices arrive through the sink QpControl::start registered.
        Ok(())
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        match self.exec(CommandOp::ResolvePaths { port, dgid }).await? {
            CommandOutcome::Paths(p) => Ok(p),
            _ => Err(unexpected(Operation::ResolvePaths)),
        }
    }

    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError> {
        self.exec(CommandOp::Subscribe { port }).await.map(|_| ())
    }
}
