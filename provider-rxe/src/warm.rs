//! What a software migration onto a path needs ready before the path is needed: the
//! peer's link-layer address on it (its neighbour entry) and the index of its source GID
//! in the local GID table.
//!
//! Both lie on the critical path of a move. A cold neighbour makes the address-vector
//! change wait for ARP inside `ibv_modify_qp` (about a second on rxe under emulation). A
//! GID index never looked up costs a scan of the table, one query per slot up to the
//! GID's, where a known one is checked with a single query ([`Context::roce_gid_index`]:
//! 0.1 to 0.4 ms in the VM). So each path a connection may move onto is made ready when
//! it is protected ([`crate::RxeQpControl::keep_warm`]), and again every [`WARM_EVERY`]
//! while the facet runs (neighbour entries expire; GID indexes move when addresses come
//! and go, and a stale index costs the scan again, not a wrong address: the move checks
//! its slot first).

use apm_core::{Gid, Path};
use provider_verbs::ffi::Context;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

/// How often the paths are made ready again (neighbours: well inside Linux's default
/// reachable time of about 30 s).
pub const WARM_EVERY: Duration = Duration::from_secs(5);

/// The paths to keep ready, as what each needs.
#[derive(Debug, Default)]
pub struct Warm {
    /// Local/remote address pairs whose neighbour entries are kept resolved.
    neighbours: BTreeSet<(IpAddr, IpAddr)>,
    /// Source GIDs (device index, port, GID) whose table index is kept known.
    sources: BTreeSet<(u16, u8, Gid)>,
}

/// Work that [`Warm::add`] found new, to be done by the caller (outside the lock).
#[derive(Debug, Default)]
pub struct Fresh {
    neighbours: Vec<(IpAddr, IpAddr)>,
    sources: Vec<(u16, u8, Gid)>,
}

impl Warm {
    /// Remember `paths`; returns what of them was not kept ready before.
    pub fn add(&mut self, paths: impl IntoIterator<Item = Path>) -> Fresh {
        let mut fresh = Fresh::default();
        for p in paths {
            // IPv6 link-local GIDs have no interface scope: no neighbour to warm.
            if let (Some(l), Some(r)) = (ip_of_gid(&p.sgid), ip_of_gid(&p.dgid)) {
                if self.neighbours.insert((l, r)) {
                    fresh.neighbours.push((l, r));
                }
            }
            let source = (p.port.device, p.port.port, p.sgid);
            if self.sources.insert(source) {
                fresh.sources.push(source);
            }
        }
        fresh
    }

    /// Everything remembered, for a periodic refresh.
    pub fn all(&self) -> Fresh {
        Fresh {
            neighbours: self.neighbours.iter().copied().collect(),
            sources: self.sources.iter().copied().collect(),
        }
    }
}

impl Fresh {
    /// Resolve the neighbours and look up the source GIDs' indexes on `contexts`
    /// (device index `i` is `contexts[i]`). Best effort: a path that cannot be made
    /// ready now is looked up by the move itself, as without this.
    pub fn make_ready(&self, contexts: &[Context]) {
        for (l, r) in &self.neighbours {
            crate::route::warm_neighbour(*l, *r);
        }
        for (device, port, gid) in &self.sources {
            if let Some(ctx) = contexts.get(usize::from(*device)) {
                // The lookup leaves its answer as the context's hint for the next one.
                let _ = ctx.roce_gid_index(*port, &gid.0);
            }
        }
    }
}

/// The IP address of a RoCE v2 GID (`::ffff:a.b.c.d` is IPv4); `None` for the zero GID
/// and IPv6 link-local GIDs.
pub fn ip_of_gid(gid: &Gid) -> Option<IpAddr> {
    let v6 = std::net::Ipv6Addr::from(gid.0);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(IpAddr::V4(v4));
    }
    if v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80 {
        return None;
    }
    Some(IpAddr::V6(v6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apm_core::PortKey;

    fn path(local: &str, remote: &str) -> Path {
        crate::roce_path(
            PortKey::new(0, 1),
            local.parse().expect("ip"),
            remote.parse().expect("ip"),
            3,
            14,
        )
    }

    #[test]
    fn a_path_is_new_once() {
        let mut w = Warm::default();
        let f = w.add([
            path("10.0.10.1", "10.0.10.2"),
            path("10.0.20.1", "10.0.20.2"),
        ]);
        assert_eq!((f.neighbours.len(), f.sources.len()), (2, 2));
        let again = w.add([path("10.0.10.1", "10.0.10.2")]);
        assert!(again.neighbours.is_empty() && again.sources.is_empty());
        // A second peer on a known source: a new neighbour, the same source GID.
        let other_peer = w.add([path("10.0.10.1", "10.0.10.3")]);
        assert_eq!(
            (other_peer.neighbours.len(), other_peer.sources.len()),
            (1, 0)
        );
        assert_eq!(w.all().neighbours.len(), 3);
        assert_eq!(w.all().sources.len(), 2);
    }

    #[test]
    fn only_ip_gids_have_an_address() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        for addr in ["10.0.20.2", "2001:db8::7"] {
            assert_eq!(ip_of_gid(&crate::gid_of_ip(ip(addr))), Some(ip(addr)));
        }
        assert_eq!(ip_of_gid(&crate::gid_of_ip(ip("fe80::1"))), None);
        assert_eq!(ip_of_gid(&Gid::default()), None);
    }

    #[test]
    fn neighbours_are_kept_for_ip_gids_only() {
        let mut w = Warm::default();
        let mut p = path("10.0.10.1", "10.0.10.2");
        p.sgid = Gid("fe80::1"
            .parse::<std::net::Ipv6Addr>()
            .expect("ip")
            .octets());
        let f = w.add([p]);
        assert!(f.neighbours.is_empty());
        assert_eq!(f.sources.len(), 1);
    }
}
