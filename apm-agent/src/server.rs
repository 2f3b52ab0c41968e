//! The agent: routes peer messages between this host's protected processes and the
//! agents of other hosts (see the crate docs).
//!
//! It never touches a QP and keeps nothing a process could not register again. It must
//! never block a process: each process has its own writer task, and a process that
//! stops reading only loses its own messages.

use crate::hello::HelloSocket;
use crate::local::{self, ip_of};
use crate::probes::AgentProbes;
use crate::wire::{self, FromAgent, Route, ToAgent};
use crate::{AgentError, HELLO_OFFSET};
use apm_core::probe::{PathEnds, ProbePolicy};
use apm_core::{Gid, Input, Lid, PeerAddr, PeerChannel, PortKey};
use cm_lap::auth::Mode;
use cm_lap::udp::UdpPeerChannel;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::linux::net::SocketAddrExt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The UDP port of peer messages (hello: this + [`HELLO_OFFSET`]).
    pub peer_port: u16,
    /// Exit after this long without a connected process (`None`: run until killed).
    pub idle_exit: Option<Duration>,
    /// Liveness probes of the processes' paths (`enabled = false`: none).
    pub probe: ProbePolicy,
    /// How the peer channels authenticate datagrams (cm-lap's `auth`): with a key,
    /// every datagram sent is sealed and those received are opened before they are
    /// routed; `Require` drops the unauthenticated. Hellos stay plain (public facts).
    pub peer_auth: Mode,
}

/// Why the agent did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Another agent serves this port here already (not an error for `apm run`).
    #[error("an apm agent already runs for port {0} here")]
    AlreadyRunning(u16),
    /// A socket could not be bound.
    #[error("apm agent: {0}")]
    Io(#[from] std::io::Error),
}

/// The agent's listening sockets, bound: [`Agent::run`] serves them.
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    listener: UnixListener,
    hello: HelloSocket,
}

struct State {
    /// The peer channels' authentication (the configuration's).
    peer_auth: Mode,
    next_client: u64,
    /// The protected processes (what keeps an idle agent alive).
    clients: BTreeMap<u64, mpsc::UnboundedSender<FromAgent>>,
    /// The watchers (`apm watch --agent`): every verdict, nothing else.
    watchers: BTreeMap<u64, mpsc::UnboundedSender<FromAgent>>,
    routes: Vec<(u64, Route)>,
    channels: BTreeMap<Gid, Arc<UdpPeerChannel>>,
    /// Messages for connections not registered yet, kept [`HOLD_UNROUTED`]: the two
    /// ends of a connection register at different moments (each after its own hello),
    /// and the first LAPs of the quicker end would otherwise be lost to the slower one.
    unrouted: Vec<(tokio::time::Instant, PeerAddr, apm_core::PeerMsg)>,
    /// The host's probes (absent when the policy turns them off).
    probes: Option<AgentProbes>,
    /// Wakes the probe loop when a probe arrived: a session that changed state tells
    /// its peer at once (the prober queues that send for now), which must not wait for
    /// the loop's next wake-up (up to 50 ms, more than the default 3 x 15 ms detection time).
    probe_arrived: Arc<tokio::sync::Notify>,
}

impl State {
    fn new(peer_auth: Mode) -> State {
        State {
            peer_auth,
            next_client: 0,
            clients: BTreeMap::new(),
            watchers: BTreeMap::new(),
            routes: Vec::new(),
            channels: BTreeMap::new(),
            unrouted: Vec::new(),
            probes: None,
            probe_arrived: Arc::default(),
        }
    }
}

/// How long a message for a connection nobody registered yet is kept.
const HOLD_UNROUTED: Duration = Duration::from_secs(3);

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, State> {
    // Whole inserts and removes only: a poisoned state is still consistent.
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Agent {
    /// Bind the agent's Unix socket and hello port. Call inside a tokio runtime.
    pub async fn bind(config: AgentConfig) -> Result<Agent, StartError> {
        let name = crate::socket_name(config.peer_port);
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let std_listener = match std::os::unix::net::UnixListener::bind_addr(&addr) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(StartError::AlreadyRunning(config.peer_port))
            }
            Err(e) => return Err(e.into()),
        };
        std_listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(std_listener)?;
        let hello = HelloSocket::bind(config.peer_port.wrapping_add(HELLO_OFFSET)).await?;
        Ok(Agent {
            config,
            listener,
            hello,
        })
    }

    /// Serve until idle for `idle_exit` (or forever).
    pub async fn run(self) -> Result<(), AgentError> {
        let state: Shared = Arc::new(Mutex::new(State::new(self.config.peer_auth.clone())));
        if self.config.probe.enabled {
            lock(&state).probes = Some(AgentProbes::new(self.config.probe.clone()));
            tokio::spawn(probe_loop(state.clone(), self.config.peer_port));
        }
        let hello = self.hello.clone();
        tokio::spawn(async move { hello.serve(|g| local::device_addresses(&g)).await });
        info!(port = self.config.peer_port, "apm agent serving");
        let mut idle_since = Some(tokio::time::Instant::now());
        let tick = Duration::from_millis(250);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (stream, _) = accepted?;
                    idle_since = None;
                    let id = {
                        let mut s = lock(&state);
                        s.next_client += 1;
                        s.next_client
                    };
                    tokio::spawn(serve_client(id, stream, state.clone(), self.hello.clone(), self.config.peer_port));
                }
                () = tokio::time::sleep(tick) => {
                    let empty = lock(&state).clients.is_empty();
                    match (empty, idle_since) {
                        (false, _) => idle_since = None,
                        (true, None) => idle_since = Some(tokio::time::Instant::now()),
                        (true, Some(t)) => {
                            if self.config.idle_exit.is_some_and(|d| t.elapsed() >= d) {
                                info!("no protected process for a while: the agent exits");
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
    }
}

async fn serve_client(id: u64, stream: UnixStream, state: Shared, hello: HelloSocket, port: u16) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<FromAgent>();
    lock(&state).clients.insert(id, tx.clone());
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if write.write_all(&wire::line(&m)).await.is_err() {
                return;
            }
        }
    });
    let mut lines = wire::Lines::new(BufReader::new(read));
    loop {
        let l = match lines.next_line().await {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                warn!(client = id, error = %e, "a process's stream is unreadable: closed");
                break;
            }
        };
        match serde_json::from_slice::<ToAgent>(l) {
            Ok(m) => handle(id, m, &state, &hello, &tx, port).await,
            Err(e) => warn!(client = id, error = %e, "unreadable line from a process: dropped"),
        }
    }
    debug!(client = id, "process left");
    let mut s = lock(&state);
    s.clients.remove(&id);
    s.watchers.remove(&id);
    s.routes.retain(|(c, _)| *c != id);
    refollow(&mut s);
    drop(s);
    writer.abort();
}

async fn handle(
    id: u64,
    m: ToAgent,
    state: &Shared,
    hello: &HelloSocket,
    me: &mpsc::UnboundedSender<FromAgent>,
    port: u16,
) {
    match m {
        ToAgent::Register { route } => {
            for g in &route.local_gids {
                if let Err(e) = channel(state, *g, port).await {
                    warn!(gid = %g, error = %e, "cannot listen for peer messages on this address");
                }
            }
            let mut s = lock(state);
            s.routes.retain(|(c, r)| {
                !(*c == id && r.local_qpn == route.local_qpn && r.remote_qpn == route.remote_qpn)
            });
            // Hand over what arrived for this connection before it was registered.
            let now = tokio::time::Instant::now();
            let held = std::mem::take(&mut s.unrouted);
            for (at, from, msg) in held {
                if now.duration_since(at) > HOLD_UNROUTED {
                    continue;
                }
                if matches_route(&route, &from, &msg) {
                    let _ = me.send(FromAgent::Peer { from, msg });
                } else {
                    s.unrouted.push((at, from, msg));
                }
            }
            s.routes.push((id, route));
            refollow(&mut s);
        }
        ToAgent::Unregister {
            local_qpn,
            remote_qpn,
        } => {
            let mut s = lock(state);
            s.routes.retain(|(c, r)| {
                !(*c == id && r.local_qpn == local_qpn && r.remote_qpn == remote_qpn)
            });
            refollow(&mut s);
        }
        ToAgent::Send { from, to, msg } => match channel(state, from, port).await {
            Ok(ch) => {
                let to = PeerAddr {
                    gid: to,
                    lid: Lid::from_wire(0),
                };
                if let Err(e) = ch.send(PortKey::new(0, 1), to, msg).await {
                    debug!(error = %e, "peer message not sent");
                }
            }
            Err(e) => warn!(gid = %from, error = %e, "no channel to send from"),
        },
        ToAgent::Candidates {
            req,
            sgid,
            dgid,
            local_gids,
        } => {
            let hello = hello.clone();
            let me = me.clone();
            tokio::spawn(async move {
                let result = candidates(&hello, sgid, dgid, &local_gids).await;
                let _ = me.send(FromAgent::Candidates { req, result });
            });
        }
        ToAgent::RailDown { gid } => {
            info!(%gid, "rail down: telling every process");
            lock(state).tell_all(&FromAgent::RailDown { gid });
        }
        ToAgent::Watch => {
            let mut s = lock(state);
            // A watcher is no protected process: it leaves the idle count.
            if let Some(tx) = s.clients.remove(&id) {
                s.watchers.insert(id, tx);
            }
            s.routes.retain(|(c, _)| *c != id);
            refollow(&mut s);
            let answer = FromAgent::Watching {
                probing: s.probes.is_some(),
                sessions: s
                    .probes
                    .as_ref()
                    .map(AgentProbes::sessions)
                    .unwrap_or_default(),
            };
            debug!(client = id, "a watcher attached");
            let _ = me.send(answer);
        }
        ToAgent::Sync { req } => {
            let _ = me.send(FromAgent::Synced { req });
        }
    }
}

impl State {
    /// Send a verdict to every process and every watcher.
    fn tell_all(&self, m: &FromAgent) {
        for c in self.clients.values().chain(self.watchers.values()) {
            let _ = c.send(m.clone());
        }
    }
}

/// The alternates from the device of `sgid` to the host of `dgid` (see [`local::pair`]).
async fn candidates(
    hello: &HelloSocket,
    sgid: Gid,
    dgid: Gid,
    local_gids: &[Gid],
) -> Result<Vec<(Gid, Gid)>, String> {
    let mine = tokio::task::spawn_blocking(move || local::device_addresses(&sgid))
        .await
        .ok()
        .flatten()
        .ok_or_else(|| format!("no local RDMA device holds {sgid}"))?;
    let mine: Vec<_> = mine
        .into_iter()
        .filter(|a| local_gids.is_empty() || local_gids.contains(&a.gid))
        .collect();
    let theirs = hello
        .ask(dgid)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("the peer's agent knows no device holding {dgid}"))?;
    let pairs = local::pair(&mine, &theirs, &sgid, &dgid);
    if pairs.is_empty() {
        return Err(format!(
            "no second path: no address of this device ({}) shares a subnet with one of the \
             peer's ({}) other than the primary's",
            list(mine.iter().map(|a| a.gid)),
            list(theirs.iter().map(|a| a.gid))
        ));
    }
    Ok(pairs)
}

fn list(gids: impl Iterator<Item = Gid>) -> String {
    gids.filter_map(|g| ip_of(&g).map(|ip| ip.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The UDP channel bound to local address `gid` (created, and started, on first use).
async fn channel(state: &Shared, gid: Gid, port: u16) -> Result<Arc<UdpPeerChannel>, String> {
    if let Some(ch) = lock(state).channels.get(&gid) {
        return Ok(ch.clone());
    }
    let ip = ip_of(&gid).ok_or_else(|| format!("{gid} is not an IP address"))?;
    let auth = lock(state).peer_auth.clone();
    let ch = UdpPeerChannel::bind(SocketAddr::new(ip, port), PortKey::new(0, 1))
        .await
        .map_err(|e| format!("binding {ip}:{port}: {e}"))?
        .with_auth(auth, cm_lap::auth::DEFAULT_MAX_SKEW);
    ch.derive_port(port);
    let (tx, mut rx) = mpsc::unbounded_channel::<Input>();
    ch.start(tx).await.map_err(|e| e.to_string())?;
    let ch = Arc::new(ch);
    let routed = state.clone();
    tokio::spawn(async move {
        while let Some(input) = rx.recv().await {
            if let Input::PeerMessage { from, msg, .. } = input {
                route(&routed, from, msg);
            }
        }
    });
    let mut s = lock(state);
    // Another task may have bound it meanwhile (same address twice fails): keep the first.
    Ok(s.channels.entry(gid).or_insert(ch).clone())
}

/// Whether `msg` from `from` belongs to the connection `r`.
fn matches_route(r: &Route, from: &PeerAddr, msg: &apm_core::PeerMsg) -> bool {
    let (receiver, sender) = wire::comm_ids(msg);
    r.local_qpn == receiver && r.remote_qpn == sender && r.peer_gids.contains(&from.gid)
}

/// Hand a received peer message to the process that registered its connection (or
/// keep it a moment for one that has not registered yet).
fn route(state: &Shared, from: PeerAddr, msg: apm_core::PeerMsg) {
    let mut s = lock(state);
    if let apm_core::PeerMsg::Probe(p) = &msg {
        // Probes are the agent's own: a process never sees one.
        if let Some(probes) = s.probes.as_mut() {
            probes.receive(p);
            s.probe_arrived.notify_one();
        }
        return;
    }
    let owner = s
        .routes
        .iter()
        .find(|(_, r)| matches_route(r, &from, &msg))
        .map(|(c, _)| *c);
    match owner.and_then(|c| s.clients.get(&c)) {
        Some(c) => {
            let _ = c.send(FromAgent::Peer { from, msg });
        }
        None => {
            let (receiver, sender) = wire::comm_ids(&msg);
            debug!(from = %from.gid, receiver, sender, "peer message for no registered connection: held");
            let now = tokio::time::Instant::now();
            s.unrouted
                .retain(|(at, _, _)| now.duration_since(*at) <= HOLD_UNROUTED);
            // Bounded: a stranger cannot make the agent hoard.
            if s.unrouted.len() < 1024 {
                s.unrouted.push((now, from, msg));
            }
        }
    }
}

/// Probe the paths of every registered connection, and nothing else.
fn refollow(s: &mut State) {
    let paths = s
        .routes
        .iter()
        .flat_map(|(_, r)| r.paths.iter())
        .map(|(local, remote)| PathEnds {
            local: *local,
            remote: *remote,
        })
        .collect();
    if let Some(p) = s.probes.as_mut() {
        p.follow(paths);
    }
}

/// Run the host's prober: send its probes from the paths' local addresses to the peers'
/// agents, and tell every process its verdicts.
async fn probe_loop(state: Shared, port: u16) {
    // New paths are probed within this long even when nothing else is due.
    let idle = Duration::from_millis(50);
    let arrived = lock(&state).probe_arrived.clone();
    loop {
        let wake = {
            let s = lock(&state);
            let Some(p) = s.probes.as_ref() else { return };
            let latest = tokio::time::Instant::now() + idle;
            p.next_wake().map_or(latest, |w| w.min(latest))
        };
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = arrived.notified() => {}
        }
        let step = {
            let mut s = lock(&state);
            let Some(p) = s.probes.as_mut() else { return };
            let step = p.step();
            for &(ends, verdict) in &step.verdicts {
                info!(local = %ends.local, remote = %ends.remote, verdict = verdict.name(),
                    kind = verdict.failure().map(|k| k.name()), "probes: path verdict");
                s.tell_all(&FromAgent::Path { ends, verdict });
            }
            step
        };
        for (from, probe) in step.sends {
            let to = PeerAddr {
                gid: probe.ends.remote,
                lid: Lid::from_wire(0),
            };
            match channel(&state, from, port).await {
                Ok(ch) => {
                    if let Err(e) = ch
                        .send(PortKey::new(0, 1), to, apm_core::PeerMsg::Probe(probe))
                        .await
                    {
                        debug!(error = %e, "probe not sent");
                    }
                }
                Err(e) => debug!(gid = %from, error = %e, "no channel to probe from"),
            }
        }
    }
}
