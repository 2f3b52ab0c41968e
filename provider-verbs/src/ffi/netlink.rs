//! Link changes as the kernel announces them: a `NETLINK_ROUTE` socket subscribed to
//! the link group (`RTMGRP_LINK`), so the rail watcher learns that an interface lost its
//! carrier when it happens, not at its next look.
//!
//! The messages themselves are not parsed: any link message means "look again" (the
//! watcher reads each rail's carrier from sysfs, which it trusts either way). That keeps
//! this reader small and safe against whatever the kernel sends: a datagram is read into
//! a fixed buffer and dropped, a socket that overflowed (`ENOBUFS`: changes were lost)
//! is a change too. Nothing here grows with the input.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tokio::io::unix::AsyncFd;

/// A subscription to the kernel's link changes. Needs a tokio runtime with IO enabled.
#[derive(Debug)]
pub struct LinkChanges {
    fd: AsyncFd<OwnedFd>,
}

impl LinkChanges {
    /// Subscribe (any process may: the link group is readable without privileges).
    pub fn open() -> io::Result<LinkChanges> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor this function alone owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_nl is valid (pid 0: the kernel assigns one).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: bind(2) on our socket with a sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the AsyncFd owns the descriptor (OwnedFd): it stays open, and the same,
        // for as long as it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(LinkChanges { fd })
    }

    /// Wait until the kernel announces a link change (or lost some), then take every
    /// announcement queued so far: one wake-up however many came together.
    pub async fn changed(&self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            match self.drain() {
                Ok(0) => guard.clear_ready(),
                Ok(_) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Read and drop the queued datagrams, at most [`DRAIN_MAX`] (a kernel announcing
    /// without pause must not hold the caller: the rest stay queued for the next call);
    /// how many there were (an overflow counts as one).
    fn drain(&self) -> io::Result<usize> {
        let mut buf = [0u8; 8192];
        let mut n = 0;
        while n < DRAIN_MAX {
            // SAFETY: recv(2) into a buffer of the length passed; MSG_DONTWAIT so an
            // empty queue returns at once.
            let got = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if got >= 0 {
                n += 1;
                continue;
            }
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(n),
                Some(libc::EINTR) => continue,
                // The kernel dropped announcements: something changed.
                Some(libc::ENOBUFS) => Ok(n + 1),
                _ => Err(e),
            };
        }
        Ok(n)
    }
}

/// The most datagrams one [`LinkChanges::changed`] reads.
const DRAIN_MAX: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Duration;

    fn ip(args: &[&str]) -> bool {
        Command::new("ip")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    #[tokio::test]
    async fn a_link_change_is_announced_at_once() {
        let changes = LinkChanges::open().expect("a netlink socket on the link group");
        // A dummy interface of our own to toggle (needs CAP_NET_ADMIN: skipped without).
        let name = format!("apmnl{}", std::process::id() % 100_000);
        if !ip(&["link", "add", &name, "type", "dummy"]) {
            println!("SKIPPED: cannot add a dummy interface here (needs CAP_NET_ADMIN)");
            return;
        }
        // What adding it announced is taken first.
        let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
        let _ = changes.drain();
        assert!(ip(&["link", "set", &name, "up"]));
        let seen = tokio::time::timeout(Duration::from_secs(2), changes.changed()).await;
        let _ = ip(&["link", "del", &name]);
        assert!(
            matches!(seen, Ok(Ok(()))),
            "the link change was announced: {seen:?}"
        );
    }
}
