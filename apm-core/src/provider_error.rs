//! [`ProviderError`]: why a provider could not do what it was asked, as values.
//!
//! Every provider crate (verbs, rxe, the simulator, umad-sa, cm-lap, the agent) answers
//! with this one type, so the engine and the tools can match on what failed (the
//! [`Operation`]), why ([`Reason`]: an errno, a status, the port or GID at fault) and
//! print the same sentence whichever provider said it. Nothing here is a formatted
//! string: the text is made when the error is displayed.

use crate::io::CommandOp;
use crate::types::{ConnId, Gid, MigState, PortKey};
use serde::Serialize;
use std::fmt;

/// Why a provider could not carry out a command (or start, or register a QP).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize)]
#[non_exhaustive]
pub enum ProviderError {
    /// The provider does not implement this operation (yet, or ever, for its device).
    #[error("{provider} does not support {operation}{}", why.map(|w| format!(": {w}")).unwrap_or_default())]
    Unsupported {
        /// The provider's name (its crate, or the facet's for test doubles).
        provider: &'static str,
        /// What was asked.
        operation: Operation,
        /// What to do instead, when there is something to say.
        why: Option<Reason>,
    },
    /// The device or the provider refused the operation.
    #[error("{operation} refused: {why}")]
    Refused {
        /// What was asked.
        operation: Operation,
        /// Why it was refused.
        why: Reason,
    },
    /// The QP is in ERR: the connection is gone.
    #[error("the QP is in the error state")]
    QpInError,
    /// The connection or QP is not known to the provider.
    #[error("unknown connection {0}")]
    UnknownConnection(ConnId),
    /// No answer in time (SA query, send completion).
    #[error("{operation} timed out")]
    Timeout {
        /// What was asked.
        operation: Operation,
    },
    /// The provider did not answer within the command's deadline
    /// (`Policy::command_timeout_ms`): the engine and the driver treat the command as
    /// failed and go on without its answer.
    #[error("no answer within {after_ms} ms")]
    NoAnswer {
        /// The deadline, in milliseconds after the command was handed over.
        after_ms: u64,
    },
    /// A library the provider needs is missing.
    #[error("cannot load {library}: install the package {package}")]
    Unavailable {
        /// The shared object looked for.
        library: &'static str,
        /// The Debian package that ships it.
        package: &'static str,
    },
    /// Any other failure on the way (a closed channel, a system call's errno).
    #[error("{operation} failed: {why}")]
    Io {
        /// What was asked.
        operation: Operation,
        /// What went wrong.
        why: Reason,
    },
}

impl ProviderError {
    /// `operation` refused for `why`.
    pub fn refused(operation: Operation, why: Reason) -> ProviderError {
        ProviderError::Refused { operation, why }
    }

    /// `operation` failed on the way for `why`.
    pub fn io(operation: Operation, why: Reason) -> ProviderError {
        ProviderError::Io { operation, why }
    }

    /// `provider` does not do `operation` (no further word).
    pub fn unsupported(provider: &'static str, operation: Operation) -> ProviderError {
        ProviderError::Unsupported {
            provider,
            operation,
            why: None,
        }
    }
}

/// What a provider was asked to do: one of the engine's commands, or a step of setting
/// a provider up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Operation {
    /// [`CommandOp::LoadAlternate`] (`ibv_modify_qp` with `IBV_QP_ALT_PATH`).
    LoadAlternate,
    /// [`CommandOp::SetRearm`] (`IBV_QP_PATH_MIG_STATE` = REARM).
    SetRearm,
    /// [`CommandOp::ForceMigrate`] (`IBV_QP_PATH_MIG_STATE` = MIGRATED).
    ForceMigrate,
    /// [`CommandOp::SoftwareMigrate`] (the SQ-drain move).
    SoftwareMigrate,
    /// [`CommandOp::PeerThere`] (releasing sends held for the peer).
    PeerThere,
    /// [`CommandOp::ArmingWrite`] (apm's own zero-length RDMA WRITE).
    ArmingWrite,
    /// [`CommandOp::QueryQp`].
    QueryQp,
    /// [`CommandOp::SendPeer`].
    SendPeer,
    /// [`CommandOp::ResolvePaths`] (a PathRecord query).
    ResolvePaths,
    /// [`CommandOp::Subscribe`] (InformInfo for traps 64/65).
    Subscribe,
    /// Starting a facet ([`crate::Provider::start`] and the facets' own).
    Start,
    /// Registering a QP with a facet.
    Register,
    /// Taking an application's QP under software migration.
    Adopt,
    /// Querying a device's attributes.
    QueryDevice,
    /// Querying a port's attributes.
    QueryPort,
    /// Looking up a source GID in a port's GID table.
    FindGid,
    /// Reading a device's asynchronous events.
    ReadEvents,
}

impl From<&CommandOp> for Operation {
    fn from(op: &CommandOp) -> Operation {
        match op {
            CommandOp::LoadAlternate { .. } => Operation::LoadAlternate,
            CommandOp::SetRearm { .. } => Operation::SetRearm,
            CommandOp::ForceMigrate { .. } => Operation::ForceMigrate,
            CommandOp::SoftwareMigrate { .. } => Operation::SoftwareMigrate,
            CommandOp::PeerThere { .. } => Operation::PeerThere,
            CommandOp::ArmingWrite { .. } => Operation::ArmingWrite,
            CommandOp::QueryQp { .. } => Operation::QueryQp,
            CommandOp::SendPeer { .. } => Operation::SendPeer,
            CommandOp::ResolvePaths { .. } => Operation::ResolvePaths,
            CommandOp::Subscribe { .. } => Operation::Subscribe,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::LoadAlternate => "load alternate path",
            Operation::SetRearm => "set REARM",
            Operation::ForceMigrate => "force MIGRATED",
            Operation::SoftwareMigrate => "software path migration",
            Operation::PeerThere => "release sends held for the peer",
            Operation::ArmingWrite => "post apm's arming write",
            Operation::QueryQp => "query QP",
            Operation::SendPeer => "send peer message",
            Operation::ResolvePaths => "PathRecord query",
            Operation::Subscribe => "SA subscription",
            Operation::Start => "start",
            Operation::Register => "register the QP",
            Operation::Adopt => "adopt the application's QP",
            Operation::QueryDevice => "query device",
            Operation::QueryPort => "query port",
            Operation::FindGid => "find source GID",
            Operation::ReadEvents => "read async events",
        })
    }
}

/// Why an operation failed or is not supported, as the facts that say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
#[non_exhaustive]
pub enum Reason {
    /// A C call (a verb, a libibumad function) failed with this errno.
    Call {
        /// The C function.
        call: &'static str,
        /// Its errno (positive).
        errno: i32,
    },
    /// A system call failed with this errno (positive), or `EIO` when it gave none.
    Errno(i32),
    /// The channel to the device, agent or simulation is closed.
    Closed,
    /// The port is not one this provider serves (not configured, or another device's).
    NotOurPort(PortKey),
    /// No local address reaches this peer GID (no UDP address, no rail to it).
    NoRouteTo(Gid),
    /// The source GID is not in the GID table of local port `port` (its number).
    GidNotInTable {
        /// The GID looked for.
        gid: Gid,
        /// The local port number.
        port: u8,
    },
    /// The connection is registered already.
    AlreadyRegistered(ConnId),
    /// The path does not start at this host (its SLID or port is another's).
    NotLocalPath,
    /// The path's MTU is not the connection's.
    MtuDiffers,
    /// The QP has no alternate path loaded.
    NoAlternate,
    /// The QP's path migration state does not allow it (EINVAL).
    MigState(MigState),
    /// The SA (or a management agent) answered with this non-zero MAD status.
    Status(u16),
    /// An answer that does not match or decode.
    BadAnswer,
    /// The worker thread of a blocking call died.
    WorkerFailed,
    /// A step that waits (for a QP state, a drain) did not finish in time.
    TimedOut(&'static str),
    /// A fixed explanation (an invalid argument, what to do instead).
    Because(&'static str),
}

impl Reason {
    /// The reason of an IO error: its errno, or `EIO` when it has none.
    pub fn of_io(e: &std::io::Error) -> Reason {
        Reason::Errno(e.raw_os_error().unwrap_or(EIO))
    }
}

/// `EIO`, for an IO error that carries no errno.
const EIO: i32 = 5;

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = |n: i32| std::io::Error::from_raw_os_error(n);
        match self {
            Reason::Call { call, errno: n } => write!(f, "{call} failed: {}", errno(*n)),
            Reason::Errno(n) => write!(f, "{}", errno(*n)),
            Reason::Closed => f.write_str("the channel is closed"),
            Reason::NotOurPort(port) => write!(f, "{port} is not a port this provider serves"),
            Reason::NoRouteTo(gid) => write!(f, "no local address reaches GID {gid}"),
            Reason::GidNotInTable { gid, port } => {
                write!(f, "{gid} is not in port {port}'s GID table")
            }
            Reason::AlreadyRegistered(conn) => write!(f, "connection {conn} is already registered"),
            Reason::NotLocalPath => f.write_str("EINVAL: the path's SLID or port is not ours"),
            Reason::MtuDiffers => f.write_str("EINVAL: the path's MTU differs from the QP's"),
            Reason::NoAlternate => f.write_str("EINVAL: no alternate path loaded"),
            Reason::MigState(m) => write!(f, "EINVAL: the QP is {m:?}"),
            Reason::Status(s) => write!(f, "status {s:#06x}"),
            Reason::BadAnswer => f.write_str("an answer that does not match the request"),
            Reason::WorkerFailed => f.write_str("the call's worker thread failed"),
            Reason::TimedOut(what) => write!(f, "{what} timed out"),
            Reason::Because(why) => f.write_str(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_what_failed_and_why() {
        let e = ProviderError::refused(
            Operation::LoadAlternate,
            Reason::Call {
                call: "ibv_modify_qp",
                errno: 22,
            },
        );
        let text = e.to_string();
        assert!(
            text.starts_with("load alternate path refused: ibv_modify_qp failed: "),
            "{text}"
        );
        assert!(text.contains("os error 22"), "{text}");
        let e = ProviderError::Unsupported {
            provider: "provider-rxe",
            operation: Operation::SetRearm,
            why: Some(Reason::Because("RoCE has no hardware APM")),
        };
        assert_eq!(
            e.to_string(),
            "provider-rxe does not support set REARM: RoCE has no hardware APM"
        );
        assert_eq!(
            ProviderError::unsupported("umad-sa", Operation::Subscribe).to_string(),
            "umad-sa does not support SA subscription"
        );
        let e = ProviderError::Unavailable {
            library: "libibverbs.so.1",
            package: "libibverbs1",
        };
        assert_eq!(
            e.to_string(),
            "cannot load libibverbs.so.1: install the package libibverbs1"
        );
    }
}
