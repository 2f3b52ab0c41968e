//! What `apm run` tells the library through the environment, beyond the engine's
//! policy: where the host's agent listens and whom to trust there.

use apm_agent::access::AgentSocket;

/// The agent's socket: `APM_RUN_AGENT_SOCKET` (where `apm run` found or started it),
/// else the one of the agent of `APM_RUN_PORT` (or apm's default port) that this user
/// reaches; its agent is trusted when it runs as root, as this user, or as
/// `APM_RUN_AGENT_UID`.
pub(crate) fn agent_socket() -> AgentSocket {
    let port = std::env::var("APM_RUN_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(apm_agent::DEFAULT_PEER_PORT);
    let socket = match std::env::var_os("APM_RUN_AGENT_SOCKET") {
        Some(path) => {
            let path = std::path::PathBuf::from(path);
            AgentSocket::in_dir(path.parent().unwrap_or(std::path::Path::new("/")), port)
        }
        None => AgentSocket::locate(port, None),
    };
    socket.trust_uid(
        std::env::var("APM_RUN_AGENT_UID")
            .ok()
            .and_then(|u| u.parse().ok()),
    )
}
