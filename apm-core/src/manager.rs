//! The driver: the only async part of apm-core. It feeds provider inputs and API calls to
//! the engine, carries out the engine's commands through the provider, and sleeps until
//! the engine's next deadline.
//!
//! Time: the driver stamps every input with `tokio::time::Instant` elapsed since it
//! started, so tests with tokio's paused clock run in virtual time. Commands run as
//! concurrent tasks: the engine hands over at most one QP command per connection at a
//! time (an override's command waits for the answer to the one in flight), so tasks
//! of one connection never overlap; sends, path queries and subscriptions name no QP
//! and may overlap. Every call is abandoned at `Policy::command_timeout_ms` and
//! answered `ProviderError::NoAnswer`, the engine failing the command at the same
//! deadline: a provider call that never returns wedges neither its connection nor the
//! commands after it.

use crate::engine::{ConnStatus, Engine, EngineError, Stats};
use crate::io::*;
use crate::policy::{Policy, PolicyError};
use crate::provider::{InputSink, Provider};
use crate::types::*;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tracing::debug;

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
    ReportStall(ConnId, oneshot::Sender<Result<(), EngineError>>),
    Status(ConnId, oneshot::Sender<Option<ConnStatus>>),
    Stats(oneshot::Sender<Stats>),
    Shutdown,
}

/// A cheap, cloneable handle to a running [`Manager`].
#[derive(Clone, Debug)]
pub struct ManagerHandle {
    requests: mpsc::UnboundedSender<Request>,
    notifications: broadcast::Sender<Notification>,
    events: broadcast::Sender<FabricEvent>,
}

/// An unaffiliated event as the Manager saw it pass (seed 002: user-level programs such
/// as a subnet manager or a monitor need port up/down and fabric notices).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FabricEvent {
    /// When the Manager received it (its own clock, as for the engine).
    pub time: Time,
    /// What happened.
    pub kind: FabricEventKind,
}

/// Kinds of [`FabricEvent`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum FabricEventKind {
    /// A local port's attributes (reported at start and after changes).
    PortInfo(PortInfo),
    /// An unaffiliated port event.
    Port {
        /// The port.
        port: PortKey,
        /// What happened.
        event: PortEvent,
    },
    /// A device-wide fatal error.
    DeviceFatal {
        /// Provider device index.
        device: u16,
    },
    /// An SA notice about a remote port GID (trap 64: in service, trap 65: out).
    RemoteGid {
        /// The remote port GID.
        gid: Gid,
        /// In service or not.
        in_service: bool,
    },
}

impl FabricEventKind {
    /// The fabric event an input carries, if it is one.
    pub fn of(input: &Input) -> Option<FabricEventKind> {
        Some(match input {
            Input::PortInfo(info) => FabricEventKind::PortInfo(info.clone()),
            Input::PortEvent { port, event } => FabricEventKind::Port {
                port: *port,
                event: *event,
            },
            Input::DeviceFatal { device } => FabricEventKind::DeviceFatal { device: *device },
            Input::RemoteGid { gid, in_service } => FabricEventKind::RemoteGid {
                gid: *gid,
                in_service: *in_service,
            },
            _ => return None,
        })
    }
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

    /// The application saw the sends of `id` stop completing (work outstanding, no
    /// completion for longer than it tolerates): the engine takes it as the primary path
    /// stalled and moves the connection to its armed alternate (forcing the migration in
    /// hardware, moving the path in software), telling the peer. For QPs whose
    /// completions apm cannot see (an application's own), where a dead path that raises
    /// no port event or notice is noticed only by the application.
    pub async fn report_stall(&self, id: ConnId) -> Result<(), ManagerError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::ReportStall(id, tx))
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

    /// A stream of unaffiliated events (port up/down, LID/SM changes, client reregister,
    /// device fatal, remote GID in/out of service) from now on, as they reach the engine.
    pub fn fabric_events(&self) -> broadcast::Receiver<FabricEvent> {
        self.events.subscribe()
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
        let (events_tx, _) = broadcast::channel(1024);
        let handle = ManagerHandle {
            requests: req_tx,
            notifications: notif_tx,
            events: events_tx,
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
        // The ports the provider reported at start must be known before any API call.
        while let Ok(input) = input_rx.try_recv() {
            self.engine.handle_input(elapsed(), input);
        }
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
            // Provider inputs first: an event that already happened must be seen before
            // an API call that follows it.
            tokio::select! {
                biased;
                input = input_rx.recv() => {
                    // input_tx lives in this function, so the channel never closes.
                    let Some(input) = input else { return Ok(()) };
                    let now = elapsed();
                    if let Some(kind) = FabricEventKind::of(&input) {
                        // No watcher is fine: the stream is advisory.
                        let _ = self.handle.events.send(FabricEvent { time: now, kind });
                    }
                    self.engine.handle_input(now, input);
                }
                req = self.requests.recv() => {
                    let Some(req) = req else { return Ok(()) };
                    let now = elapsed();
                    match req {
                        Request::Protect(spec, tx) => {
                            let _ = tx.send(self.engine.protect(now, spec));
                        }
                        Request::Unprotect(id, tx) => {
                            let _ = tx.send(self.engine.unprotect(now, id));
                        }
                        Request::ReportStall(id, tx) => {
                            let _ = tx.send(self.engine.report_stall(now, id));
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
                    let after_ms = self.engine.policy().command_timeout_ms;
                    tokio::spawn(async move {
                        // The engine fails the command at its deadline too; dropping the
                        // call here ends this task, so a provider that never answers
                        // holds no task and no part of the command window.
                        let limit = std::time::Duration::from_millis(after_ms);
                        let result = tokio::time::timeout(limit, provider.execute(op))
                            .await
                            .unwrap_or(Err(ProviderError::NoAnswer { after_ms }));
                        let _ = results.send(Input::CommandDone { id, result });
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The driver against a mocked provider, in tokio's paused (virtual) time.

    use super::*;
    use crate::provider::MockProvider;
    use std::sync::Mutex;

    fn port(p: u8) -> PortInfo {
        PortInfo {
            key: PortKey::new(0, p),
            gids: vec![Gid::from_guid(0xa0 + u64::from(p))],
            lid: Lid::new(u16::from(p)).expect("unicast"),
            lmc: 0,
            active: true,
            link_layer: LinkLayer::InfiniBand,
        }
    }

    fn path(p: u8) -> Path {
        Path {
            port: PortKey::new(0, p),
            slid: Lid::new(u16::from(p)).expect("unicast"),
            dlid: Lid::new(10 + u16::from(p)).expect("unicast"),
            sgid: Gid::from_guid(0xa0 + u64::from(p)),
            dgid: Gid::from_guid(0xb0 + u64::from(p)),
            sgid_index: 0,
            sl: 0,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            rate: 0,
            mtu: 5,
            pkey_index: 0,
            ack_timeout: 14,
        }
    }

    fn spec() -> ConnSpec {
        ConnSpec {
            id: ConnId(7),
            role: Role::Active,
            mode: MigrationMode::Hardware,
            local_qpn: Qpn::new(0x11).expect("24-bit"),
            remote_qpn: Qpn::new(0x22).expect("24-bit"),
            local_comm_id: 1,
            remote_comm_id: 2,
            primary: path(1),
            agreed_alternate: Some(path(2)),
            candidates: vec![],
        }
    }

    /// A mock that hands out ports at start, keeps the sink, and records every command.
    /// Its peer answers a probe (`Migrate` asking it to move first) by moving.
    fn mock(sink: Arc<Mutex<Option<InputSink>>>, ops: Arc<Mutex<Vec<CommandOp>>>) -> MockProvider {
        let mut m = MockProvider::new();
        let started = sink.clone();
        m.expect_start().returning(move |s| {
            for p in [1, 2] {
                s.send(Input::PortInfo(port(p))).expect("driver listens");
            }
            *started.lock().expect("not poisoned") = Some(s);
            Ok(())
        });
        m.expect_execute().returning(move |op| {
            ops.lock().expect("not poisoned").push(op.clone());
            if let CommandOp::SendPeer {
                port,
                msg: PeerMsg::Migrate(m),
                ..
            } = &op
            {
                let answer = Input::PeerMessage {
                    from: PeerAddr::far_end(&m.path),
                    port: *port,
                    msg: PeerMsg::MigrateAck(MigrateAck {
                        sender_comm_id: m.receiver_comm_id,
                        receiver_comm_id: m.sender_comm_id,
                        ok: true,
                    }),
                };
                if let Some(s) = sink.lock().expect("not poisoned").as_ref() {
                    // The driver listens while it runs.
                    let _ = s.send(answer);
                }
            }
            Ok(match op {
                CommandOp::SetRearm { .. } => CommandOutcome::MigState(MigState::Armed),
                _ => CommandOutcome::Done,
            })
        });
        m.expect_name().return_const("mock".to_string());
        m
    }

    /// A Manager on the recording mock, spawned, its streams subscribed before it runs.
    struct Running {
        handle: ManagerHandle,
        notes: broadcast::Receiver<Notification>,
        events: broadcast::Receiver<FabricEvent>,
        sink: Arc<Mutex<Option<InputSink>>>,
        ops: Arc<Mutex<Vec<CommandOp>>>,
        task: tokio::task::JoinHandle<Result<(), ManagerError>>,
    }

    fn start() -> Running {
        let sink = Arc::new(Mutex::new(None));
        let ops = Arc::new(Mutex::new(Vec::new()));
        let provider = Arc::new(mock(sink.clone(), ops.clone()));
        let (manager, handle) = Manager::new(provider, Policy::default()).expect("valid");
        let notes = handle.notifications();
        let events = handle.fabric_events();
        let task = tokio::spawn(manager.run());
        Running {
            handle,
            notes,
            events,
            sink,
            ops,
            task,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn protect_loads_arms_and_notifies_then_port_err_forces_migration() {
        let Running {
            handle,
            mut notes,
            mut events,
            sink,
            ops,
            task,
        } = start();
        // No waiting: the ports reported at start reach the engine before any API call.
        handle.protect(spec()).await.expect("accepted");
        let n = notes.recv().await.expect("a notification");
        assert!(
            matches!(n.kind, NotificationKind::Protected { alternate, .. } if alternate.same_route(&path(2)))
        );
        let names: Vec<_> = ops.lock().expect("ok").iter().map(|o| o.name()).collect();
        assert_eq!(
            names,
            ["subscribe", "subscribe", "load_alternate", "set_rearm"]
        );

        // A PORT_ERR pushed by the provider reaches the engine; the driver forces migration.
        let s = sink.lock().expect("ok").clone().expect("started");
        s.send(Input::PortEvent {
            port: PortKey::new(0, 1),
            event: PortEvent::Down,
        })
        .expect("driver listens");
        let n = notes.recv().await.expect("a notification");
        assert!(
            matches!(n.kind, NotificationKind::Migrated { forced: true, .. }),
            "{n:?}"
        );
        let ev = events.recv().await.expect("the port event is published");
        assert_eq!(
            ev.kind,
            FabricEventKind::Port {
                port: PortKey::new(0, 1),
                event: PortEvent::Down
            }
        );
        assert!(ops
            .lock()
            .expect("ok")
            .iter()
            .any(|o| o.name() == "force_migrate"));
        let status = handle
            .status(ConnId(7))
            .await
            .expect("running")
            .expect("known");
        assert!(status.primary.same_route(&path(2)), "{}", status.primary);

        // API misuse is reported, not fatal.
        assert!(matches!(
            handle.protect(spec()).await,
            Err(ManagerError::Engine(_))
        ));
        handle.shutdown();
        task.await.expect("joined").expect("clean stop");
        assert!(matches!(
            handle.protect(spec()).await,
            Err(ManagerError::Stopped)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_the_application_reports_forces_the_migration() {
        let Running {
            handle,
            mut notes,
            ops,
            ..
        } = start();
        // No waiting: the ports reported at start reach the engine before any API call.
        handle.protect(spec()).await.expect("accepted");
        let n = notes.recv().await.expect("protected");
        assert!(
            matches!(n.kind, NotificationKind::Protected { .. }),
            "{n:?}"
        );
        assert!(matches!(
            handle.report_stall(ConnId(9)).await,
            Err(ManagerError::Engine(EngineError::UnknownConnection(
                ConnId(9)
            )))
        ));
        handle
            .report_stall(spec().id)
            .await
            .expect("known connection");
        let n = notes.recv().await.expect("migrated");
        assert!(
            matches!(n.kind, NotificationKind::Migrated { forced: true, .. }),
            "{n:?}"
        );
        let forced = ops
            .lock()
            .expect("ok")
            .iter()
            .any(|o| matches!(o, CommandOp::ForceMigrate { .. }));
        assert!(forced, "the HCA was told to migrate");
    }

    #[tokio::test(start_paused = true)]
    async fn provider_start_failure_is_reported() {
        let mut m = MockProvider::new();
        m.expect_start().returning(|_| {
            Err(ProviderError::Unavailable(
                "libibverbs.so.1 not found: install libibverbs1".into(),
            ))
        });
        let (manager, _handle) = Manager::new(Arc::new(m), Policy::default()).expect("valid");
        let err = manager.run().await.expect_err("start fails");
        assert!(err.to_string().contains("libibverbs1"), "{err}");
    }

    /// A provider whose QP loads never return (a wedged device call); it reports every
    /// call it gets.
    struct NeverAnswers {
        calls: mpsc::UnboundedSender<&'static str>,
    }

    #[async_trait::async_trait]
    impl Provider for NeverAnswers {
        fn name(&self) -> String {
            "never-answers".into()
        }
        async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
            for p in [1, 2] {
                sink.send(Input::PortInfo(port(p))).expect("driver listens");
            }
            Ok(())
        }
        async fn execute(&self, op: CommandOp) -> Result<CommandOutcome, ProviderError> {
            let _ = self.calls.send(op.name());
            match op {
                CommandOp::LoadAlternate { .. } => std::future::pending().await,
                _ => Ok(CommandOutcome::Done),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_provider_call_that_never_returns_fails_at_the_deadline() {
        let (calls, mut called) = mpsc::unbounded_channel();
        let provider = Arc::new(NeverAnswers { calls });
        let (manager, handle) = Manager::new(provider, Policy::default()).expect("valid");
        let mut notes = handle.notifications();
        let task = tokio::spawn(manager.run());
        handle.protect(spec()).await.expect("accepted");
        let n = notes.recv().await.expect("a notification");
        assert_eq!(
            n.kind,
            NotificationKind::Unprotected {
                reason: UnprotectedReason::ModifyFailed
            }
        );
        assert_eq!(
            n.time,
            Time::from_millis(Policy::default().command_timeout_ms)
        );
        // Not wedged: the manager answers and goes on issuing commands.
        let status = handle.status(ConnId(7)).await.expect("running");
        assert_eq!(
            status.map(|s| s.protection),
            Some(crate::Protection::Unprotected)
        );
        // And the provider is called again after the stuck load.
        let mut seen = Vec::new();
        while !seen.contains(&"load_alternate") {
            seen.push(called.recv().await.expect("the provider is called"));
        }
        let next = called.recv().await.expect("a call after the stuck one");
        assert!(!next.is_empty(), "{seen:?} then {next}");
        handle.shutdown();
        task.await.expect("joined").expect("clean stop");
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_fire_in_virtual_time() {
        // No APR ever comes: after lap_max_tries the connection is reported unprotected,
        // 1.5 s of virtual time later, with no real waiting.
        let Running {
            handle,
            mut notes,
            ops,
            ..
        } = start();
        let mut s = spec();
        s.agreed_alternate = None;
        s.candidates = vec![path(2)];
        handle.protect(s).await.expect("accepted");
        let n = notes.recv().await.expect("a notification");
        assert!(
            matches!(
                n.kind,
                NotificationKind::Unprotected {
                    reason: UnprotectedReason::PeerUnresponsive
                }
            ),
            "{n:?}"
        );
        assert_eq!(n.time, Time::from_millis(1500));
        let laps = ops
            .lock()
            .expect("ok")
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    CommandOp::SendPeer {
                        msg: PeerMsg::Lap(_),
                        ..
                    }
                )
            })
            .count();
        assert_eq!(laps, 4);
    }
}
