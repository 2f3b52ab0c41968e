//! What the agent knows of its host, as a trait: this host's RDMA addresses and who owns
//! a QP. The agent checks every registration against it (a process claims only a QP of
//! its own, on an address of this host); [`SystemHost`] asks sysfs and the kernel's
//! RDMA netlink, and tests on loopback give their own.

use crate::local::{self, Addr};
use crate::rdma_nl::{QpRecord, RdmaNetlink};
use apm_core::Gid;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Mutex, PoisonError};

/// Why a QP's owner could not be told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OwnerError {
    /// The address is on no RDMA device of this host.
    #[error("{0} is not an address of this host's RDMA devices")]
    NotLocal(Gid),
    /// The kernel could not be asked (no RDMA netlink, ...).
    #[error("{0}")]
    Unavailable(String),
}

/// This host, as the agent needs to know it.
pub trait Host: Send + Sync + Debug {
    /// Whether `gid` is an address (a RoCE GID, an InfiniBand port GID) of one of this
    /// host's RDMA ports.
    fn is_local(&self, gid: &Gid) -> bool {
        self.port_of(gid).is_some()
    }

    /// The device and port that hold `gid` here.
    fn port_of(&self, gid: &Gid) -> Option<(String, u8)>;

    /// Every address of the device port holding `gid`, with subnets (the hello's
    /// answer); `None` when no port here holds it.
    fn device_addresses(&self, gid: &Gid) -> Option<Vec<Addr>>;

    /// What the kernel says of QP `qpn` on the device port holding local address `gid`
    /// (its owner the process, not the thread, that created it): `Ok(None)` when that
    /// port has no such QP.
    fn qp(&self, gid: &Gid, qpn: u32) -> Result<Option<QpRecord>, OwnerError>;
}

/// The real host: sysfs for addresses, RDMA netlink for QP owners.
#[derive(Debug, Default)]
pub struct SystemHost {
    /// Device indexes by name (they change only when a device comes or goes).
    indexes: Mutex<BTreeMap<String, u32>>,
}

impl SystemHost {
    fn index(&self, nl: &mut RdmaNetlink, dev: &str) -> Result<u32, OwnerError> {
        if let Some(i) = self
            .indexes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(dev)
        {
            return Ok(*i);
        }
        let i = nl
            .device_index(dev)
            .map_err(|e| OwnerError::Unavailable(e.to_string()))?;
        self.indexes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(dev.to_owned(), i);
        Ok(i)
    }
}

impl Host for SystemHost {
    fn port_of(&self, gid: &Gid) -> Option<(String, u8)> {
        local::port_of(gid)
    }

    fn device_addresses(&self, gid: &Gid) -> Option<Vec<Addr>> {
        local::device_addresses(gid)
    }

    fn qp(&self, gid: &Gid, qpn: u32) -> Result<Option<QpRecord>, OwnerError> {
        let (dev, port) = local::port_of(gid).ok_or(OwnerError::NotLocal(*gid))?;
        let mut nl = RdmaNetlink::open().map_err(|e| OwnerError::Unavailable(e.to_string()))?;
        let index = self.index(&mut nl, &dev)?;
        let record = match nl.qp(index, port, qpn) {
            Ok(r) => r,
            Err(_) => {
                // The device may have come back under another index: ask once more.
                self.indexes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&dev);
                let index = self.index(&mut nl, &dev)?;
                nl.qp(index, port, qpn)
                    .map_err(|e| OwnerError::Unavailable(e.to_string()))?
            }
        };
        Ok(record.map(|r| QpRecord {
            pid: r.pid.and_then(process_of_thread),
            ..r
        }))
    }
}

/// The process of thread `tid`, from `/proc/TID/status` (`Tgid:`): the kernel names a
/// QP's creator by the thread that created it, and programs create QPs on any thread.
/// `None` for 0 (a thread that has exited since) or a thread that is gone.
fn process_of_thread(tid: u32) -> Option<u32> {
    if tid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A host for tests and demonstrations on one machine without RDMA devices: every
/// loopback address (127.0.0.0/8, ::1) is local and answers the hello with itself in a
/// /8, and a QP belongs to the process running the agent unless
/// [`LoopbackHost::with_qp`] says otherwise. Never what `apm agent` runs with.
#[derive(Debug, Default)]
pub struct LoopbackHost {
    qps: BTreeMap<u32, Option<QpRecord>>,
}

impl LoopbackHost {
    /// Say what the kernel would say of QP `qpn` (`None`: no such QP).
    pub fn with_qp(mut self, qpn: u32, record: Option<QpRecord>) -> LoopbackHost {
        self.qps.insert(qpn, record);
        self
    }
}

impl Host for LoopbackHost {
    fn port_of(&self, gid: &Gid) -> Option<(String, u8)> {
        local::ip_of(gid)
            .is_some_and(|ip| ip.is_loopback())
            .then(|| ("lo".to_owned(), 1))
    }

    fn device_addresses(&self, gid: &Gid) -> Option<Vec<Addr>> {
        self.is_local(gid).then(|| {
            vec![Addr {
                gid: *gid,
                prefix: 8,
            }]
        })
    }

    fn qp(&self, gid: &Gid, qpn: u32) -> Result<Option<QpRecord>, OwnerError> {
        if !self.is_local(gid) {
            return Err(OwnerError::NotLocal(*gid));
        }
        Ok(self.qps.get(&qpn).copied().unwrap_or(Some(QpRecord {
            pid: Some(std::process::id()),
            remote_qpn: None,
        })))
    }
}
