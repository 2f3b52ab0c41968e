//! Messages between a protected process and its host's agent: one JSON object per line
//! on the agent's Unix socket. Both ends are built from this crate, so the format only
//! has to be stable within one apm version; the agent refuses a line it cannot parse
//! (it logs and drops it) and never panics on one. Lines are read with a length limit
//! ([`LINE_LIMIT`], [`Lines`]): a peer on the socket that never sends a newline costs
//! that much memory, then its stream is closed.

use crate::status::{AgentStatus, ProcessStatus};
use apm_core::probe::{PathEnds, PathVerdict, SessionState};
use apm_core::{Gid, PeerAddr, PeerMsg};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The longest line either end reads: far above any message (a `Register` of a
/// connection with a hundred paths is ~20 KiB).
pub const LINE_LIMIT: usize = 1 << 20;

/// Why a stream of lines ended early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// A line longer than [`LINE_LIMIT`]: what follows cannot be told from it.
    #[error("a line longer than {LINE_LIMIT} bytes")]
    TooLong,
    /// The stream failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The lines of a stream, each at most [`LINE_LIMIT`] bytes.
#[derive(Debug)]
pub struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    /// Read `reader` line by line.
    pub fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            buf: Vec::new(),
        }
    }

    /// The next line, without its newline; `None` at the end of the stream (a last
    /// line without a newline is a line).
    pub async fn next_line(&mut self) -> Result<Option<&[u8]>, LineError> {
        self.buf.clear();
        let limit = LINE_LIMIT as u64 + 1;
        let n = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buf)
            .await?;
        if n == 0 {
            return Ok(None);
        }
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if self.buf.len() > LINE_LIMIT {
            return Err(LineError::TooLong);
        }
        Ok(Some(&self.buf))
    }
}

/// One protected connection as the agent routes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The local QP number (the connection's local comm id).
    pub local_qpn: u32,
    /// The peer's QP number (its remote comm id).
    pub remote_qpn: u32,
    /// The peer's addresses (GIDs) the connection may hear from.
    pub peer_gids: Vec<Gid>,
    /// The local addresses its paths leave from (the agent listens on each).
    pub local_gids: Vec<Gid>,
    /// The connection's paths as (local GID, peer GID): the primary and every
    /// candidate. The agent probes each (once per host, however many connections).
    #[serde(default)]
    pub paths: Vec<(Gid, Gid)>,
    /// On InfiniBand, the peer's LIDs the connection may hear from (a MAD without a
    /// GRH names its sender by LID only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_lids: Vec<u16>,
}

/// The SA's answer to [`ToAgent::Paths`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathsAnswer {
    /// The destination port's GID (looked up when it was asked by LID).
    pub dgid: apm_core::Gid,
    /// Every path the SA gave from the asking port to the destination's node: to the
    /// destination port first, then to the node's other ports.
    pub paths: Vec<apm_core::Path>,
    /// Every port of the destination's node: `(port GID, base LID)` (the addresses its
    /// messages may come from).
    #[serde(default)]
    pub peer_ports: Vec<(apm_core::Gid, u16)>,
}

/// From a process to the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum ToAgent {
    /// Route peer messages of this connection to me.
    Register {
        /// The connection.
        route: Route,
    },
    /// Stop routing them (the QP is gone).
    Unregister {
        /// Local QP number.
        local_qpn: u32,
        /// Peer QP number.
        remote_qpn: u32,
    },
    /// Send a peer message from local address `from` to the peer address `to`.
    Send {
        /// The local address (GID) to send from.
        from: Gid,
        /// The peer's address (GID).
        to: Gid,
        /// The message.
        msg: PeerMsg,
        /// On InfiniBand, the peer's LID (where the MAD goes); 0 on RoCE.
        #[serde(default, skip_serializing_if = "is_zero")]
        lid: u16,
    },
    /// The paths from the InfiniBand port holding `sgid` to a peer port, named by its
    /// GID or (a QP without a GRH) its LID: answered once per host from the SA.
    Paths {
        /// Echoed in the answer.
        req: u64,
        /// A local address of the asking port.
        sgid: Gid,
        /// The peer port's GID, when known.
        #[serde(default)]
        dgid: Option<Gid>,
        /// The peer port's LID, when its GID is not known.
        #[serde(default)]
        dlid: Option<u16>,
    },
    /// Send me the SA's notices (traps 64/65); subscribe through the InfiniBand port
    /// holding `sgid` (again: after CLIENT_REREGISTER the SA has forgotten).
    Subscribe {
        /// A local address of the port.
        sgid: Gid,
    },
    /// Which other paths lead from `local_gids` to the host of `dgid`? (hello).
    Candidates {
        /// Echoed in the answer.
        req: u64,
        /// The primary path's local address.
        sgid: Gid,
        /// The primary path's peer address.
        dgid: Gid,
        /// Every address of the local device and port the QP is on.
        local_gids: Vec<Gid>,
    },
    /// Treat `gid` (a local or a peer address) as unreachable: tell every process.
    RailDown {
        /// The address.
        gid: Gid,
    },
    /// This connection is a watcher (`apm watch --agent`), not a protected process:
    /// send it every verdict (the probes', an operator's rail-down) and nothing else.
    /// It does not keep an idle agent alive.
    Watch,
    /// Answer [`FromAgent::Synced`] once everything this process sent before has been
    /// handled (the agent handles one process's lines in order).
    Sync {
        /// Echoed in the answer.
        req: u64,
    },
    /// This process's account of its QPs, failovers and moves, replacing the last one
    /// (sent as it changes, at a bounded rate; `apm status` and the metrics read it).
    Report {
        /// The status.
        status: Box<ProcessStatus>,
    },
    /// What the agent and its processes are doing (`apm status`): answered with
    /// [`FromAgent::Status`]. Every process for an operator, else the caller's own.
    Status {
        /// Echoed in the answer.
        req: u64,
        /// Only this process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
    },
}

/// From the agent to a process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum FromAgent {
    /// A peer message for one of the process's connections.
    Peer {
        /// The sender, named by the datagram's source address.
        from: PeerAddr,
        /// The message.
        msg: PeerMsg,
    },
    /// The answer to [`ToAgent::Candidates`].
    Candidates {
        /// The request's id.
        req: u64,
        /// `(local GID, peer GID)` pairs on other rails than the primary, or why none
        /// can be known (no apm at the peer, ...).
        result: Result<Vec<(Gid, Gid)>, String>,
    },
    /// An address was found unreachable ([`ToAgent::RailDown`]).
    RailDown {
        /// The address.
        gid: Gid,
    },
    /// The answer to [`ToAgent::Sync`]: what the process sent before it has been
    /// handled (registrations listen, sends are sent, rail-downs are told).
    Synced {
        /// The request's id.
        req: u64,
    },
    /// The agent's probes' verdict on a path: down (local port, peer port or the fabric
    /// between), up (the first time or again), or up but held for flapping.
    Path {
        /// The path (this host's GID, the peer's).
        ends: PathEnds,
        /// What the probes say of it.
        verdict: PathVerdict,
    },
    /// The answer to [`ToAgent::Paths`].
    Paths {
        /// The request's id.
        req: u64,
        /// The SA's answer, or why there is none.
        result: Result<PathsAnswer, String>,
    },
    /// An SA notice: a port of the fabric went out of service (trap 65) or came (back)
    /// into service (trap 64).
    RemoteGid {
        /// The port's GID.
        gid: Gid,
        /// What the notice says.
        service: apm_core::GidService,
    },
    /// The agent refused a request of this client (it was not its to make, or a cap
    /// was reached); nothing of it was done.
    Refused {
        /// What was refused, and why.
        what: String,
    },
    /// The answer to [`ToAgent::Watch`]: what the agent watches now.
    Watching {
        /// Whether the agent probes at all (`apm agent --probes`); without, only
        /// rail-down verdicts come.
        probing: bool,
        /// Every path probed, with its session's state.
        sessions: Vec<(PathEnds, SessionState)>,
    },
    /// The answer to [`ToAgent::Status`].
    Status {
        /// The request's id.
        req: u64,
        /// The agent and the processes the caller may see.
        status: Box<AgentStatus>,
    },
}

fn is_zero(v: &u16) -> bool {
    *v == 0
}

/// The comm ids of a peer message: (the receiver's, the sender's).
pub fn comm_ids(msg: &PeerMsg) -> (u32, u32) {
    msg.comm_ids().unwrap_or((0, 0))
}

/// One line of JSON for `msg` (with its newline).
pub fn line<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these plain enums cannot fail (no maps with non-string keys).
    let mut v = serde_json::to_vec(msg).unwrap_or_default();
    v.push(b'\n');
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endless_line_stops_at_the_limit() {
        let endless = tokio::io::BufReader::new(tokio::io::repeat(b'x'));
        let mut lines = Lines::new(endless);
        assert!(matches!(lines.next_line().await, Err(LineError::TooLong)));
        let mut lines = Lines::new(&b"{}\nlast"[..]);
        assert_eq!(lines.next_line().await.expect("ok"), Some(&b"{}"[..]));
        assert_eq!(lines.next_line().await.expect("ok"), Some(&b"last"[..]));
        assert_eq!(lines.next_line().await.expect("ok"), None);
        let exact = format!("{}\n", "y".repeat(LINE_LIMIT));
        let mut lines = Lines::new(exact.as_bytes());
        assert_eq!(
            lines.next_line().await.expect("fits").map(<[u8]>::len),
            Some(LINE_LIMIT)
        );
    }
    use apm_core::{Lid, MigrateAck};

    #[test]
    fn messages_survive_a_line_each() {
        let gid: Gid = "::ffff:10.0.10.1".parse().expect("gid");
        let msgs = [
            FromAgent::Peer {
                from: PeerAddr {
                    gid,
                    lid: Lid::from_wire(0),
                },
                msg: PeerMsg::MigrateAck(MigrateAck {
                    sender_comm_id: 17,
                    receiver_comm_id: 18,
                    ok: true,
                }),
            },
            FromAgent::Candidates {
                req: 3,
                result: Err("no apm at the peer".into()),
            },
            FromAgent::RailDown { gid },
            FromAgent::Path {
                ends: PathEnds {
                    local: gid,
                    remote: gid,
                },
                verdict: PathVerdict::Held { hold_ms: 6_000 },
            },
            FromAgent::Watching {
                probing: true,
                sessions: vec![(
                    PathEnds {
                        local: gid,
                        remote: gid,
                    },
                    SessionState::Up,
                )],
            },
            FromAgent::Synced { req: 4 },
            FromAgent::Refused {
                what: "reporting a rail down (operators only)".into(),
            },
        ];
        for m in msgs {
            let l = line(&m);
            assert_eq!(l.last(), Some(&b'\n'));
            assert_eq!(l.iter().filter(|b| **b == b'\n').count(), 1);
            let back: FromAgent = serde_json::from_slice(&l).expect("parse");
            assert_eq!(back, m);
        }
        let ack = PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: 17,
            receiver_comm_id: 18,
            ok: true,
        });
        assert_eq!(comm_ids(&ack), (18, 17));
        let sync = ToAgent::Sync { req: 4 };
        let back: ToAgent = serde_json::from_slice(&line(&sync)).expect("parse");
        assert_eq!(back, sync);
    }
}
