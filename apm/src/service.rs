//! `apm agent` under systemd: readiness and reloads told to the service manager
//! (`sd_notify`, for `Type=notify`), and logs to the journal with their fields when
//! standard error is the journal's stream.
//!
//! Outside systemd (no `NOTIFY_SOCKET`, standard error not the journal) every call here
//! does nothing and logs go to standard error as for every subcommand.

use sd_notify::NotifyState;

/// Tell the service manager the agent is ready (it listens, its devices are read),
/// with a one-line status for `systemctl status`.
pub fn ready(status: &str) {
    let _ = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tell the service manager a reload of the configuration starts (`systemctl reload`
/// waits for the [`ready`] that ends it).
pub fn reloading() {
    let now = NotifyState::monotonic_usec_now();
    let mut states = vec![NotifyState::Reloading];
    if let Ok(now) = now {
        states.push(now);
    }
    let _ = sd_notify::notify(&states);
}

/// Tell the service manager the agent is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
}

/// Whether standard error is connected to the journal (systemd sets `JOURNAL_STREAM`
/// to its device and inode, `systemd.exec(5)`): then logs go to the journal directly,
/// each with its fields.
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    // fstat(2) of fd 2 through procfs: the link's target is the stream itself.
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Whether the host has an RDMA device (an entry in `/sys/class/infiniband`, where the
/// kernel lists every RDMA device: InfiniBand, RoCE and soft-RoCE alike).
pub fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}
