//! Agent <-> agent hello: "which addresses does the device holding this GID have?"
//!
//! One JSON datagram each way on the hello port (the peer port + [`crate::HELLO_OFFSET`]).
//! The asking agent pairs the answer with its own addresses into rails
//! ([`crate::local::pair`]); an ask that gets no answer after a few tries means the peer
//! host runs no apm agent, and the connection is left unprotected with that reason.
//! Answers are public facts (a host's RoCE addresses): nothing here changes a QP, and a
//! forged answer can at most propose an alternate that the peer's engine then refuses
//! (its LAP checks that a path's ends are its own addresses).
//!
//! Everything kept is bounded, whoever asks: answers by asked address ([`TtlMap`],
//! capped and pruned as they age), askers waiting (an ask given up on leaves nothing
//! behind), and this host's own answers (looked up by at most two tasks at once; an
//! ask that finds both busy is dropped, and its asker asks again). The addresses that
//! some host's agent answered for are *vouched* ([`HelloSocket::vouched`]): the agent
//! probes only those for a client that is not an operator, so a registration cannot
//! aim probes at a host that runs no apm.

use crate::local::{ip_of, Addr};
use apm_core::Gid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;
use tracing::debug;

/// Why an agent's hello got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// The GID is no IP address: there is no host to ask.
    #[error("{0} is not an IP address (link-local or zero GID)")]
    NotIp(Gid),
    /// The question could not be encoded.
    #[error("encoding the hello: {0}")]
    Encode(String),
    /// Too many addresses are being asked about at once.
    #[error("too many hellos under way")]
    Busy,
    /// Nobody answered at the agent's address.
    #[error("no apm agent answered at {0} (the peer runs no apm, or its agent is not reachable)")]
    NoAnswer(SocketAddr),
}

/// The datagrams.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "apm_hello")]
pub enum Hello {
    /// Which addresses does the device holding `gid` have?
    Ask {
        /// An address of the asked host.
        gid: Gid,
    },
    /// The answer: `None` when no device there holds `gid`.
    Answer {
        /// The asked address.
        gid: Gid,
        /// The device port's addresses with their subnets.
        addrs: Option<Vec<Addr>>,
    },
}

/// How often an ask is sent before giving up, and the wait after the first (doubling
/// after each: 0.4 + 0.8 + 1.6 + 3.2 s). Generous: busy-polling programs on every core
/// leave an agent little CPU.
const TRIES: u32 = 4;
const WAIT: Duration = Duration::from_millis(400);

type Waiters = Arc<Mutex<BTreeMap<Gid, Vec<oneshot::Sender<Option<Vec<Addr>>>>>>>;

/// How long an answer is reused: an MPI job connects many QPs to one peer at once, and
/// a host's addresses change rarely.
const ANSWER_TTL: Duration = Duration::from_secs(10);

type Answers = Arc<Mutex<TtlMap<Option<Vec<Addr>>>>>;

/// How long this host's own answer is reused (many processes ask at once at start).
const OWN_TTL: Duration = Duration::from_secs(2);

/// How long an address stays vouched for after the last answer that listed it.
const VOUCHED_TTL: Duration = Duration::from_secs(3600);

/// Entries of each map at most (answers, own answers, vouched addresses, addresses
/// being asked about).
const MAP_MAX: usize = 4096;

/// This host's answers looked up at once, at most (each reads sysfs).
const LOOKUPS_AT_ONCE: usize = 2;

/// Values by address, each with the time it was put, at most 4,096 of them: an
/// expired entry reads as absent, and a full map drops its expired entries, then its
/// oldest, before it takes another.
#[derive(Debug)]
pub struct TtlMap<V> {
    ttl: Duration,
    entries: BTreeMap<Gid, (tokio::time::Instant, V)>,
}

impl<V: Clone> TtlMap<V> {
    /// An empty map whose entries live `ttl`.
    pub fn new(ttl: Duration) -> TtlMap<V> {
        TtlMap {
            ttl,
            entries: BTreeMap::new(),
        }
    }

    /// The live value of `gid`.
    pub fn get(&self, gid: &Gid) -> Option<V> {
        self.entries
            .get(gid)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, v)| v.clone())
    }

    /// Put `v` for `gid`, making room when full.
    pub fn put(&mut self, gid: Gid, v: V) {
        if !self.entries.contains_key(&gid) && self.entries.len() >= MAP_MAX {
            let ttl = self.ttl;
            self.entries.retain(|_, (at, _)| at.elapsed() < ttl);
            if self.entries.len() >= MAP_MAX {
                if let Some(oldest) = self.entries.iter().min_by_key(|(_, (at, _))| *at) {
                    let k = *oldest.0;
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(gid, (tokio::time::Instant::now(), v));
    }

    /// Entries held (live or not yet dropped).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The hello socket of one agent: serves asks and asks others.
#[derive(Debug, Clone)]
pub struct HelloSocket {
    socket: Arc<UdpSocket>,
    port: u16,
    waiters: Waiters,
    answers: Answers,
    /// This host's answers, by asked GID.
    mine: Answers,
    /// Addresses some host's agent answered for.
    vouched: Arc<Mutex<TtlMap<()>>>,
    /// Permits for this host's lookups.
    lookups: Arc<tokio::sync::Semaphore>,
}

impl HelloSocket {
    /// Bind the hello port on every address (IPv6 and IPv4 when the host has IPv6).
    pub async fn bind(port: u16) -> std::io::Result<HelloSocket> {
        let socket = match UdpSocket::bind(("::", port)).await {
            Ok(s) => s,
            Err(_) => UdpSocket::bind(("0.0.0.0", port)).await?,
        };
        Ok(HelloSocket {
            socket: Arc::new(socket),
            port,
            waiters: Arc::default(),
            answers: Arc::new(Mutex::new(TtlMap::new(ANSWER_TTL))),
            mine: Arc::new(Mutex::new(TtlMap::new(OWN_TTL))),
            vouched: Arc::new(Mutex::new(TtlMap::new(VOUCHED_TTL))),
            lookups: Arc::new(tokio::sync::Semaphore::new(LOOKUPS_AT_ONCE)),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Answer asks with `lookup` and hand answers to their askers, until the socket fails.
    pub async fn serve(&self, lookup: impl Fn(Gid) -> Option<Vec<Addr>> + Send + Sync + 'static) {
        let lookup = Arc::new(lookup);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let (len, from) = match self.socket.recv_from(&mut buf).await {
                Ok(r) => r,
                Err(e) => {
                    debug!(error = %e, "hello receive error");
                    continue;
                }
            };
            let Some(msg) = buf
                .get(..len)
                .and_then(|d| serde_json::from_slice::<Hello>(d).ok())
            else {
                debug!(%from, len, "not a hello: dropped");
                continue;
            };
            match msg {
                Hello::Ask { gid } => {
                    let cached = self
                        .mine
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get(&gid);
                    if let Some(addrs) = cached {
                        if let Ok(bytes) = serde_json::to_vec(&Hello::Answer { gid, addrs }) {
                            let _ = self.socket.send_to(&bytes, from).await;
                        }
                        continue;
                    }
                    // Looked up on a task of its own (it reads sysfs, and the loop must
                    // keep receiving the answers to this agent's own asks), by at most
                    // LOOKUPS_AT_ONCE tasks: a flood of asks is dropped, not queued.
                    let Ok(permit) = self.lookups.clone().try_acquire_owned() else {
                        debug!(%from, "hello asks faster than they can be looked up: dropped");
                        continue;
                    };
                    let (lookup, socket, mine) =
                        (lookup.clone(), self.socket.clone(), self.mine.clone());
                    tokio::spawn(async move {
                        let addrs = tokio::task::spawn_blocking(move || lookup(gid))
                            .await
                            .unwrap_or(None);
                        drop(permit);
                        mine.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .put(gid, addrs.clone());
                        if let Ok(bytes) = serde_json::to_vec(&Hello::Answer { gid, addrs }) {
                            let _ = socket.send_to(&bytes, from).await;
                        }
                    });
                }
                Hello::Answer { gid, addrs } => {
                    let waiting = self
                        .waiters
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&gid);
                    // Only an answer somebody here waits for counts (a stranger's
                    // unasked answers vouch for nothing).
                    let Some(waiting) = waiting else { continue };
                    if let Some(list) = &addrs {
                        let mut v = self.vouched.lock().unwrap_or_else(PoisonError::into_inner);
                        v.put(gid, ());
                        for a in list.iter().take(MAP_MAX / 16) {
                            v.put(a.gid, ());
                        }
                    }
                    for w in waiting {
                        let _ = w.send(addrs.clone());
                    }
                }
            }
        }
    }

    /// Ask the agent at `gid`'s address for the addresses of its device holding `gid`.
    /// `Err` when nobody answered (no agent there); `Ok(None)` when the agent answered
    /// that no device of its host holds `gid`.
    pub async fn ask(&self, gid: Gid) -> Result<Option<Vec<Addr>>, HelloError> {
        let Some(ip) = ip_of(&gid) else {
            return Err(HelloError::NotIp(gid));
        };
        let cached = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&gid);
        if let Some(a) = cached {
            return Ok(a);
        }
        let to = self.dest(ip);
        let bytes = serde_json::to_vec(&Hello::Ask { gid })
            .map_err(|e| HelloError::Encode(e.to_string()))?;
        for attempt in 0..TRIES {
            let (tx, rx) = oneshot::channel();
            {
                let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
                if !waiters.contains_key(&gid) && waiters.len() >= MAP_MAX {
                    return Err(HelloError::Busy);
                }
                waiters.entry(gid).or_default().push(tx);
            }
            if let Err(e) = self.socket.send_to(&bytes, to).await {
                debug!(%to, error = %e, "hello send failed");
            }
            let answer = tokio::time::timeout(WAIT * (1 << attempt), rx).await;
            // An ask given up on leaves nothing behind.
            {
                let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(list) = waiters.get_mut(&gid) {
                    list.retain(|w| !w.is_closed());
                    if list.is_empty() {
                        waiters.remove(&gid);
                    }
                }
            }
            if let Ok(Ok(answer)) = answer {
                self.answers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .put(gid, answer.clone());
                return Ok(answer);
            }
        }
        Err(HelloError::NoAnswer(to))
    }

    /// Whether some host's agent answered for `gid` (within the last hour).
    pub fn vouched(&self, gid: &Gid) -> bool {
        self.vouched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(gid)
            .is_some()
    }

    /// Entries held in its maps (answers, own answers, vouched addresses, addresses
    /// being asked about): what a flood of asks could grow, and cannot past a bound.
    pub fn held(&self) -> usize {
        let n = |m: &Answers| m.lock().unwrap_or_else(PoisonError::into_inner).len();
        n(&self.answers)
            + n(&self.mine)
            + self
                .vouched
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
            + self
                .waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
    }

    /// `ip`'s hello address in the socket's family (IPv4 as mapped IPv6 on a dual-stack
    /// socket).
    fn dest(&self, ip: IpAddr) -> SocketAddr {
        let v6_socket = self.socket.local_addr().is_ok_and(|a| a.is_ipv6());
        match ip {
            IpAddr::V4(v4) if v6_socket => {
                SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), self.port)
            }
            other => SocketAddr::new(other, self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_ask_is_answered_and_silence_is_named() {
        let a = HelloSocket::bind(0).await.expect("bind");
        let port = a.local_addr().expect("addr").port();
        // Answer as the host whose device holds 127.0.0.1.
        let me: Gid = crate::local::gid_of("127.0.0.1".parse().expect("ip"));
        let addrs = vec![Addr { gid: me, prefix: 8 }];
        let served = addrs.clone();
        let server = HelloSocket { port, ..a.clone() };
        tokio::spawn(async move {
            server
                .serve(move |g| (g == me).then(|| served.clone()))
                .await;
        });
        let asker = HelloSocket::bind(0).await.expect("bind");
        let asker = HelloSocket { port, ..asker };
        let asker2 = asker.clone();
        tokio::spawn(async move { asker2.serve(|_| None).await });
        assert_eq!(asker.ask(me).await, Ok(Some(addrs)));
        let other = crate::local::gid_of("127.0.0.2".parse().expect("ip"));
        assert_eq!(asker.ask(other).await, Ok(None), "answered: not here");
        // Nobody on that port: named as such.
        let silent = HelloSocket::bind(0).await.expect("bind");
        let silent = HelloSocket {
            port: port.wrapping_add(7),
            ..silent
        };
        let err = silent.ask(me).await.expect_err("no agent");
        assert!(err.to_string().contains("no apm agent answered"), "{err}");
    }
}
