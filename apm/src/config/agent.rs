//! The `[agent]` table: where the host agent of `apm run` (`apm agent`) listens and who
//! may use it, checked as it is read and looked up on the host when the agent starts.

use super::{Config, ConfigErrors};
use serde::{Deserialize, Serialize};
use toml::Spanned;
use toml_located::Collector;

/// The `[agent]` table: where the host agent of `apm run` (`apm agent`) listens and who
/// may use it. Names are looked up on the host when the agent starts
/// ([`Config::agent_access`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// The directory of the agent's socket (absolute). Default: `/run/apm` for root's
    /// agent; for another user's, `$XDG_RUNTIME_DIR/apm` or `/tmp/apm-UID`.
    #[schemars(with = "Option<String>")]
    pub runtime_dir: Option<Spanned<String>>,
    /// The group that owns the socket. Default: `apm` where the host has that group,
    /// else the agent's own.
    #[schemars(with = "Option<String>")]
    pub socket_group: Option<Spanned<String>>,
    /// The socket's permission bits. Default 0o660 (its owner and group); 0o666 lets
    /// every local user protect their own programs (each request is still checked).
    #[schemars(with = "Option<u32>")]
    pub socket_mode: Option<Spanned<u32>>,
    /// Members of this group are operators: they may report a rail down, watch every
    /// path's verdict, and have any address probed. Root and the agent's own user
    /// always are. Default: none.
    #[schemars(with = "Option<String>")]
    pub operator_group: Option<Spanned<String>>,
    /// The user the agent runs as, when not root: clients trust an agent of root,
    /// of their own user, or of this user.
    #[schemars(with = "Option<String>")]
    pub user: Option<Spanned<String>>,
    /// Serve the agent's Prometheus metrics over HTTP at this address (`GET
    /// /metrics`), e.g. `"127.0.0.1:9713"`. Default: not served. Anyone who can reach
    /// the address can read them: keep it on loopback or a management network.
    #[schemars(with = "Option<std::net::SocketAddr>")]
    pub metrics: Option<Spanned<std::net::SocketAddr>>,
}

/// What `[agent]` says, looked up on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentAccess {
    /// The runtime directory (`None`: the default for the user).
    pub runtime_dir: Option<std::path::PathBuf>,
    /// The socket's group and mode.
    pub perms: apm_agent::access::SocketPerms,
    /// The operator group's id.
    pub operator_gid: Option<u32>,
    /// The agent user's id.
    pub agent_uid: Option<u32>,
}

impl Config {
    /// `[agent]` looked up on this host: a group or user it does not know is an error
    /// at its key. `text` is the configuration the spans refer to.
    pub fn agent_access(&self, text: &str) -> Result<AgentAccess, ConfigErrors> {
        let a = &self.agent;
        let mut errors = Collector::new(text);
        let mut group = |g: &Option<Spanned<String>>, key: &str| -> Option<u32> {
            let g = g.as_ref()?;
            match apm_agent::access::group_id(g.get_ref()) {
                Ok(id) => Some(id),
                Err(e) => {
                    errors.push(Some(g.span()), key, &e.to_string());
                    None
                }
            }
        };
        let mut perms = apm_agent::access::SocketPerms::default_for_host();
        if let Some(g) = group(&a.socket_group, "agent.socket_group") {
            perms.group = Some(g);
        }
        let operator_gid = group(&a.operator_group, "agent.operator_group");
        if let Some(m) = &a.socket_mode {
            perms.mode = *m.get_ref();
        }
        let agent_uid =
            a.user
                .as_ref()
                .and_then(|u| match nix::unistd::User::from_name(u.get_ref()) {
                    Ok(Some(user)) => Some(user.uid.as_raw()),
                    _ => {
                        errors.push(
                            Some(u.span()),
                            "agent.user",
                            &format!("no user named {:?} on this host", u.get_ref()),
                        );
                        None
                    }
                });
        if !errors.is_empty() {
            return Err(errors.into_problems());
        }
        Ok(AgentAccess {
            runtime_dir: a.runtime_dir.as_ref().map(|d| d.get_ref().into()),
            perms,
            operator_gid,
            agent_uid,
        })
    }

    /// `[agent]`: values that cannot be, whatever the host.
    pub(super) fn check_agent(
        &self,
        at: &mut impl FnMut(Option<std::ops::Range<usize>>, &str, String),
    ) {
        let a = &self.agent;
        if let Some(d) = &a.runtime_dir {
            if !std::path::Path::new(d.get_ref()).is_absolute() {
                at(
                    Some(d.span()),
                    "agent.runtime_dir",
                    "must be an absolute path".into(),
                );
            }
        }
        if let Some(m) = &a.socket_mode {
            if *m.get_ref() > 0o777 {
                at(
                    Some(m.span()),
                    "agent.socket_mode",
                    format!(
                        "{:#o} is not a file mode: at most 0o777 (write it in octal, 0o660)",
                        m.get_ref()
                    ),
                );
            }
        }
        for (key, name) in [
            ("agent.socket_group", &a.socket_group),
            ("agent.operator_group", &a.operator_group),
            ("agent.user", &a.user),
        ] {
            if let Some(n) = name {
                let bad = n.get_ref().is_empty()
                    || n.get_ref().len() > 256
                    || n.get_ref().contains(['\0', '/', ':', '\n']);
                if bad {
                    at(Some(n.span()), key, "is not a user or group name".into());
                }
            }
        }
    }
}
