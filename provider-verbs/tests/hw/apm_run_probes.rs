//! `apm run` with the agent's liveness probes on: nothing reports the cut to apm (no
//! `report_stall`, no operator's rail-down, no port event), so only the probes can.
//!
//! - A silent cut of the rail in use (netem 100% loss both ways, for good): both ends'
//!   QPs, adopted from an unmodified `ibv_rc_pingpong`, move to rail 20 on the probes'
//!   verdict, which the report names `fabric` (probe loss with both ports up).
//! - Both rails dead, the alternate first: once rail 20's sessions are down nothing is
//!   armed onto it, so when rail 10 dies too the connection stays where it is,
//!   unprotected, instead of moving onto a dead path; when both come back the program
//!   finishes (stock rxe retries for ever at `retry_cnt` 7) with no failover before the
//!   return (one just after it is right: rail 20's return may be heard before rail
//!   10's, and a connection whose primary is dead moves to the path that is up).
//!
//! The probes run at 100 ms x 5 here, not apm's 15 ms x 3: this is a test of what the
//! verdicts do, and a qemu guest on a loaded host misses 45 ms deadlines (the failover
//! benchmark measures the detection time itself). The "longest stall" the cases print
//! counts the agents' probes as traffic on the rails, so it is no measure here.

use super::*;

/// The agent's port for these tests: a fresh agent, started with probes by the first
/// `apm run` (an agent keeps the probe setting it was started with).
const PROBE_PORT: &str = "47953";

fn probe_config() {
    std::fs::write(
        "/tmp/apm-run.toml",
        format!(
            "[lap]\nudp_listen = \"0.0.0.0:{PROBE_PORT}\"\n\n\
             [policy.probe]\nenabled = true\ninterval_ms = 100\nmultiplier = 5\n"
        ),
    )
    .expect("config");
}

/// When each failover of one end's `--report` happened, on the system clock (ms since
/// the Unix epoch): each process states when its `at_ms` clock started.
fn failover_times(path: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut times = Vec::new();
    for p in v["processes"].as_array().into_iter().flatten() {
        let origin = p["started_unix_ms"].as_f64().unwrap_or(0.0);
        let at = p["failovers"].as_array().into_iter().flatten();
        times.extend(at.filter_map(|f| f["at_ms"].as_f64()).map(|t| origin + t));
    }
    times
}

/// One end's `--report`: (failovers with their causes, connection-ms unprotected, lost).
fn report(path: &str) -> (Vec<String>, f64, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let processes = v["processes"].as_array().cloned().unwrap_or_default();
    let causes = processes
        .iter()
        .flat_map(|p| p["failovers"].as_array().cloned().unwrap_or_default())
        .map(|f| f["cause"].as_str().unwrap_or("none").to_owned())
        .collect();
    let unprotected = processes
        .iter()
        .filter_map(|p| p["unprotected_ms"].as_f64())
        .sum();
    let lost = processes
        .iter()
        .map(|p| p["lost"].as_array().map_or(0, Vec::len))
        .sum();
    (causes, unprotected, lost)
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_probes_move_an_adopted_qp_off_a_silent_cut() {
    let Some((apm, _rails)) = prepare("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    probe_config();
    let name = "probes-silent";
    let out = case(
        name,
        &[pingpong(18661, PINGPONG_ITERS)],
        Some(&apm),
        Cut::SilentUnreported,
        CutAt::pingpong(Duration::from_millis(1500)),
    );
    assert!(
        out.all_ok(),
        "the probes' verdict moves both ends off the cut rail:\n{}",
        out.text
    );
    for end in ["server0", "client0"] {
        let path = format!("/tmp/{name}-apm-{end}.json");
        let (causes, _, lost) = report(&path);
        println!("  {name} {end}: failovers {causes:?}, {lost} lost");
        assert!(
            lost == 0 && !causes.is_empty(),
            "{end} moved and lost nothing ({path}):\n{}",
            out.text
        );
    }
    // At least one side saw the path die itself (the other may have moved on its ask).
    let fabric = ["server0", "client0"]
        .iter()
        .flat_map(|end| report(&format!("/tmp/{name}-apm-{end}.json")).0)
        .any(|c| c == "fabric");
    assert!(fabric, "the probes' verdict is `fabric`:\n{}", out.text);
}

fn netem(devs: &[&str]) {
    for dev in devs {
        tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
    }
}

fn heal(devs: &[&str]) {
    for dev in devs {
        let _ = Command::new("/usr/sbin/tc")
            .args(["qdisc", "del", "dev", dev, "root"])
            .output();
    }
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_probes_down_on_both_rails_leave_the_qp_unprotected_not_moved() {
    let Some((apm, _rails)) = prepare("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    probe_config();
    uncut();
    let name = "probes-both";
    let (server, client) = pingpong(18663, PINGPONG_ITERS);
    let mut ends = vec![spawn(
        &format!("{name}-server0"),
        &server,
        Some(&apm),
        &format!("/tmp/{name}-apm-server0.json"),
    )];
    wait_listening(tcp_port(&server), Duration::from_secs(30));
    ends.push(spawn(
        &format!("{name}-client0"),
        &client,
        Some(&apm),
        &format!("/tmp/{name}-apm-client0.json"),
    ));
    let start = Instant::now();
    while ends.iter().map(End::protected).sum::<u64>() < 2
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let protected = ends.iter().map(End::protected).sum::<u64>();
    // The alternate dies first: its sessions go down (500 ms) and nothing is armed onto
    // it; then the primary dies too, and nothing may move onto the dead alternate.
    netem(&["vA.20", "vB.20"]);
    std::thread::sleep(Duration::from_millis(1500));
    netem(&["vA.10", "vB.10"]);
    std::thread::sleep(Duration::from_millis(2000));
    let qps = qp_table();
    let healed_unix_ms = crate::child::unix_ms();
    heal(&["vA.10", "vB.10", "vA.20", "vB.20"]);
    let deadline = Instant::now() + Duration::from_secs(180);
    let status: Vec<Option<i32>> = ends.iter_mut().map(|e| e.wait(deadline)).collect();
    uncut();
    let tails: Vec<String> = ends.iter().map(End::tail).collect();
    let text = format!(
        "{name}: {protected} of 2 ends protected before the cuts; status {status:?}\n  \
         QPs with both rails cut:\n{qps}  server: {}\n  client: {}",
        tails[0], tails[1]
    );
    println!("{text}");
    assert!(
        status.iter().all(|s| *s == Some(0)),
        "both rails back: the program finishes on rail 10:\n{text}"
    );
    for end in ["server0", "client0"] {
        let path = format!("/tmp/{name}-apm-{end}.json");
        let (causes, unprotected_ms, lost) = report(&path);
        // Both on the system clock, which the process and this test share.
        let after_return: Vec<f64> = failover_times(&path)
            .iter()
            .map(|t| t - healed_unix_ms)
            .collect();
        println!(
            "  {name} {end}: failovers {causes:?} at {after_return:.0?} ms after the rails came \
             back, {unprotected_ms:.0} ms unprotected"
        );
        // A move once both rails are back is fine (rail 20's return can be heard before
        // rail 10's, and a connection whose primary is dead moves to what is up). A move
        // while both were dead would have come ~0.5 s after rail 10's cut, 1.5 s before
        // the return (read just before the heal); half a second tells the two apart.
        assert!(
            lost == 0 && after_return.iter().all(|t| *t > -500.0),
            "{end}: no move onto the dead alternate, nothing lost ({path}):\n{text}"
        );
        assert!(
            unprotected_ms >= 1000.0,
            "{end}: unprotected while its alternate was down ({path}):\n{text}"
        );
    }
}
