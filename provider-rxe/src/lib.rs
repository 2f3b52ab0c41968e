//! apm Provider facets for soft-RoCE (rxe): software path migration.
//!
//! RoCE has no usable hardware APM (the kernel refuses alternate paths on RoCE ports,
//! and rxe never uses its alternate address vector), so apm moves a connection's
//! *primary* path itself when it fails, and the peer is told to do the same (apm-core's
//! engine in `MigrationMode::Software`, cm-lap's UDP channel carrying `Migrate`).
//!
//! - [`conn`]: [`RcConn`], an RC QP whose work goes through apm, so that a migration
//!   loses and duplicates nothing. Two procedures, as they were found to work on rxe:
//!   **SQ-drain** while the old path still acknowledges (RTS->SQD with
//!   `IBV_QP_EN_SQD_ASYNC_NOTIFY`, wait for `IBV_EVENT_SQ_DRAINED`, SQD->SQD with
//!   `IBV_QP_AV` alone — new `sgid_index` and `dgid`; `IBV_QP_STATE|IBV_QP_AV` is
//!   refused while draining — flush the route cache, SQD->RTS, one 0-byte signalled RDMA
//!   write as the kick, since rxe sends work rolled back by the drain only at the next
//!   post); **re-initialisation** when the QP is already in ERR (a link down does that
//!   within milliseconds), or when the old path has stopped acknowledging (its sends
//!   made no progress for the drain grace, or the drain did not end within it: on a dead
//!   path only rxe's retransmit timer, a whole ACK timeout, would end it), in which case
//!   apm fails the QP itself: collect the flushes, RESET->INIT (receives posted
//!   again)->RTR (new AV, own receive PSN)->RTS (send PSN = the oldest unacknowledged
//!   send's), replay the unacknowledged sends with their original PSNs so the peer's
//!   responder drops what it already has. That PSN is rxe's own when the QP failed by
//!   itself (it rolled back to retry), and apm's count when apm failed it and rxe's next
//!   PSN agrees with the count; a send that fails right after a migration (work the dead
//!   path had doomed) is repaired in place the same way, on the new path. After a move,
//!   while nothing is acknowledged, a few kicks ([`RcConn::nudge`]) make the peer's
//!   responder NAK at its first packet once it has followed, so the unacknowledged sends
//!   go again at once instead of at the retransmit timer.
//! - [`facet`]: [`RxeQpControl`], the `QpControl` facet: port and QP events through
//!   provider-verbs, software migration, the progress monitor that reports a stalled
//!   primary (rxe with `retry_cnt` 7 retries forever, so a dead path never errors), and
//!   a clear refusal of hardware-APM operations.
//! - [`adopt`]: [`AdoptedQp`], the SQ-drain migration of a QP the application owns
//!   (created, posted and polled by the application, handed over through
//!   [`RxeQpControl::adopt`]): no replay, no monitor, a kick that posts nothing (the
//!   send-queue doorbell); a QP already in ERR is lost.
//! - [`route`]: the route cache flush rxe needs after an address vector moves.
//! - [`warm`]: what a move onto a path needs ready before it (the peer's neighbour
//!   entry, the source GID's index), made ready when a connection is protected.
//! - [`roce_path`]: an engine path between two IP addresses (RoCE v2 GIDs).
//!
//! GID indexes are looked up by address at every use: they move when addresses change
//! (the index found last is checked first, one query, see [`warm`]).
// A provider, not the engine: it times real devices (stall detection, drain timeouts).
#![allow(clippy::disallowed_methods)]
#![forbid(unsafe_code)]

pub mod adopt;
pub mod conn;
pub mod facet;
pub mod route;
pub mod warm;

pub use adopt::{AdoptedQp, KICK_WR_ID};
pub use conn::{Completion, ConnError, ConnStats, ConnectParams, RcConn, Replay};
pub use facet::{address_vector, gid_index, RxeConfig, RxeQpControl};

use apm_core::{Gid, Path, PortKey};
use std::net::IpAddr;

/// The RoCE v2 GID of an IP address (`::ffff:a.b.c.d` for IPv4).
pub fn gid_of_ip(ip: IpAddr) -> Gid {
    Gid(match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    })
}

/// The engine's path from local address `local` to the peer's `remote` through `port`:
/// LIDs 0, hop limit 64, `mtu` in IBA encoding, `ack_timeout` as in the QP. The GID index
/// is left 0: [`address_vector`] looks it up when the path is used.
pub fn roce_path(port: PortKey, local: IpAddr, remote: IpAddr, mtu: u8, ack_timeout: u8) -> Path {
    Path::roce(port, gid_of_ip(local), gid_of_ip(remote), mtu, ack_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_paths_use_mapped_gids() {
        let p = roce_path(
            PortKey::new(0, 1),
            "10.0.10.1".parse().expect("ip"),
            "10.0.10.2".parse().expect("ip"),
            3,
            14,
        );
        assert_eq!(p.sgid.to_string(), "::ffff:10.0.10.1");
        assert_eq!(p.dgid.to_string(), "::ffff:10.0.10.2");
        assert_eq!(p.hop_limit, 64);
    }
}
