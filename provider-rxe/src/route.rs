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
