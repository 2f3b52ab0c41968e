//! Who owns a QP, asked of the kernel: the RDMA netlink interface's resource tracking
//! (`NETLINK_RDMA`, client `RDMA_NL_NLDEV`), what `rdma resource show qp` prints.
//!
//! The agent uses it to bind a registration to the process that made it: a process may
//! register only a QP of its own (the kernel names the process that created each user
//! QP), so that another local user cannot claim a connection's peer messages first.
//!
//! Two requests, no dump of every QP: `RDMA_NLDEV_CMD_GET` (a dump of the devices, for
//! the index of the device by its name) and `RDMA_NLDEV_CMD_RES_QP_GET` for one QP
//! (`RDMA_NLDEV_ATTR_DEV_INDEX`, `RDMA_NLDEV_ATTR_PORT_INDEX` and
//! `RDMA_NLDEV_ATTR_RES_LQPN`: Linux 5.2 and later; without the port the kernel answers
//! EINVAL, QPs being a port's resources in its tables).
//! The numbers are the uapi header's (`include/uapi/rdma/rdma_netlink.h`); RDMA
//! netlink messages carry their attributes right after the netlink header, with no
//! family header. Every read is bounded (one receive buffer, a receive timeout), and
//! every reply is parsed defensively: a short or malformed attribute ends the parse.

use nix::sys::socket::{
    bind, recv, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nix::sys::time::TimeVal;
use std::os::fd::{AsRawFd, OwnedFd};

/// `RDMA_NL_NLDEV`: the RDMA device interface's netlink client number.
const NLDEV: u16 = 5;
/// `RDMA_NLDEV_CMD_GET` (can dump).
const CMD_GET: u16 = 1;
/// `RDMA_NLDEV_CMD_RES_QP_GET`.
const CMD_RES_QP_GET: u16 = 10;
/// Attributes used (`enum rdma_nldev_attr`).
const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_PORT_INDEX: u16 = 3;
const ATTR_RES_QP: u16 = 19;
const ATTR_RES_QP_ENTRY: u16 = 20;
const ATTR_RES_LQPN: u16 = 21;
const ATTR_RES_RQPN: u16 = 22;
const ATTR_RES_PID: u16 = 28;
/// Netlink header values (`linux/netlink.h`).
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
/// The nested-attribute flag bits in `nla_type`.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// What the kernel says of one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRecord {
    /// The thread that created it, as the kernel names it (in the agent's PID
    /// namespace; 0 once that thread has exited); `None` for a QP of the kernel's own.
    /// (`SystemHost` turns it into the thread's process.)
    pub pid: Option<u32>,
    /// The remote QPN it is connected to (RC and UC QPs past INIT).
    pub remote_qpn: Option<u32>,
}

/// Why the kernel could not be asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NlError {
    /// The socket could not be opened or used (no RDMA netlink in this kernel, ...).
    #[error("RDMA netlink: {0}")]
    Sys(#[from] nix::Error),
    /// The kernel answered with an error.
    #[error("RDMA netlink: the kernel answered {0}")]
    Kernel(nix::Error),
    /// An answer that cannot be read.
    #[error("RDMA netlink: malformed answer ({0})")]
    Malformed(&'static str),
    /// No device of that name.
    #[error("no RDMA device named {0}")]
    NoDevice(String),
}

/// One RDMA netlink socket.
#[derive(Debug)]
pub struct RdmaNetlink {
    fd: OwnedFd,
    seq: u32,
}

/// The largest answer read at once (the kernel's own default for a dump part is 32 KiB).
const RECV_BUF: usize = 64 * 1024;

impl RdmaNetlink {
    /// Open a socket (blocking, with a 2 s receive timeout: a kernel that never answers
    /// cannot wedge the caller).
    pub fn open() -> Result<RdmaNetlink, NlError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRDMA,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(2, 0))?;
        Ok(RdmaNetlink { fd, seq: 1 })
    }

    /// The index of device `name`.
    pub fn device_index(&mut self, name: &str) -> Result<u32, NlError> {
        let replies = self.request(CMD_GET, NLM_F_DUMP, &[])?;
        for attrs in replies {
            let mut index = None;
            let mut dev = None;
            for (kind, value) in Attrs(&attrs) {
                match kind {
                    ATTR_DEV_INDEX => index = u32_of(value),
                    ATTR_DEV_NAME => dev = c_string(value),
                    _ => {}
                }
            }
            if dev.as_deref() == Some(name) {
                return index.ok_or(NlError::Malformed("a device without an index"));
            }
        }
        Err(NlError::NoDevice(name.to_owned()))
    }

    /// The QP `qpn` of device `index`, port `port`; `None` when the device has no such
    /// QP. (The kernel answers for one QP only with a port given: QPs are resources of
    /// a port, not of the device, in its tables; a QP on another port, or one still in
    /// RESET, is EAGAIN.)
    pub fn qp(&mut self, index: u32, port: u8, qpn: u32) -> Result<Option<QpRecord>, NlError> {
        let mut body = Vec::new();
        put_u32(&mut body, ATTR_DEV_INDEX, index);
        put_u32(&mut body, ATTR_PORT_INDEX, u32::from(port));
        put_u32(&mut body, ATTR_RES_LQPN, qpn);
        let replies = match self.request(CMD_RES_QP_GET, 0, &body) {
            Ok(r) => r,
            Err(NlError::Kernel(nix::Error::ENOENT)) => return Ok(None),
            Err(e) => return Err(e),
        };
        for attrs in replies {
            // A doit's answer carries the QP's attributes at the top level (a dump's
            // nests them in RES_QP / RES_QP_ENTRY).
            if let Some(r) = qp_entry(&attrs, qpn) {
                return Ok(Some(r));
            }
            for (kind, value) in Attrs(&attrs) {
                if kind != ATTR_RES_QP {
                    continue;
                }
                for (entry_kind, entry) in Attrs(value) {
                    if entry_kind != ATTR_RES_QP_ENTRY {
                        continue;
                    }
                    if let Some(r) = qp_entry(entry, qpn) {
                        return Ok(Some(r));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Send one request and collect the attribute areas of its answers (one for a plain
    /// request, every part of a dump).
    fn request(&mut self, cmd: u16, flags: u16, body: &[u8]) -> Result<Vec<Vec<u8>>, NlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let len = NLMSG_HDRLEN + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
        msg.extend_from_slice(&((NLDEV << 10) + cmd).to_ne_bytes());
        msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())?;
        let dump = flags & NLM_F_DUMP != 0;
        let mut out = Vec::new();
        let mut buf = vec![0u8; RECV_BUF];
        // A dump ends with NLMSG_DONE; a plain request with its one answer. Bounded: a
        // dump of more parts than this is not an answer to anything asked here.
        for _ in 0..256 {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut rest = buf.get(..n).unwrap_or_default();
            while rest.len() >= NLMSG_HDRLEN {
                let mlen = u32_at(rest, 0).ok_or(NlError::Malformed("header"))? as usize;
                let kind = u16_at(rest, 4).ok_or(NlError::Malformed("header"))?;
                let mseq = u32_at(rest, 8).ok_or(NlError::Malformed("header"))?;
                if mlen < NLMSG_HDRLEN || mlen > rest.len() {
                    return Err(NlError::Malformed("message length"));
                }
                let payload = rest.get(NLMSG_HDRLEN..mlen).unwrap_or_default();
                rest = rest.get(align4(mlen).min(rest.len())..).unwrap_or_default();
                if mseq != seq {
                    continue; // a late answer to an earlier request
                }
                match kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .and_then(|b| b.try_into().ok())
                            .map(i32::from_ne_bytes)
                            .ok_or(NlError::Malformed("error message"))?;
                        if code == 0 {
                            return Ok(out); // an acknowledgement
                        }
                        return Err(NlError::Kernel(nix::Error::from_raw(-code)));
                    }
                    _ => {
                        out.push(payload.to_vec());
                        if !dump {
                            return Ok(out);
                        }
                    }
                }
            }
        }
        Err(NlError::Malformed("a dump that does not end"))
    }
}

/// One QP entry's record, if it is QP `qpn`.
fn qp_entry(entry: &[u8], qpn: u32) -> Option<QpRecord> {
    let mut lqpn = None;
    let mut record = QpRecord {
        pid: None,
        remote_qpn: None,
    };
    for (kind, value) in Attrs(entry) {
        match kind {
            ATTR_RES_LQPN => lqpn = u32_of(value),
            ATTR_RES_RQPN => record.remote_qpn = u32_of(value),
            ATTR_RES_PID => record.pid = u32_of(value),
            _ => {}
        }
    }
    (lqpn == Some(qpn)).then_some(record)
}

/// The attributes of an area: `(type without flag bits, value)`.
struct Attrs<'a>(&'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let len = usize::from(u16_at(self.0, 0)?);
        let kind = u16_at(self.0, 2)? & NLA_TYPE_MASK;
        if len < 4 || len > self.0.len() {
            self.0 = &[];
            return None;
        }
        let value = self.0.get(4..len)?;
        self.0 = self
            .0
            .get(align4(len).min(self.0.len())..)
            .unwrap_or_default();
        Some((kind, value))
    }
}

fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u32_of(value: &[u8]) -> Option<u32> {
    (value.len() == 4).then(|| u32_at(value, 0)).flatten()
}

fn c_string(value: &[u8]) -> Option<String> {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    std::str::from_utf8(value.get(..end)?)
        .ok()
        .map(str::to_owned)
}

fn put_u32(out: &mut Vec<u8>, kind: u16, v: u32) {
    out.extend_from_slice(&8u16.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&v.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&u16::try_from(4 + value.len()).expect("short").to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(value);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn a_qp_entry_is_read_and_malformed_areas_end_the_parse() {
        let mut entry = attr(ATTR_RES_LQPN, &17u32.to_ne_bytes());
        entry.extend(attr(ATTR_RES_RQPN, &18u32.to_ne_bytes()));
        entry.extend(attr(ATTR_RES_PID, &4242u32.to_ne_bytes()));
        entry.extend(attr(ATTR_DEV_NAME, b"rxe0\0"));
        assert_eq!(
            qp_entry(&entry, 17),
            Some(QpRecord {
                pid: Some(4242),
                remote_qpn: Some(18)
            })
        );
        assert_eq!(qp_entry(&entry, 19), None, "another QP");
        // A length past the end, a zero length, a truncated header: no panic, no entry.
        for bad in [&[0xff, 0x00, 21, 0][..], &[0, 0, 21, 0], &[8]] {
            assert_eq!(Attrs(bad).count(), 0);
            assert_eq!(qp_entry(bad, 17), None);
        }
        assert_eq!(c_string(b"rxe1\0\0"), Some("rxe1".into()));
        assert_eq!(u32_of(&[1, 2, 3]), None, "a u32 of three bytes");
    }
}
