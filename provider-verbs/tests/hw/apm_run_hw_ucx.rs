//! ucx_perftest over UCX's `rc_verbs` under `apm run` with hardware APM. UCX's RC QPs
//! receive through an SRQ, which apm protects when the device does hardware APM (apm's
//! part is then RTS -> RTS modifies of the QP's paths; its queues are never touched) and
//! refuses under software migration (phase 1's UCX case shows the refusal).
//!
//! No rail cut reaches UCX in this VM, so the move comes from an operator's verdict
//! instead (`apm agent --rail-down` with rail 10's address): apm forces the migration of
//! both ends' QPs, the device moves them to rail 20's GIDs under traffic, and the program
//! must not notice. Why no cut reaches it: ucx_perftest's server takes the client's test
//! parameters, its device among them, so at UCT level (`-x rc_verbs`) both ends open
//! rxe0 and talk over rxe's loopback (one GID at both ends); the UCP level, where each
//! end picks its own device (`UCX_NET_DEVICES`), wires `rc_verbs` endpoints up through an
//! auxiliary UD transport, and UCX's `ud_verbs` never connects on rxe here (stock and
//! patched modules alike, also on one device: rxe counts its connection requests as
//! received, UCX never answers them and aborts with "UD endpoint ... unhandled timeout
//! error", while `ibv_ud_pingpong` runs in the same layout).

use super::*;

/// The UCT-level pair: `put_bw` of `n` 4 KiB bcopy puts, both ends on rxe0's rail-10
/// GID (the server takes the client's device).
fn ucx(n: u32, port: u16) -> Pair {
    let (ga, _) = rail10();
    (
        v(&format!(
            "/bin/env UCX_IB_GID_INDEX={ga} /usr/bin/ucx_perftest -d rxe1:1 -x rc_verbs -p {port}"
        )),
        v(&format!(
            "/bin/env UCX_IB_GID_INDEX={ga} /usr/bin/ucx_perftest -d rxe0:1 -x rc_verbs \
             -p {port} -t put_bw -D bcopy -s 4096 -n {n} 127.0.0.1"
        )),
    )
}

/// One run of `pair`, under `apm` or not; under apm, once both ends are protected, the
/// operator's verdict that rail 10 is dead, `move_after` after the client started. The
/// stall is not measured: the pair's traffic is rxe's loopback, on no rail.
fn run(tag: &str, pair: &Pair, apm: Option<&str>, move_after: Duration) -> Outcome {
    let report = |end: &str| format!("/tmp/{tag}-{end}.json");
    let s = spawn(&format!("{tag}-server0"), &pair.0, apm, &report("server0"));
    wait_listening(tcp_port(&pair.0), Duration::from_secs(10));
    let c = spawn(&format!("{tag}-client0"), &pair.1, apm, &report("client0"));
    let start = Instant::now();
    let mut ends = [s, c];
    let mut text = String::new();
    if let Some(bin) = apm {
        let protected = |ends: &[End]| ends.iter().map(End::protected).sum::<u64>();
        while protected(&ends) < 2 && start.elapsed() < Duration::from_secs(180) {
            std::thread::sleep(Duration::from_millis(20));
        }
        text.push_str(&format!(
            "{} of 2 ends protected after {:.1} s; ",
            protected(&ends),
            start.elapsed().as_secs_f64()
        ));
        std::thread::sleep(move_after.saturating_sub(start.elapsed()));
        let out = Command::new(bin)
            .args(["agent", "--port", PORT, "--rail-down", "10.0.10.1"])
            .output()
            .expect("apm agent --rail-down");
        let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        text.push_str(&format!(
            "rail-down 10.0.10.1 at {:.1} s ({}); ",
            start.elapsed().as_secs_f64(),
            if out.status.success() { "sent" } else { &said }
        ));
    }
    let deadline = start + Duration::from_secs(120);
    let status: Vec<Option<i32>> = ends.iter_mut().map(|e| e.wait(deadline)).collect();
    text.push_str(&format!("{tag}: exit {}", exit_status(&status)));
    for (role, e) in ["server", "client"].iter().zip(&ends) {
        text.push_str(&format!("\n  {role}: {}", e.tail()));
    }
    println!("{text}");
    Outcome {
        outputs: ends
            .iter()
            .map(|e| std::fs::read_to_string(&e.out).unwrap_or_default())
            .collect(),
        status,
        stall: Duration::ZERO,
        text,
    }
}

/// How many puts take about `secs` here, from the message rate of a short run without
/// apm (its `Final:` row; the run's own time is mostly UCX's start); `None` (said why)
/// when UCX does not run on rxe in this VM.
fn puts_for(secs: f64, port: u16) -> Option<u32> {
    let probe = run("hw-ucx-probe", &ucx(2000, port), None, Duration::ZERO);
    // "Final: iterations, latency 50%ile, average, overall (us), bandwidth average,
    // overall (MB/s), message rate average, overall (msg/s)"
    let rate = probe.outputs[1]
        .lines()
        .find_map(|l| l.trim().strip_prefix("Final:"))
        .and_then(|r| r.split_whitespace().nth(7)?.parse::<f64>().ok());
    match rate {
        Some(rate) if probe.all_ok() && rate > 0.0 => {
            println!("  ucx_perftest: {rate:.0} puts/s here");
            Some(((secs * rate) as u32).clamp(2_000, 5_000_000))
        }
        _ => {
            println!(
                "SKIPPED: ucx_perftest over rc_verbs does not run here:\n{}",
                probe.text
            );
            None
        }
    }
}

/// UCX's own verdict: the client finished its puts and printed its final figures.
fn ucx_finished(out: &Outcome) -> bool {
    out.all_ok() && out.outputs[1].contains("Final:")
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_run_ucx_perftest_rc_verbs_srq_qps_moved_by_the_device() {
    let Some((apm, _rails)) = prepare_hw("/usr/bin/ucx_perftest") else {
        return;
    };
    let t0 = Instant::now();
    // UCX maps its shared-memory transports under /dev/shm, which the VM's devtmpfs
    // lacks.
    let _ = std::fs::create_dir_all("/dev/shm");
    let _ = Command::new("/bin/mount")
        .args(["-t", "tmpfs", "tmpfs", "/dev/shm"])
        .output();
    // Time for both ends to be protected (~1-2 s), the move at 4 s, and traffic after.
    let Some(n) = puts_for(10.0, 18660) else {
        return;
    };
    let pair = ucx(n, 18661);
    // Without apm the verdict has nobody to tell: the run shows the pace, no fault.
    let bare = run("hw-ucx-bare", &pair, None, Duration::ZERO);
    let name = "hw-ucx";
    let out = run(
        &format!("{name}-apm"),
        &pair,
        Some(&apm),
        Duration::from_secs(2),
    );
    let ends = ["server0", "client0"].map(|e| EndReport::of(name, e));
    println!(
        "HW-APM {name}: {n} puts; without apm exit {}; under apm run exit {}, failovers by \
         hardware APM server {}/{} client {}/{}, lost {}+{}, protected {}+{}; {:.0} s",
        exit_status(&bare.status),
        exit_status(&out.status),
        ends[0].by_device,
        ends[0].failovers,
        ends[1].by_device,
        ends[1].failovers,
        ends[0].lost,
        ends[1].lost,
        ends[0].protected,
        ends[1].protected,
        t0.elapsed().as_secs_f64()
    );
    assert!(
        ucx_finished(&out),
        "under apm run UCX finishes its puts, status 0 on both ends:\n{}",
        out.text
    );
    for (end, r) in ["server", "client"].iter().zip(&ends) {
        assert!(
            r.protected >= 1 && !r.refusals.iter().any(|w| w.contains("SRQ")),
            "{name} {end}: its SRQ QP is protected under hardware APM ({r:?}):\n{}",
            out.text
        );
        assert!(
            r.by_device >= 1 && r.lost == 0,
            "{name} {end}: the device moved the QP and nothing was lost ({r:?}):\n{}",
            out.text
        );
    }
}
