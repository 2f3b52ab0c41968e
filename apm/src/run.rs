//! `apm run -- PROGRAM` and `apm agent`: protect an unmodified verbs program.
//!
//! `apm run` checks the configuration (a bad one is refused before the program
//! starts), makes sure this host's agent runs (starting `apm agent` detached when it
//! does not: it exits by itself once no protected process is left for a while), starts
//! the program with apm's interposition library in `LD_PRELOAD` and the settings in
//! `APM_RUN_*`, forwards the signals it gets to the program, and exits with the
//! program's status (128 + the signal when the program was killed). Then it prints one
//! summary line on stderr for programs that used verbs, and writes `--report FILE`
//! (JSON: every process's QPs seen, protected and why not, failovers with their move
//! time, time unprotected). apm never makes a program fail: when the agent cannot be
//! started the program still runs, unprotected, and says so once.
//!
//! With `[lap] key_file` the agent it starts authenticates the peer datagrams (cm-lap's
//! `auth`); the key is checked before the program starts.
//!
//! `apm agent` is that agent in the foreground (`--idle-exit-secs` to let it exit), and
//! `apm agent --rail-down ADDR` tells the running agent that an address is unreachable
//! (every process moves the connections whose primary uses it): the hook through which
//! a path-down verdict from outside the programs (a probe, an operator) reaches them.

use crate::out::{errln, outln};
use anyhow::{bail, Context, Result};
use apm::Config;
use apm_agent::report::{ProcessReport, RunReport};
use apm_agent::server::{Agent, AgentConfig, StartError};
use apm_core::probe::ProbePolicy;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `apm run` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Deployment configuration: `[policy]` knobs for the engine, `[lap] udp_listen`
    /// whose port is the agent's (default 47910), and `[lap] key_file`/`require_auth`
    /// for the agent it starts. `[[device]]` tables are not needed: apm protects QPs
    /// on the devices the program uses.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the JSON report here when the program has exited.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// apm's interposition library (default: `libapm_preload.so` beside this binary).
    #[arg(long, env = "APM_PRELOAD", value_name = "FILE")]
    pub preload: Option<PathBuf>,
    /// How the program's QPs move to another path: `auto` uses hardware APM where the
    /// kernel accepts alternate paths on the device (the device migrates by itself; apm
    /// arms and re-arms it) and software migration (apm moves the QP through the SQ
    /// drain) elsewhere; `software` or `hardware` insist on one.
    #[arg(long, value_enum, default_value_t = Migration::Auto)]
    pub migration: Migration,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
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

/// `apm agent` arguments.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The UDP port of apm's peer messages (the hello port is the next one).
    #[arg(long, default_value_t = apm_agent::DEFAULT_PEER_PORT)]
    pub port: u16,
    /// Exit after this many seconds without a protected process (default: never).
    #[arg(long, value_name = "SECS")]
    pub idle_exit_secs: Option<u64>,
    /// Tell the running agent that this address (a local or peer rail's IP) is
    /// unreachable, and exit.
    #[arg(long, value_name = "ADDR")]
    pub rail_down: Option<std::net::IpAddr>,
    /// Interval between liveness probes on each path (`[policy.probe] interval_ms`).
    #[arg(long, value_name = "MS", default_value_t = ProbePolicy::default().interval_ms)]
    pub probe_interval_ms: u32,
    /// Probes missed in a row before a path is declared down.
    #[arg(long, value_name = "N", default_value_t = ProbePolicy::default().multiplier)]
    pub probe_multiplier: u8,
    /// Probe the processes' paths (off by default: see `[policy.probe] enabled`).
    #[arg(long)]
    pub probes: bool,
    /// Authenticate peer datagrams with the shared secret in this file (`[lap]
    /// key_file`; readable by its owner only): every datagram sent carries a MAC and a
    /// sequence number, and unauthenticated, forged or replayed ones are dropped.
    #[arg(long, value_name = "FILE")]
    pub peer_key: Option<PathBuf>,
    /// With `--peer-key`: accept unauthenticated datagrams too (`[lap] require_auth =
    /// false`, while a deployment moves to keys host by host).
    #[arg(long, requires = "peer_key")]
    pub accept_unauthenticated: bool,
}

impl AgentArgs {
    /// The probe policy these arguments say, checked.
    fn probe_policy(&self) -> Result<ProbePolicy> {
        let p = ProbePolicy {
            enabled: self.probes,
            interval_ms: self.probe_interval_ms,
            multiplier: self.probe_multiplier,
            down_interval_ms: ProbePolicy::default()
                .down_interval_ms
                .max(self.probe_interval_ms),
            ..ProbePolicy::default()
        };
        p.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(p)
    }

    /// The peer channels' authentication these arguments say, the key read and its
    /// file checked.
    fn peer_auth(&self) -> Result<cm_lap::auth::Mode> {
        use cm_lap::auth::{Key, Mode};
        let Some(file) = &self.peer_key else {
            return Ok(Mode::Off);
        };
        let key = Key::from_file(file).with_context(|| format!("--peer-key {}", file.display()))?;
        Ok(if self.accept_unauthenticated {
            Mode::AcceptUnauthenticated(key)
        } else {
            Mode::Require(key)
        })
    }
}

/// What the configuration decides for a run.
struct Settings {
    port: u16,
    policy: apm_core::Policy,
    /// The agent's peer authentication, as arguments of `apm agent`.
    peer_key: Vec<OsString>,
}

fn settings(path: Option<&Path>) -> Result<Settings> {
    let Some(path) = path else {
        return Ok(Settings {
            port: apm_agent::DEFAULT_PEER_PORT,
            policy: apm_core::Policy::default(),
            peer_key: Vec::new(),
        });
    };
    let text = apm::input::read_file(path, apm::input::CONFIG_LIMIT, "a configuration file")?;
    // Devices are the program's: a configuration without `[[device]]` is fine here.
    let config = match Config::parse(&text) {
        Ok(c) => c,
        Err(errors) => {
            let real: Vec<String> = errors
                .iter()
                .filter(|e| !e.message.starts_with("no [[device]] table"))
                .map(|e| format!("{}: {e}", path.display()))
                .collect();
            if !real.is_empty() {
                bail!("the configuration is refused:\n  {}", real.join("\n  "));
            }
            toml::from_str::<Config>(&text).context("the configuration")?
        }
    };
    // The key is checked here, before the program starts: the agent would only log it.
    config
        .peer_auth()
        .with_context(|| format!("{}: [lap] key_file", path.display()))?;
    let mut peer_key = Vec::new();
    if let Some(file) = &config.lap.key_file {
        peer_key.push(OsString::from("--peer-key"));
        peer_key.push(OsString::from(file.get_ref()));
        if config
            .lap
            .require_auth
            .as_ref()
            .is_some_and(|r| !*r.get_ref())
        {
            peer_key.push(OsString::from("--accept-unauthenticated"));
        }
    }
    Ok(Settings {
        port: config
            .lap
            .udp_listen
            .as_ref()
            .map_or(apm_agent::DEFAULT_PEER_PORT, |a| a.get_ref().port()),
        policy: config.engine_policy(),
        peer_key,
    })
}

/// The interposition library: `--preload`, else beside this binary (as cargo builds
/// both), else in `../lib`.
fn preload_library(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        if p.is_file() {
            return Ok(p);
        }
        bail!("the interposition library {} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("where is this binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for p in [
        dir.join("libapm_preload.so"),
        dir.join("../lib/libapm_preload.so"),
    ] {
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "cannot find libapm_preload.so beside {} (build it with `cargo build -p apm-preload`, \
         or name it with --preload or APM_PRELOAD)",
        exe.display()
    )
}

/// Make sure this host's agent for `port` runs, probing as `probe` says and
/// authenticating peer datagrams as `peer_key` says (an agent already running keeps its
/// own); `Err` says why it cannot.
fn ensure_agent(port: u16, probe: &ProbePolicy, peer_key: &[OsString]) -> Result<()> {
    if agent_listens(port) {
        return Ok(());
    }
    let exe = std::env::current_exe().context("where is this binary")?;
    // Its log goes nowhere unless APM_AGENT_LOG_FILE names a file (with APM_LOG's filter).
    let log = std::env::var_os("APM_AGENT_LOG_FILE")
        .and_then(|f| std::fs::File::create(f).ok())
        .map_or_else(std::process::Stdio::null, std::process::Stdio::from);
    std::process::Command::new(exe)
        .args([
            "agent",
            "--port",
            &port.to_string(),
            "--idle-exit-secs",
            "10",
            "--probe-interval-ms",
            &probe.interval_ms.to_string(),
            "--probe-multiplier",
            &probe.multiplier.to_string(),
        ])
        .args(probe.enabled.then_some("--probes"))
        .args(peer_key)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        // Its own process group: a Ctrl-C meant for the program does not stop it.
        .process_group(0)
        .spawn()
        .context("starting `apm agent`")?;
    for _ in 0..60 {
        if agent_listens(port) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("`apm agent` did not come up within 3 s")
}

fn agent_listens(port: u16) -> bool {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(apm_agent::socket_name(port).as_bytes())
        .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
        .is_ok()
}

use std::os::unix::process::CommandExt as _;

/// `apm run`.
pub fn run(args: Args) -> Result<()> {
    let settings = settings(args.config.as_deref())?;
    let library = preload_library(args.preload)?;
    let Some((program, rest)) = args.program.split_first() else {
        bail!(
            "apm run needs a program: apm run [--config FILE] [--report FILE] -- PROGRAM [ARGS...]"
        );
    };
    if let Err(e) = ensure_agent(settings.port, &settings.policy.probe, &settings.peer_key) {
        errln!("apm run: {e:#}: the program runs unprotected");
    }
    let dir = std::env::temp_dir().join(format!("apm-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let mut preload = OsString::from(&library);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .env("LD_PRELOAD", preload)
        .env("APM_RUN_PORT", settings.port.to_string())
        .env("APM_RUN_POLICY", serde_json::to_string(&settings.policy)?)
        .env("APM_RUN_REPORT_DIR", &dir)
        .env("APM_RUN_MIGRATION", args.migration.env_value());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = rt.block_on(supervise(cmd, program));
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            errln!("apm run: {e:#}");
            std::process::exit(127);
        }
    };
    let report = RunReport {
        exit_status: status,
        processes: read_reports(&dir),
    };
    let _ = std::fs::remove_dir_all(&dir);
    if !report.processes.is_empty() {
        errln!("{}", report.summary());
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    crate::log_writer::flush();
    std::process::exit(status);
}

/// Start the program, forward signals to it, and return its exit status (128 + signal
/// when a signal ended it).
async fn supervise(mut cmd: tokio::process::Command, program: &OsString) -> Result<i32> {
    use nix::sys::signal::{kill, Signal};
    use std::os::unix::process::ExitStatusExt;
    use tokio::signal::unix::{signal, SignalKind};
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", Path::new(program).display()))?;
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(nix::unistd::Pid::from_raw);
    let kinds = [
        (SignalKind::interrupt(), Signal::SIGINT),
        (SignalKind::terminate(), Signal::SIGTERM),
        (SignalKind::hangup(), Signal::SIGHUP),
        (SignalKind::quit(), Signal::SIGQUIT),
        (SignalKind::user_defined1(), Signal::SIGUSR1),
        (SignalKind::user_defined2(), Signal::SIGUSR2),
    ];
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (kind, sig) in kinds {
        let mut stream = signal(kind).context("installing a signal handler")?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
    }
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for the program")?;
                return Ok(status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
            }
            Some(sig) = rx.recv() => {
                if let Some(pid) = pid {
                    let _ = kill(pid, sig);
                }
            }
        }
    }
}

/// Every process report the run's processes left.
fn read_reports(dir: &Path) -> Vec<ProcessReport> {
    let mut out: Vec<ProcessReport> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .filter_map(|e| std::fs::read(e.path()).ok())
                .filter_map(|b| serde_json::from_slice(&b).ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|p| p.pid);
    out
}

/// `apm agent`.
pub fn agent(args: AgentArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if let Some(ip) = args.rail_down {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let client = apm_agent::client::AgentClient::connect(args.port, tx).await?;
            client.rail_down(apm_agent::local::gid_of(ip))?;
            // The line goes out on the client's writer task: done once the agent has
            // handled it (told every process).
            client.synced().await?;
            outln!("apm agent: {ip} reported unreachable to every protected process")?;
            return Ok(());
        }
        let agent = match Agent::bind(AgentConfig {
            peer_port: args.port,
            idle_exit: args.idle_exit_secs.map(Duration::from_secs),
            probe: args.probe_policy()?,
            peer_auth: args.peer_auth()?,
        })
        .await
        {
            Ok(a) => a,
            Err(StartError::AlreadyRunning(p)) => {
                bail!("an apm agent already runs on this host for port {p}")
            }
            Err(e) => return Err(e.into()),
        };
        agent.run().await?;
        Ok(())
    })
}
