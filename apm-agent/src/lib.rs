//! apm's per-host agent for `apm run`, and the client side the protected processes use.
//!
//! A program under `apm run` (or with apm's interposition library in `LD_PRELOAD`) runs
//! its own apm engine in-process: only that process can modify its QPs. Its peer
//! messages (LAP/APR, software-migration requests) must still reach the right process on
//! the other host, and an MPI job has one process per core, all behind the same
//! addresses. So one **agent** per host (per network namespace) owns apm's UDP peer
//! port and routes:
//!
//! - **Out**: a process hands the agent `(from GID, to GID, message)`; the agent sends
//!   it with cm-lap's UDP channel bound to the `from` address (one channel per local
//!   RoCE address, so the receiver names the sender by the datagram's source address,
//!   also when both ends share one host), to the peer's agent at `to`'s IP address and
//!   the agent port.
//! - **In**: a datagram's comm ids are the QP numbers of its two ends (apm run has no
//!   CM exchange; both ends know both QPNs from the RTR attributes), so the agent hands
//!   it to the process that registered that (local QPN, remote QPN) pair with the
//!   sender's GID among the connection's peer GIDs.
//! - **Hello**: to learn the peer's other rails, a process asks the agent for
//!   candidate paths; the agent asks the peer host's agent (a JSON datagram on the hello
//!   port, [`hello`]) which addresses the device holding the peer's GID has, and pairs
//!   them with the local ones by subnet. No answer means no apm at the peer.
//! - **Probes**: the agent probes every path its processes registered, once per host
//!   (`probes`: BFD-like sessions, apm-core's `probe` module), and tells every process
//!   when one goes down (of which kind) or comes back; their engines move the
//!   connections on it and stop arming onto it.
//! - **Rail down**: an operator's verdict that an address is unreachable (`apm agent
//!   --rail-down`) is broadcast to every process, which moves the connections whose
//!   primary uses it.
//! - **Watchers**: `apm watch --agent` attaches as a watcher ([`client::AgentWatch`]) and
//!   gets every verdict (the probes', with their kind, and rail-down) as the processes
//!   do, and nothing else; a watcher does not keep an idle agent alive.
//!
//! The agent holds no connection state a process could not re-register, and it never
//! touches a QP. When it dies, every process says so once and runs on unprotected.
//!
//! **A security boundary.** The agent runs as root beside every protected process and
//! holds the deployment's peer key: its socket is a file only root places, each end
//! checks the other's credentials, a process acts only on QPs the kernel says are its
//! own, operators' requests need root or the operator group, and every queue and table
//! a client or a stranger could fill is bounded ([`access`], [`server`]).
//!
//! Modules: [`wire`] (process <-> agent messages), [`hello`] (agent <-> agent), [`local`]
//! (this host's RoCE addresses and subnets, pairing), [`access`] (the socket's place
//! and the credentials at each end), [`host`] (this host's addresses and QP owners, as
//! [`rdma_nl`] asks the kernel), [`outbox`] (a client's bounded outgoing lines),
//! [`server`] (the agent), [`client`] (the process side), [`facets`] (the engine's peer
//! and fabric facets over the agent), [`ib`] (the agent's InfiniBand side: SA paths and
//! notices, vendor MADs), [`status`] (what each process says of itself, and `apm
//! status`'s answer), [`metrics_http`] (the metrics' HTTP responder).
#![forbid(unsafe_code)]

pub mod access;
pub mod client;
pub mod facets;
pub mod hello;
pub mod host;
pub mod ib;
pub mod local;
pub mod metrics_http;
pub mod outbox;
mod probes;
pub mod rdma_nl;
pub mod report;
pub mod server;
pub mod status;
pub mod wire;

/// The UDP port apm's agents exchange peer messages on (LAP/APR, software migration).
pub const DEFAULT_PEER_PORT: u16 = 47_910;

/// The hello port is the peer port plus this.
pub const HELLO_OFFSET: u16 = 1;

/// Why talking to the agent failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No agent listens on this host (for this port).
    #[error("no apm agent on this host ({}): start `apm agent`, or run the program under `apm run`", .0.display())]
    NotRunning(std::path::PathBuf),
    /// The agent's socket refuses this user (its group and mode).
    #[error("the apm agent's socket {} refuses this user: ask for membership of its group, or run under root's agent", .0.display())]
    NotAllowed(std::path::PathBuf),
    /// The socket or the agent behind it is not one to trust.
    #[error(transparent)]
    Untrusted(#[from] access::AccessError),
    /// The agent refused a request (see [`wire::FromAgent::Refused`]).
    #[error("the apm agent refused: {0}")]
    Refused(String),
    /// The agent went away.
    #[error("the apm agent closed the connection")]
    Gone,
    /// The agent did not answer a watcher (an agent of another apm version).
    #[error("the apm agent did not answer the watch request within {0:?} (an agent of another apm version? restart it)")]
    NoWatch(std::time::Duration),
    /// The agent did not answer in time.
    #[error("the apm agent did not answer within {0:?}")]
    NoAnswer(std::time::Duration),
    /// Local IO.
    #[error("apm agent: {0}")]
    Io(#[from] std::io::Error),
}
