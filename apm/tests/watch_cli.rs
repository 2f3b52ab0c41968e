//! `apm watch` end to end from the command line: `--sim` (JSON lines, filters,
//! `--exec`, probe verdicts with their kind) and `--agent` against an agent on loopback.

use apm_agent::client::AgentClient;
use apm_agent::server::{Agent, AgentConfig};
use apm_agent::wire::Route;
use apm_core::probe::ProbePolicy;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

fn apm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(args)
        .env("APM_LOG", "warn")
        .output()
        .expect("apm runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a serde_json::Value {
    v.get(k).unwrap_or_else(|| panic!("no {k:?} in {v}"))
}

#[test]
fn sim_json_lines_carry_the_port_read_back() {
    // The built-in dual-rail scenario: rail A's switch dies at 0.5 s and returns at
    // 2.5 s; h3's port 2 flaps at 3.5 s.
    let (ok, out, err) = apm(&["watch", "--sim", "--json", "--device", "h5"]);
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    assert!(!lines.is_empty(), "{err}");
    for l in &lines {
        assert_eq!(field(l, "device"), "h5", "{l}");
        assert_eq!(field(l, "source"), "sim");
        assert!(field(l, "time")
            .as_str()
            .is_some_and(|t| t.starts_with('+')));
    }
    let downs: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "event") == "port_down")
        .collect();
    let first = downs.first().expect("a port_down");
    assert_eq!(field(first, "port"), 1, "rail A first: {first}");
    assert_eq!(field(first, "state"), "down");
    assert!(field(first, "lid").as_u64().is_some_and(|l| l > 0));
    assert!((field(first, "elapsed_ms").as_f64().unwrap() - 500.0).abs() < 10.0);
    let actives: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "event") == "port_active")
        .collect();
    assert!(
        actives.iter().all(|l| field(l, "state") == "active"),
        "state read back after the event: {actives:?}"
    );
    // Traps 64/65 about h3's flapping port reach h5 through its SA subscription.
    assert!(
        lines
            .iter()
            .any(|l| field(l, "event") == "gid_out_of_service" && l["gid"].is_string()),
        "{out}"
    );
}

#[test]
fn filters_by_port_and_kind() {
    let (ok, out, err) = apm(&[
        "watch",
        "--sim",
        "--json",
        "--device",
        "h3",
        "--port",
        "2",
        "--event",
        "port-down,port_active",
    ]);
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    let got: Vec<(String, u64)> = lines
        .iter()
        .map(|l| {
            (
                field(l, "event").as_str().unwrap().to_owned(),
                field(l, "port").as_u64().unwrap(),
            )
        })
        .collect();
    // h3 port 2 flaps once (down at 3.5 s ... up) and nothing else matches.
    assert!(
        got.iter().all(|(_, p)| *p == 2),
        "only port 2 passes: {got:?}"
    );
    assert!(
        got.iter()
            .all(|(e, _)| e == "port_down" || e == "port_active"),
        "{got:?}"
    );
    assert!(got.iter().any(|(e, _)| e == "port_down"), "{out}{err}");
    let (ok, out, _) = apm(&["watch", "--sim", "--json", "--count", "3"]);
    assert!(ok);
    assert_eq!(json_lines(&out).len(), 3, "--count stops the watch");
}

#[test]
fn exec_gets_the_event_in_its_environment() {
    let dir = std::env::temp_dir().join(format!("apm-watch-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("events");
    let cmd = format!(
        "echo \"$APM_EVENT|$APM_DEVICE|$APM_PORT|$APM_STATE|$APM_LID|$APM_LMC|$APM_GID|$APM_SOURCE\" >> '{}'",
        file.display()
    );
    let (ok, out, err) = apm(&[
        "watch",
        "--sim",
        "--device",
        "h5",
        "--event",
        "port_down",
        "--exec",
        &cmd,
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(
        rows.len(),
        out.lines().count(),
        "one command per printed event: {text}\n{out}"
    );
    let first = rows.first().expect("h5 port 1 goes down with rail A");
    assert_eq!(&first[..4], ["port_down", "h5", "1", "down"], "{text}");
    assert!(first[4].parse::<u16>().is_ok_and(|l| l > 0), "{text}");
    assert_eq!(first[5], "1", "lmc of the scenario");
    assert!(first[6].starts_with("fe80:"), "{text}");
    assert_eq!(first[7], "sim");
    // Human-readable lines by default.
    assert!(
        out.lines()
            .all(|l| l.contains(" h5 port ") && l.contains("port_down")),
        "{out}"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (ok, _, err) = apm(&["watch", "--sim", "--event", "port_up"]);
    assert!(!ok);
    assert!(err.contains("port_active"), "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--timeout=-1"]);
    assert!(!ok);
    assert!(err.contains("seconds"), "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--count", "0"]);
    assert!(!ok, "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--device", "h99"]);
    assert!(!ok);
    assert!(err.contains("h99"), "{err}");
    let (ok, _, err) = apm(&["watch", "--scenario", "x.toml"]);
    assert!(!ok);
    assert!(err.contains("--sim"), "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--scenario", "/nonexistent.toml"]);
    assert!(!ok);
    assert!(err.contains("nonexistent"), "{err}");
}

#[test]
fn a_silent_rail_shows_as_path_down_of_the_fabric_with_both_ends() {
    // Rail A's switch black-holes at 1 s, its ports up: no port event, no trap; the
    // probes (on in the simulator) find it within 45 ms.
    let dir = std::env::temp_dir().join(format!("apm-watch-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("events");
    let cmd = format!(
        "echo \"$APM_EVENT|$APM_PATH_KIND|$APM_LOCAL_GID|$APM_PEER_GID|$APM_PORT\" >> '{}'",
        file.display()
    );
    let args = [
        "watch",
        "--sim",
        "--scenario",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../provider-sim/scenarios/nccl-silent.toml"
        ),
        "--device",
        "h3",
        "--timeout",
        "1.5",
        "--json",
        "--event",
        "path_down",
    ];
    let (ok, out, err) = apm(&args);
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    assert!(!lines.is_empty(), "{err}");
    for l in &lines {
        assert_eq!(field(l, "event"), "path_down", "{l}");
        assert_eq!(field(l, "path_kind"), "fabric", "both ports are up: {l}");
        assert_eq!(field(l, "port"), 1, "rail A: {l}");
        assert_eq!(field(l, "state"), "active", "the port stays up: {l}");
        let local = field(l, "local_gid").as_str().expect("local GID");
        let peer = field(l, "peer_gid").as_str().expect("peer GID");
        assert!(local.starts_with("fe80:") && peer.starts_with("fe80:") && local != peer);
        let at = field(l, "elapsed_ms").as_f64().unwrap();
        assert!((1000.0..1100.0).contains(&at), "found in tens of ms: {l}");
    }
    // The same seed gives the same events.
    let (_, again, _) = apm(&args);
    assert_eq!(out, again);
    // --exec gets the path and the kind; text lines say them too.
    let mut with_exec: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    with_exec.extend(["--exec", &cmd]);
    let (ok, text, err) = apm(&with_exec);
    assert!(ok, "{err}");
    let env = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<Vec<&str>> = env.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), lines.len(), "{env}");
    for (row, l) in rows.iter().zip(&lines) {
        assert_eq!(row[..2], ["path_down", "fabric"]);
        assert_eq!(row[2], field(l, "local_gid"));
        assert_eq!(row[3], field(l, "peer_gid"));
        assert_eq!(row[4], "1");
    }
    assert!(
        text.lines()
            .all(|l| l.contains(" h3 port 1 path_down ") && l.contains(" kind=fabric")),
        "{text}"
    );
}

#[test]
fn watching_an_agent_that_does_not_run_is_a_clear_error() {
    let port = 20_000 + ((std::process::id() + 11_117) % 20_000) as u16;
    let (ok, _, err) = apm(&["watch", "--agent", "--agent-port", &port.to_string()]);
    assert!(!ok);
    assert!(err.contains("no apm agent on this host"), "{err}");
    let (ok, _, err) = apm(&["watch", "--agent", "--sim"]);
    assert!(!ok);
    assert!(err.contains("--sim"), "{err}");
}

/// `apm watch ARGS` started in the background, once it says on stderr that it is
/// attached; its stdout read to the end on a thread.
fn watch_in_background(args: &[String]) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(args)
        .env("APM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("apm runs");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut first = String::new();
    stderr.read_line(&mut first).expect("a line on stderr");
    assert!(first.contains("attached to the apm agent"), "{first}");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    (child, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_watch_prints_the_probes_verdicts_with_their_kind() {
    let port = 20_000 + ((std::process::id() + 5_309) % 20_000) as u16;
    let dir = tempfile::tempdir().expect("runtime dir");
    let socket = apm_agent::access::AgentSocket::in_dir(dir.path(), port);
    let agent = Agent::bind(AgentConfig {
        probe: ProbePolicy {
            enabled: true,
            ..ProbePolicy::default()
        },
        host: std::sync::Arc::new(apm_agent::host::LoopbackHost::default()),
        ..AgentConfig::new(port, Some(dir.path()))
    })
    .await
    .expect("agent");
    let served = tokio::spawn(agent.run());
    let args: Vec<String> = [
        "watch",
        "--agent",
        "--agent-port",
        &port.to_string(),
        "--runtime-dir",
        &dir.path().display().to_string(),
        "--json",
        "--count",
        "3",
        "--timeout",
        "20",
    ]
    .map(str::to_owned)
    .to_vec();
    let (mut child, stdout) = tokio::task::spawn_blocking(move || watch_in_background(&args))
        .await
        .expect("joined");
    // One agent plays both hosts of a loopback path: each end's probes reach the
    // other's session through the same prober.
    let gid = |ip: &str| apm_agent::local::gid_of(ip.parse().expect("ip"));
    let (ga, gb) = (gid("127.0.0.8"), gid("127.0.0.9"));
    let route = |local, remote, lq, rq| Route {
        local_qpn: lq,
        remote_qpn: rq,
        peer_gids: vec![remote],
        local_gids: vec![local],
        paths: vec![(local, remote)],
        peer_lids: Vec::new(),
    };
    let (a_tx, _a_rx) = tokio::sync::mpsc::unbounded_channel();
    let (b_tx, _b_rx) = tokio::sync::mpsc::unbounded_channel();
    let a = AgentClient::connect(&socket, a_tx).await.expect("a");
    let b = AgentClient::connect(&socket, b_tx).await.expect("b");
    a.register(route(ga, gb, 1, 2)).expect("register a");
    b.register(route(gb, ga, 2, 1)).expect("register b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // b's end goes silent: a's session ends, a fabric failure (both addresses are up).
    b.unregister(2, 1).expect("unregister b");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("joined")
        .expect("the watch ends after --count events");
    let out = stdout.join().expect("stdout");
    assert!(status.success(), "{status}: {out}");
    let lines = json_lines(&out);
    let events: Vec<&str> = lines
        .iter()
        .map(|l| field(l, "event").as_str().unwrap())
        .collect();
    assert_eq!(events, ["path_up", "path_up", "path_down"], "{out}");
    let down = &lines[2];
    assert_eq!(field(down, "path_kind"), "fabric");
    assert_eq!(field(down, "local_gid"), "::ffff:127.0.0.8");
    assert_eq!(field(down, "peer_gid"), "::ffff:127.0.0.9");
    assert_eq!(field(down, "source"), "agent");
    assert_eq!(
        field(down, "device"),
        "agent",
        "no device holds a loopback address"
    );
    drop((a, b));
    served.abort();
}
