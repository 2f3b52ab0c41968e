//! The two-rail layout of the VM (VLANs 10 and 20 over the veth pair) and the tools to
//! cut a rail and see where traffic goes.

use super::*;

/// The two-rail layout of a protected RoCE connection in one network namespace: VLANs 10
/// and 20 on the veth pair `vA`<->`vB` (rxe0 on `vA`, rxe1 on `vB`); each VLAN's IPv4
/// addresses become RoCE v2 GIDs of the device on its parent. Two local addresses talk
/// over the wire only with `rp_filter` 0, `accept_local` 1, the `local` table rule moved
/// below per-source rules for locally generated packets (`iif lo`), and each source
/// address routed through its VLAN (and unreachable when that VLAN's link is down). Idempotent: earlier tests toggle `vA`, which also
/// removes the per-source routes.
pub(crate) const RAILS: [(u16, &str, &str); 2] = [
    (10, "10.0.10.1", "10.0.10.2"),
    (20, "10.0.20.1", "10.0.20.2"),
];

pub(crate) fn ip_quiet(args: &[&str]) -> bool {
    std::process::Command::new("/usr/bin/ip")
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

pub(crate) fn sysctl(path: &str, value: &str) {
    let p = format!("/proc/sys/net/ipv4/conf/{path}");
    std::fs::write(&p, value).unwrap_or_else(|e| panic!("write {p}: {e}"));
}

pub(crate) fn rail_routes(vlan: u16, a: &str, b: &str) {
    for (dev, src, dst, table) in [
        (format!("vA.{vlan}"), a, b, 100 + u32::from(vlan)),
        (format!("vB.{vlan}"), b, a, 200 + u32::from(vlan)),
    ] {
        let table = table.to_string();
        ip(&[
            "route", "replace", dst, "dev", &dev, "src", src, "table", &table,
        ]);
        // When the rail's link is down the kernel drops the route above: the address is
        // then unreachable from this source, as across a real cable, instead of found in
        // the local table (both ends live in one namespace) and reached over loopback.
        ip(&[
            "route",
            "replace",
            "unreachable",
            dst,
            "table",
            &table,
            "metric",
            "4000",
        ]);
        if !rule_present(src, &table) {
            ip(&[
                "rule", "add", "pref", "100", "from", src, "iif", "lo", "lookup", &table,
            ]);
        }
    }
}

pub(crate) fn rule_present(src: &str, table: &str) -> bool {
    rule_listed(table, |l| l.contains(&format!("from {src} ")))
}

/// Whether `ip rule show` lists a rule into `table` whose line also satisfies `which`.
pub(crate) fn rule_listed(table: &str, which: impl Fn(&str) -> bool) -> bool {
    std::process::Command::new("/usr/bin/ip")
        .args(["rule", "show"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| which(l) && l.contains(&format!("lookup {table}")))
        })
        .unwrap_or(false)
}

pub(crate) fn setup_rails() {
    for (vlan, a, b) in RAILS {
        for (parent, addr) in [("vA", a), ("vB", b)] {
            let dev = format!("{parent}.{vlan}");
            if !ip_quiet(&["link", "show", &dev]) {
                ip(&[
                    "link",
                    "add",
                    "link",
                    parent,
                    "name",
                    &dev,
                    "type",
                    "vlan",
                    "id",
                    &vlan.to_string(),
                ]);
                ip(&["addr", "add", &format!("{addr}/24"), "dev", &dev]);
            }
            ip(&["link", "set", &dev, "up"]);
        }
    }
    for dev in [
        "all", "default", "vA", "vB", "vA.10", "vA.20", "vB.10", "vB.20", "lo",
    ] {
        sysctl(&format!("{dev}/rp_filter"), "0");
        sysctl(&format!("{dev}/accept_local"), "1");
    }
    if !rule_present_pref("1000", "local") {
        ip(&["rule", "add", "pref", "1000", "lookup", "local"]);
    }
    let _ = ip_quiet(&["rule", "del", "pref", "0"]);
    for (vlan, a, b) in RAILS {
        rail_routes(vlan, a, b);
    }
}

pub(crate) fn rule_present_pref(pref: &str, table: &str) -> bool {
    rule_listed(table, |l| l.starts_with(&format!("{pref}:")))
}

pub(crate) fn tc(args: &[&str]) {
    let out = std::process::Command::new("/usr/sbin/tc")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tc {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "tc {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn tx_packets(dev: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/tx_packets"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Packets `dev` sends in `window` (is traffic on this rail?).
pub(crate) fn rail_rate(dev: &str, window: Duration) -> u64 {
    let before = tx_packets(dev);
    std::thread::sleep(window);
    tx_packets(dev).saturating_sub(before)
}

/// Wait until both devices list every rail address as a GID.
pub(crate) fn wait_for_rail_gids(v: &Verbs) {
    let until = Instant::now() + Duration::from_secs(10);
    for (dev, side) in [("rxe0", 1usize), ("rxe1", 2)] {
        let ctx = v.open(dev).expect("open");
        for (_, a, b) in RAILS {
            let addr: std::net::IpAddr = if side == 1 { a } else { b }.parse().expect("ip");
            wait_gid(&ctx, dev, addr, until, "10 s");
        }
    }
}

/// Wait until device `dev` (open as `ctx`) lists `addr` as a RoCE v2 GID of port 1;
/// panics at `until` (`limit` says how long that was).
pub(crate) fn wait_gid(
    ctx: &provider_verbs::ffi::Context,
    dev: &str,
    addr: std::net::IpAddr,
    until: Instant,
    limit: &str,
) {
    while ctx
        .find_gid(1, addr, GidType::RoceV2)
        .ok()
        .flatten()
        .is_none()
    {
        assert!(
            Instant::now() < until,
            "{dev}: no GID for {addr} after {limit}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The rail watcher reports a rail's link going down and coming back, each as the
/// kernel announces it (within tens of milliseconds even in an emulated guest, not at
/// a poll), and nothing for the rail that stays up.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn rail_watcher_reports_a_rails_link_as_the_kernel_announces_it() {
    if !link_toggle_allowed() {
        return println!("SKIPPED: takes a link down (APM_HWTEST_LINK_TOGGLE=1, set by --vm)");
    }
    let v = verbs();
    if v.open("rxe0").is_err() {
        return println!("SKIPPED: no rxe0 (the VM's devices)");
    }
    setup_rails();
    wait_for_rail_gids(&v);
    let rt = runtime();
    rt.block_on(async {
        let ctx = v.open("rxe0").expect("open rxe0");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let key = apm_core::PortKey::new(0, 1);
        let watcher = tokio::spawn(provider_verbs::rails::watch(ctx, key, tx));
        // Its first look finds both rails up: nothing to say.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(rx.try_recv().is_err(), "both rails are up");
        let rail20: std::net::Ipv4Addr = RAILS[1].1.parse().expect("ip");
        let gid20 = apm_core::Gid(rail20.to_ipv6_mapped().octets());
        for (updown, want) in [("down", apm_core::Link::Down), ("up", apm_core::Link::Up)] {
            // `ip` runs beside the watcher (it takes a while under emulation, and the
            // kernel announces the change while it runs).
            let t = Instant::now();
            let cmd = tokio::task::spawn_blocking(move || ip(&["link", "set", "vA.20", updown]));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
            // Other GIDs of the interface come and go with it (its IPv6 link-local
            // address): the report wanted is the rail's own.
            loop {
                let got = tokio::time::timeout_at(deadline, rx.recv())
                    .await
                    .expect("a report of rail 20 within 3 s")
                    .expect("the watcher runs");
                match got {
                    apm_core::Input::RailLink { gid, link, .. } if gid == gid20 => {
                        assert_eq!(link, want, "rail 20's link");
                        break;
                    }
                    apm_core::Input::RailLink { gid, link, .. } => {
                        println!("  (another GID of the interface: {gid} {link:?})");
                    }
                    other => panic!("not a rail link report: {other:?}"),
                }
            }
            let after = t.elapsed();
            cmd.await.expect("ip");
            println!(
                "  vA.20 {updown}: reported after {after:?}, `ip link set` took {:?}",
                t.elapsed()
            );
        }
        watcher.abort();
    });
    // The link's return dropped the rail's routes: put them back for the next tests.
    for (vlan, a, b) in RAILS {
        rail_routes(vlan, a, b);
    }
}

/// `ip` and `tc` started ahead of a fault, reading commands from their stdin (`-batch
/// -`), so that the fault itself costs no process start. In this guest (qemu TCG, two
/// vCPUs shared by both "hosts") starting `ip` or `tc` takes 150-350 ms of CPU, which
/// would land in the very window a failover is measured in and starve both sides'
/// probes; a real cable does not cost its hosts anything when it dies.
pub(crate) struct FaultInjector {
    ip: std::process::Child,
    tc: std::process::Child,
}

impl FaultInjector {
    pub(crate) fn start() -> FaultInjector {
        let batch = |prog: &str| {
            std::process::Command::new(prog)
                .args(["-force", "-batch", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("start {prog} -batch: {e}"))
        };
        FaultInjector {
            ip: batch("/usr/bin/ip"),
            tc: batch("/usr/sbin/tc"),
        }
    }

    /// `ip LINE` now (e.g. `link set vA.10 down`).
    pub(crate) fn ip(&mut self, line: &str) {
        Self::send(&mut self.ip, "ip", line);
    }

    /// `tc LINE` now (e.g. `qdisc add dev vA.10 root netem loss 100%`).
    pub(crate) fn tc(&mut self, line: &str) {
        Self::send(&mut self.tc, "tc", line);
    }

    fn send(child: &mut std::process::Child, name: &str, line: &str) {
        use std::io::Write;
        let stdin = child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("{name} -batch: {line}: {e}"));
    }
}

impl Drop for FaultInjector {
    fn drop(&mut self) {
        // End of input ends both; wait so that nothing they were told is still pending.
        for child in [&mut self.ip, &mut self.tc] {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// True when `dev` has a netem qdisc whose settings, as `tc qdisc show` prints them,
/// contain `with` (`loss 100%`: a silent cut is on).
pub(crate) fn has_netem(dev: &str, with: &str) -> bool {
    std::process::Command::new("/usr/sbin/tc")
        .args(["qdisc", "show", "dev", dev])
        .output()
        .is_ok_and(|o| {
            let shown = String::from_utf8_lossy(&o.stdout);
            shown
                .lines()
                .any(|l| l.contains("netem") && l.contains(with))
        })
}

/// True when `dev`'s link is administratively down.
pub(crate) fn link_is_down(dev: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/flags"))
        .ok()
        .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|flags| flags & 1 == 0)
}
