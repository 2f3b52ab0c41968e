//! Agent <-> agent hello: "which addresses does the device holding this GID have?"
//!
//! One JSON datagram each way on the hello port (the peer port + [`crate::HELLO_OFFSET`]).
//! The asking agent pairs the answer with its own addresses into rails
//! ([`crate::local::pair`]); an ask that gets no answer after a few tries means the peer
//! host runs no apm agent, and the connection is left unprotected with that reason.
//! Answers are public facts (a host's RoCE addresses): nothing here changes a QP, and a
//! forged answer can at most propose an alternate that the peer's engine then refuses
//! (its LAP checks that a path's ends are its own addresses).

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

type Answers = Arc<Mutex<BTreeMap<Gid, (tokio::time::Instant, Option<Vec<Addr>>)>>>;

/// How long this host's own answer is reused (many processes ask at once at start).
const OWN_TTL: Duration = Duration::from_secs(2);

/// The hello socket of one agent: serves asks and asks others.
#[derive(Debug, Clone)]
pub struct HelloSocket {
    socket: Arc<UdpSocket>,
    port: u16,
    waiters: Waiters,
    answers: Answers,
    /// This host's answers, by asked GID.
    mine: Answers,
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
            answers: Arc::default(),
            mine: Arc::default(),
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
                    // Answered on a task of its own: a lookup reads sysfs, and the loop
                    // must keep receiving the answers to this agent's own asks.
                    let (lookup, socket, mine) =
                        (lookup.clone(), self.socket.clone(), self.mine.clone());
                    tokio::spawn(async move {
                        let cached = mine
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get(&gid)
                            .filter(|(at, _)| at.elapsed() < OWN_TTL)
                            .map(|(_, a)| a.clone());
                        let addrs = match cached {
                            Some(a) => a,
                            None => {
                                let a = tokio::task::spawn_blocking(move || lookup(gid))
                                    .await
                                    .unwrap_or(None);
                                mine.lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .insert(gid, (tokio::time::Instant::now(), a.clone()));
                                a
                            }
                        };
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
                        .remove(&gid)
                        .unwrap_or_default();
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
        if let Some((at, a)) = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&gid)
        {
            if at.elapsed() < ANSWER_TTL {
                return Ok(a.clone());
            }
        }
        let to = self.dest(ip);
        let bytes = serde_json::to_vec(&Hello::Ask { gid })
            .map_err(|e| HelloError::Encode(e.to_string()))?;
        for attempt in 0..TRIES {
            let (tx, rx) = oneshot::channel();
            self.waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(gid)
                .or_default()
                .push(tx);
            if let Err(e) = self.socket.send_to(&bytes, to).await {
                debug!(%to, error = %e, "hello send failed");
            }
            if let Ok(Ok(answer)) = tokio::time::timeout(WAIT * (1 << attempt), rx).await {
                self.answers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(gid, (tokio::time::Instant::now(), answer.clone()));
                return Ok(answer);
            }
        }
        Err(HelloError::NoAnswer(to))
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
