//! `bench failover`'s bonding layout: two veth pairs (one per rail), a bond on each
//! side over them, rxe on each bond, and the routes that make the bonds' two local
//! addresses talk over the wire.

use super::rails::{ip_quiet, rule_listed, sysctl};
use super::*;

/// The bonds' addresses (one subnet: bonding keeps one address across its slaves).
pub(crate) const BOND_A: &str = "10.0.30.1";
pub(crate) const BOND_B: &str = "10.0.30.2";

/// Make the bond layout: veth pairs vA1<->vB1 and vA2<->vB2 (rails 1 and 2), bondA and
/// bondB active-backup over them with `monitor` (bonding's own options), rxe2 and rxe3
/// on the bonds, and the routes that make the two local addresses talk over the wire.
pub(crate) fn bonds_up(monitor: &[&str]) {
    bonds_down();
    for r in ["1", "2"] {
        ip(&[
            "link",
            "add",
            &format!("vA{r}"),
            "type",
            "veth",
            "peer",
            "name",
            &format!("vB{r}"),
        ]);
    }
    for (bond, side, target) in [("bondA", "A", BOND_B), ("bondB", "B", BOND_A)] {
        let mut args = vec!["link", "add", bond, "type", "bond", "mode", "active-backup"];
        args.extend(monitor);
        let with_target: Vec<String> = args
            .iter()
            .map(|a| {
                if *a == "TARGET" {
                    target.to_owned()
                } else {
                    (*a).to_owned()
                }
            })
            .collect();
        ip(&with_target.iter().map(String::as_str).collect::<Vec<_>>());
        for r in ["1", "2"] {
            ip(&["link", "set", &format!("v{side}{r}"), "master", bond]);
        }
        let addr = if side == "A" { BOND_A } else { BOND_B };
        ip(&["addr", "add", &format!("{addr}/24"), "dev", bond]);
        ip(&["link", "set", bond, "up"]);
        for r in ["1", "2"] {
            ip(&["link", "set", &format!("v{side}{r}"), "up"]);
        }
    }
    for dev in ["bondA", "bondB", "vA1", "vA2", "vB1", "vB2"] {
        sysctl(&format!("{dev}/rp_filter"), "0");
        sysctl(&format!("{dev}/accept_local"), "1");
    }
    bond_routes();
    for (dev, netdev) in [("rxe2", "bondA"), ("rxe3", "bondB")] {
        let ok = std::process::Command::new("/usr/bin/rdma")
            .args(["link", "add", dev, "type", "rxe", "netdev", netdev])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "rdma link add {dev} on {netdev}");
    }
    wait_bond_gid("rxe2", BOND_A);
    wait_bond_gid("rxe3", BOND_B);
}

/// Routes through the bonds for locally sent packets to the other bond's address
/// (dropped by a link going down; set again after). By destination, not source: the
/// bonding ARP monitor looks its target up with no source address, and must find the
/// bond, not the local table.
pub(crate) fn bond_routes() {
    for (dev, src, dst, table) in [
        ("bondA", BOND_A, BOND_B, "130"),
        ("bondB", BOND_B, BOND_A, "230"),
    ] {
        let _ = ip_quiet(&[
            "route", "replace", dst, "dev", dev, "src", src, "table", table,
        ]);
        if !rule_to_present(dst, table) {
            ip(&[
                "rule", "add", "pref", "100", "to", dst, "iif", "lo", "lookup", table,
            ]);
        }
    }
}

/// Whether the rule sending locally generated packets for `dst` to `table` is there.
fn rule_to_present(dst: &str, table: &str) -> bool {
    rule_listed(table, |l| l.contains(&format!("to {dst} ")))
}

pub(crate) fn bonds_down() {
    for dev in ["rxe2", "rxe3"] {
        let _ = std::process::Command::new("/usr/bin/rdma")
            .args(["link", "delete", dev])
            .output();
    }
    for dev in ["bondA", "bondB", "vA1", "vA2"] {
        let _ = ip_quiet(&["link", "del", dev]);
    }
}

/// Wait until `dev` lists `addr` as a RoCE v2 GID.
fn wait_bond_gid(dev: &str, addr: &str) {
    let ctx = verbs().open(dev).expect("open");
    let ip: std::net::IpAddr = addr.parse().expect("ip");
    let until = Instant::now() + Duration::from_secs(15);
    super::rails::wait_gid(&ctx, dev, ip, until, "15 s");
}
