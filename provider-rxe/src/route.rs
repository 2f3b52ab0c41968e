//! The kernel route cache flush a software migration needs on rxe.
//!
//! rxe caches the route (and so the outgoing netdev) of a QP's destination. After the
//! primary address vector moves to another source address, rxe keeps sending out of the
//! old netdev until the route generation changes: the peer drops those packets (wrong
//! address for its QP) and the QP retransmits forever. Writing to
//! `/proc/sys/net/ipv4/route/flush` (what `ip route flush cache` does) bumps the
//! generation; the IPv6 one is bumped too for link-local and global IPv6 GIDs. This needs
//! `CAP_NET_ADMIN`; without it the migration still runs and a warning says why traffic
//! may not follow.
//!
//! [`warm_neighbour`] keeps the peer's MAC address resolved on alternate paths, so that
//! the address-vector change of a migration does not wait for ARP.

use tracing::warn;

const FLUSH_FILES: [&str; 2] = [
    "/proc/sys/net/ipv4/route/flush",
    "/proc/sys/net/ipv6/route/flush",
];

/// Flush the IPv4 and IPv6 route caches. Returns false (and logs) when the IPv4 flush
/// was refused; the IPv6 one is best effort (IPv6 may be disabled).
pub fn flush_route_cache() -> bool {
    let mut ok = true;
    for (i, f) in FLUSH_FILES.iter().enumerate() {
        if let Err(e) = std::fs::write(f, b"1\n") {
            if i == 0 {
                warn!(file = f, error = %e, "cannot flush the route cache: rxe may keep using the old path");
                ok = false;
            }
        }
    }
    ok
}

/// Make the kernel resolve the peer's link-layer address on the path from `local` to
/// `remote` now, by sending one empty UDP datagram (to the discard port, 9) from `local`.
///
/// Moving a QP's address vector resolves the destination MAC (ARP or neighbour
/// discovery) inside `ibv_modify_qp`; with a cold neighbour cache that takes long (about
/// a second was seen under emulation), all of it added to the failover. Warming the
/// alternate paths ahead of time, and again now and then (entries expire), keeps it out.
/// Best effort: errors are ignored.
pub fn warm_neighbour(local: std::net::IpAddr, remote: std::net::IpAddr) {
    if let Ok(s) = std::net::UdpSocket::bind((local, 0)) {
        let _ = s.set_nonblocking(true);
        let _ = s.send_to(&[], (remote, 9));
    }
}
