//! `apm run` as a shell user meets it, with no RDMA device: the program's status kept
//! (its own, 126/127 as shells give them, also when the report cannot be written), the
//! interposition library checked before the program starts, every ending signal passed
//! to the program's process group and nothing of it left behind, the reports in a
//! private directory of the run's own.
//!
//! The interposition library here is the C library itself (an ELF shared object that
//! preloads harmlessly): these cases are about `apm run`, not about protection. Each
//! runs its agent on a port and in a runtime directory of its own.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

const APM: &str = env!("CARGO_BIN_EXE_apm");

/// A shared object to preload in place of apm's own.
fn stand_in_preload() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib64/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// A configuration of its own (agent port, runtime directory) in `dir`.
fn config(dir: &Path, salt: u32) -> PathBuf {
    let port = 30_000 + ((std::process::id() + salt) % 5_000) * 2;
    let path = dir.join("apm.toml");
    std::fs::write(
        &path,
        format!(
            "[lap]\nudp_listen = \"0.0.0.0:{port}\"\n\n[agent]\nruntime_dir = \"{}\"\n",
            dir.join("run").display()
        ),
    )
    .expect("config");
    path
}

/// `apm run` with `args` before `--` and `program` after, its stderr collected.
fn apm_run(dir: &Path, salt: u32, args: &[&str], program: &[&str]) -> (ExitStatus, String) {
    let Some(preload) = stand_in_preload() else {
        panic!("no C library to stand in for the preload library");
    };
    let out = Command::new(APM)
        .arg("run")
        .arg("--config")
        .arg(config(dir, salt))
        .arg("--preload")
        .arg(preload)
        .args(args)
        .arg("--")
        .args(program)
        .stdin(Stdio::null())
        .output()
        .expect("apm run");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_programs_status_is_kept_as_a_shell_gives_it() {
    let dir = tempfile::tempdir().expect("dir");
    let (st, err) = apm_run(dir.path(), 1, &[], &["sh", "-c", "exit 3"]);
    assert_eq!(st.code(), Some(3), "{err}");
    let (st, err) = apm_run(dir.path(), 1, &[], &["/no/such/program"]);
    assert_eq!(st.code(), Some(127), "not found: {err}");
    assert!(err.contains("/no/such/program"), "{err}");
    let not_exec = dir.path().join("plain.txt");
    std::fs::write(&not_exec, "not a program").expect("write");
    let (st, err) = apm_run(dir.path(), 1, &[], &[not_exec.to_str().expect("utf-8")]);
    assert_eq!(st.code(), Some(126), "not executable: {err}");
    let (st, err) = apm_run(dir.path(), 1, &[], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(st.code(), Some(128 + 15), "killed by SIGTERM: {err}");
    // A report that cannot be written changes nothing of the status.
    let (st, err) = apm_run(
        dir.path(),
        1,
        &["--report", "/no/such/dir/report.json"],
        &["sh", "-c", "exit 4"],
    );
    assert_eq!(st.code(), Some(4), "{err}");
    assert!(err.contains("cannot write the report"), "{err}");
}

#[test]
fn a_preload_ld_so_would_split_or_skip_is_refused_before_the_program_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let spaced = dir.path().join("lib apm.so");
    std::fs::copy(stand_in_preload().expect("libc"), &spaced).expect("copy");
    let text = dir.path().join("libtext.so");
    std::fs::write(&text, "not an ELF object, just text that is long enough").expect("write");
    for (preload, why) in [(&spaced, "space"), (&text, "ELF shared object")] {
        let out = Command::new(APM)
            .arg("run")
            .arg("--config")
            .arg(config(dir.path(), 2))
            .arg("--preload")
            .arg(preload)
            .args(["--", "sh", "-c", &touch])
            .output()
            .expect("apm run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(
            !marker.exists(),
            "the program ran with a preload it could not use"
        );
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{what}: not within 10 s");
}

#[test]
fn every_ending_signal_ends_the_program_and_what_it_started() {
    let dir = tempfile::tempdir().expect("dir");
    for (i, sig) in ["HUP", "TERM", "QUIT", "USR1"].into_iter().enumerate() {
        let pids = dir.path().join(format!("pids-{sig}"));
        // The program starts a child in the background and waits for it: both belong
        // to the program's process group, and both must end with the run.
        let script = format!(
            "sleep 300 & echo $! > {p}; echo $$ >> {p}; wait",
            p = pids.display()
        );
        let mut run = Command::new(APM)
            .arg("run")
            .arg("--config")
            .arg(config(dir.path(), 3 + i as u32))
            .arg("--preload")
            .arg(stand_in_preload().expect("libc"))
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("apm run");
        wait_for("the program's pids", || {
            std::fs::read_to_string(&pids).is_ok_and(|t| t.lines().count() == 2)
        });
        let started: Vec<u32> = std::fs::read_to_string(&pids)
            .expect("pids")
            .lines()
            .map(|l| l.trim().parse().expect("pid"))
            .collect();
        assert!(started.iter().all(|p| alive(*p)));
        let sent = Command::new("kill")
            .args([format!("-{sig}"), run.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let mut status = None;
        wait_for("apm run to end", || {
            status = run.try_wait().expect("wait");
            status.is_some()
        });
        let status = status.expect("ended");
        // The shell died of the signal; apm run says so as a shell would.
        assert!(
            status.code().is_some_and(|c| c > 128),
            "SIG{sig}: {status:?}"
        );
        for pid in &started {
            wait_for(&format!("SIG{sig}: process {pid} to end"), || !alive(*pid));
        }
        assert!(
            status.signal().is_none(),
            "apm run itself exits, it is not killed"
        );
    }
}

#[test]
fn the_reports_live_in_a_private_directory_of_the_runs_own() {
    let dir = tempfile::tempdir().expect("dir");
    let seen = dir.path().join("seen");
    // The program looks at the directory it was given while it runs.
    let script = format!(
        "stat -c '%a %u' \"$APM_RUN_REPORT_DIR\" > {s}; echo \"$APM_RUN_REPORT_DIR\" >> {s}",
        s = seen.display()
    );
    let (st, err) = apm_run(dir.path(), 9, &[], &["sh", "-c", &script]);
    assert!(st.success(), "{err}");
    let text = std::fs::read_to_string(&seen).expect("the program wrote");
    let mut lines = text.lines();
    let mode_owner = lines.next().expect("mode");
    let me = nix::unistd::geteuid().as_raw();
    assert_eq!(mode_owner, format!("700 {me}"), "{text}");
    let path = PathBuf::from(lines.next().expect("path"));
    let name = path
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("apm-run-"), "{name}");
    assert!(
        name.len() > "apm-run-".len() + 8,
        "a name nobody can guess: {name}"
    );
    assert!(!path.exists(), "removed when the run ended");
    // The agent's runtime directory is the user's own, private.
    let run = dir.path().join("run");
    if run.exists() {
        let mode = std::fs::metadata(&run)
            .expect("run dir")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode & 0o022, 0, "{mode:o}");
    }
}
