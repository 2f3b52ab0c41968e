//! The driver: the only async part of apm-core. It feeds provider inputs and API calls to
//! the engine, carries out the engine's commands through the provider, and sleeps until
//! the engine's next deadline.
//!
//! Time: the driver stamps every input with `tokio::time::Instant` elapsed since it
//! started, so tests with tokio's paused clock run in virtual time. Commands run as
//! concurrent tasks; the engine never issues two for the same connection at once.

use crate::engine::{ConnStatus, Engine, EngineError, Stats};
use crate::io::*;
use crate::policy::{Policy, PolicyError};
use crate::provider::{InputSink, Provider};
use crate::types::*;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

/// Why the manager stopped or refused a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The policy is unusable.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The provider failed to start.
    #[error("provider failed to start: {0}")]
    Start(ProviderError),
    /// The engine refused an API call.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The manager is no longer running.
    #[error("the manager has shut down")]
    Stopped,
}

enum Request {
    Protect(ConnSpec, oneshot::Sender<Result<(), EngineError>>),
    Unprotect(ConnId, oneshot::Sender<Result<(), EngineError>>),
    Status(ConnId, oneshot::Sender<Option<ConnStatus>>),
    Stats(oneshot::Sender<Stats>),
    Shutdown,
}

/// A cheap, cloneable handle to a running [`Manager`].
#[derive(Clone, Debug)]
pub struct ManagerHandle {
    requests: mpsc::UnboundedSender<Request>,
    notifications: broadcast::Sender<Notification>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Request")
    }
}

impl ManagerHandle {
    /// Put a connection under protection.
    pub async fn protect(&self, spec: ConnSpec) -> Result<(), ManagerError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Protect(spec, tx))
            .map_err(|_| ManagerError::Stopped)?;
        Ok(rx.await.map_err(|_| ManagerError::Stopped)??)
    }

    /// Stop protecting a connection (the QP is left as it is).
    pub async fn unprotect(&self, id: ConnId) -> Result<(), ManagerError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Unprotect(id, tx))
            .map_err(|_| ManagerError::Stopped)?;
        Ok(rx.await.map_err(|_| ManagerError::Stopped)??)
    }

    /// How a connection stands.
    pub async fn status(&self, id: ConnId) -> Result<Option<ConnStatus>, ManagerError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Status(id, tx))
            .map_err(|_| ManagerError::Stopped)?;
        rx.await.map_err(|_| ManagerError::Stopped)
    }

    /// The engine's counters.
    pub async fn stats(&self) -> Result<Stats, ManagerError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Stats(tx))
            .map_err(|_| ManagerError::Stopped)?;
        rx.await.map_err(|_| ManagerError::Stopped)
    }

    /// A stream of notifications from now on. A receiver that falls more than 4096
    /// notifications behind loses the oldest (tokio broadcast semantics).
    pub fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.notifications.subscribe()
    }

    /// Ask the manager to stop after the current step.
    pub fn shutdown(&self) {
        let _ = self.requests.send(Request::Shutdown);
    }
}

/// Drives an [`Engine`] with a [`Provider`]. Create with [`Manager::new`], run with
/// [`Manager::run`], talk to it through its [`ManagerHandle`].
#[derive(Debug)]
pub struct Manager<P: Provider> {
    engine: Engine,
    provider: Arc<P>,
    requests: mpsc::UnboundedReceiver<Request>,
    handle: ManagerHandle,
}

impl<P: Provider> Manager<P> {
    /// A manager for `provider` with `policy`.
    pub fn new(
        provider: Arc<P>,
        policy: Policy,
    ) -> Result<(Manager<P>, ManagerHandle), ManagerError> {
        let engine = Engine::new(policy)?;
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (notif_tx, _) = broadcast::channel(4096);
        let handle = ManagerHandle {
            requests: req_tx,
            notifications: notif_tx,
        };
        Ok((
            Manager {
                engine,
                provider,
                requests: req_rx,
                handle: handle.clone(),
            },
            handle,
        ))
    }

    /// Run until [`ManagerHandle::shutdown`] or until every handle is dropped.
    pub async fn run(mut self) -> Result<(), ManagerError> {
        let start = Instant::now();
        let elapsed = move || {
            let d = Instant::now().saturating_duration_since(start);
            Time(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        };
        let (input_tx, mut input_rx): (InputSink, _) = mpsc::unbounded_channel();
        self.provider
            .start(input_tx.clone())
            .await
            .map_err(ManagerError::Start)?;
        loop {
            self.flush(&input_tx);
            let deadline = self
                .engine
                .poll_timeout()
                .map(|t| start + std::time::Duration::from_nanos(t.as_nanos()));
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                req = self.requests.recv() => {
                    let Some(req) = req else { return Ok(()) };
                    let now = elapsed();
                    match req {
                        Request::Protect(spec, tx) => {
                            let _ = tx.send(self.engine.handle_input(now, Input::Protect(spec)));
                        }
                        Request::Unprotect(id, tx) => {
                            let _ = tx.send(self.engine.handle_input(now, Input::Unprotect(id)));
                        }
                        Request::Status(id, tx) => {
                            let _ = tx.send(self.engine.connection(id));
                        }
                        Request::Stats(tx) => {
                            let _ = tx.send(self.engine.stats().clone());
                        }
                        Request::Shutdown => return Ok(()),
                    }
                }
                input = input_rx.recv() => {
                    // input_tx lives in this function, so the channel never closes.
                    let Some(input) = input else { return Ok(()) };
                    if let Err(e) = self.engine.handle_input(elapsed(), input) {
                        warn!(error = %e, "provider input refused by the engine");
                    }
                }
                () = sleep => {
                    self.engine.handle_timeout(elapsed());
                }
            }
        }
    }

    /// Hand every pending output on: commands to provider tasks, notifications to
    /// subscribers.
    fn flush(&mut self, results: &InputSink) {
        while let Some(out) = self.engine.poll_output() {
            match out {
                Output::Notify(n) => {
                    debug!(conn = %n.conn, kind = ?n.kind, "notification");
                    // No subscriber is fine: notifications are advisory.
                    let _ = self.handle.notifications.send(n);
                }
                Output::Command(Command { id, op }) => {
                    let provider = Arc::clone(&self.provider);
                    let results = results.clone();
                    tokio::spawn(async move {
                        let result = provider.execute(op).await;
                        let _ = results.send(Input::CommandDone { id, result });
                    });
                }
            }
        }
    }
}
