//! `apm agent` on SIGHUP: its configuration read again. What the running agent can take
//! at once is applied (the metrics address, the operator group); every other setting
//! is bound into the sockets and channels it serves, and a change to one is logged as
//! needing a restart, naming it. A file that no longer reads changes nothing.

use super::agent::AgentArgs;
use apm_agent::server::{AgentConfig, AgentControl};
use tracing::{info, warn};

/// The settings a reload cannot change, as the agent started with them.
#[derive(Debug, PartialEq)]
pub(super) struct Running {
    /// Its UDP port.
    pub port: u16,
    /// Each other setting's name and value (compared by their `Debug` text: a key
    /// shows its id only, never its secret).
    fixed: Vec<(&'static str, String)>,
}

impl Running {
    /// The settings of `c` a reload cannot change.
    pub(super) fn of(c: &AgentConfig) -> Running {
        Running {
            port: c.peer_port,
            fixed: vec![
                (
                    "the port ([lap] udp_listen, --port)",
                    c.peer_port.to_string(),
                ),
                (
                    "the socket ([agent] runtime_dir)",
                    c.socket.path().display().to_string(),
                ),
                (
                    "the socket's group and mode ([agent] socket_group, socket_mode)",
                    format!("{:?}", c.perms),
                ),
                ("the probes ([policy.probe])", format!("{:?}", c.probe)),
                (
                    "the peer key ([lap] key_file, require_auth)",
                    format!("{:?}", c.peer_auth),
                ),
                ("the agent's user ([agent] user)", format!("{:?}", c.socket)),
            ],
        }
    }
}

/// Read the configuration again and apply what can be applied.
pub(super) async fn reload(args: &AgentArgs, running: &Running, control: &AgentControl) {
    let Some(file) = &args.config else {
        info!("SIGHUP: no --config to read again");
        return;
    };
    let new = match args.reread() {
        Ok(c) => c,
        Err(e) => {
            warn!(file = %file.display(), error = %format!("{e:#}"),
                "SIGHUP: the configuration does not read: nothing changed");
            return;
        }
    };
    for ((what, was), (_, now)) in running.fixed.iter().zip(Running::of(&new).fixed) {
        if *was != now {
            warn!("SIGHUP: {what} changed: restart the agent to apply it (systemctl restart apm-agent)");
        }
    }
    control.set_operator_gid(new.operator_gid);
    match control.set_metrics(new.metrics).await {
        Ok(()) => info!(metrics = ?control.metrics_addr(), file = %file.display(),
            "SIGHUP: the configuration is read again"),
        Err(e) => warn!(error = %e, metrics = ?control.metrics_addr(),
            "SIGHUP: the new metrics address cannot be served"),
    }
}
