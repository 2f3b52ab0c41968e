//! `apm agent`: this host's agent for `apm run` in the foreground, and `apm agent
//! --rail-down ADDR`, an operator's word that an address is unreachable (every process
//! moves the connections whose primary uses it): the hook through which a path-down
//! verdict from outside the programs (a probe, an operator) reaches them.
//!
//! Its settings come from `--config FILE` (`[lap] udp_listen`'s port, `[lap] key_file`
//! and `require_auth`, `[policy.probe]`, `[agent]`), each overridden by its flag.
//! SIGHUP reads the file again: the metrics address and the operator group change at
//! once, every other change is said to need a restart (`reload.rs`). Under systemd it
//! tells the service manager when it is ready (`crate::service`).

use crate::out::outln;
use anyhow::{bail, Context, Result};
use apm::Config;
use apm_agent::access::{AgentSocket, SocketPerms};
use apm_agent::server::{Agent, AgentConfig, StartError};
use apm_core::probe::ProbePolicy;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What `apm agent` exits with.
pub const AGENT_EXIT_STATUS_HELP: &str = "\
Exit status:
  0  the agent exited when idle (--idle-exit-secs), or --rail-down was told to every
     process;
  1  it could not start, and nothing of it was left running: another agent serves the
     port, the ports overlap a running agent's, the metrics address is in use or not
     this host's, an unsafe runtime directory, a bad key or configuration (an unknown
     key among them), no RDMA device with --require-device; or the agent refused or
     could not be reached (--rail-down).
SIGHUP reads --config again: [agent] metrics and operator_group apply at once; any
other change is logged as needing a restart (`systemctl restart apm-agent`), and a
file that no longer reads is logged and changes nothing. Another signal that ends
processes (INT, TERM, ...) ends it as it ends any process (128 + N), once it has
removed its socket.";

/// `apm agent` arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = AGENT_EXIT_STATUS_HELP)]
pub struct AgentArgs {
    /// Deployment configuration: its `[lap] udp_listen` port, `[lap] key_file` and
    /// `require_auth`, `[policy.probe]` and `[agent]` (the flags below override them).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The UDP port of apm's peer messages (the hello port is the next one): 1 to
    /// 65534, and at least 2 away from another agent's.
    #[arg(long)]
    pub port: Option<u16>,
    /// The directory of the agent's socket (`[agent] runtime_dir`; default /run/apm for
    /// root, else this user's own).
    #[arg(long, value_name = "DIR", env = "APM_RUNTIME_DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// Exit after this many seconds without a protected process (default: never).
    #[arg(long, value_name = "SECS")]
    pub idle_exit_secs: Option<u64>,
    /// Tell the running agent that this address (a local or peer rail's IP, or an
    /// InfiniBand port's GID written as IPv6, e.g. fe80::2:c903:0:1) is unreachable:
    /// every connection whose primary path leaves or reaches it moves at once. Exits
    /// when told (root or the operator group only).
    #[arg(long, value_name = "ADDR")]
    pub rail_down: Option<std::net::IpAddr>,
    /// Interval between liveness probes on each path (`[policy.probe] interval_ms`).
    #[arg(long, value_name = "MS")]
    pub probe_interval_ms: Option<u32>,
    /// Probes missed in a row before a path is declared down.
    #[arg(long, value_name = "N")]
    pub probe_multiplier: Option<u8>,
    /// Probe the processes' paths (off by default: see `[policy.probe] enabled`).
    #[arg(long)]
    pub probes: bool,
    /// Authenticate peer datagrams with the shared secret in this file (`[lap]
    /// key_file`; readable by its owner only): every datagram sent carries a MAC and a
    /// sequence number, and unauthenticated, forged or replayed ones are dropped.
    #[arg(long, value_name = "FILE")]
    pub peer_key: Option<PathBuf>,
    /// With a key: accept unauthenticated datagrams too (`[lap] require_auth =
    /// false`, while a deployment moves to keys host by host).
    #[arg(long)]
    pub accept_unauthenticated: bool,
    /// Print what the host's liveness probes cost and buy, and exit: the paths the
    /// running agent probes, the interval `[policy.probe] max_probes_per_sec` allows
    /// them, the probes a second, and the time a silent failure takes to be found
    /// (under this command's `--config` and flags: give the agent's own).
    #[arg(long, conflicts_with = "rail_down")]
    pub explain: bool,
    /// With `--explain`: for this many paths instead of the running agent's.
    #[arg(long, value_name = "N", requires = "explain")]
    pub paths: Option<usize>,
    /// With `--explain`: one JSON object.
    #[arg(long, requires = "explain")]
    pub json: bool,
    /// Serve the agent's Prometheus metrics at this address (`GET /metrics`; `[agent]
    /// metrics`), e.g. 127.0.0.1:9713. Off unless given; anyone who can reach the
    /// address reads them.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Refuse to start (status 1) when the host has no RDMA device (the service's
    /// setting: without one there is nothing to protect).
    #[arg(long)]
    pub require_device: bool,
}

/// Read and check the configuration at `path` (a bad one is refused whole); with its
/// text, which its spans refer to.
pub(crate) fn read_config(path: &Path) -> Result<(Config, String)> {
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
            // One error, one line (what a service's journal shows); more, one each.
            match real.as_slice() {
                [] => {}
                [one] => bail!("the configuration is refused: {one}"),
                _ => bail!("the configuration is refused:\n  {}", real.join("\n  ")),
            }
            toml::from_str::<Config>(&text).context("the configuration")?
        }
    };
    Ok((config, text))
}

/// The agent's port a configuration says (`[lap] udp_listen`), else the default.
pub(crate) fn config_port(config: &Config) -> u16 {
    config
        .lap
        .udp_listen
        .as_ref()
        .map_or(apm_agent::DEFAULT_PEER_PORT, |a| a.get_ref().port())
}

/// Whether an agent this user trusts serves `socket`: connected and checked, then
/// left (an agent counts a process only once it registers).
pub(super) fn reach(socket: &AgentSocket) -> Result<(), apm_agent::AgentError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        apm_agent::client::AgentClient::connect(socket, tx)
            .await
            .map(drop)
    })
}

impl AgentArgs {
    /// The agent's configuration these arguments and `--config` say, checked (the key
    /// read, groups and users looked up), and the file's configuration.
    fn agent_config(&self) -> Result<(AgentConfig, Option<Config>)> {
        let file = self.config.as_deref().map(read_config).transpose()?;
        let config = file.as_ref().map(|(c, _)| c);
        let port = self
            .port
            .unwrap_or_else(|| config.map_or(apm_agent::DEFAULT_PEER_PORT, config_port));
        let access = match &file {
            Some((c, text)) => Some(c.agent_access(text).map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e}",
                    self.config.as_deref().unwrap_or(Path::new("")).display()
                )
            })?),
            None => None,
        };
        let dir = self
            .runtime_dir
            .clone()
            .or_else(|| access.as_ref().and_then(|a| a.runtime_dir.clone()));
        let mut agent = AgentConfig::new(port, dir.as_deref());
        if let Some(a) = &access {
            agent.socket = agent.socket.trust_uid(a.agent_uid);
            agent.perms = a.perms;
            agent.operator_gid = a.operator_gid;
        } else {
            agent.perms = SocketPerms::default_for_host();
        }
        agent.idle_exit = self.idle_exit_secs.map(Duration::from_secs);
        agent.probe = self.probe_policy(config)?;
        agent.peer_auth = self.peer_auth(config)?;
        agent.metrics = self
            .metrics
            .or_else(|| config.and_then(|c| c.agent.metrics.as_ref().map(|m| *m.get_ref())));
        Ok((agent, file.map(|(c, _)| c)))
    }

    /// The agent's configuration again (a reload): `Err` says why it is refused.
    pub(super) fn reread(&self) -> Result<AgentConfig> {
        self.agent_config().map(|(c, _)| c)
    }

    /// The probe policy: `[policy.probe]` with the flags over it, checked.
    fn probe_policy(&self, config: Option<&Config>) -> Result<ProbePolicy> {
        let mut p = config.map_or_else(ProbePolicy::default, |c| c.engine_policy().probe);
        p.enabled |= self.probes;
        if let Some(ms) = self.probe_interval_ms {
            p.interval_ms = ms;
            p.down_interval_ms = p.down_interval_ms.max(ms);
        }
        if let Some(n) = self.probe_multiplier {
            p.multiplier = n;
        }
        p.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(p)
    }

    /// The peer channels' authentication: `--peer-key` or `[lap] key_file`, the key
    /// read and its file checked.
    fn peer_auth(&self, config: Option<&Config>) -> Result<cm_lap::auth::Mode> {
        use cm_lap::auth::{Key, Mode};
        let Some(file) = &self.peer_key else {
            let mode = match config {
                Some(c) => c.peer_auth().context("[lap] key_file")?,
                None => Mode::Off,
            };
            return Ok(match mode {
                Mode::Require(k) if self.accept_unauthenticated => Mode::AcceptUnauthenticated(k),
                other => other,
            });
        };
        let key = Key::from_file(file).with_context(|| format!("--peer-key {}", file.display()))?;
        Ok(if self.accept_unauthenticated {
            Mode::AcceptUnauthenticated(key)
        } else {
            Mode::Require(key)
        })
    }
}

/// `apm agent`.
pub fn agent(args: AgentArgs) -> Result<()> {
    let (mut config, file) = args.agent_config()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        if let Some(ip) = args.rail_down {
            return rail_down(&config.socket, ip).await;
        }
        if args.explain {
            return super::explain::explain(&config.socket, &config.probe, args.paths, args.json)
                .await;
        }
        if args.require_device && !crate::service::has_rdma_device() {
            bail!(
                "no RDMA device on this host (/sys/class/infiniband is empty): nothing for \
                 the agent to protect (load the device's driver, or rdma_rxe for soft-RoCE)"
            );
        }
        config.infiniband = infiniband_side(file.as_ref());
        let running = super::reload::Running::of(&config);
        let agent = match Agent::bind(config).await {
            Ok(a) => a,
            Err(StartError::AlreadyRunning(p)) => {
                bail!("an apm agent already runs on this host for port {p}")
            }
            Err(e) => return Err(e.into()),
        };
        let socket = agent.socket();
        let metrics = agent.metrics_addr();
        tracing::info!(port = running.port, socket = %socket.path().display(),
            metrics = ?metrics, "apm agent started");
        let control = agent.control();
        let mut signals = crate::signals::listen(&crate::signals::ENDING)?;
        // Boxed, so that dropping it below (before exit) ends the agent and removes its
        // socket.
        let mut served = Box::pin(agent.run());
        crate::service::ready(&match metrics {
            Some(m) => format!(
                "serving {}; metrics at http://{m}/metrics",
                socket.path().display()
            ),
            None => format!("serving {}", socket.path().display()),
        });
        let ended_by = loop {
            tokio::select! {
                served = &mut served => {
                    crate::service::stopping();
                    served?;
                    return Ok(());
                }
                Some(sig) = signals.recv() => {
                    if sig != nix::sys::signal::Signal::SIGHUP {
                        break sig;
                    }
                    crate::service::reloading();
                    super::reload::reload(&args, &running, &control).await;
                    crate::service::ready("configuration read again");
                }
            }
        };
        // Ended by a signal: the agent (and with it its socket) is gone once `served`
        // is dropped; the signal ends the process as it would have.
        crate::service::stopping();
        drop(served);
        tracing::info!(signal = %ended_by, "the agent exits");
        crate::log_writer::flush();
        let _ = signal_hook::low_level::emulate_default_handler(ended_by as i32);
        std::process::exit(128 + ended_by as i32)
    })
}

/// The host's InfiniBand ports as the agent's side (SA and MAD channels through
/// umad), when it has any and they can be opened; what could not be is said, and the
/// agent serves RoCE alone.
fn infiniband_side(
    config: Option<&Config>,
) -> Option<std::sync::Arc<dyn apm_agent::ib::InfiniBand>> {
    let ports = apm::agent_ib::infiniband_ports();
    if ports.is_empty() {
        return None;
    }
    let opened = apm::agent_ib::umad_config(&ports, config)
        .and_then(|c| apm::agent_ib::AgentInfiniBand::open(&c, &apm::ib::UmadOptions::default()));
    match opened {
        Ok(side) => {
            tracing::info!(ports = ?ports, "serving the host's InfiniBand ports");
            Some(std::sync::Arc::new(side))
        }
        Err(e) => {
            tracing::warn!(error = %e, "the host has InfiniBand ports the agent cannot serve: \
                processes on them run unprotected");
            None
        }
    }
}

/// `apm agent --rail-down ADDR`.
async fn rail_down(socket: &AgentSocket, ip: std::net::IpAddr) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let client = apm_agent::client::AgentClient::connect(socket, tx).await?;
    client.rail_down(apm_agent::local::gid_of(ip))?;
    // The line goes out on the client's writer task: done once the agent has handled
    // it (told every process), or refused it.
    client.synced().await?;
    while let Ok(m) = rx.try_recv() {
        if let apm_agent::wire::FromAgent::Refused { what } = m {
            bail!("the apm agent refused: {what}");
        }
    }
    outln!("apm agent: {ip} reported unreachable to every protected process")?;
    Ok(())
}
