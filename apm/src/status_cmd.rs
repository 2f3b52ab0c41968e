//! `apm status`: what the host's agent and the processes under apm are doing now, asked
//! of the agent over its socket (`apm_agent::status`): per process its QPs (seen,
//! protected, not protected and why), how each port moves QPs, its failovers by cause
//! and its lost connections; the agent's probe sessions, each path's state. `--json`
//! prints the agent's answer as it is.
//!
//! An operator (root, the agent's user, the operator group) sees every process; anybody
//! else their own user's. With no agent running it says so and exits 1.

use crate::out::outln;
use anyhow::{Context, Result};
use apm_agent::access::AgentSocket;
use apm_agent::client::AgentClient;
use apm_agent::status::{AgentStatus, ProcessEntry, QpState};
use std::fmt::Write as _;
use std::path::PathBuf;

/// `apm status` arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit status:
  0  the agent answered;
  1  no agent runs on this host (for this port), its socket refuses this user, or it
     did not answer.")]
pub struct Args {
    /// The deployment configuration the agent runs with (its `[lap] udp_listen` port
    /// and `[agent] runtime_dir` and `user` say where the agent is), e.g.
    /// /etc/apm/apm.toml.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The agent's UDP port (default 47910, or the configuration's).
    #[arg(long)]
    port: Option<u16>,
    /// The directory of the agent's socket (default /run/apm, else this user's own).
    #[arg(long, value_name = "DIR", env = "APM_RUNTIME_DIR")]
    runtime_dir: Option<PathBuf>,
    /// Only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// Print the agent's answer as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `apm status`.
pub fn run(args: Args) -> Result<()> {
    let socket = locate(&args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = rt
        .block_on(async {
            let (tx, _events) = tokio::sync::mpsc::unbounded_channel();
            let client = AgentClient::connect(&socket, tx).await?;
            client.status(args.pid).await
        })
        .context("apm status")?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&status)?)?;
    } else {
        crate::out::out!("{}", text(&status))?;
    }
    Ok(())
}

/// Where the agent's socket is: the flags over the configuration's settings.
fn locate(args: &Args) -> Result<AgentSocket> {
    let (port, dir, trusted) = match &args.config {
        Some(path) => {
            let (config, text) = crate::run::read_config(path)?;
            let access = config
                .agent_access(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            (
                crate::run::config_port(&config),
                access.runtime_dir,
                access.agent_uid,
            )
        }
        None => (apm_agent::DEFAULT_PEER_PORT, None, None),
    };
    let port = args.port.unwrap_or(port);
    let dir = args.runtime_dir.clone().or(dir);
    Ok(AgentSocket::locate(port, dir.as_deref()).trust_uid(trusted))
}

/// The answer for a person.
fn text(s: &AgentStatus) -> String {
    let mut t = String::new();
    let a = &s.agent;
    let _ = writeln!(
        t,
        "apm agent {} (pid {}, port {}): probes {}, metrics {}",
        a.version,
        a.pid,
        a.port,
        if a.probing { "on" } else { "off" },
        a.metrics.as_deref().unwrap_or("off"),
    );
    let whose = if s.all_processes {
        "every user's"
    } else {
        "this user's"
    };
    let _ = writeln!(t, "{} processes under apm ({whose})", s.processes.len());
    for p in &s.processes {
        process(&mut t, p);
    }
    if s.omitted > 0 {
        let _ = writeln!(
            t,
            "{} more processes left out (ask for one with --pid)",
            s.omitted
        );
    }
    if a.probing {
        let _ = writeln!(t, "probe sessions: {}", s.sessions.len());
        for (ends, state) in &s.sessions {
            let ip =
                |g| apm_agent::local::ip_of(g).map_or_else(|| g.to_string(), |i| i.to_string());
            let _ = writeln!(
                t,
                "  {} -> {}: {state:?}",
                ip(&ends.local),
                ip(&ends.remote)
            );
        }
    }
    if let Some(d) = &s.peer_drops {
        let dropped: Vec<String> = d
            .by_reason()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let said = if dropped.is_empty() {
            "none".to_owned()
        } else {
            dropped.join(", ")
        };
        let _ = writeln!(t, "peer datagrams dropped: {said}");
    }
    t
}

/// One process, for a person.
fn process(t: &mut String, p: &ProcessEntry) {
    let pid = p.pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
    let Some(s) = &p.status else {
        let _ = writeln!(t, "process {pid} (uid {}): nothing reported yet", p.uid);
        return;
    };
    let states: Vec<String> = s
        .looked_after
        .iter()
        .map(|(st, n)| format!("{n} {}", st.name()))
        .collect();
    let causes: Vec<String> = s
        .failovers_total
        .iter()
        .map(|(c, n)| format!("{} {n}", c.name()))
        .collect();
    let _ = writeln!(
        t,
        "process {pid} {} (uid {}): {} QPs seen, {} looked after ({}), {} not protected, \
         {} failovers{}, {} lost, unprotected {:.1} conn-s",
        s.program,
        p.uid,
        s.qps_seen_total,
        s.looked_after.values().sum::<u64>(),
        if states.is_empty() {
            "none".to_owned()
        } else {
            states.join(", ")
        },
        s.refused_total,
        s.failovers(),
        if causes.is_empty() {
            String::new()
        } else {
            format!(" ({})", causes.join(", "))
        },
        s.lost_total,
        s.unprotected_s,
    );
    for q in &s.qps {
        let why = match q.state {
            QpState::Protected => "protected".to_owned(),
            other => format!("unprotected: {}", other.name()),
        };
        let _ = writeln!(t, "  QP {:#x} on {}: {why}", q.qpn, q.device);
    }
    for r in &s.refused {
        let _ = writeln!(t, "  not protected ({}): {}", r.count, r.reason);
    }
    for port in &s.ports {
        let _ = writeln!(
            t,
            "  port {}:{} ({}): {} ({})",
            port.device, port.port, port.link_layer, port.mechanism, port.evidence
        );
    }
}
