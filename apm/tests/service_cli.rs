//! `apm` as the apm-agent service and its operator use it: `apm status` with no agent
//! and with one, the agent's bad starts (a metrics address in use, an unknown key, no
//! RDMA device) each one line and status 1 with nothing left bound, and `apm generate`,
//! whose pages and default file the package installs.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const APM: &str = env!("CARGO_BIN_EXE_apm");

fn apm(args: &[&str]) -> Output {
    Command::new(APM)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("apm runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A UDP port pair for an agent of this test process (`salt` apart per test).
fn port(salt: u32) -> String {
    (21_000 + ((std::process::id() * 8 + salt * 2) % 20_000)).to_string()
}

/// An agent in `dir` on `port`, killed when dropped.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(dir: &std::path::Path, port: &str, extra: &[&str]) -> Agent {
    let run = dir.join("run");
    let child = Command::new(APM)
        .args(["agent", "--port", port, "--runtime-dir"])
        .arg(&run)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("apm agent");
    let socket = run.join(format!("agent-{port}.sock"));
    #[allow(clippy::disallowed_methods)] // the test waits for a real process
    let start = Instant::now();
    while !socket.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    Agent(child)
}

#[test]
fn status_without_an_agent_says_so_in_one_line() {
    let dir = tempfile::tempdir().expect("dir");
    let run = dir.path().join("run");
    let run = run.to_str().expect("utf-8");
    let out = apm(&["status", "--runtime-dir", run, "--port", &port(0)]);
    assert_eq!(out.status.code(), Some(1));
    let said = stderr(&out);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("no apm agent on this host"), "{said}");
    let json = apm(&["status", "--json", "--runtime-dir", run, "--port", &port(0)]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("a JSON error object");
    assert_eq!(v["exit_status"], 1);
}

#[test]
fn status_asks_the_running_agent() {
    let dir = tempfile::tempdir().expect("dir");
    let p = port(1);
    let _agent = start_agent(dir.path(), &p, &["--metrics", "127.0.0.1:0"]);
    let run = dir.path().join("run");
    let out = apm(&[
        "status",
        "--json",
        "--port",
        &p,
        "--runtime-dir",
        run.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["agent"]["port"].as_u64().map(|p| p.to_string()), Some(p));
    assert!(
        v["agent"]["metrics"]
            .as_str()
            .is_some_and(|m| m.ends_with("/metrics")),
        "{v}"
    );
    assert_eq!(v["processes"], serde_json::json!([]));
}

#[test]
fn bad_starts_are_one_line_and_leave_nothing_bound() {
    let dir = tempfile::tempdir().expect("dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let p = port(2);
    let run = dir.path().join("run");
    let run = run.to_str().expect("utf-8");
    let agent = |extra: &[&str]| {
        let mut args = vec!["agent", "--port", &p, "--runtime-dir", run];
        args.extend_from_slice(extra);
        apm(&args)
    };
    let in_use = agent(&["--metrics", &addr]);
    assert_eq!(in_use.status.code(), Some(1));
    assert!(
        stderr(&in_use).contains(&format!("the metrics address {addr} is in use")),
        "{}",
        stderr(&in_use)
    );
    assert_eq!(stderr(&in_use).lines().count(), 1, "{}", stderr(&in_use));

    let config = dir.path().join("apm.toml");
    std::fs::write(&config, "[agent]\nmetrics = \"127.0.0.1:0\"\nmetric = 1\n").expect("write");
    let unknown = agent(&["--config", config.to_str().expect("utf-8")]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("line 3"), "{}", stderr(&unknown));

    if !std::path::Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        let none = agent(&["--require-device"]);
        assert_eq!(none.status.code(), Some(1));
        assert!(
            stderr(&none).contains("no RDMA device"),
            "{}",
            stderr(&none)
        );
    }
    // Nothing of those was left bound: the agent starts on the same port and socket.
    let _agent = start_agent(dir.path(), &p, &[]);
    let status = apm(&["status", "--port", &p, "--runtime-dir", run]);
    assert!(status.status.success(), "{}", stderr(&status));
}

#[test]
fn generate_writes_the_pages_the_completions_and_the_default_file() {
    let dir = tempfile::tempdir().expect("dir");
    let d = |n: &str| dir.path().join(n).to_str().expect("utf-8").to_owned();
    assert!(apm(&["generate", "man", &d("man")]).status.success());
    assert!(apm(&["generate", "completions", &d("comp")])
        .status
        .success());
    assert!(apm(&["generate", "config", &d("apm.toml")])
        .status
        .success());
    for page in [
        "apm.8",
        "apm-agent.8",
        "apm-status.8",
        "apm-run.8",
        "apm.toml.5",
    ] {
        let text = std::fs::read_to_string(dir.path().join("man").join(page)).expect(page);
        assert!(text.lines().any(|l| l.starts_with(".TH ")), "{page}");
    }
    for file in ["apm.bash", "_apm", "apm.fish"] {
        let text = std::fs::read_to_string(dir.path().join("comp").join(file)).expect(file);
        assert!(text.contains("status"), "{file} completes apm status");
    }
    // The default file is accepted by the agent's reading of a configuration.
    let status = apm(&[
        "status",
        "--config",
        &d("apm.toml"),
        "--runtime-dir",
        &d("run"),
    ]);
    assert!(
        stderr(&status).contains("no apm agent"),
        "{}",
        stderr(&status)
    );
    // `generate` is for packaging: not in the help.
    let help = apm(&["--help"]);
    assert!(!String::from_utf8_lossy(&help.stdout).contains("generate"));
}

/// What the agent tells a service manager over `NOTIFY_SOCKET` (systemd's protocol,
/// `sd_notify(3)`), read here from a datagram socket of the test's own: `READY=1`
/// only once its socket is there and answers, `RELOADING=1` then `READY=1` on SIGHUP,
/// `STOPPING=1` on SIGTERM. No systemd runs here; this is the whole of what
/// `Type=notify` reads.
#[test]
fn the_agent_tells_the_service_manager_ready_reloading_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().expect("dir");
    let notify = dir.path().join("notify");
    let manager = UnixDatagram::bind(&notify).expect("notify socket");
    manager
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let p = port(3);
    let run = dir.path().join("run");
    let config = dir.path().join("apm.toml");
    std::fs::write(&config, "[agent]\n").expect("config");
    let mut child = Command::new(APM)
        .args(["agent", "--port", &p, "--runtime-dir"])
        .arg(&run)
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("apm agent");
    let next = || -> String {
        let mut buf = [0u8; 4096];
        let n = manager.recv(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = next();
    // Ready means served: the socket answers at once.
    let status = apm(&[
        "status",
        "--port",
        &p,
        "--runtime-dir",
        run.to_str().expect("utf-8"),
    ]);
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    };
    signal("-HUP");
    let reloading = next();
    let ready_again = next();
    signal("-TERM");
    let stopping = next();
    let _ = child.wait();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(status.status.success(), "{}", stderr(&status));
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "{reloading:?}"
    );
    assert!(
        ready_again.lines().any(|l| l == "READY=1"),
        "{ready_again:?}"
    );
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
}
