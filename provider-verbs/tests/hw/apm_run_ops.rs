//! What an operator sees of `apm run` through the host's agent: `apm status --json`
//! and the agent's Prometheus metrics, read while an unmodified perftest pair runs
//! under `apm run` and its rail is cut.
//!
//! The agent is started by hand with `--metrics` (the processes' `apm run`s find it by
//! its port). Once both ends are protected, `apm status --json` must list each end's
//! protected QP; a scrape is taken; rail 10 is cut (netem, and the operator's
//! rail-down through the agent); once every end has moved, a second scrape must show
//! `apm_failovers_total` and `apm_move_duration_seconds_count` grown. The programs run
//! in duration mode far longer than the point needs and are ended by the test once it
//! is made: nothing here depends on how fast the machine is.

use super::{prepare, rail10, spawn, uncut, v, wait_listening, End, PORT};
use crate::rails::tc;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the agent serves its metrics in this test.
const METRICS: &str = "127.0.0.1:9464";

/// The perftest TCP port.
const TCP_PORT: u16 = 18680;

/// One scrape of the agent's `/metrics`, or why not.
fn scrape() -> Result<String, String> {
    let mut s = std::net::TcpStream::connect(METRICS).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: apm\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// The sum of every sample of `name` (all its label sets) in a scrape.
fn sum(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `apm status --json` from the agent of this test's port.
fn status(apm: &str) -> serde_json::Value {
    let out = Command::new(apm)
        .args(["status", "--json", "--port", PORT])
        .output()
        .expect("apm status");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "apm status --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The QP numbers `apm status` shows protected, per process.
fn protected_qps(status: &serde_json::Value) -> Vec<Vec<u64>> {
    status["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            p["status"]["qps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|q| q["state"] == "protected")
                .filter_map(|q| q["qpn"].as_u64())
                .collect()
        })
        .collect()
}

/// Wait for `done` up to `limit` (a bound, not a measure), polling every 100 ms.
pub(super) fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_status_and_metrics_through_a_silent_rail_cut() {
    let Some((apm, _rails)) = prepare("/usr/bin/ib_send_bw") else {
        return;
    };
    uncut();
    let log = std::fs::File::create("/tmp/ops-agent.log").expect("agent log");
    let mut agent = Command::new(&apm)
        .args(["agent", "--port", PORT, "--metrics", METRICS])
        .args(["--config", "/tmp/apm-run.toml"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .spawn()
        .expect("apm agent");
    let agent_up = wait_for(Duration::from_secs(120), || scrape().is_ok());
    let (ga, gb) = rail10();
    // Both ways (`-b`), so both QPs reach RTS; 600 s: ended by the test.
    let (server, client) = (
        v(&format!(
            "/usr/bin/ib_send_bw -d rxe1 -x {gb} -p {TCP_PORT} -F -D 600 -b"
        )),
        v(&format!(
            "/usr/bin/ib_send_bw -d rxe0 -x {ga} -p {TCP_PORT} -F -D 600 -b 127.0.0.1"
        )),
    );
    let mut ends: Vec<End> = Vec::new();
    ends.push(spawn(
        "ops-server0",
        &server,
        Some(&apm),
        "/tmp/ops-server0.json",
    ));
    wait_listening(TCP_PORT, Duration::from_secs(60));
    ends.push(spawn(
        "ops-client0",
        &client,
        Some(&apm),
        "/tmp/ops-client0.json",
    ));
    let protected = wait_for(Duration::from_secs(180), || {
        ends.iter().all(|e| e.protected() >= 1)
    });
    // The agent hears each process's account at most every 200 ms.
    let mut listed = Vec::new();
    let shown = wait_for(Duration::from_secs(30), || {
        listed = protected_qps(&status(&apm));
        listed.iter().filter(|q| !q.is_empty()).count() >= 2
    });
    let before = scrape().unwrap_or_default();
    for dev in ["vA.10", "vB.10"] {
        tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
    }
    let verdict = Command::new(&apm)
        .args(["agent", "--port", PORT, "--rail-down", "10.0.10.1"])
        .output()
        .expect("apm agent --rail-down");
    let failovers_before = sum(&before, "apm_failovers_total");
    let mut after = String::new();
    let moved = wait_for(Duration::from_secs(120), || {
        after = scrape().unwrap_or_default();
        sum(&after, "apm_failovers_total") >= failovers_before + 2.0
    });
    uncut();
    for e in &mut ends {
        super::kill_group(&e.child);
        let _ = e.child.wait();
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let figures = |s: &str| {
        (
            sum(s, "apm_failovers_total"),
            sum(s, "apm_move_duration_seconds_count"),
            sum(s, "apm_connections_protected"),
        )
    };
    let text = format!(
        "agent metrics up {agent_up}; both ends protected {protected}; apm status lists \
         protected QPs {listed:?}; rail-down: {}; moved {moved}; before the cut (failovers, \
         moves, protected) {:?}, after {:?}\n  server: {}\n  client: {}",
        String::from_utf8_lossy(&verdict.stderr).trim(),
        figures(&before),
        figures(&after),
        ends[0].tail(),
        ends[1].tail()
    );
    println!("APM-OPS {text}");
    assert!(agent_up && protected, "{text}");
    assert!(
        shown,
        "apm status --json lists each end's protected QP: {text}"
    );
    assert!(
        moved,
        "apm_failovers_total grew by both ends' moves: {text}"
    );
    assert!(
        figures(&after).1 >= figures(&before).1 + 2.0,
        "the move histogram counted both moves: {text}"
    );
}
