//! This host's RoCE addresses, their subnets, and how two hosts' addresses pair up into
//! rails.
//!
//! Read from sysfs and procfs only (no libibverbs): `/sys/class/infiniband/*/ports/*/gids`
//! with each GID's type and netdev, the IPv4 subnets of the netdevs' connected routes
//! (`/proc/net/route`) and the IPv6 prefixes (`/proc/net/if_inet6`). A RoCE GID is an IP
//! address; two addresses are on one rail when each is inside the other's subnet.
//! Link-local IPv6 GIDs are left out (they need an interface scope a GID does not carry).

use apm_core::Gid;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// One address of a device port, with its subnet's prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Addr {
    /// The GID (`::ffff:a.b.c.d` for IPv4).
    pub gid: Gid,
    /// The prefix length of its subnet, in the address family's own bits (24 for a /24).
    pub prefix: u8,
}

/// The IP address of a RoCE GID; `None` for the zero GID and link-local IPv6.
pub fn ip_of(gid: &Gid) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(gid.0);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(IpAddr::V4(v4));
    }
    if v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80 {
        return None;
    }
    Some(IpAddr::V6(v6))
}

/// The RoCE GID of an IP address.
pub fn gid_of(ip: IpAddr) -> Gid {
    Gid(match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    })
}

/// Whether `a` and `b` are in one subnet of `prefix` bits (same address family only).
pub fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// The alternate rails between two hosts: every `(local, peer)` pair of addresses in one
/// subnet (each inside the other's), leaving out the primary's two ends (an alternate
/// through either would share the primary's failures). Sorted, no duplicates.
pub fn pair(local: &[Addr], peer: &[Addr], sgid: &Gid, dgid: &Gid) -> Vec<(Gid, Gid)> {
    let mut out = Vec::new();
    for l in local.iter().filter(|l| l.gid != *sgid) {
        let Some(lip) = ip_of(&l.gid) else { continue };
        for r in peer.iter().filter(|r| r.gid != *dgid) {
            let Some(rip) = ip_of(&r.gid) else { continue };
            if same_subnet(lip, rip, l.prefix) && same_subnet(lip, rip, r.prefix) {
                out.push((l.gid, r.gid));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every address of the device port that holds `gid` (RoCE v2 entries, no link-local),
/// with subnets; `None` when no device here has it.
pub fn device_addresses(gid: &Gid) -> Option<Vec<Addr>> {
    device_addresses_in(Path::new("/sys/class/infiniband"), gid, &Subnets::read())
}

/// [`device_addresses`] over a sysfs tree at `root` and given subnets (for tests).
pub fn device_addresses_in(root: &Path, gid: &Gid, subnets: &Subnets) -> Option<Vec<Addr>> {
    let (_, entries) = find_port(root, gid)?;
    let mut out: Vec<Addr> = entries
        .iter()
        .filter_map(|(g, ndev)| {
            let ip = ip_of(g)?;
            let prefix = subnets.prefix_of(ip, ndev)?;
            Some(Addr { gid: *g, prefix })
        })
        .collect();
    out.sort();
    out.dedup();
    Some(out)
}

/// The device and port number that hold `gid` here (`rxe0`, 1), if any (a RoCE v2
/// GID, or any GID of an InfiniBand port): how `apm watch --agent` names the port of a
/// path the agent's probes judged, and how the agent finds a process's port.
pub fn port_of(gid: &Gid) -> Option<(String, u8)> {
    port_of_in(Path::new("/sys/class/infiniband"), gid)
}

/// [`port_of`] over a sysfs tree at `root` (for tests).
pub fn port_of_in(root: &Path, gid: &Gid) -> Option<(String, u8)> {
    let (port, _) = find_port(root, gid)?;
    let num = port.file_name()?.to_str()?.parse().ok()?;
    let dev = port.parent()?.parent()?.file_name()?.to_str()?.to_owned();
    Some((dev, num))
}

/// The sysfs directory of the device port holding `gid`, with that port's RoCE v2 GIDs.
fn find_port(root: &Path, gid: &Gid) -> Option<(std::path::PathBuf, Vec<(Gid, String)>)> {
    for dev in read_dir_sorted(root) {
        for port in read_dir_sorted(&dev.join("ports")) {
            let entries = port_gids(&port);
            if entries.iter().any(|(g, _)| g == gid) {
                return Some((port, entries));
            }
        }
    }
    None
}

fn read_dir_sorted(p: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(p)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// A GID table fills from index 0 (the core hands out the lowest free slot), so a run
/// of this many empty slots ends the scan: rxe's table has 1024 slots, and reading them
/// all one file at a time is slow (most of a second under emulation).
const EMPTY_RUN_ENDS_SCAN: usize = 32;

/// The non-zero RoCE v2 GIDs of one port, with their netdev names; on an InfiniBand
/// port every non-zero GID (no netdev).
fn port_gids(port: &Path) -> Vec<(Gid, String)> {
    let mut out = Vec::new();
    let infiniband =
        std::fs::read_to_string(port.join("link_layer")).is_ok_and(|l| l.trim() == "InfiniBand");
    let attrs = port.join("gid_attrs");
    let mut empty_run = 0;
    for index in 0.. {
        if empty_run >= EMPTY_RUN_ENDS_SCAN {
            break;
        }
        let f = port.join("gids").join(index.to_string());
        let Ok(text) = std::fs::read_to_string(&f) else {
            if !f.exists() {
                break; // past the table's end
            }
            empty_run += 1;
            continue;
        };
        let gid = parse_sysfs_gid(text.trim()).unwrap_or_default();
        if gid == Gid::default() {
            empty_run += 1;
            continue;
        }
        empty_run = 0;
        if infiniband {
            out.push((gid, String::new()));
            continue;
        }
        let index = index.to_string();
        let kind = std::fs::read_to_string(attrs.join("types").join(&index)).unwrap_or_default();
        if !kind.to_ascii_lowercase().contains("v2") {
            continue;
        }
        let ndev = std::fs::read_to_string(attrs.join("ndevs").join(&index)).unwrap_or_default();
        out.push((gid, ndev.trim().to_owned()));
    }
    out
}

/// A sysfs GID (`0000:0000:0000:0000:0000:ffff:0a00:0a01`).
fn parse_sysfs_gid(s: &str) -> Option<Gid> {
    s.parse::<Ipv6Addr>().ok().map(|a| Gid(a.octets()))
}

/// The subnets of this host's netdevs: IPv4 connected routes and IPv6 prefixes.
#[derive(Clone, Debug, Default)]
pub struct Subnets {
    /// (netdev, network, prefix).
    pub v4: Vec<(String, Ipv4Addr, u8)>,
    /// (netdev, address, prefix).
    pub v6: Vec<(String, Ipv6Addr, u8)>,
}

impl Subnets {
    /// Read them from procfs (empty where a file is missing).
    pub fn read() -> Subnets {
        Subnets {
            v4: std::fs::read_to_string("/proc/net/route")
                .map(|t| parse_route(&t))
                .unwrap_or_default(),
            v6: std::fs::read_to_string("/proc/net/if_inet6")
                .map(|t| parse_if_inet6(&t))
                .unwrap_or_default(),
        }
    }

    /// The prefix length of `ip` on `ndev` (any netdev when `ndev` is empty).
    pub fn prefix_of(&self, ip: IpAddr, ndev: &str) -> Option<u8> {
        let on = |d: &str| ndev.is_empty() || d == ndev;
        match ip {
            IpAddr::V4(a) => self
                .v4
                .iter()
                .filter(|(d, net, p)| on(d) && same_subnet(IpAddr::V4(a), IpAddr::V4(*net), *p))
                .map(|(_, _, p)| *p)
                .max(),
            IpAddr::V6(a) => self
                .v6
                .iter()
                .find(|(d, addr, _)| on(d) && *addr == a)
                .map(|(_, _, p)| *p),
        }
    }
}

/// `/proc/net/route`: `Iface Destination Gateway Flags ... Mask ...`, hex in host order;
/// connected routes (no gateway) only, the default route left out.
fn parse_route(text: &str) -> Vec<(String, Ipv4Addr, u8)> {
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (dest, gw, mask) = (hex(f.get(1)?)?, hex(f.get(2)?)?, hex(f.get(7)?)?);
            if gw != 0 || mask == 0 {
                return None;
            }
            // The kernel prints each network-order word as a host integer: its bytes
            // in memory are the address's.
            let net = Ipv4Addr::from(dest.to_ne_bytes());
            let prefix = u32::from_be_bytes(mask.to_ne_bytes()).leading_ones() as u8;
            Some((f[0].to_owned(), net, prefix))
        })
        .collect()
}

/// `/proc/net/if_inet6`: `address ifindex prefixlen scope flags name`.
fn parse_if_inet6(text: &str) -> Vec<(String, Ipv6Addr, u8)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let a = u128::from_str_radix(f.first()?, 16).ok()?;
            let prefix = u8::from_str_radix(f.get(2)?, 16).ok()?;
            Some((f.get(5)?.to_string(), Ipv6Addr::from(a), prefix))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> Gid {
        s.parse().expect("gid")
    }

    fn a(s: &str, prefix: u8) -> Addr {
        Addr { gid: g(s), prefix }
    }

    #[test]
    fn rails_pair_by_subnet_and_leave_the_primary_out() {
        let local = [
            a("::ffff:10.0.10.1", 24),
            a("::ffff:10.0.20.1", 24),
            a("::ffff:10.0.30.1", 24),
        ];
        let peer = [
            a("::ffff:10.0.10.2", 24),
            a("::ffff:10.0.20.2", 24),
            a("2001:db8::2", 64),
        ];
        let got = pair(
            &local,
            &peer,
            &g("::ffff:10.0.10.1"),
            &g("::ffff:10.0.10.2"),
        );
        assert_eq!(got, vec![(g("::ffff:10.0.20.1"), g("::ffff:10.0.20.2"))]);
        // No second rail: nothing.
        assert!(pair(&local[..1], &peer, &local[0].gid, &peer[0].gid).is_empty());
        // A narrower subnet on one side splits the rail.
        let narrow = [a("::ffff:10.0.20.1", 30), a("::ffff:10.0.10.1", 24)];
        let far = [a("::ffff:10.0.20.9", 24)];
        assert!(pair(
            &narrow,
            &far,
            &g("::ffff:10.0.10.1"),
            &g("::ffff:10.0.10.2")
        )
        .is_empty());
    }

    #[test]
    fn procfs_tables_parse() {
        let route =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     vA.10\t000A000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        let v4 = parse_route(route);
        assert_eq!(
            v4,
            vec![("vA.10".to_owned(), Ipv4Addr::new(10, 0, 10, 0), 24)]
        );
        let inet6 = "20010db8000000000000000000000002 03 40 00 80 vA.20\n";
        let v6 = parse_if_inet6(inet6);
        assert_eq!(v6[0].2, 64);
        let s = Subnets { v4, v6 };
        assert_eq!(
            s.prefix_of("10.0.10.1".parse().expect("ip"), "vA.10"),
            Some(24)
        );
        assert_eq!(s.prefix_of("10.0.10.1".parse().expect("ip"), "vB.10"), None);
        assert_eq!(
            s.prefix_of("2001:db8::2".parse().expect("ip"), ""),
            Some(64)
        );
    }

    #[test]
    fn a_sysfs_tree_gives_the_device_of_a_gid() {
        let root = std::env::temp_dir().join(format!("apm-agent-sysfs-{}", std::process::id()));
        let port = root.join("rxe0/ports/1");
        for d in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
            std::fs::create_dir_all(port.join(d)).expect("mkdir");
        }
        let entries = [
            (
                "0",
                "fe80:0000:0000:0000:0000:0000:0000:0001",
                "RoCE v2",
                "vA",
            ),
            (
                "1",
                "0000:0000:0000:0000:0000:ffff:0a00:0a01",
                "RoCE v2",
                "vA.10",
            ),
            (
                "2",
                "0000:0000:0000:0000:0000:ffff:0a00:0a01",
                "IB/RoCE v1",
                "vA.10",
            ),
            (
                "3",
                "0000:0000:0000:0000:0000:ffff:0a00:1401",
                "RoCE v2",
                "vA.20",
            ),
            ("4", "0000:0000:0000:0000:0000:0000:0000:0000", "", ""),
        ];
        for (i, gid, kind, ndev) in entries {
            std::fs::write(port.join("gids").join(i), format!("{gid}\n")).expect("w");
            std::fs::write(port.join("gid_attrs/types").join(i), format!("{kind}\n")).expect("w");
            std::fs::write(port.join("gid_attrs/ndevs").join(i), format!("{ndev}\n")).expect("w");
        }
        let subnets = Subnets {
            v4: vec![
                ("vA.10".into(), Ipv4Addr::new(10, 0, 10, 0), 24),
                ("vA.20".into(), Ipv4Addr::new(10, 0, 20, 0), 24),
            ],
            v6: vec![],
        };
        let got = device_addresses_in(&root, &g("::ffff:10.0.20.1"), &subnets).expect("found");
        assert_eq!(
            got,
            vec![a("::ffff:10.0.10.1", 24), a("::ffff:10.0.20.1", 24)]
        );
        assert_eq!(
            device_addresses_in(&root, &g("::ffff:10.9.9.9"), &subnets),
            None
        );
        assert_eq!(
            port_of_in(&root, &g("::ffff:10.0.20.1")),
            Some(("rxe0".to_owned(), 1))
        );
        assert_eq!(port_of_in(&root, &g("::ffff:10.9.9.9")), None);
        // An InfiniBand port: its GIDs are its own whatever their type says, and none is
        // an IP address to pair.
        let ib = root.join("mlx5_0/ports/2");
        for d in ["gids", "gid_attrs/types"] {
            std::fs::create_dir_all(ib.join(d)).expect("mkdir");
        }
        std::fs::write(ib.join("link_layer"), "InfiniBand\n").expect("w");
        let port_gid = "fe80:0000:0000:0000:0002:c903:0011:2233";
        std::fs::write(ib.join("gids/0"), format!("{port_gid}\n")).expect("w");
        std::fs::write(ib.join("gid_attrs/types/0"), "IB/RoCE v1\n").expect("w");
        let ib_gid = g("fe80::2:c903:11:2233");
        assert_eq!(port_of_in(&root, &ib_gid), Some(("mlx5_0".to_owned(), 2)));
        assert_eq!(device_addresses_in(&root, &ib_gid, &subnets), Some(vec![]));
        let _ = std::fs::remove_dir_all(&root);
    }
}
