//! The process side: a connection to the host's agent, and [`AgentPeer`], the engine's
//! peer facet over it; and [`AgentWatch`], a watcher's connection (`apm watch --agent`).
//!
//! What arrives from the agent goes to one receiver the process owns (`events`): peer
//! messages (to be handed to the engine of the connection's device through
//! [`AgentPeer::deliver`]), rail-down verdicts, refusals, and the end of the stream
//! when the agent goes away.
//!
//! A client believes nothing before it has checked whom it reached: the socket's
//! directory must be writable by nobody but its owner, and the process listening on it
//! must run as root, as this user, or as the configured agent user
//! ([`AgentSocket::trusts`]); otherwise [`AgentClient::connect`] fails with
//! [`AgentError::Untrusted`].
use crate::access::{AccessError, AgentSocket};
use crate::status::{AgentStatus, ProcessStatus};
use crate::wire::{self, FromAgent, PathsAnswer, Route, ToAgent};
use crate::AgentError;
use apm_core::{Gid, PeerAddr, PeerMsg};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// Requests waiting for the agent's answer, by request id.
#[derive(Debug)]
struct Waiters<T>(Mutex<BTreeMap<u64, oneshot::Sender<T>>>);

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters(Mutex::new(BTreeMap::new()))
    }
}

impl<T> Waiters<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, oneshot::Sender<T>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the answer to request `req` will arrive.
    fn wait(&self, req: u64) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(req, tx);
        rx
    }

    /// The answer to request `req` (dropped when nobody waits for it).
    fn answer(&self, req: u64, value: T) {
        if let Some(w) = self.lock().remove(&req) {
            let _ = w.send(value);
        }
    }
}

type Candidates = Waiters<Result<Vec<(Gid, Gid)>, String>>;
type PathAnswers = Waiters<Result<PathsAnswer, String>>;
type StatusAnswers = Waiters<Box<AgentStatus>>;

/// Why no paths came back from [`AgentClient::paths`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathsError {
    /// The agent could not be asked (gone, ...).
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The agent did not answer in time.
    #[error("the apm agent did not answer within {0:?}")]
    TimedOut(Duration),
    /// The agent (the SA behind it) could not tell, and why.
    #[error("{0}")]
    Unknown(String),
}

/// How long a paths request may take (the agent asks the SA, which retries).
const PATHS_TIMEOUT: Duration = Duration::from_secs(15);

/// Why no alternate rails came back from [`AgentClient::candidates`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CandidatesError {
    /// The agent could not be asked (gone, ...).
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The agent did not answer in time.
    #[error("the apm agent did not answer within {0:?}")]
    TimedOut(Duration),
    /// The agent answered that there are none, and why (no apm at the peer, no
    /// address in a common subnet, ...).
    #[error("{0}")]
    NoneThere(String),
}

/// How long a candidates request may take (the agent asks the peer's agent, with retries).
const CANDIDATES_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the agent may take to answer [`AgentClient::synced`] (it answers from its
/// own loop, with nothing to ask anybody).
const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// A process's connection to its host's agent.
#[derive(Debug)]
pub struct AgentClient {
    tx: mpsc::UnboundedSender<ToAgent>,
    candidates: Arc<Candidates>,
    paths: Arc<PathAnswers>,
    syncs: Arc<Waiters<()>>,
    statuses: Arc<StatusAnswers>,
    next: AtomicU64,
}

impl AgentClient {
    /// Connect to the agent at `socket`, once its directory and the agent's credentials
    /// are checked. Everything the agent sends but the answers to
    /// [`AgentClient::candidates`] and [`AgentClient::synced`] goes to `events`, which
    /// closes when the agent goes away. Call inside a tokio runtime.
    pub async fn connect(
        socket: &AgentSocket,
        events: mpsc::UnboundedSender<FromAgent>,
    ) -> Result<AgentClient, AgentError> {
        let stream = connect_checked(socket)?;
        let (read, mut write) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<ToAgent>();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if write.write_all(&wire::line(&m)).await.is_err() {
                    return;
                }
            }
        });
        let candidates: Arc<Candidates> = Arc::default();
        let answers = candidates.clone();
        let paths: Arc<PathAnswers> = Arc::default();
        let path_answers = paths.clone();
        let syncs: Arc<Waiters<()>> = Arc::default();
        let synced = syncs.clone();
        let statuses: Arc<StatusAnswers> = Arc::default();
        let status_answers = statuses.clone();
        tokio::spawn(async move {
            let mut lines = wire::Lines::new(BufReader::new(read));
            while let Ok(Some(l)) = lines.next_line().await {
                match serde_json::from_slice::<FromAgent>(l) {
                    Ok(FromAgent::Candidates { req, result }) => answers.answer(req, result),
                    Ok(FromAgent::Paths { req, result }) => path_answers.answer(req, result),
                    Ok(FromAgent::Synced { req }) => synced.answer(req, ()),
                    Ok(FromAgent::Status { req, status }) => status_answers.answer(req, status),
                    Ok(other) => {
                        if events.send(other).is_err() {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "unreadable line from the agent"),
                }
            }
            // Dropping `events` here tells the process the agent is gone; dropping the
            // waiters tells each `synced` and `status` caller.
            synced.lock().clear();
            status_answers.lock().clear();
        });
        Ok(AgentClient {
            tx,
            candidates,
            paths,
            syncs,
            statuses,
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
    ) -> Result<Vec<(Gid, Gid)>, CandidatesError> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let rx = self.candidates.wait(req);
        self.put(ToAgent::Candidates {
            req,
            sgid,
            dgid,
            local_gids,
        })?;
        match tokio::time::timeout(CANDIDATES_TIMEOUT, rx).await {
            Ok(Ok(r)) => r.map_err(CandidatesError::NoneThere),
            Ok(Err(_)) => Err(AgentError::Gone.into()),
            Err(_) => Err(CandidatesError::TimedOut(CANDIDATES_TIMEOUT)),
        }
    }

    /// Once the agent has handled everything sent before (it handles one process's
    /// lines in order): registrations listen on their addresses, messages are sent,
    /// rail-downs are told. `Err` when the agent is gone or does not answer in time.
    pub async fn synced(&self) -> Result<(), AgentError> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let rx = self.syncs.wait(req);
        self.put(ToAgent::Sync { req })?;
        match tokio::time::timeout(SYNC_TIMEOUT, rx).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(AgentError::Gone),
            Err(_) => Err(AgentError::NoAnswer(SYNC_TIMEOUT)),
        }
    }

    /// What the agent and the processes this caller may see are doing (`apm status`;
    /// `pid`: only that process). `Err` when the agent is gone or does not answer in
    /// time (an agent of an older apm drops the request it cannot read).
    pub async fn status(&self, pid: Option<u32>) -> Result<AgentStatus, AgentError> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let rx = self.statuses.wait(req);
        self.put(ToAgent::Status { req, pid })?;
        match tokio::time::timeout(SYNC_TIMEOUT, rx).await {
            Ok(Ok(s)) => Ok(*s),
            Ok(Err(_)) => Err(AgentError::Gone),
            Err(_) => Err(AgentError::NoAnswer(SYNC_TIMEOUT)),
        }
    }

    /// Tell the agent this process's account of itself (replacing the last one).
    pub fn report(&self, status: ProcessStatus) -> Result<(), AgentError> {
        self.put(ToAgent::Report {
            status: Box::new(status),
        })
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
        self.put(ToAgent::Send {
            from,
            to,
            msg,
            lid: 0,
        })
    }

    /// Send a peer message from local address `from` to the peer `to`: on InfiniBand
    /// its LID is where the MAD goes.
    pub fn send_to(&self, from: Gid, to: PeerAddr, msg: PeerMsg) -> Result<(), AgentError> {
        self.put(ToAgent::Send {
            from,
            to: to.gid,
            msg,
            lid: to.lid.get(),
        })
    }

    /// The paths from the InfiniBand port holding `sgid` to a peer port named by its
    /// GID, or by its LID when its GID is not known: the SA's, asked once per host.
    pub async fn paths(
        &self,
        sgid: Gid,
        dgid: Option<Gid>,
        dlid: Option<u16>,
    ) -> Result<PathsAnswer, PathsError> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let rx = self.paths.wait(req);
        self.put(ToAgent::Paths {
            req,
            sgid,
            dgid,
            dlid,
        })?;
        match tokio::time::timeout(PATHS_TIMEOUT, rx).await {
            Ok(Ok(r)) => r.map_err(PathsError::Unknown),
            Ok(Err(_)) => Err(AgentError::Gone.into()),
            Err(_) => Err(PathsError::TimedOut(PATHS_TIMEOUT)),
        }
    }

    /// Ask for the SA's notices (traps 64/65), subscribing through the InfiniBand port
    /// holding `sgid` (they arrive as [`FromAgent::RemoteGid`] on `events`).
    pub fn subscribe(&self, sgid: Gid) -> Result<(), AgentError> {
        self.put(ToAgent::Subscribe { sgid })
    }
}

/// A non-blocking stream to the agent at `socket`, its directory and the agent's
/// credentials checked.
fn connect_checked(socket: &AgentSocket) -> Result<tokio::net::UnixStream, AgentError> {
    use std::io::ErrorKind;
    let path = socket.path().to_owned();
    let stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {
            return Err(AgentError::NotRunning(path))
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return Err(AgentError::NotAllowed(path))
        }
        Err(e) => return Err(e.into()),
    };
    socket.check_dir()?;
    let stream = tokio::net::UnixStream::from_std({
        stream.set_nonblocking(true)?;
        stream
    })?;
    let uid = stream.peer_cred()?.uid();
    if !socket.trusts(uid) {
        return Err(AccessError::Impostor { path, uid }.into());
    }
    Ok(stream)
}

/// How long a watcher waits for the agent to answer [`ToAgent::Watch`]: an agent of
/// another apm version drops the line it cannot read and never answers.
const WATCH_TIMEOUT: Duration = Duration::from_secs(3);

/// A watcher attached to the host's agent (`apm watch --agent`): every verdict the
/// agent makes (its probes', an operator's rail-down), as it makes them. Nothing is
/// asked of the protected processes, and an agent with no watcher does no work for one.
#[derive(Debug)]
pub struct AgentWatch {
    /// Kept for the connection: the agent forgets the watcher when it closes.
    _client: AgentClient,
    /// The agent's verdicts; closed when the agent goes away.
    pub events: mpsc::UnboundedReceiver<FromAgent>,
    /// Whether the agent probes (without, only rail-down verdicts come).
    pub probing: bool,
    /// The paths it probed when the watcher attached, with their sessions' states.
    pub sessions: Vec<(apm_core::probe::PathEnds, apm_core::probe::SessionState)>,
}

impl AgentWatch {
    /// Attach to the agent at `socket` as a watcher (operators only). Call inside a
    /// tokio runtime.
    pub async fn attach(socket: &AgentSocket) -> Result<AgentWatch, AgentError> {
        let (tx, mut events) = mpsc::unbounded_channel();
        let client = AgentClient::connect(socket, tx).await?;
        client.put(ToAgent::Watch)?;
        let answer = tokio::time::timeout(WATCH_TIMEOUT, async {
            // Verdicts sent before the answer cannot come: the agent answers first.
            loop {
                match events.recv().await {
                    Some(FromAgent::Watching { probing, sessions }) => {
                        return Ok((probing, sessions))
                    }
                    Some(FromAgent::Refused { what }) => return Err(AgentError::Refused(what)),
                    Some(_) => continue,
                    None => return Err(AgentError::Gone),
                }
            }
        })
        .await
        .map_err(|_| AgentError::NoWatch(WATCH_TIMEOUT))??;
        Ok(AgentWatch {
            _client: client,
            events,
            probing: answer.0,
            sessions: answer.1,
        })
    }
}

pub use crate::facets::AgentPeer;
