//! The agent: routes peer messages between this host's protected processes and the
//! agents of other hosts (see the crate docs), behind a socket whose every caller is
//! known ([`crate::access`]).
//!
//! It never touches a QP and keeps nothing a process could not register again. It must
//! never block on a process, and nothing a client or a stranger sends can grow it
//! without bound or end it:
//!
//! - each client's outgoing lines wait in an [`Outbox`] of a fixed byte budget; a client
//!   that stops reading is dropped and said once (`session.rs`);
//! - connections are capped per user and in total, below the descriptor limit (raised
//!   to its hard limit at start), and a failed `accept` (descriptors exhausted) is
//!   waited out, never the end of the agent;
//! - registrations are capped per client and in total, their addresses must be this
//!   host's, their QP the caller's own (`requests.rs`), and their probe targets hosts
//!   whose agents answered a hello (operators excepted);
//! - the UDP channels exist only for this host's addresses, and share one replay
//!   window per sender (`peers.rs`);
//! - what a client sends that cannot be read is logged at a bounded rate.

mod fabric;
mod metrics;
mod peers;
mod requests;
mod routes;
mod session;
mod status;

use crate::access::{self, AgentSocket, Caller, SocketPerms};
use crate::hello::HelloSocket;
use crate::host::{Host, SystemHost};
use crate::outbox::{Outbox, Refused};
use crate::probes::AgentProbes;
use crate::status::{ProcessStatus, Totals};
use crate::wire::{self, FromAgent};
use crate::{AgentError, HELLO_OFFSET};
use apm_core::probe::{PathEnds, ProbePolicy};
use apm_core::Gid;
use cm_lap::auth::{Authenticator, Mode};
use cm_lap::udp::UdpPeerChannel;
use routes::Routes;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::UnixListener;
use tracing::{info, warn};

/// A client's number on this agent.
type ClientId = u64;

/// How many of what the agent holds for its clients, at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Client connections at once (processes and watchers); also kept below half the
    /// descriptor limit.
    pub clients: usize,
    /// Client connections of one user at once (root's are not counted).
    pub clients_per_user: usize,
    /// Connections one client may register.
    pub routes_per_client: usize,
    /// Connections registered in all.
    pub routes: usize,
    /// Paths, local addresses and peer addresses of one registration, each.
    pub per_route: usize,
    /// Candidate requests one client may have in flight.
    pub candidates_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            clients: 4096,
            clients_per_user: 512,
            routes_per_client: 16_384,
            routes: 65_536,
            per_route: 64,
            candidates_per_client: 64,
        }
    }
}

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The UDP port of peer messages (hello: this + [`HELLO_OFFSET`]).
    pub peer_port: u16,
    /// Where its socket is.
    pub socket: AgentSocket,
    /// The socket's group and mode.
    pub perms: SocketPerms,
    /// Members of this group are operators (root and the agent's own user always are).
    pub operator_gid: Option<u32>,
    /// Exit after this long without a connected process (`None`: run until killed).
    pub idle_exit: Option<Duration>,
    /// Liveness probes of the processes' paths (`enabled = false`: none).
    pub probe: ProbePolicy,
    /// How the peer channels authenticate datagrams (cm-lap's `auth`): with a key,
    /// every datagram sent is sealed and those received are opened before they are
    /// routed; `Require` drops the unauthenticated. Hellos stay plain (public facts).
    pub peer_auth: Mode,
    /// This host's addresses and QP owners.
    pub host: Arc<dyn Host>,
    /// The caps.
    pub limits: Limits,
    /// The host's InfiniBand ports (SA and MAD channels; `None`: RoCE only).
    pub infiniband: Option<Arc<dyn crate::ib::InfiniBand>>,
    /// Where to serve the metrics over HTTP (`None`: not at all).
    pub metrics: Option<std::net::SocketAddr>,
}

impl AgentConfig {
    /// An agent of `peer_port` on this host, with its socket in the runtime directory
    /// `dir` (root's when `None`, see [`AgentSocket::locate`]), every other setting at
    /// its default: no probes, no key, no idle exit.
    pub fn new(peer_port: u16, dir: Option<&std::path::Path>) -> AgentConfig {
        AgentConfig {
            peer_port,
            socket: AgentSocket::locate(peer_port, dir),
            perms: SocketPerms::default_for_host(),
            operator_gid: None,
            idle_exit: None,
            probe: ProbePolicy::default(),
            peer_auth: Mode::Off,
            host: Arc::new(SystemHost::default()),
            limits: Limits::default(),
            infiniband: None,
            metrics: None,
        }
    }
}

/// Why the agent did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Another agent serves this port here already (not an error for `apm run`).
    #[error("an apm agent already runs for port {0} here")]
    AlreadyRunning(u16),
    /// The socket cannot be placed (unsafe directory, overlapping ports, ...).
    #[error(transparent)]
    Access(access::AccessError),
    /// The hello port is taken.
    #[error(
        "the hello port {port} (the agent's port + 1) is in use: another apm agent (of \
         port {port} or {}) or another program has it",
        port.wrapping_add(1)
    )]
    HelloInUse {
        /// The hello port.
        port: u16,
    },
    /// The metrics address is taken.
    #[error(
        "the metrics address {addr} is in use (another apm agent, or another exporter, has it)"
    )]
    MetricsInUse {
        /// The address.
        addr: std::net::SocketAddr,
    },
    /// The metrics address cannot be bound (not this host's, a privileged port, ...).
    #[error("the metrics address {addr} cannot be bound: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A socket could not be bound.
    #[error("apm agent: {0}")]
    Io(#[from] std::io::Error),
}

impl From<access::AccessError> for StartError {
    fn from(e: access::AccessError) -> Self {
        match e {
            access::AccessError::AlreadyRunning { port, .. } => StartError::AlreadyRunning(port),
            other => StartError::Access(other),
        }
    }
}

/// The agent's listening sockets, bound: [`Agent::run`] serves them.
#[derive(Debug)]
pub struct Agent {
    state: Shared,
    bound: access::Bound,
    hello: HelloSocket,
    metrics: Option<tokio::net::TcpListener>,
}

/// One connected client.
#[derive(Debug)]
struct Client {
    caller: Caller,
    outbox: Outbox,
    /// A watcher (`apm watch --agent`) rather than a protected process.
    watcher: bool,
    /// Candidate requests in flight.
    candidates: usize,
    /// What the process last said of itself ([`wire::ToAgent::Report`]).
    status: Option<Box<ProcessStatus>>,
}

/// What the agent's tasks share.
#[derive(Debug)]
struct State {
    config: AgentConfig,
    /// The agent's own user (an operator).
    uid: u32,
    /// One authenticator for every channel: one replay window per sender, whichever
    /// local address a datagram arrives on.
    auth: Arc<Authenticator>,
    next_client: ClientId,
    clients: BTreeMap<ClientId, Client>,
    routes: Routes,
    channels: BTreeMap<Gid, Arc<UdpPeerChannel>>,
    /// The host's probes (absent when the policy turns them off).
    probes: Option<AgentProbes>,
    /// Wakes the probe loop when a probe arrived: a session that changed state tells
    /// its peer at once (the prober queues that send for now), which must not wait for
    /// the loop's next wake-up (up to 50 ms, more than the default 3 x 15 ms detection time).
    probe_arrived: Arc<tokio::sync::Notify>,
    /// Client connections not taken (over a cap) since that was last said.
    refused_connections: u64,
    /// The InfiniBand side, when the host has one.
    ib: Option<fabric::IbState>,
    /// The counters of the processes that have left (their last words).
    retired: Totals,
    /// The metrics' HTTP server, and its address.
    metrics: Option<(std::net::SocketAddr, tokio::task::JoinHandle<()>)>,
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    // Whole inserts and removes only: a poisoned state is still consistent.
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Tell client `id` `m`; a client over its budget is dropped (its writer ends),
    /// and said once.
    fn tell(&self, id: ClientId, m: &FromAgent) {
        let Some(c) = self.clients.get(&id) else {
            return;
        };
        if c.outbox.put(wire::line(m)) == Err(Refused::OverBudget) {
            warn!(
                client = id,
                uid = c.caller.uid,
                pid = c.caller.pid,
                queued = c.outbox.queued(),
                "a client stopped reading what the agent sends: dropped"
            );
        }
    }

    /// Tell every watcher, and every process with a registration of the path, a
    /// verdict on `ends`.
    fn tell_verdict(&self, ends: &PathEnds, m: &FromAgent) {
        for (id, c) in &self.clients {
            if c.watcher || self.routes.client_has_path(*id, ends) {
                self.tell(*id, m);
            }
        }
    }

    /// Tell every client `m` (an operator's rail-down).
    fn tell_all(&self, m: &FromAgent) {
        for id in self.clients.keys() {
            self.tell(*id, m);
        }
    }

    /// Probe the paths of every registered connection, and nothing else.
    fn refollow(&mut self) {
        let paths = self.routes.paths();
        if let Some(p) = self.probes.as_mut() {
            p.follow(paths);
        }
    }

    /// Whether one more connection of `uid` may be taken.
    fn room_for(&self, uid: u32, max_clients: usize) -> bool {
        let limits = &self.config.limits;
        if self.clients.len() >= max_clients {
            return false;
        }
        uid == 0
            || self
                .clients
                .values()
                .filter(|c| c.caller.uid == uid)
                .count()
                < limits.clients_per_user
    }
}

impl Agent {
    /// Bind the agent's Unix socket, hello port and metrics address (when asked):
    /// all of them or none. Call inside a tokio runtime.
    pub async fn bind(config: AgentConfig) -> Result<Agent, StartError> {
        if config.peer_port == 0 || config.peer_port == u16::MAX {
            return Err(access::AccessError::BadPort(config.peer_port).into());
        }
        let bound = access::bind(&config.socket, config.perms)?;
        let hello_port = config.peer_port + HELLO_OFFSET;
        let hello = match HelloSocket::bind(hello_port).await {
            Ok(h) => h,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(StartError::HelloInUse { port: hello_port })
            }
            Err(e) => return Err(e.into()),
        };
        let metrics = match config.metrics {
            Some(addr) => Some(metrics::bind(addr).await?),
            None => None,
        };
        let auth = Arc::new(
            Authenticator::new(
                config.peer_auth.clone(),
                Authenticator::fresh_sender_id(
                    format!("apm-agent-{}", config.peer_port).as_bytes(),
                ),
            )
            .with_max_skew(cm_lap::auth::DEFAULT_MAX_SKEW),
        );
        let probes = config
            .probe
            .enabled
            .then(|| AgentProbes::new(config.probe.clone()));
        let ib = config.infiniband.clone().map(fabric::IbState::new);
        let state: Shared = Arc::new(Mutex::new(State {
            config,
            uid: nix::unistd::geteuid().as_raw(),
            auth,
            next_client: 0,
            clients: BTreeMap::new(),
            routes: Routes::default(),
            channels: BTreeMap::new(),
            probes,
            probe_arrived: Arc::default(),
            refused_connections: 0,
            ib,
            retired: Totals::default(),
            metrics: None,
        }));
        Ok(Agent {
            state,
            bound,
            hello,
            metrics,
        })
    }

    /// The socket it listens on.
    pub fn socket(&self) -> AgentSocket {
        lock(&self.state).config.socket.clone()
    }

    /// Where the metrics will be served (the address bound, its port chosen when `0`
    /// was asked).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// A handle that changes what can be changed while the agent runs.
    pub fn control(&self) -> AgentControl {
        AgentControl {
            state: self.state.clone(),
        }
    }

    /// Serve until idle for `idle_exit` (or forever).
    pub async fn run(self) -> Result<(), AgentError> {
        let Agent {
            state,
            bound,
            hello,
            metrics,
        } = self;
        let (port, host, idle_exit, probing, socket_path, limit) = {
            let s = lock(&state);
            let c = &s.config;
            (
                c.peer_port,
                c.host.clone(),
                c.idle_exit,
                s.probes.is_some(),
                c.socket.path().display().to_string(),
                c.limits.clients,
            )
        };
        let max_clients = limit.min(raise_descriptor_limit() / 2);
        let listener = UnixListener::from_std(bound.listener.try_clone()?)?;
        if let Some(l) = metrics {
            metrics::start(&state, l);
        }
        fabric::start(&state).await;
        if probing {
            tokio::spawn(peers::probe_loop(state.clone(), port));
        }
        let answering = hello.clone();
        tokio::spawn(async move { answering.serve(move |g| host.device_addresses(&g)).await });
        info!(port, socket = %socket_path, max_clients, "apm agent serving");
        let mut idle_since = Some(tokio::time::Instant::now());
        let tick = Duration::from_millis(250);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        idle_since = None;
                        session::start(stream, &state, &hello, port, max_clients);
                    }
                    Err(e) => {
                        // Out of descriptors (or memory): the clients wait in the backlog
                        // while some are given back. Never the end of the agent.
                        warn!(error = %e, "cannot accept a client: waiting");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                () = tokio::time::sleep(tick) => {
                    let mut s = lock(&state);
                    let refused = std::mem::take(&mut s.refused_connections);
                    if refused > 0 {
                        warn!(refused, "client connections refused: over the agent's connection caps");
                    }
                    let empty = s.clients.values().all(|c| c.watcher);
                    drop(s);
                    match (empty, idle_since) {
                        (false, _) => idle_since = None,
                        (true, None) => idle_since = Some(tokio::time::Instant::now()),
                        (true, Some(t)) => {
                            if idle_exit.is_some_and(|d| t.elapsed() >= d) {
                                info!("no protected process for a while: the agent exits");
                                metrics::stop(&state);
                                drop(bound);
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What can be changed while the agent runs (a reload of its configuration).
#[derive(Clone, Debug)]
pub struct AgentControl {
    state: Shared,
}

impl AgentControl {
    /// Who is an operator from now on: the members of group `gid` (besides root and
    /// the agent's own user). Clients connected before keep what they were.
    pub fn set_operator_gid(&self, gid: Option<u32>) {
        lock(&self.state).config.operator_gid = gid;
    }

    /// Serve the metrics at `addr` from now on (`None`: stop serving them). On an
    /// error the metrics stay where they were.
    pub async fn set_metrics(&self, addr: Option<std::net::SocketAddr>) -> Result<(), StartError> {
        let current = lock(&self.state).metrics.as_ref().map(|(a, _)| *a);
        if current == addr {
            return Ok(());
        }
        let listener = match addr {
            Some(a) if current.is_some_and(|c| c.port() == a.port()) => {
                // The same port elsewhere: free it first (a failed bind below leaves
                // the metrics off, and says so).
                metrics::stop(&self.state);
                metrics::bind(a).await?
            }
            Some(a) => metrics::bind(a).await?,
            None => {
                metrics::stop(&self.state);
                return Ok(());
            }
        };
        metrics::stop(&self.state);
        metrics::start(&self.state, listener);
        Ok(())
    }

    /// Where the metrics are served now.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        lock(&self.state).metrics.as_ref().map(|(a, _)| *a)
    }
}

/// Raise the soft descriptor limit to the hard one, and return the soft limit in force.
fn raise_descriptor_limit() -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return usize::try_from(hard).unwrap_or(usize::MAX);
    }
    usize::try_from(soft).unwrap_or(usize::MAX)
}
