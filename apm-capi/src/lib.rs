//! apm's C API: create a manager from a deployment configuration, protect connections,
//! receive notifications through a file descriptor or a callback, unprotect, destroy.
//!
//! The header `include/apm.h` is generated from this crate by cbindgen (`cargo xtask
//! capi-header`) and a test checks that the committed header is current.
//!
//! Rules every function here keeps:
//! - No panic crosses the FFI boundary: each entry point runs inside `catch_unwind` and
//!   reports a panic as `APM_STATUS_PANIC`.
//! - Errors are codes ([`ApmStatus`]); `apm_last_error()` gives the message of the last
//!   failed call on the calling thread.
//! - Pointers from C are checked for NULL; everything else about them is the caller's
//!   contract, stated in each function's `# Safety` section.
//!
//! Deployments: what [`apm::Apm`] can build.
//! - **rxe (RoCE)**: the application creates, connects, posts to and polls its own RC
//!   QPs and hands each to `apm_protect`; apm moves a QP's primary path with the SQ
//!   drain when the path fails (port down, or the application's `apm_report_stall`), and
//!   tells the peer's apm over UDP, which moves its side. apm runs on its own threads;
//!   notifications arrive on the fd or the callback at any time.
//! - **sim**: the simulated fabric on a paused tokio clock, advanced only inside
//!   `apm_sim_run_for`, so a C test plays seconds of fabric time in moments.
//! - **verbs (InfiniBand)**: the application's QP is registered with provider-verbs'
//!   facet and migrated by the HCA (hardware APM: `software = 0`); apm arms its
//!   alternate with LAP/APR and SA paths. Built and tested against OpenSM on the ibsim
//!   bed with a test QP facet; never run on an HCA.
//!
//! Without the RDMA stack or the configured device, creation fails with
//! `APM_STATUS_UNAVAILABLE` and the reason.
// The FFI layer: raw pointers from C, an eventfd. Every unsafe block says why it is sound.
#![allow(unsafe_code)]

mod manager;
mod notify;
mod protect;
mod sim;

pub use manager::*;
pub use notify::*;
pub use protect::*;
pub use sim::*;

use apm::apm_core::{
    Cause, ConnId, ConnSpec, Gid, Lid, LostReason, MigrationMode, Notification, NotificationKind,
    Path, PortKey, Qpn, Role, UnprotectedReason,
};
use apm::{Apm, Config, ProtectError, Qp, StartError};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Kept for programs written against earlier versions, which skipped completions with
/// this `wr_id`: no completion carries it now. After moving a RoCE QP's path apm
/// restarts its send queue with the send doorbell alone (a zero-work-request post), so
/// nothing of apm's reaches the application's CQ, also with `sq_sig_all = 1`.
pub const APM_KICK_WR_ID: u64 = 0xA9A9_0000_0000_4B1C;

/// Result codes of every `apm_*` function that can fail.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApmStatus {
    /// Success.
    Ok = 0,
    /// A NULL or malformed argument.
    InvalidArgument = 1,
    /// The configuration file is unreadable or invalid (the message says where).
    Config = 2,
    /// The deployment cannot be built by this library yet.
    Unsupported = 3,
    /// What the deployment needs is not on this machine (libibverbs, a device).
    Unavailable = 4,
    /// The engine refused the request (e.g. protecting a connection twice).
    Engine = 5,
    /// The manager has stopped.
    Stopped = 6,
    /// No notification is pending.
    Again = 7,
    /// A system call failed.
    Io = 8,
    /// An internal error (a bug): the call was abandoned, nothing unwound into C.
    Panic = 9,
}

/// Kinds of [`ApmNotification`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApmNotificationKind {
    /// First armed alternate since protect; `path` is the alternate.
    Protected = 1,
    /// Armed again; `path` is the new alternate.
    Rearmed = 2,
    /// Moved to the alternate; `path` is the new primary.
    Migrated = 3,
    /// No armed healthy alternate any more; `reason` says why.
    Unprotected = 4,
    /// The QP is in ERR: the connection is gone; `reason` says why.
    Lost = 5,
}

/// One path (both directions described from this side), as in an `ibv_ah_attr` plus
/// the QP's P_Key index and ACK timeout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApmPath {
    /// Provider device index (0 for the first device of the configuration).
    pub device: u16,
    /// Local port number (1-based).
    pub port: u8,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Source GID, network order.
    pub sgid: [u8; 16],
    /// Destination GID, network order.
    pub dgid: [u8; 16],
    /// Index of `sgid` in the port's GID table.
    pub sgid_index: u8,
    /// Service level.
    pub sl: u8,
    /// GRH flow label.
    pub flow_label: u32,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// Static rate (IBA encoding).
    pub rate: u8,
    /// Path MTU (IBA encoding, 1..=5).
    pub mtu: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Local ACK timeout exponent.
    pub ack_timeout: u8,
}

/// A connection as the application set it up.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ApmConnInfo {
    /// The application's id for the connection (echoed in notifications).
    pub id: u64,
    /// 1 if this side sent the REQ (active), 0 if passive.
    pub active: c_int,
    /// 1 for software migration (RoCE), 0 for hardware APM.
    pub software: c_int,
    /// This side's QPN.
    pub local_qpn: u32,
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// This side's CM communication id.
    pub local_comm_id: u32,
    /// The peer's CM communication id.
    pub remote_comm_id: u32,
    /// The path the QP uses now.
    pub primary: ApmPath,
    /// 1 if `agreed_alternate` holds an alternate agreed at connect time and loaded.
    pub has_agreed_alternate: c_int,
    /// The agreed alternate (ignored unless `has_agreed_alternate`).
    pub agreed_alternate: ApmPath,
    /// Other paths to the same peer, best first (may be NULL when `n_candidates` is 0).
    pub candidates: *const ApmPath,
    /// Number of `candidates`.
    pub n_candidates: usize,
}

/// A notification about a protected connection.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ApmNotification {
    /// The connection's id.
    pub conn_id: u64,
    /// When the engine decided it (ns since the manager started).
    pub time_ns: u64,
    /// What happened.
    pub kind: ApmNotificationKind,
    /// For `Unprotected` and `Lost`: a short reason, NUL-terminated ("alternate_down",
    /// "qp_fatal", ...); for `Protected` and `Rearmed`: what the alternate survives
    /// ("port_disjoint", "one_port_shared" or "same_ports"); "forced" for a `Migrated`
    /// apm forced, empty otherwise.
    pub reason: [c_char; 32],
    /// For `Migrated` and an `Unprotected` "primary_down_unarmed": what this side saw
    /// kill the primary, NUL-terminated: "local_port" (its port), "peer_port" (the
    /// peer's port: an SA notice, or the peer's probes), "fabric" (both ports up,
    /// liveness probes lost between them) or "stall" (sends stopped completing);
    /// empty when this side saw nothing (the peer asked it to move, or the device
    /// migrated by itself) and for the other kinds.
    pub cause: [c_char; 16],
    /// The alternate (`Protected`, `Rearmed`) or the new primary (`Migrated`).
    pub path: ApmPath,
}

/// Called with each notification (see `apm_set_callback`), on the thread that runs
/// the manager's work: one of apm's own threads in a device deployment (so the callback
/// must be thread-safe), inside `apm_sim_run_for` in a simulated one.
pub type ApmCallback =
    Option<unsafe extern "C" fn(note: *const ApmNotification, user: *mut c_void)>;

/// libibverbs' `struct ibv_qp`, opaque here: apm-capi does not depend on verbs.h.
#[derive(Debug)]
pub struct IbvQp {
    _private: [u8; 0],
}

/// The C side's handle. Not thread-safe: call the functions on one manager from one
/// thread at a time (different managers are independent).
pub struct ApmManager {
    rt: tokio::runtime::Runtime,
    apm: Option<Apm>,
    /// The notifications, taken by `collect` in a simulated deployment; `None` in a
    /// device deployment, where a task forwards them as they come.
    notes: Option<broadcast::Receiver<Notification>>,
    out: Arc<Delivery>,
}

/// Where notifications go: the callback if one is set, else the queue behind the fd.
/// Shared with the forwarding task of a device deployment; the fd is closed when the
/// last holder drops, so the task never writes to a closed (or reused) descriptor.
struct Delivery {
    queue: Mutex<VecDeque<ApmNotification>>,
    efd: c_int,
    callback: Mutex<
        Option<(
            unsafe extern "C" fn(*const ApmNotification, *mut c_void),
            usize,
        )>,
    >,
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.efd >= 0 {
            // SAFETY: the eventfd was created by us and is closed once, here.
            unsafe { libc::close(self.efd) };
        }
    }
}

impl std::fmt::Debug for ApmManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApmManager")
            .field("efd", &self.out.efd)
            .finish_non_exhaustive()
    }
}

impl Drop for ApmManager {
    fn drop(&mut self) {
        if let Some(apm) = self.apm.take() {
            let _ = self.rt.block_on(apm.shutdown());
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn fail(status: ApmStatus, msg: impl AsRef<str>) -> ApmStatus {
    set_error(msg.as_ref());
    status
}

/// Run `f`, turning a panic into `APM_STATUS_PANIC`.
fn guard(f: impl FnOnce() -> ApmStatus) -> ApmStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(s) => s,
        Err(_) => fail(
            ApmStatus::Panic,
            "internal error (a bug in apm): the call was abandoned",
        ),
    }
}

fn start_error(e: StartError) -> ApmStatus {
    let status = match &e {
        StartError::Unsupported { .. } => ApmStatus::Unsupported,
        StartError::Unavailable(_) => ApmStatus::Unavailable,
        StartError::Sim(_) | StartError::NoDevice => ApmStatus::Config,
        _ => ApmStatus::Engine,
    };
    fail(status, e.to_string())
}

fn protect_error(e: ProtectError) -> ApmStatus {
    match e {
        ProtectError::Manager(e) => manager_error(e),
        ProtectError::NoQpFacet => fail(ApmStatus::Unsupported, e.to_string()),
        other => fail(ApmStatus::InvalidArgument, other.to_string()),
    }
}

fn manager_error(e: apm::apm_core::ManagerError) -> ApmStatus {
    let status = match e {
        apm::apm_core::ManagerError::Stopped => ApmStatus::Stopped,
        _ => ApmStatus::Engine,
    };
    fail(status, e.to_string())
}

/// The message of the last failed `apm_*` call on this thread (empty if none). Valid
/// until the next failing call on this thread; never NULL.
#[no_mangle]
pub extern "C" fn apm_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr())).unwrap_or(c"internal error".as_ptr())
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, ApmStatus> {
    if p.is_null() {
        return Err(fail(ApmStatus::InvalidArgument, format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| fail(ApmStatus::InvalidArgument, format!("{what} is not UTF-8")))
}
