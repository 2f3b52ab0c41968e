//! `apm run` on InfiniBand ports: an unmodified perftest pair on two active InfiniBand
//! ports of one subnet (the ports `apm_plan` picks), both ends under `apm run`, moved
//! by an operator's verdict while it runs.
//!
//! Nothing here touches a link or a switch: on a machine with real HCAs the test must
//! leave the fabric as it found it. The move is forced by the agent
//! (`apm agent --rail-down` with the GID of the client's port, written as IPv6): every
//! connection whose primary leaves or reaches that GID is moved at once to its armed
//! alternate, which is how an operator's word reaches `apm run` on any port. Both ends
//! must then end with status 0, each report must show its QP protected by hardware APM,
//! its port's mechanism `hardware_apm` (from the capability probe, not from the device's
//! name), at least one failover and nothing lost.
//!
//! Skips, saying why, on a machine without two such ports (the VM has none: its rxe
//! devices are RoCE; the VM runs the RoCE cases of `apm_run_hw.rs` instead), or with one
//! port per end (an alternate through a second LID of the same port shares the port
//! the verdict names).

use super::hw::EndReport;
use super::ops::wait_for;
use super::{apm_bin, spawn_opts, wait_listening};
use crate::apm_plan::{ib_plan, skip};
use crate::verbs;
use std::process::Command;
use std::time::{Duration, Instant};

/// The agent's UDP port for this test (not the default, nor the VM cases' one).
const PORT: &str = "47960";

/// The perftest TCP port.
const TCP_PORT: u16 = 18700;

/// How long perftest runs (`-D`), whatever the machine's speed: the verdict comes once
/// both ends are protected, and the move must leave the program time to go on.
const DURATION_S: u64 = 12;

/// GID 0 of `dev`'s `port`, as `apm agent --rail-down` takes it (an IPv6 address).
fn port_gid(dev: &str, port: u8) -> Option<std::net::Ipv6Addr> {
    let ctx = verbs().open(dev).ok()?;
    let e = ctx.query_gid(port, 0).ok()??;
    Some(std::net::Ipv6Addr::from(e.gid))
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest`"]
fn ib_apm_run_perftest_moved_by_an_operator_verdict() {
    let test = "ib_apm_run_perftest_moved_by_an_operator_verdict";
    let Some(apm) = apm_bin() else {
        skip(
            test,
            "APM_BIN does not name the apm binary (hwtest sets it)",
        );
        return;
    };
    let plan = match ib_plan(&verbs()) {
        Ok(p) => p,
        Err(why) => return skip(test, &why),
    };
    if !plan.two_ports {
        return skip(
            test,
            &format!(
                "{}: the alternate leaves through the same ports, which the verdict names",
                plan.how
            ),
        );
    }
    let bw = "/usr/bin/ib_write_bw";
    if !std::path::Path::new(bw).is_file() {
        return skip(test, "perftest's ib_write_bw is not installed");
    }
    let (a_port, b_port) = (plan.a.primary.port(), plan.b.primary.port());
    let Some(b_gid) = port_gid(&plan.b_dev, b_port) else {
        return skip(test, &format!("{}:{b_port} has no GID 0", plan.b_dev));
    };
    println!("IB apm run: {}", plan.how);
    std::fs::write(
        "/tmp/apm-run-ib.toml",
        format!("[lap]\nudp_listen = \"0.0.0.0:{PORT}\"\n"),
    )
    .expect("config");
    let opts = ["--config", "/tmp/apm-run-ib.toml"];
    // Both ways (`-b`): both QPs reach RTS, so both ends are protected.
    let argv = |dev: &str, port: u8, client: bool| -> Vec<String> {
        let mut a: Vec<String> =
            format!("{bw} -d {dev} -i {port} -p {TCP_PORT} -F -b -D {DURATION_S}")
                .split_whitespace()
                .map(String::from)
                .collect();
        if client {
            a.push("127.0.0.1".into());
        }
        a
    };
    let reports = ["/tmp/ib-apm-server.json", "/tmp/ib-apm-client.json"];
    let mut server = spawn_opts(
        "ib-apm-server",
        &argv(&plan.a_dev, a_port, false),
        Some(&apm),
        &opts,
        reports[0],
    );
    wait_listening(TCP_PORT, Duration::from_secs(30));
    let mut client = spawn_opts(
        "ib-apm-client",
        &argv(&plan.b_dev, b_port, true),
        Some(&apm),
        &opts,
        reports[1],
    );
    let protected = wait_for(Duration::from_secs(30), || {
        [&server, &client].iter().all(|e| e.protected() >= 1)
    });
    let verdict = Command::new(&apm)
        .args(["agent", "--port", PORT, "--rail-down", &b_gid.to_string()])
        .output()
        .expect("apm agent --rail-down");
    let limit = Instant::now() + Duration::from_secs(DURATION_S + 60);
    let status = [server.wait(limit), client.wait(limit)];
    let ends = reports.map(EndReport::read);
    println!(
        "IB apm run: protected before the verdict: {protected}; rail-down {b_gid}: {}; \
         exit {status:?}; server {:?}; client {:?}",
        String::from_utf8_lossy(&verdict.stderr).trim(),
        ends[0],
        ends[1]
    );
    let text = format!("server:\n{}\nclient:\n{}", server.tail(), client.tail());
    assert!(protected, "both ends protected before the verdict:\n{text}");
    assert!(
        verdict.status.success(),
        "the agent took the verdict:\n{text}"
    );
    assert_eq!(
        status,
        [Some(0), Some(0)],
        "both ends end with status 0:\n{text}"
    );
    for (end, r) in ["server", "client"].iter().zip(&ends) {
        assert!(
            r.protected >= 1
                && r.failovers >= 1
                && r.lost == 0
                && r.mechanisms.iter().all(|m| m == "hardware_apm")
                && !r.mechanisms.is_empty(),
            "{end}: protected by hardware APM, moved, nothing lost ({r:?}):\n{text}"
        );
    }
}
