//! Where the agent listens and who is at each end of its socket.
//!
//! The agent runs as root beside every protected process and holds the deployment's
//! peer key, so its local socket is a boundary:
//!
//! - **A file, not an abstract name.** The socket is `agent-PORT.sock` in a runtime
//!   directory: the system's [`SYSTEM_RUNTIME_DIR`] for root's agent (a directory only
//!   root may write, so nobody else can bind the name first), or a user's own directory
//!   for an agent that user starts ([`user_runtime_dir`]). Its owner, group and mode are
//!   the operator's ([`SocketPerms`]; by default root, the group `apm` where it exists,
//!   mode 0660); it is bound under a temporary name, given them, then renamed into
//!   place, so it is never reachable with other permissions. A lock file beside it
//!   (`agent-PORT.lock`, held for the agent's life) decides which of two agents
//!   starting at once serves, and tells an agent whose port pair overlaps a running
//!   one's.
//! - **Both ends check the other.** The agent reads each client's credentials
//!   (`SO_PEERCRED`) when it connects ([`Caller`]): root, the agent's own user and the
//!   members of the operator group are operators; everyone else may act only on QPs of
//!   its own process. A client checks that the directory is not writable by others and
//!   that the agent it reached runs as root, as itself, or as the configured user
//!   ([`AgentSocket::trust_uid`]) before it believes a word of it.
//!
//! What each request may do is decided in the server, with the [`Caller`] in hand.

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Root's agents' runtime directory.
pub const SYSTEM_RUNTIME_DIR: &str = "/run/apm";

/// The group that may reach root's agent by default, where the host has it.
pub const DEFAULT_SOCKET_GROUP: &str = "apm";

/// The socket's mode by default: its owner and group read and write (connect).
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

/// Why the agent's socket cannot be used or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// Another agent serves this port from this directory.
    #[error("an apm agent already serves port {port} ({})", path.display())]
    AlreadyRunning {
        /// The port.
        port: u16,
        /// Its socket.
        path: PathBuf,
    },
    /// A running agent's port pair (peer port, hello port = peer port + 1) overlaps.
    #[error(
        "port {port} overlaps the running agent of port {other} (an agent uses its port \
         and the next one): choose a port at least 2 away"
    )]
    PortOverlap {
        /// This agent's port.
        port: u16,
        /// The running agent's.
        other: u16,
    },
    /// A port that has no hello port after it, or none at all.
    #[error("port {0} cannot be an agent's port: it must be between 1 and 65534 (the hello port is the next one)")]
    BadPort(u16),
    /// The runtime directory could be changed by someone else than its owner (who could
    /// then put a socket of their own in the agent's place).
    #[error(
        "{}: {why}: anyone who can write there could stand in for the agent",
        dir.display()
    )]
    UnsafeDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The agent reached is not one this user trusts.
    #[error(
        "the apm agent at {} runs as uid {uid}, not as root, this user or the configured \
         agent user: refusing to trust it",
        path.display()
    )]
    Impostor {
        /// Its socket.
        path: PathBuf,
        /// Its user.
        uid: u32,
    },
    /// A group name that the host does not know.
    #[error("no group named {0:?} on this host")]
    NoGroup(String),
    /// The operating system refused.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AccessError {
    let what = what.into();
    move |source| AccessError::Io { what, source }
}

/// Where an agent's socket is, and whom a client trusts to serve it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSocket {
    path: PathBuf,
    port: u16,
    /// A user besides root and the client's own that may serve (a service user).
    trusted_uid: Option<u32>,
}

impl AgentSocket {
    /// The socket of the agent of `port` in `dir`.
    pub fn in_dir(dir: impl AsRef<Path>, port: u16) -> AgentSocket {
        AgentSocket {
            path: dir.as_ref().join(format!("agent-{port}.sock")),
            port,
            trusted_uid: None,
        }
    }

    /// The socket a client of this user reaches for `port`: in `dir` when given;
    /// otherwise root's agent's when it is there or this user is root, else this user's
    /// own agent's.
    pub fn locate(port: u16, dir: Option<&Path>) -> AgentSocket {
        if let Some(dir) = dir {
            return AgentSocket::in_dir(dir, port);
        }
        let system = AgentSocket::in_dir(SYSTEM_RUNTIME_DIR, port);
        if nix::unistd::geteuid().is_root() || system.path.exists() {
            return system;
        }
        AgentSocket::in_dir(user_runtime_dir(), port)
    }

    /// Also trust an agent running as `uid` (the configured agent user).
    pub fn trust_uid(mut self, uid: Option<u32>) -> AgentSocket {
        self.trusted_uid = uid;
        self
    }

    /// The user trusted besides root and this one, if any.
    pub fn trusted_uid(&self) -> Option<u32> {
        self.trusted_uid
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The agent's UDP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether an agent running as `uid` may be believed.
    pub fn trusts(&self, uid: u32) -> bool {
        uid == 0 || uid == nix::unistd::geteuid().as_raw() || Some(uid) == self.trusted_uid
    }

    /// The directory the socket is in.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }

    fn lock_path(&self, port: u16) -> PathBuf {
        self.dir().join(format!("agent-{port}.lock"))
    }

    /// Check the directory before connecting: nobody but its owner (root, this user or
    /// the trusted user) may change what is in it.
    pub fn check_dir(&self) -> Result<(), AccessError> {
        check_dir(self.dir(), |uid| self.trusts(uid))
    }
}

/// A user's own runtime directory for an agent that user starts: `$XDG_RUNTIME_DIR/apm`
/// where the session has one (logind makes it the user's, mode 0700), else
/// `/tmp/apm-UID`.
pub fn user_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("apm"),
        None => std::env::temp_dir().join(format!("apm-{}", nix::unistd::geteuid())),
    }
}

/// `dir` is a real directory (not a link), owned by a user `owner_ok` accepts, and
/// writable by nobody else.
fn check_dir(dir: &Path, owner_ok: impl Fn(u32) -> bool) -> Result<(), AccessError> {
    let unsafe_dir = |why: String| AccessError::UnsafeDir {
        dir: dir.to_owned(),
        why,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(io(format!("{}", dir.display())))?;
    if !meta.file_type().is_dir() {
        return Err(unsafe_dir("not a directory".into()));
    }
    if !owner_ok(meta.uid()) {
        return Err(unsafe_dir(format!("owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "writable by its group or others (mode {:04o})",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// The socket's owner group and mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketPerms {
    /// The group (`None`: the agent's own).
    pub group: Option<u32>,
    /// The permission bits.
    pub mode: u32,
}

impl SocketPerms {
    /// The defaults: the group `apm` where the host has it and this agent may give its
    /// socket to it (else the agent's own), mode [`DEFAULT_SOCKET_MODE`].
    pub fn default_for_host() -> SocketPerms {
        // A user's own agent gives its socket to the group only when it may (root, or
        // a member): the package creates the group, and an unprivileged `apm run`
        // starting its own agent must not then fail to place its socket.
        let group = group_id(DEFAULT_SOCKET_GROUP).ok().filter(|g| {
            let gid = nix::unistd::Gid::from_raw(*g);
            nix::unistd::geteuid().is_root()
                || nix::unistd::getegid() == gid
                || nix::unistd::getgroups().is_ok_and(|gs| gs.contains(&gid))
        });
        SocketPerms {
            group,
            mode: DEFAULT_SOCKET_MODE,
        }
    }
}

/// The id of group `name`.
pub fn group_id(name: &str) -> Result<u32, AccessError> {
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(AccessError::NoGroup(name.to_owned())),
    }
}

/// The agent's socket, bound, and the lock that makes it the only agent of its port
/// in its directory. Dropping it removes the socket file.
#[derive(Debug)]
pub struct Bound {
    /// The listening socket (non-blocking).
    pub listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    _lock: Flock<File>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        // Still held, so the file is ours: nobody else binds it while the lock is held.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bind the agent's socket: the directory made (0755 for root's, 0700 for a user's)
/// and checked, the lock taken, the port pair checked against running agents, a stale
/// socket of a dead agent removed, the new one given `perms` before it appears.
pub fn bind(socket: &AgentSocket, perms: SocketPerms) -> Result<Bound, AccessError> {
    let port = socket.port;
    if port == 0 || port == u16::MAX {
        return Err(AccessError::BadPort(port));
    }
    let dir = socket.dir();
    if std::fs::symlink_metadata(dir).is_err() {
        let mode = if dir == Path::new(SYSTEM_RUNTIME_DIR) {
            0o755
        } else {
            0o700
        };
        // Parents too: a minimal system may have no /run yet.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(io(format!("creating {}", dir.display())))?;
    }
    let me = nix::unistd::geteuid().as_raw();
    check_dir(dir, |uid| uid == me || uid == 0)?;
    let held = lock(&socket.lock_path(port))?.ok_or_else(|| AccessError::AlreadyRunning {
        port,
        path: socket.path.clone(),
    })?;
    for other in [port - 1, port + 1] {
        let path = socket.lock_path(other);
        if path.exists() && lock(&path)?.is_none() {
            return Err(AccessError::PortOverlap { port, other });
        }
    }
    match std::fs::symlink_metadata(&socket.path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            // Ours by the lock: the agent that made it is gone.
            std::fs::remove_file(&socket.path)
                .map_err(io(format!("removing {}", socket.path.display())))?;
        }
        Ok(_) => {
            return Err(AccessError::UnsafeDir {
                dir: dir.to_owned(),
                why: format!("{} is there and is no socket", socket.path.display()),
            })
        }
        Err(_) => {}
    }
    let staging = dir.join(format!(".agent-{port}.sock.{}", std::process::id()));
    // `sun_path` holds 108 bytes with its NUL: say so rather than the kernel's EINVAL.
    if staging.as_os_str().len() >= 108 {
        return Err(AccessError::UnsafeDir {
            dir: dir.to_owned(),
            why: format!(
                "the path is too long for a Unix socket in it ({} bytes with the socket's \
                 name, at most 107): choose a shorter runtime directory",
                staging.as_os_str().len()
            ),
        });
    }
    let _ = std::fs::remove_file(&staging);
    let listener = std::os::unix::net::UnixListener::bind(&staging)
        .map_err(io(format!("binding {}", staging.display())))?;
    let placed = (|| {
        if let Some(g) = perms.group {
            std::os::unix::fs::lchown(&staging, None, Some(g))?;
        }
        std::fs::set_permissions(
            &staging,
            std::fs::Permissions::from_mode(perms.mode & 0o777),
        )?;
        std::fs::rename(&staging, &socket.path)
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&staging);
        return Err(io(format!("placing {}", socket.path.display()))(e));
    }
    listener
        .set_nonblocking(true)
        .map_err(io("the agent's socket"))?;
    Ok(Bound {
        listener,
        path: socket.path.clone(),
        _lock: held,
    })
}

/// The lock at `path`, taken without waiting; `None` when another process holds it.
fn lock(path: &Path) -> Result<Option<Flock<File>>, AccessError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io(format!("opening {}", path.display())))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::Error::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(io(format!("locking {}", path.display()))(e.into())),
    }
}

/// Whom the agent is talking to on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The user (effective uid at connect time).
    pub uid: u32,
    /// The process (in the agent's PID namespace), when the kernel says.
    pub pid: Option<u32>,
    /// Root, the agent's own user, or a member of the operator group: may use the
    /// operator's requests (rail-down, watching every verdict, probing any address).
    pub operator: bool,
}

impl Caller {
    /// The caller with credentials `uid`, `gid`, `pid`, for an agent running as
    /// `agent_uid` whose operator group is `operator_gid`.
    pub fn new(
        uid: u32,
        gid: u32,
        pid: Option<u32>,
        agent_uid: u32,
        operator_gid: Option<u32>,
    ) -> Caller {
        let operator = uid == 0
            || uid == agent_uid
            || operator_gid.is_some_and(|g| g == gid || pid.is_some_and(|p| in_group(p, uid, g)));
        Caller { uid, pid, operator }
    }
}

/// Whether process `pid`, running as `uid`, has `gid` among its groups (its
/// supplementary groups are not in `SO_PEERCRED`; `/proc/PID/status` has them, and its
/// `Uid:` line must match, so that a reused PID of another user counts for nothing).
fn in_group(pid: u32, uid: u32, gid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|v| v.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    // Uid: real, effective, saved, filesystem.
    if field("Uid:").get(1) != Some(&uid) {
        return false;
    }
    field("Gid:").get(1) == Some(&gid) || field("Groups:").contains(&gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("apm-access-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn one_agent_per_port_and_no_overlapping_pairs() {
        let dir = scratch("bind");
        let perms = SocketPerms {
            group: None,
            mode: 0o600,
        };
        let a = AgentSocket::in_dir(&dir, 40_000);
        let bound = bind(&a, perms).expect("first");
        let meta = std::fs::symlink_metadata(a.path()).expect("socket");
        assert_eq!(meta.mode() & 0o777, 0o600, "the mode asked for");
        assert_eq!(
            std::fs::metadata(&dir).expect("dir").mode() & 0o777,
            0o700,
            "a user's directory is private"
        );
        assert!(matches!(
            bind(&a, perms),
            Err(AccessError::AlreadyRunning { port: 40_000, .. })
        ));
        for port in [39_999, 40_001] {
            let e = bind(&AgentSocket::in_dir(&dir, port), perms).expect_err("overlap");
            assert!(
                matches!(e, AccessError::PortOverlap { other: 40_000, .. }),
                "{e}"
            );
        }
        bind(&AgentSocket::in_dir(&dir, 40_002), perms).expect("two away is fine");
        for port in [0, u16::MAX] {
            assert!(matches!(
                bind(&AgentSocket::in_dir(&dir, port), perms),
                Err(AccessError::BadPort(_))
            ));
        }
        drop(bound);
        assert!(!a.path().exists(), "removed with the agent");
        // A stale socket of a dead agent is replaced.
        let stale = std::os::unix::net::UnixListener::bind(a.path()).expect("stale");
        drop(stale);
        bind(&a, perms).expect("a stale socket is replaced");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = scratch("unsafe");
        std::fs::create_dir(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let s = AgentSocket::in_dir(&dir, 40_100);
        let e = s.check_dir().expect_err("world-writable");
        assert!(
            e.to_string().contains("writable by its group or others"),
            "{e}"
        );
        let e = bind(
            &s,
            SocketPerms {
                group: None,
                mode: 0o600,
            },
        )
        .expect_err("refused");
        assert!(matches!(e, AccessError::UnsafeDir { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn operators_are_root_the_agent_user_and_the_group() {
        let me = nix::unistd::geteuid().as_raw();
        let my_gid = nix::unistd::getegid().as_raw();
        let pid = std::process::id();
        assert!(Caller::new(0, 0, None, 1000, None).operator);
        assert!(
            Caller::new(1000, 1000, None, 1000, None).operator,
            "the agent's user"
        );
        assert!(!Caller::new(1001, 1001, None, 1000, None).operator);
        assert!(
            Caller::new(1001, 50, None, 1000, Some(50)).operator,
            "primary group"
        );
        // Supplementary groups come from /proc, and only for the uid that runs the pid.
        assert!(in_group(pid, me, my_gid));
        assert!(
            !in_group(pid, me.wrapping_add(1), my_gid),
            "another user's pid"
        );
    }
}
