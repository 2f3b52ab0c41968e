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
use crate::probe::{PathEnds, PathVerdict, ProbeAction, ProbeDriver};
use crate::provider::{InputSink, Provider};
use crate::types::*;
use std::sync::{Arc, Mutex, PoisonError};
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
    PathHealth(PathEnds, PathVerdict),
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

/// An unaffiliated event as the Manager saw it pass: user-level programs such as a
/// subnet manager or a monitor need port up/down and fabric notices at once (the
/// "user-level events" problem of docs/iba-facts.md, section 2).
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
        service: GidService,
    },
    /// A liveness probe session's verdict: the path went down (of which kind), is up
    /// (the first time or again), or is up but held for flapping.
    Path {
        /// The path (this host's GID, the peer's).
        ends: PathEnds,
        /// What the prober says of it.
        verdict: PathVerdict,
    },
}

impl FabricEventKind {
    /// The fabric event an input received at `now` carries, if it is one.
    pub fn of(input: &Input, now: Time) -> Option<FabricEventKind> {
        if let Some((ends, verdict)) = PathVerdict::of_input(input, now) {
            return Some(FabricEventKind::Path { ends, verdict });
        }
        Some(match input {
            Input::PortInfo(info) => FabricEventKind::PortInfo(info.clone()),
            Input::PortEvent { port, event } => FabricEventKind::Port {
                port: *port,
                event: *event,
            },
            Input::DeviceFatal { device } => FabricEventKind::DeviceFatal { device: *device },
            Input::RemoteGid { gid, service } => FabricEventKind::RemoteGid {
                gid: *gid,
                service: *service,
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

    /// A liveness verdict from a prober outside this Manager (`apm run`'s per-host agent
    /// probes for every process of the host), taken as the Manager's own prober's would
    /// be (a hold counts from when the Manager receives it).
    pub fn path_health(&self, ends: PathEnds, verdict: PathVerdict) -> Result<(), ManagerError> {
        self.requests
            .send(Request::PathHealth(ends, verdict))
            .map_err(|_| ManagerError::Stopped)
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
    /// The seed of the prober's jitter; the process id when `None`.
    probe_seed: Option<u64>,
    /// Words the tasks of software moves sent ahead of the engine, and when
    /// ([`Manager::said_already`]).
    said_ahead: Arc<Mutex<Vec<(Instant, PeerWord)>>>,
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
                probe_seed: None,
                said_ahead: Arc::default(),
            },
            handle,
        ))
    }

    /// Seed the prober's jitter with `seed` instead of the process id: a simulation
    /// driven through Managers (`apm watch --sim`) plays the same for the same seed.
    pub fn with_probe_seed(mut self, seed: u64) -> Manager<P> {
        self.probe_seed = Some(seed);
        self
    }

    /// Run until [`ManagerHandle::shutdown`] or until every handle is dropped.
    pub async fn run(mut self) -> Result<(), ManagerError> {
        let start = Instant::now();
        let elapsed = move || {
            let d = Instant::now().saturating_duration_since(start);
            Time(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        };
        let (input_tx, mut input_rx): (InputSink, _) = mpsc::unbounded_channel();
        // Seeded per process: probes of hosts started together must not beat in step
        // (the jitter is what keeps them apart).
        let seed = self.probe_seed.unwrap_or(std::process::id().into());
        let mut probes = ProbeDriver::new(&self.engine.policy().probe, seed);
        let mut probe_out = probes.as_ref().map(|_| self.probe_sender());
        self.provider
            .start(input_tx.clone())
            .await
            .map_err(ManagerError::Start)?;
        // The ports the provider reported at start must be known before any API call.
        while let Ok(input) = input_rx.try_recv() {
            self.take_input(probes.as_mut(), elapsed(), input);
        }
        loop {
            if let (Some(p), Some(out)) = (probes.as_mut(), probe_out.as_mut()) {
                self.run_probes(p, out, elapsed());
            }
            if self.flush(&input_tx) {
                // Let the command tasks just spawned start now. A task spawned from a
                // worker waits in that worker's LIFO slot, which no other worker may
                // steal, until the spawner yields; with inputs queued (a link going
                // down brings a burst: the rail, GID changes, probe verdicts) this loop
                // does not yield at its `select!`, and the move waited behind every
                // input that followed it (tens of ms in the VM).
                requeue_behind_spawned().await;
            }
            let next = [
                self.engine.poll_timeout(),
                probes.as_ref().and_then(|p| p.next_deadline()),
            ]
            .into_iter()
            .flatten()
            .min();
            let deadline = next.map(|t| start + std::time::Duration::from_nanos(t.as_nanos()));
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
                    self.publish(now, &input);
                    self.take_input(probes.as_mut(), now, input);
                }
                req = self.requests.recv() => {
                    let Some(req) = req else { return Ok(()) };
                    let now = elapsed();
                    match req {
                        Request::Protect(spec, tx) => {
                            let _ = tx.send(self.engine.protect(now, spec));
                            if let Some(p) = probes.as_mut() {
                                p.follow(now, self.engine.follow_probe_paths());
                            }
                        }
                        Request::Unprotect(id, tx) => {
                            let _ = tx.send(self.engine.unprotect(now, id));
                            if let Some(p) = probes.as_mut() {
                                p.follow(now, self.engine.follow_probe_paths());
                            }
                        }
                        Request::ReportStall(id, tx) => {
                            let _ = tx.send(self.engine.report_stall(now, id));
                        }
                        Request::PathHealth(ends, verdict) => {
                            let input = verdict.input(ends, now);
                            self.publish(now, &input);
                            self.engine.handle_input(now, input);
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

    /// Publish the fabric event `input` carries, if it is one. No watcher is fine: the
    /// stream is advisory.
    fn publish(&self, now: Time, input: &Input) {
        if let Some(kind) = FabricEventKind::of(input, now) {
            let _ = self.handle.events.send(FabricEvent { time: now, kind });
        }
    }

    /// A provider's input: the prober's if it is a probe, the engine's otherwise (the
    /// prober also sees the port events).
    fn take_input(&mut self, probes: Option<&mut ProbeDriver>, now: Time, input: Input) {
        let input = match probes {
            Some(p) => p.on_input(now, input),
            None => Some(input),
        };
        if let Some(input) = input {
            self.engine.handle_input(now, input);
        }
    }

    /// Where the prober's sends go (see [`ProbeSender`]).
    fn probe_sender(&self) -> ProbeSender<P> {
        let limit = self.engine.policy().command_timeout_ms;
        ProbeSender::new(Arc::clone(&self.provider), limit)
    }

    /// Run the prober's due timers: its sends go to `out`, in order per destination (a
    /// lost probe is what probes are for: results are only logged), its verdicts to the
    /// engine and to the fabric event stream.
    fn run_probes(&mut self, probes: &mut ProbeDriver, out: &mut ProbeSender<P>, now: Time) {
        for action in probes.poll(now) {
            match action {
                ProbeAction::Send { port, to, msg } => out.send(port, to, msg),
                ProbeAction::Engine(input) => {
                    self.publish(now, &input);
                    self.engine.handle_input(now, input);
                }
            }
        }
    }

    /// Hand every pending output on (commands to provider tasks, notifications to
    /// subscribers); true when a command went to a provider task.
    fn flush(&mut self, results: &InputSink) -> bool {
        let mut spawned = false;
        while let Some(out) = self.engine.poll_output() {
            match out {
                Output::Notify(n) => {
                    debug!(conn = %n.conn, kind = ?n.kind, "notification");
                    // No subscriber is fine: notifications are advisory.
                    let _ = self.handle.notifications.send(n);
                }
                Output::Command(Command { id, op }) => {
                    if self.said_already(&op) {
                        // Its result is the one the word's send had.
                        let result = Ok(CommandOutcome::Done);
                        let _ = results.send(Input::CommandDone { id, result });
                        continue;
                    }
                    spawned = true;
                    self.spawn_command(id, op, results);
                }
            }
        }
        spawned
    }

    /// Whether `op` sends a word a move's task already sent the moment the move was done
    /// ([`CommandOp::SoftwareMigrate`]'s `announce`); the engine asks for it only once
    /// it hears of the move, and the peer needs it once. Words the engine has not asked
    /// for within one LAP timeout are forgotten: what it sends after that is its own
    /// retransmission.
    fn said_already(&self, op: &CommandOp) -> bool {
        let CommandOp::SendPeer { port, to, msg } = op else {
            return false;
        };
        let mut said = self
            .said_ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if said.is_empty() {
            return false;
        }
        let keep = std::time::Duration::from_millis(self.engine.policy().lap_timeout_ms);
        said.retain(|(at, _)| at.elapsed() < keep);
        let this = PeerWord {
            port: *port,
            to: *to,
            msg: *msg,
        };
        match said.iter().position(|(_, w)| *w == this) {
            Some(i) => {
                said.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Carry out command `id` on a task of its own; its result goes to `results`. A
    /// software move that names the word it ends with sends that word itself once the
    /// QP runs on the new path (see [`Manager::said_already`]).
    fn spawn_command(&self, id: CommandId, mut op: CommandOp, results: &InputSink) {
        let provider = Arc::clone(&self.provider);
        let results = results.clone();
        let said_ahead = Arc::clone(&self.said_ahead);
        let word = match &mut op {
            CommandOp::SoftwareMigrate { announce, .. } => announce.take(),
            _ => None,
        };
        let after_ms = self.engine.policy().command_timeout_ms;
        let (command, handed) = (op.name(), Instant::now());
        tokio::spawn(async move {
            // How long a command waited for a worker is the first thing to read when a
            // failover is slower than its steps.
            let queued = handed.elapsed();
            // The engine fails the command at its deadline too; dropping the call here
            // ends this task, so a provider that never answers holds no task and no part
            // of the command window.
            let limit = std::time::Duration::from_millis(after_ms);
            let result = tokio::time::timeout(limit, provider.execute(op))
                .await
                .unwrap_or(Err(ProviderError::NoAnswer { after_ms }));
            let ran = handed.elapsed().saturating_sub(queued);
            debug!(?id, command, ?queued, ?ran, "command done");
            if let (Ok(_), Some(&word)) = (&result, word.as_deref()) {
                // Within what is left of the command's time: the engine fails a move
                // whose result comes after its deadline, done or not.
                let left = limit.saturating_sub(handed.elapsed());
                let send = provider.execute(word.send());
                match tokio::time::timeout(left, send).await {
                    Ok(Ok(_)) => said_ahead
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), word)),
                    // The engine's own send of it goes out instead.
                    Ok(Err(e)) => debug!(?id, error = %e, "the word after the move not sent"),
                    Err(_) => debug!(?id, "the word after the move not sent in time"),
                }
            }
            let _ = results.send(Input::CommandDone { id, result });
        });
    }
}

/// The prober's sends, in the order the prober made them for each destination: one
/// queue and task per (port, peer address), so a session's probes go out one after the
/// other. A task per probe (as commands have) let two probes of one session overtake
/// each other on a multi-threaded runtime: a session coming up that said Down and, on
/// hearing its peer, Up at once was heard saying Up then Down, and its peer, Up by then,
/// took the late Down for the session going down (RFC 5880 6.8.6) and moved its
/// connections off a healthy path (seen in the VM: a false move on both sides right
/// after protection in 7 of 16 benchmark runs, none in the 80 since). One queue per
/// destination rather than one for all: a rail whose socket stops taking datagrams
/// (its send buffer full) holds only that rail's probes, and each send is abandoned at
/// the command timeout, as every provider call is.
struct ProbeSender<P: Provider> {
    provider: Arc<P>,
    limit: std::time::Duration,
    queues: std::collections::BTreeMap<(PortKey, PeerAddr), mpsc::Sender<PeerMsg>>,
}

impl<P: Provider> ProbeSender<P> {
    /// Probes waiting for one destination at most: a session's probes for several
    /// detection times; beyond it the newest are dropped, as a full socket buffer would.
    const QUEUE: usize = 64;

    fn new(provider: Arc<P>, command_timeout_ms: u64) -> ProbeSender<P> {
        ProbeSender {
            provider,
            limit: std::time::Duration::from_millis(command_timeout_ms.max(1)),
            queues: std::collections::BTreeMap::new(),
        }
    }

    fn send(&mut self, port: PortKey, to: PeerAddr, msg: PeerMsg) {
        let queue = self
            .queues
            .entry((port, to))
            .or_insert_with(|| spawn_probe_queue(Arc::clone(&self.provider), port, to, self.limit));
        if queue.try_send(msg).is_err() {
            debug!(%port, ?to, "probe not sent: its destination's queue is full");
        }
    }
}

/// The task that sends one destination's probes in order; it ends when the Manager
/// (its [`ProbeSender`]) drops the queue.
fn spawn_probe_queue<P: Provider>(
    provider: Arc<P>,
    port: PortKey,
    to: PeerAddr,
    limit: std::time::Duration,
) -> mpsc::Sender<PeerMsg> {
    let (queue, mut rx) = mpsc::channel::<PeerMsg>(ProbeSender::<P>::QUEUE);
    tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            let op = CommandOp::SendPeer { port, to, msg };
            match tokio::time::timeout(limit, provider.execute(op)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => debug!(error = %e, "probe not sent"),
                Err(_) => debug!(%port, ?to, "probe not sent: the send did not return in time"),
            }
        }
    });
    queue
}

/// Give the worker to the tasks just spawned, and stay where another worker can take
/// this one: a task that wakes itself while it runs goes to the back of its worker's
/// run queue, which the other workers steal from, while the worker runs what waits in
/// its LIFO slot first. (`tokio::task::yield_now` parks the task on the worker's defer
/// list instead, which no other worker takes: a command that then blocks the worker in
/// a verb, a RoCE modify resolving a neighbour, would hold the Manager with it.)
async fn requeue_behind_spawned() {
    let mut woke = false;
    std::future::poll_fn(|cx| {
        if woke {
            return std::task::Poll::Ready(());
        }
        woke = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

#[cfg(test)]
mod tests;
