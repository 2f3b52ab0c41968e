//! `apm` as a hostile user runs it: closed pipes and a full disk, endless input, values
//! that would overflow, files with problems on many lines, hooks that hang or leave
//! processes behind, signals. Nothing may panic (status 101); a closed standard output
//! ends the process as SIGPIPE ends any filter; every reader stops at its stated limit;
//! every problem of a file is named with its line and key; no hook outlives apm.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};

const APM: &str = env!("CARGO_BIN_EXE_apm");

fn root() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/..")
}

/// The write end of a pipe whose only reader has already exited: `true` got the read
/// end as its standard input and is waited for, so nothing can read any more.
fn closed_pipe() -> Stdio {
    let mut reader = Command::new("true")
        .stdin(Stdio::piped())
        .spawn()
        .expect("true runs");
    let write_end = reader.stdin.take().expect("pipe");
    reader.wait().expect("true ends");
    Stdio::from(write_end)
}

/// Run apm with its standard output a pipe nobody reads any more.
fn with_closed_stdout(args: &[&str]) -> (ExitStatus, String) {
    let out = Command::new(APM)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(closed_pipe())
        .output()
        .expect("apm runs");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run_with_stdin(args: &[&str], stdin: Stdio) -> (ExitStatus, String) {
    let out = Command::new(APM)
        .args(args)
        .current_dir(root())
        .stdin(stdin)
        .output()
        .expect("apm runs");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn dev_zero() -> Stdio {
    Stdio::from(std::fs::File::open("/dev/zero").expect("/dev/zero"))
}

#[test]
fn a_closed_stdout_ends_every_subcommand_quietly_by_sigpipe() {
    let cases: &[&[&str]] = &[
        &["simulate", "--connections", "10"],
        &["simulate", "--connections", "10", "--json"],
        &["config", "check", "examples/config/roce.toml"],
        &[
            "config",
            "check",
            "--json",
            "examples/config/infiniband.toml",
        ],
        &["mad", "encode", "lap"],
        &["mad", "encode", "sminfo-resp"],
        &["watch", "--sim"],
        &["watch", "--sim", "--json"],
    ];
    for args in cases {
        let (status, err) = with_closed_stdout(args);
        assert_eq!(
            status.signal(),
            Some(13),
            "{args:?}: want death by SIGPIPE, got {status}; stderr: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?} is not quiet: {err}");
    }
    // decode prints a MAD's fields.
    let hex = Command::new(APM)
        .args(["mad", "encode", "report"])
        .output()
        .expect("encode");
    let hex = String::from_utf8_lossy(&hex.stdout).replace('\n', " ");
    let (status, err) = with_closed_stdout(&["mad", "decode", &hex]);
    assert_eq!(status.signal(), Some(13), "{status} {err}");
}

#[test]
fn a_closed_stderr_does_not_panic_an_error_path() {
    let status = Command::new(APM)
        .args(["mad", "decode", "zz"])
        .stdout(Stdio::null())
        .stderr(closed_pipe())
        .status()
        .expect("apm runs");
    assert_eq!(status.code(), Some(1), "{status}");
}

/// A standard error nobody reads (a supervisor that stopped draining it, `2>&1 | less`
/// left paused) fills its pipe; apm then drops log lines and says so, and its work goes
/// on. Before the log writer had a thread of its own the first write past the pipe's
/// 64 KiB blocked whichever thread logged, the Manager's among them, for good.
#[test]
fn a_standard_error_nobody_reads_holds_up_nothing() {
    let quiet = Command::new(APM)
        .args(["watch", "--sim", "--json"])
        .output()
        .expect("apm runs");
    assert!(quiet.status.success(), "{}", quiet.status);
    // The reader holds the read end open and never reads it.
    let mut child = Command::new(APM)
        .args(["watch", "--sim", "--json", "--log", "debug,apm_core=trace"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("apm runs");
    let unread = child.stderr.take().expect("piped");
    let mut stdout = child.stdout.take().expect("piped");
    let events = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
    });
    let status = wait_bounded(&mut child);
    drop(unread);
    assert!(status.success(), "{status}");
    let text = events.join().expect("reader").expect("stdout");
    assert_eq!(
        text,
        String::from_utf8_lossy(&quiet.stdout),
        "the events of a run whose log went nowhere differ from a quiet run's"
    );
}

#[test]
fn endless_input_stops_at_the_named_limit() {
    let cases: &[(&[&str], &str)] = &[
        (&["mad", "decode", "-"], "64 KiB limit for a MAD in hex"),
        (
            &["mad", "encode", "--json", "-"],
            "1 MiB limit for a JSON MAD",
        ),
        (
            &["config", "check", "/dev/zero"],
            "16 MiB limit for a configuration file",
        ),
        (
            &["simulate", "--scenario", "/dev/zero"],
            "16 MiB limit for a scenario file",
        ),
        (
            &["watch", "--sim", "--scenario", "/dev/zero"],
            "16 MiB limit for a scenario file",
        ),
    ];
    for (args, want) in cases {
        let (status, err) = run_with_stdin(args, dev_zero());
        assert_eq!(status.code(), Some(1), "{args:?}: {status} {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn durations_that_would_overflow_are_refused_by_name() {
    for v in ["nan", "inf", "-inf", "1e300", "-1"] {
        let arg = format!("--duration={v}");
        let (status, err) = run_with_stdin(&["pingpong", "-d", "rxe0", &arg], Stdio::null());
        assert_eq!(status.code(), Some(2), "{v}: {status} {err}");
        assert!(err.contains("--duration"), "{v}: {err}");
        assert!(!err.contains("panicked"), "{v}: {err}");
    }
    let (status, err) = run_with_stdin(
        &["pingpong", "-d", "rxe0", "--interval-ms", "0"],
        Stdio::null(),
    );
    assert_eq!(status.code(), Some(2), "{status} {err}");
    let (status, err) = run_with_stdin(&["watch", "--sim", "--timeout", "inf"], Stdio::null());
    assert_eq!(status.code(), Some(2), "{status} {err}");
    // Values a QP or a timer cannot hold are refused by name before any device is opened.
    for (flag, v) in [
        ("--stall-ms", "18446744073709551615"),
        ("--stall-ms", "0"),
        ("--ack-timeout", "32"),
        ("--window", "0"),
    ] {
        let (status, err) = run_with_stdin(&["pingpong", "-d", "rxe0", flag, v], Stdio::null());
        assert_eq!(status.code(), Some(2), "{flag} {v}: {status} {err}");
        assert!(err.contains(flag), "{flag} {v}: {err}");
    }
}

#[test]
fn absurd_counts_are_refused_before_any_work_with_the_limit_named() {
    for (args, want) in [
        (
            &["simulate", "--sweep", "4294967296"][..],
            "at most 100000 seeds",
        ),
        (
            &["simulate", "--connections", "1000000000"][..],
            "at most 1000000",
        ),
        (&["simulate", "--hosts", "100000"][..], "at most 4096 hosts"),
    ] {
        let (status, err) = run_with_stdin(args, Stdio::null());
        assert_eq!(status.code(), Some(1), "{args:?}: {status} {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A process is gone (or a zombie nobody reaped yet: not running either way).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn wait_for_file(path: &std::path::Path) -> String {
    for _ in 0..200 {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_owned();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{} never appeared", path.display());
}

fn wait_bounded(child: &mut std::process::Child) -> ExitStatus {
    for _ in 0..200 {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("apm did not end within 10 s");
}

#[test]
fn every_ending_signal_ends_watch_and_its_exec_children() {
    for (sig, number) in [
        ("TERM", 15),
        ("INT", 2),
        ("HUP", 1),
        ("QUIT", 3),
        ("USR1", 10),
    ] {
        let dir = std::env::temp_dir().join(format!("apm-hostile-{}-{sig}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let pidfile = dir.join("hook.pid");
        let _ = std::fs::remove_file(&pidfile);
        // The hook starts a grandchild (`sleep`) and waits for it: both must go, and so
        // must a grandchild that left the hook's process group for a session of its own.
        let hook = format!(
            "setsid sleep 100 & echo $! > {p}.setsid; sleep 100 & echo $! > {p}; wait",
            p = pidfile.display()
        );
        let mut child = Command::new(APM)
            .args(["watch", "--sim", "--exec", &hook, "--exec-timeout", "60"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("apm starts");
        let sleeper = wait_for_file(&pidfile);
        let escaped = wait_for_file(&pidfile.with_extension("pid.setsid"));
        assert!(!gone(&sleeper), "the hook's child runs");
        let killed = Command::new("kill")
            .args([format!("-{sig}"), child.id().to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        let status = wait_bounded(&mut child);
        assert_eq!(status.signal(), Some(number), "SIG{sig}: {status}");
        for _ in 0..40 {
            if gone(&sleeper) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            gone(&sleeper),
            "SIG{sig}: the hook's child {sleeper} outlived apm"
        );
        for _ in 0..40 {
            if gone(&escaped) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            gone(&escaped),
            "SIG{sig}: the hook's child {escaped} in its own session outlived apm"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_hung_exec_is_reported_and_killed() {
    let out = Command::new(APM)
        .args([
            "watch",
            "--sim",
            "--count",
            "2",
            "--exec",
            "sleep 100",
            "--exec-timeout",
            "0.3",
        ])
        .output()
        .expect("apm runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert_eq!(
        err.matches("still running after 0.3 s (--exec-timeout): killed")
            .count(),
        2,
        "{err}"
    );
}

/// A file in a fresh temporary directory.
fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("apm-hostile-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn every_scenario_problem_is_named_with_its_file_line_and_key() {
    let text = "# 1\nname = \"lines\"\nduration_ms = 4000\n[topology]\nhosts = 4\n\
                [fabric]  # 6\nack_timeout = 40  # 7\n\
                [[topology.switches]]  # 8\nname = \"S\"\nsubnet = 0\n\
                [[topology.switches]]  # 11\nname = \"S\"  # 12\nsubnet = 0\n\
                [[faults]]  # 14\nkind = \"switch_down\"\nswitch = \"A\"\nat_ms = \"soon\"  # 17\n";
    let path = temp_file("lines.toml", text);
    let p = path.display().to_string();
    for args in [
        vec!["simulate", "--scenario", &p],
        vec!["watch", "--sim", "--scenario", &p],
    ] {
        let (status, err) = run_with_stdin(&args, Stdio::null());
        assert_eq!(status.code(), Some(1), "{args:?}: {err}");
        for want in [
            format!("{p}:line 7, column 15: fabric.ack_timeout: 40: use 1..=31"),
            format!(
                "{p}:line 12, column 8: topology.switches[2].name: switch \"S\" is declared twice"
            ),
            format!("{p}:line 17, column 9: faults[1].at_ms: invalid type"),
        ] {
            assert!(err.contains(&want), "{args:?}: want {want:?} in {err}");
        }
    }
}

#[test]
fn config_check_reports_the_problems_of_its_sim_scenario() {
    let scenario = temp_file("inner.toml", "[fabric]\nretry_cnt = 99\n");
    let config = temp_file(
        "outer.toml",
        &format!(
            "[[device]]\nname = \"h0\"\nprovider = \"sim\"\n[sim]\nscenario = \"{}\"\n",
            scenario.display()
        ),
    );
    let (status, err) = run_with_stdin(
        &["config", "check", &config.display().to_string()],
        Stdio::null(),
    );
    assert_eq!(status.code(), Some(1), "{err}");
    let want = format!(
        "{}:line 5, column 12: sim.scenario: {}:line 2, column 13: fabric.retry_cnt: 99: use 0..=7",
        config.display(),
        scenario.display()
    );
    assert!(err.contains(&want), "want {want:?} in {err}");
}

#[test]
fn what_a_hook_leaves_running_in_its_group_ends_when_it_exits() {
    let dir = std::env::temp_dir().join(format!("apm-hostile-bg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pids = dir.join("pids");
    let hook = format!("sleep 100 & echo $! >> {}", pids.display());
    let out = Command::new(APM)
        .args(["watch", "--sim", "--count", "3", "--exec", &hook])
        .stdout(Stdio::null())
        .output()
        .expect("apm runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert_eq!(
        err.matches("left processes running").count(),
        1,
        "said once: {err}"
    );
    let started = std::fs::read_to_string(&pids).expect("pids");
    assert_eq!(started.lines().count(), 3, "{started}");
    for pid in started.lines() {
        assert!(gone(pid.trim()), "{pid} outlived its hook");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn agent_rail_down_into_a_closed_pipe_ends_by_sigpipe() {
    // An agent of its own on a port and in a directory of this test's.
    let port = (40_000 + (std::process::id() % 10_000) * 2).to_string();
    let dir = std::env::temp_dir().join(format!("apm-hostile-agent-{}", std::process::id()));
    let mut agent = Command::new(APM)
        .args(["agent", "--port", &port, "--idle-exit-secs", "5"])
        .env("APM_RUNTIME_DIR", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent starts");
    let mut status = None;
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (st, err) = with_closed_stdout(&[
            "agent",
            "--port",
            &port,
            "--runtime-dir",
            &dir.display().to_string(),
            "--rail-down",
            "10.0.0.1",
        ]);
        // Status 1 until the agent listens (nothing to connect to).
        if st.code() != Some(1) {
            status = Some((st, err));
            break;
        }
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let (st, err) = status.expect("the agent answered");
    assert_eq!(st.signal(), Some(13), "{st}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    for args in [
        &["simulate", "--connections", "10"][..],
        &["mad", "encode", "lap"][..],
        &["watch", "--sim"][..],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let out = Command::new(APM)
            .args(args)
            .stdout(Stdio::from(full))
            .output()
            .expect("apm runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}: {err}",
            out.status
        );
        assert!(err.contains("No space left on device"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
