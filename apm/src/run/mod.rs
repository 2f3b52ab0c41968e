//! `apm run -- PROGRAM` and `apm agent`: protect an unmodified verbs program.
//!
//! `apm run` checks the configuration and the interposition library (either bad: the
//! program is not started), makes sure this host's agent runs (starting `apm agent`
//! detached when none serves this user: it exits by itself once no protected process is
//! left for a while), starts the program as a job of its own ([`job`]) with apm's
//! interposition library in `LD_PRELOAD` and the settings in `APM_RUN_*`, passes it the
//! signals it gets, and exits with the program's status. Then it prints one summary
//! line on stderr for programs that used verbs, and writes `--report FILE` (JSON: every
//! process's QPs seen, protected and why not, failovers with their move time, time
//! unprotected). apm never makes a program fail: when the agent cannot be reached or
//! started the program still runs, unprotected, and says so once; when the report
//! cannot be written, that is said and the status is still the program's.
//!
//! The processes' reports go to a directory of the run's own, made for it alone
//! (a fresh name, mode 0700, owned by the user): nobody else can read them or put one
//! there, and only regular files of this user's are read back.
//!
//! `apm agent` is that agent in the foreground ([`agent`]).

mod agent;
mod explain;
mod job;
mod reload;

pub use agent::{agent, AgentArgs};
pub(crate) use agent::{config_port, read_config};

use crate::out::errln;
use anyhow::{bail, Context, Result};
use apm_agent::access::AgentSocket;
use apm_agent::report::{ProcessReport, RunReport};
use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What `apm run` exits with, besides the program's own status.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  the program's own status, or 128 + N when signal N ended it;
  1    apm refused to start the program (a bad configuration or --preload);
  126  the program was found but could not be executed;
  127  the program was not found.
apm never changes the program's status: an agent it cannot reach or a report it cannot
write is said on stderr, and the program runs (unprotected, for the agent).";

/// `apm run` arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = EXIT_STATUS_HELP)]
pub struct Args {
    /// Deployment configuration: `[policy]` knobs for the engine, `[lap] udp_listen`
    /// whose port is the agent's (default 47910), `[lap] key_file`/`require_auth` and
    /// `[agent]` for the agent it starts. `[[device]]` tables are not needed: apm
    /// protects QPs on the devices the program uses.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the JSON report here when the program has exited.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// apm's interposition library (default: `libapm_preload.so` beside this binary,
    /// or in `../lib/apm/` or `../lib/` from it). Must be an ELF shared object whose
    /// path has no space or colon (the dynamic loader splits `LD_PRELOAD` there).
    #[arg(long, env = "APM_PRELOAD", value_name = "FILE")]
    pub preload: Option<PathBuf>,
    /// How the program's QPs move to another path: `auto` uses hardware APM where the
    /// kernel accepts alternate paths on the device (the device migrates by itself; apm
    /// arms and re-arms it) and software migration (apm moves the QP through the SQ
    /// drain) elsewhere; `software` or `hardware` insist on one.
    #[arg(long, value_enum, default_value_t = Migration::Auto)]
    pub migration: Migration,
    /// Say, for every port of every RDMA device here, how a QP on it can be moved
    /// (hardware APM, the SQ-drain move, or nothing) and the evidence: each found by
    /// trying it on a pair of apm's own QPs, never from the device's name or
    /// capability bits. Then exit (no program is run).
    #[arg(long)]
    pub explain: bool,
    /// With `--explain`: one JSON object per port instead.
    #[arg(long, requires = "explain")]
    pub json: bool,
    /// The program and its arguments (after `--`).
    #[arg(
        required_unless_present = "explain",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub program: Vec<OsString>,
}

/// `apm run --migration`: passed to the interposition library as `APM_RUN_MIGRATION`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Migration {
    /// Hardware APM where the kernel accepts alternate paths, else software migration.
    Auto,
    /// Software migration only (the program's async events are not shared with apm).
    Software,
    /// Hardware APM only: QPs on devices that cannot are not protected.
    Hardware,
}

impl Migration {
    fn env_value(self) -> &'static str {
        match self {
            Migration::Auto => "auto",
            Migration::Software => "software",
            Migration::Hardware => "hardware",
        }
    }
}

/// What the configuration decides for a run.
struct Settings {
    port: u16,
    policy: apm_core::Policy,
    /// The agent's socket (located as this user reaches it).
    socket: AgentSocket,
    /// The configuration file, for the agent `apm run` starts.
    config: Option<PathBuf>,
}

fn settings(path: Option<&Path>) -> Result<Settings> {
    let Some(path) = path else {
        let port = apm_agent::DEFAULT_PEER_PORT;
        return Ok(Settings {
            port,
            policy: apm_core::Policy::default(),
            socket: AgentSocket::locate(port, None),
            config: None,
        });
    };
    let (config, text) = agent::read_config(path)?;
    // The key is checked here, before the program starts: the agent would only log it.
    config
        .peer_auth()
        .with_context(|| format!("{}: [lap] key_file", path.display()))?;
    let access = config
        .agent_access(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let port = agent::config_port(&config);
    Ok(Settings {
        port,
        policy: config.engine_policy(),
        socket: AgentSocket::locate(port, access.runtime_dir.as_deref())
            .trust_uid(access.agent_uid),
        config: Some(path.to_owned()),
    })
}

/// The interposition library: `--preload`, else beside this binary (as cargo builds
/// both), else where a package installs it; checked ([`check_preload`]).
fn preload_library(given: Option<PathBuf>) -> Result<PathBuf> {
    let path = match given {
        Some(p) => p,
        None => {
            let exe = std::env::current_exe().context("where is this binary")?;
            let dir = exe.parent().unwrap_or(Path::new("."));
            let found = [
                dir.join("libapm_preload.so"),
                dir.join("../lib/apm/libapm_preload.so"),
                dir.join("../lib/libapm_preload.so"),
            ]
            .into_iter()
            .find(|p| p.is_file());
            match found {
                Some(p) => p,
                None => bail!(
                    "cannot find libapm_preload.so beside {} (build it with `cargo build -p \
                     apm-preload`, or name it with --preload or APM_PRELOAD)",
                    exe.display()
                ),
            }
        }
    };
    check_preload(&path)?;
    Ok(path)
}

/// `path` can go into `LD_PRELOAD` and be loaded: no character the dynamic loader
/// splits the list on, a regular file, an ELF shared object of this machine's class.
/// (The loader would skip anything else with a warning, and the program would run
/// unprotected with status 0.)
fn check_preload(path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let shown = path.display();
    if let Some(c) = path
        .as_os_str()
        .as_bytes()
        .iter()
        .find(|b| matches!(b, b' ' | b':' | b'\t' | b'\n'))
    {
        bail!(
            "the interposition library's path {shown:?} has a {} in it, where the dynamic \
             loader splits LD_PRELOAD: move it to a path without one",
            match c {
                b' ' => "space",
                b':' => "colon",
                _ => "tab or newline",
            }
        );
    }
    let meta =
        std::fs::metadata(path).with_context(|| format!("the interposition library {shown}"))?;
    if !meta.is_file() {
        bail!("the interposition library {shown} is not a regular file");
    }
    let mut head = [0u8; 20];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .with_context(|| format!("reading the interposition library {shown}"))?;
    const ELF: &[u8] = b"\x7fELF";
    const CLASS: u8 = if cfg!(target_pointer_width = "64") {
        2
    } else {
        1
    };
    const ET_DYN: u16 = 3;
    let e_type = u16::from_le_bytes([head[16], head[17]]);
    if !head.starts_with(ELF) || head[4] != CLASS || head[5] != 1 || e_type != ET_DYN {
        bail!(
            "the interposition library {shown} is not a {}-bit little-endian ELF shared object",
            if CLASS == 2 { 64 } else { 32 }
        );
    }
    Ok(())
}

/// Make sure an agent serves this user at `socket` (starting one with `config` when
/// none runs there); `Err` says why the program will run unprotected.
fn ensure_agent(socket: &AgentSocket, config: Option<&Path>) -> Result<()> {
    use apm_agent::AgentError;
    match agent::reach(socket) {
        Ok(()) => return Ok(()),
        Err(AgentError::NotRunning(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let exe = std::env::current_exe().context("where is this binary")?;
    // Its log goes nowhere unless APM_AGENT_LOG_FILE names a file (with APM_LOG's filter).
    let log = std::env::var_os("APM_AGENT_LOG_FILE")
        .and_then(|f| std::fs::File::create(f).ok())
        .map_or_else(std::process::Stdio::null, std::process::Stdio::from);
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("agent");
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args([
        "--port",
        &socket.port().to_string(),
        "--idle-exit-secs",
        "10",
    ])
    .arg("--runtime-dir")
    .arg(socket.dir())
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(log);
    use std::os::unix::process::CommandExt as _;
    // Its own process group: a Ctrl-C meant for the program does not stop it, and the
    // end of the program's group does not end it.
    cmd.process_group(0);
    let mut child = cmd.spawn().context("starting `apm agent`")?;
    for _ in 0..60 {
        match agent::reach(socket) {
            Ok(()) => return Ok(()),
            Err(AgentError::NotRunning(_)) => {}
            Err(e) => return Err(e.into()),
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("`apm agent` exited at start ({status}); APM_AGENT_LOG_FILE=FILE keeps its log");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("`apm agent` did not come up within 3 s")
}

/// `apm run --explain`: what each port of each device can do, tried.
fn explain(json: bool) -> Result<()> {
    use crate::out::outln;
    let verbs = provider_verbs::Verbs::load()?;
    let devices = verbs.devices()?;
    if devices.is_empty() {
        bail!("no RDMA device here: nothing to protect");
    }
    for d in devices {
        let ctx = match verbs.open(&d.name) {
            Ok(c) => c,
            Err(e) => {
                crate::out::errln!("apm run --explain: {}: cannot open it: {e}", d.name);
                continue;
            }
        };
        let ports = ctx.query_device().map_or(1, |a| a.phys_port_cnt.max(1));
        for port in 1..=ports {
            let probe = provider_verbs::capability::probe_port(&ctx, port);
            if json {
                let mut v = serde_json::to_value(&probe)?;
                v["mechanism"] = serde_json::to_value(probe.mechanism())?;
                outln!("{v}")?;
            } else {
                outln!("{}", probe.line())?;
            }
        }
    }
    Ok(())
}

/// `apm run`.
pub fn run(args: Args) -> Result<()> {
    if args.explain {
        return explain(args.json);
    }
    let settings = settings(args.config.as_deref())?;
    let library = preload_library(args.preload)?;
    let Some((program, rest)) = args.program.split_first() else {
        bail!(
            "apm run needs a program: apm run [--config FILE] [--report FILE] -- PROGRAM [ARGS...]"
        );
    };
    if let Err(e) = ensure_agent(&settings.socket, settings.config.as_deref()) {
        errln!("apm run: {e:#}: the program runs unprotected");
    }
    // Named after this process for whoever looks for it (its reports are live), with
    // a random part so that nobody can make it first.
    let dir = tempfile::Builder::new()
        .prefix(&format!("apm-run-{}-", std::process::id()))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .context("making the run's private report directory")?;
    let mut preload = OsString::from(&library);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest)
        .env("LD_PRELOAD", preload)
        .env("APM_RUN_PORT", settings.port.to_string())
        .env("APM_RUN_POLICY", serde_json::to_string(&settings.policy)?)
        .env("APM_RUN_REPORT_DIR", dir.path())
        .env("APM_RUN_AGENT_SOCKET", settings.socket.path())
        .env("APM_RUN_MIGRATION", args.migration.env_value());
    if let Some(uid) = settings.socket.trusted_uid() {
        cmd.env("APM_RUN_AGENT_UID", uid.to_string());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let name = Path::new(program).display().to_string();
    let status = rt.block_on(async {
        let signals = crate::signals::listen(&crate::signals::ENDING)
            .context("installing signal handlers")?;
        let job = job::spawn(cmd, &name)?;
        let status = job.wait(signals).await;
        job.finish().await;
        anyhow::Ok(status)
    });
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let code = e
                .downcast_ref::<job::SpawnError>()
                .map_or(126, job::SpawnError::status);
            errln!("apm run: {e:#}");
            crate::log_writer::flush();
            std::process::exit(code);
        }
    };
    let report = RunReport {
        exit_status: status,
        processes: read_reports(dir.path()),
    };
    drop(dir);
    if !report.processes.is_empty() {
        errln!("{}", report.summary());
    }
    if let Some(path) = &args.report {
        // The program's status is kept whatever happens to the report.
        let written = serde_json::to_vec_pretty(&report)
            .map_err(std::io::Error::from)
            .and_then(|json| std::fs::write(path, json));
        if let Err(e) = written {
            errln!("apm run: cannot write the report {}: {e}", path.display());
        }
    }
    crate::log_writer::flush();
    std::process::exit(status);
}

/// The largest process report read back (a process with every QP of a large job).
const REPORT_LIMIT: u64 = 64 << 20;

/// Every process report the run's processes left: regular files of this user's
/// only, each read to at most [`REPORT_LIMIT`].
fn read_reports(dir: &Path) -> Vec<ProcessReport> {
    use std::os::unix::fs::MetadataExt as _;
    let me = nix::unistd::geteuid().as_raw();
    let mut out: Vec<ProcessReport> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().extension() == Some(OsStr::new("json")))
                .filter(|e| {
                    std::fs::symlink_metadata(e.path())
                        .is_ok_and(|m| m.file_type().is_file() && m.uid() == me)
                })
                .filter_map(|e| {
                    let f = std::fs::File::open(e.path()).ok()?;
                    let mut bytes = Vec::new();
                    f.take(REPORT_LIMIT).read_to_end(&mut bytes).ok()?;
                    serde_json::from_slice(&bytes).ok()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|p| p.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preload_path_and_kind_are_checked() {
        let dir = tempfile::tempdir().expect("dir");
        let spaced = dir.path().join("a b.so");
        std::fs::write(&spaced, b"x").expect("write");
        let e = check_preload(&spaced).expect_err("space");
        assert!(e.to_string().contains("space"), "{e}");
        let colon = dir.path().join("a:b.so");
        let e = check_preload(&colon).expect_err("colon");
        assert!(e.to_string().contains("colon"), "{e}");
        let text = dir.path().join("text.so");
        std::fs::write(&text, b"#!/bin/sh\necho not an ELF object at all\n").expect("write");
        let e = check_preload(&text).expect_err("not ELF");
        assert!(e.to_string().contains("ELF shared object"), "{e}");
        let e = check_preload(dir.path()).expect_err("a directory");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = check_preload(&dir.path().join("missing.so")).expect_err("missing");
        assert!(e.to_string().contains("missing.so"), "{e:#}");
        // An executable is ELF but no shared object... unless it is a PIE, which the
        // loader would refuse to preload just the same; a real shared object passes.
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists());
        if let Some(libc) = libc {
            check_preload(libc).expect("a shared object");
        }
    }

    #[test]
    fn reports_of_others_or_not_files_are_not_read() {
        let dir = tempfile::tempdir().expect("dir");
        let good = ProcessReport {
            pid: 7,
            qps_seen: 1,
            ..ProcessReport::default()
        };
        std::fs::write(
            dir.path().join("7.json"),
            serde_json::to_vec(&good).expect("json"),
        )
        .expect("write");
        // A link to a report elsewhere is not followed.
        let elsewhere = tempfile::tempdir().expect("dir");
        let forged = ProcessReport {
            pid: 8,
            qps_seen: 99,
            protected: 99,
            ..ProcessReport::default()
        };
        let target = elsewhere.path().join("8.json");
        std::fs::write(&target, serde_json::to_vec(&forged).expect("json")).expect("write");
        std::os::unix::fs::symlink(&target, dir.path().join("8.json")).expect("link");
        assert_eq!(read_reports(dir.path()), vec![good]);
    }
}
