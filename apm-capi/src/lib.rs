//! apm's C API: create a manager from a deployment configuration, protect connections,
//! receive notifications through a file descriptor or a callback, unprotect, destroy.
//!
//! The header `include/apm.h` is generated from this file by cbindgen (`cargo xtask
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

use apm::apm_core::{
    ConnId, ConnSpec, Gid, Lid, LostReason, MigrationMode, Notification, NotificationKind, Path,
    PortKey, Qpn, Role, UnprotectedReason,
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

fn create(config_text: &str, out: *mut *mut ApmManager) -> ApmStatus {
    let config = match Config::parse(config_text) {
        Ok(c) => c,
        Err(errors) => {
            let msg: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return fail(ApmStatus::Config, msg.join("; "));
        }
    };
    let simulated = config
        .devices
        .first()
        .is_some_and(|d| *d.provider.get_ref() == apm::config::ProviderKind::Sim);
    let rt = if simulated {
        // The simulated fabric follows tokio's clock: a paused one plays it on demand.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
    } else {
        // Devices work in real time: apm runs on its own threads between calls.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("apm")
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => return fail(ApmStatus::Io, format!("starting the runtime: {e}")),
    };
    let apm = match rt.block_on(Apm::start(&config)) {
        Ok(a) => a,
        Err(e) => return start_error(e),
    };
    // SAFETY: plain syscall; the fd is owned by `Delivery` and closed in its Drop.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        let _ = rt.block_on(apm.shutdown());
        return fail(
            ApmStatus::Io,
            format!("eventfd: {}", std::io::Error::last_os_error()),
        );
    }
    let delivery = Arc::new(Delivery {
        queue: Mutex::new(VecDeque::new()),
        efd,
        callback: Mutex::new(None),
    });
    let mut notes = apm.notifications();
    let notes = if simulated {
        Some(notes)
    } else {
        let delivery = Arc::clone(&delivery);
        rt.spawn(async move {
            loop {
                match notes.recv().await {
                    Ok(n) => delivery.deliver(vec![c_note(&n)]),
                    Err(broadcast::error::RecvError::Lagged(k)) => tracing_lag(k),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        None
    };
    let m = Box::new(ApmManager {
        rt,
        apm: Some(apm),
        notes,
        out: delivery,
    });
    // SAFETY: `out` was checked non-NULL by the callers and points to writable storage.
    unsafe { *out = Box::into_raw(m) };
    ApmStatus::Ok
}

/// Create a manager from a deployment configuration file (the TOML `apm config check`
/// validates). On success `*out` holds the manager; destroy it with
/// `apm_manager_destroy`.
///
/// # Safety
/// `config_path` is a NUL-terminated string; `out` points to writable storage for a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn apm_manager_new(
    config_path: *const c_char,
    out: *mut *mut ApmManager,
) -> ApmStatus {
    guard(|| {
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        // SAFETY: per this function's contract.
        let path = match unsafe { text(config_path, "config_path") } {
            Ok(p) => p,
            Err(s) => return s,
        };
        match std::fs::read_to_string(path) {
            Ok(t) => create(&t, out),
            Err(e) => fail(ApmStatus::Config, format!("reading {path}: {e}")),
        }
    })
}

/// Create a manager from configuration text (the same TOML as a file).
///
/// # Safety
/// As `apm_manager_new`, with `config_toml` the text itself.
#[no_mangle]
pub unsafe extern "C" fn apm_manager_new_from_str(
    config_toml: *const c_char,
    out: *mut *mut ApmManager,
) -> ApmStatus {
    guard(|| {
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        // SAFETY: per this function's contract.
        match unsafe { text(config_toml, "config_toml") } {
            Ok(t) => create(t, out),
            Err(s) => s,
        }
    })
}

/// Stop the manager (QPs are left as they are) and free it. NULL is ignored.
///
/// # Safety
/// `m` is NULL or a manager from `apm_manager_new*` not destroyed before; it must not
/// be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn apm_manager_destroy(m: *mut ApmManager) {
    let _ = guard(|| {
        if !m.is_null() {
            // SAFETY: created by Box::into_raw in `create`, destroyed once per contract.
            drop(unsafe { Box::from_raw(m) });
        }
        ApmStatus::Ok
    });
}

/// The manager behind a C pointer.
///
/// # Safety
/// `m` is NULL or a live manager, not used concurrently from another thread.
unsafe fn manager<'a>(m: *mut ApmManager) -> Result<&'a mut ApmManager, ApmStatus> {
    // SAFETY: per the caller's contract.
    unsafe { m.as_mut() }.ok_or_else(|| fail(ApmStatus::InvalidArgument, "manager is NULL"))
}

fn path_of(p: &ApmPath) -> Result<Path, ApmStatus> {
    Ok(Path {
        port: PortKey::new(p.device, p.port),
        slid: Lid::from_wire(p.slid),
        dlid: Lid::from_wire(p.dlid),
        sgid: Gid(p.sgid),
        dgid: Gid(p.dgid),
        sgid_index: p.sgid_index,
        sl: p.sl,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        rate: p.rate,
        mtu: p.mtu,
        pkey_index: p.pkey_index,
        ack_timeout: p.ack_timeout,
    })
}

fn c_path(p: &Path) -> ApmPath {
    ApmPath {
        device: p.port.device,
        port: p.port.port,
        slid: p.slid.get(),
        dlid: p.dlid.get(),
        sgid: p.sgid.0,
        dgid: p.dgid.0,
        sgid_index: p.sgid_index,
        sl: p.sl,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        rate: p.rate,
        mtu: p.mtu,
        pkey_index: p.pkey_index,
        ack_timeout: p.ack_timeout,
    }
}

/// A connection description from C.
///
/// # Safety
/// `info.candidates` points to `info.n_candidates` paths (or is NULL with 0).
unsafe fn spec_of(info: &ApmConnInfo) -> Result<ConnSpec, ApmStatus> {
    let qpn = |v: u32, what: &str| {
        Qpn::new(v).ok_or_else(|| {
            fail(
                ApmStatus::InvalidArgument,
                format!("{what} {v:#x} is not a 24-bit QPN"),
            )
        })
    };
    let candidates = if info.n_candidates == 0 {
        Vec::new()
    } else if info.candidates.is_null() {
        return Err(fail(
            ApmStatus::InvalidArgument,
            "candidates is NULL but n_candidates is not 0",
        ));
    } else {
        // SAFETY: non-NULL, `n_candidates` initialised paths per the caller's contract.
        let s = unsafe { std::slice::from_raw_parts(info.candidates, info.n_candidates) };
        s.iter().map(path_of).collect::<Result<_, _>>()?
    };
    Ok(ConnSpec {
        id: ConnId(info.id),
        role: if info.active != 0 {
            Role::Active
        } else {
            Role::Passive
        },
        mode: if info.software != 0 {
            MigrationMode::Software
        } else {
            MigrationMode::Hardware
        },
        local_qpn: qpn(info.local_qpn, "local_qpn")?,
        remote_qpn: qpn(info.remote_qpn, "remote_qpn")?,
        local_comm_id: info.local_comm_id,
        remote_comm_id: info.remote_comm_id,
        primary: path_of(&info.primary)?,
        agreed_alternate: if info.has_agreed_alternate != 0 {
            Some(path_of(&info.agreed_alternate)?)
        } else {
            None
        },
        candidates,
    })
}

/// Put a connection under protection. `qp` is the application's `struct ibv_qp *`, an
/// RC QP in RTS on the device `info->primary.device` names (the index of its
/// `[[device]]` table); it stays the application's (apm never destroys it, and stops
/// touching it at `apm_unprotect`). Nothing is asked of its access flags: on RoCE apm
/// restarts its send queue after a move with the send doorbell alone, which posts no
/// work request and completes nothing. A simulated deployment has no QPs: pass NULL
/// there.
///
/// # Safety
/// `m` is a live manager; `info` points to a valid `ApmConnInfo` (and its candidates);
/// `qp` is NULL or a QP that stays valid until `apm_unprotect` or destroy.
#[no_mangle]
pub unsafe extern "C" fn apm_protect(
    m: *mut ApmManager,
    qp: *mut IbvQp,
    info: *const ApmConnInfo,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        // SAFETY: per this function's contract (NULL checked).
        let Some(info) = (unsafe { info.as_ref() }) else {
            return fail(ApmStatus::InvalidArgument, "info is NULL");
        };
        // SAFETY: per this function's contract.
        let spec = match unsafe { spec_of(info) } {
            Ok(s) => s,
            Err(s) => return s,
        };
        let Some(apm) = &m.apm else {
            return fail(ApmStatus::Stopped, "the manager has stopped");
        };
        let r = if qp.is_null() {
            if !apm.contexts().is_empty() {
                return fail(
                    ApmStatus::InvalidArgument,
                    "qp is NULL: a device deployment protects the application's ibv_qp",
                );
            }
            m.rt.block_on(apm.protect(spec)).map_err(manager_error)
        } else {
            if apm.contexts().is_empty() {
                return fail(
                    ApmStatus::Unsupported,
                    "this deployment has no QP facet to hand an ibv_qp to (simulated \
                     fabric): pass NULL",
                );
            }
            let device = spec.primary.port.device;
            let Some(ctx) = apm.contexts().get(usize::from(device)) else {
                return fail(
                    ApmStatus::InvalidArgument,
                    format!(
                        "primary.device {device} is not a configured device (0..{})",
                        apm.contexts().len()
                    ),
                );
            };
            // SAFETY: `qp` is a live ibv_qp of this process's libibverbs that stays
            // valid until unprotect or destroy, per this function's contract.
            let adopted = match unsafe { Qp::adopt(ctx, qp.cast()) } {
                Ok(q) => q,
                Err(e) => return fail(ApmStatus::InvalidArgument, e.to_string()),
            };
            m.rt.block_on(apm.protect_qp(spec, Arc::new(adopted)))
                .map_err(protect_error)
        };
        m.collect();
        r.map_or_else(|s| s, |()| ApmStatus::Ok)
    })
}

/// The application's sends on `conn_id` stopped completing (outstanding work, no
/// completion for longer than it tolerates): apm moves the connection to its agreed
/// alternate now, telling the peer. apm cannot see an application's completions, so
/// this is how a silent path failure (no port event) reaches it.
///
/// # Safety
/// `m` is a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_report_stall(m: *mut ApmManager, conn_id: u64) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        let Some(apm) = &m.apm else {
            return fail(ApmStatus::Stopped, "the manager has stopped");
        };
        m.rt.block_on(apm.report_stall(ConnId(conn_id)))
            .map_or_else(protect_error, |()| ApmStatus::Ok)
    })
}

/// Stop protecting connection `conn_id` (the QP is left as it is).
///
/// # Safety
/// `m` is a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_unprotect(m: *mut ApmManager, conn_id: u64) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        let Some(apm) = &m.apm else {
            return fail(ApmStatus::Stopped, "the manager has stopped");
        };
        let r = m.rt.block_on(apm.unprotect(ConnId(conn_id)));
        m.collect();
        r.map_or_else(manager_error, |()| ApmStatus::Ok)
    })
}

/// A file descriptor that is readable (poll/select/epoll) while notifications are
/// pending; take them with `apm_next_notification`. Owned by the manager: do not close
/// it. -1 for a NULL manager.
///
/// # Safety
/// `m` is NULL or a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_notification_fd(m: *mut ApmManager) -> c_int {
    // SAFETY: per this function's contract.
    catch_unwind(|| unsafe { m.as_ref() }.map_or(-1, |m| m.out.efd)).unwrap_or(-1)
}

/// Take the oldest pending notification into `*out`: `APM_STATUS_OK`, or `APM_STATUS_AGAIN`
/// when none is pending (the fd is then no longer readable).
///
/// # Safety
/// `m` is a live manager; `out` points to writable storage for one notification.
#[no_mangle]
pub unsafe extern "C" fn apm_next_notification(
    m: *mut ApmManager,
    out: *mut ApmNotification,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        m.collect();
        let mut q = m.out.queue.lock().unwrap_or_else(|p| p.into_inner());
        match q.pop_front() {
            Some(n) => {
                // SAFETY: `out` is non-NULL and writable per the contract.
                unsafe { out.write(n) };
                if q.is_empty() {
                    m.out.drain_fd();
                }
                ApmStatus::Ok
            }
            None => {
                m.out.drain_fd();
                ApmStatus::Again
            }
        }
    })
}

/// Deliver notifications to `cb(note, user)` instead of the queue (NULL `cb`: back to
/// the queue and fd). `note` is valid only during the call.
///
/// # Safety
/// `m` is a live manager; `cb` is safe to call with `user` from the thread that calls
/// apm functions on this manager (simulated deployments) or from any thread (device
/// deployments), until it is replaced or the manager destroyed.
#[no_mangle]
pub unsafe extern "C" fn apm_set_callback(
    m: *mut ApmManager,
    cb: ApmCallback,
    user: *mut c_void,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        // The pointer is kept as an integer: the manager stays Send-agnostic and the
        // value goes back to C unchanged.
        *m.out.callback.lock().unwrap_or_else(|p| p.into_inner()) = cb.map(|f| (f, user as usize));
        ApmStatus::Ok
    })
}

/// Simulated deployments: advance the fabric by `ms` milliseconds of virtual time (the
/// manager works, notifications arrive). `APM_STATUS_UNSUPPORTED` on real deployments.
///
/// # Safety
/// `m` is a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_sim_run_for(m: *mut ApmManager, ms: u64) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        let Some(fabric) = m.apm.as_ref().and_then(|a| a.sim()).cloned() else {
            return fail(ApmStatus::Unsupported, "not a simulated deployment");
        };
        m.rt.block_on(fabric.run_for(std::time::Duration::from_millis(ms)));
        m.collect();
        ApmStatus::Ok
    })
}

/// Simulated deployments: the number of connections the scenario opened on the
/// configured host (`*count`), for `apm_sim_connection`.
///
/// # Safety
/// `m` is a live manager; `count` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn apm_sim_connection_count(
    m: *mut ApmManager,
    count: *mut usize,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        if count.is_null() {
            return fail(ApmStatus::InvalidArgument, "count is NULL");
        }
        match m.sim_specs() {
            // SAFETY: non-NULL and writable per the contract.
            Ok(v) => unsafe { count.write(v.len()) },
            Err(s) => return s,
        }
        ApmStatus::Ok
    })
}

/// Simulated deployments: connection `index` of the configured host as an
/// `ApmConnInfo`, as an application would fill it in (candidates: none).
///
/// # Safety
/// `m` is a live manager; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn apm_sim_connection(
    m: *mut ApmManager,
    index: usize,
    out: *mut ApmConnInfo,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        let specs = match m.sim_specs() {
            Ok(v) => v,
            Err(s) => return s,
        };
        let Some(s) = specs.get(index) else {
            return fail(
                ApmStatus::InvalidArgument,
                format!("no connection {index} ({} in all)", specs.len()),
            );
        };
        let info = ApmConnInfo {
            id: s.id.0,
            active: c_int::from(s.role == Role::Active),
            software: c_int::from(s.mode == MigrationMode::Software),
            local_qpn: s.local_qpn.get(),
            remote_qpn: s.remote_qpn.get(),
            local_comm_id: s.local_comm_id,
            remote_comm_id: s.remote_comm_id,
            primary: c_path(&s.primary),
            has_agreed_alternate: c_int::from(s.agreed_alternate.is_some()),
            agreed_alternate: s.agreed_alternate.as_ref().map(c_path).unwrap_or_default(),
            candidates: std::ptr::null(),
            n_candidates: 0,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(info) };
        ApmStatus::Ok
    })
}

impl ApmManager {
    fn sim_specs(&self) -> Result<Vec<ConnSpec>, ApmStatus> {
        let fabric = self
            .apm
            .as_ref()
            .and_then(|a| a.sim())
            .ok_or_else(|| fail(ApmStatus::Unsupported, "not a simulated deployment"))?;
        let host = fabric.hosts().first().copied().unwrap_or(0);
        // In the runtime's context, so the simulation reads its paused clock.
        let _clock = self.rt.enter();
        Ok(fabric.connections(host))
    }

    /// Simulated deployments: move what the manager published into the queue (or to
    /// the callback). Device deployments forward as notifications come.
    fn collect(&mut self) {
        let Some(notes) = self.notes.as_mut() else {
            return;
        };
        let mut fresh = Vec::new();
        loop {
            match notes.try_recv() {
                Ok(n) => fresh.push(c_note(&n)),
                Err(broadcast::error::TryRecvError::Lagged(k)) => {
                    tracing_lag(k);
                }
                Err(_) => break,
            }
        }
        self.out.deliver(fresh);
    }
}

impl Delivery {
    /// Hand `fresh` to the callback, or queue it and make the fd readable.
    fn deliver(&self, fresh: Vec<ApmNotification>) {
        let callback = *self.callback.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cb, user)) = callback {
            for n in &fresh {
                // SAFETY: the callback and `user` are valid per `apm_set_callback`'s
                // contract; `n` lives across the call.
                unsafe { cb(n, user as *mut c_void) };
            }
            return;
        }
        if fresh.is_empty() {
            return;
        }
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(fresh);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        let _ = unsafe { libc::write(self.efd, (&one as *const u64).cast(), 8) };
    }

    /// Reset the eventfd counter (non-blocking read; EAGAIN when already zero).
    fn drain_fd(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe { libc::read(self.efd, (&mut v as *mut u64).cast(), 8) };
    }
}

fn tracing_lag(k: u64) {
    set_error(&format!(
        "{k} notifications were dropped: the application fell behind"
    ));
}

fn reason_text(s: &str) -> [c_char; 32] {
    let mut out = [0 as c_char; 32];
    for (o, b) in out.iter_mut().zip(s.bytes().take(31)) {
        *o = b as c_char;
    }
    out
}

fn unprotected_reason(r: UnprotectedReason) -> &'static str {
    match r {
        UnprotectedReason::NoCandidate => "no_candidate",
        UnprotectedReason::AlternateDown => "alternate_down",
        UnprotectedReason::AlternateFailed => "alternate_failed",
        UnprotectedReason::PeerUnresponsive => "peer_unresponsive",
        UnprotectedReason::PeerRejected(_) => "peer_rejected",
        UnprotectedReason::ModifyFailed => "modify_failed",
        UnprotectedReason::PrimaryDownUnarmed => "primary_down_unarmed",
        _ => "other",
    }
}

fn c_note(n: &Notification) -> ApmNotification {
    let (kind, reason, path) = match &n.kind {
        NotificationKind::Protected {
            alternate,
            survives,
        } => (
            ApmNotificationKind::Protected,
            survives.name(),
            c_path(alternate),
        ),
        NotificationKind::Rearmed {
            alternate,
            survives,
        } => (
            ApmNotificationKind::Rearmed,
            survives.name(),
            c_path(alternate),
        ),
        NotificationKind::Migrated { primary, forced } => (
            ApmNotificationKind::Migrated,
            if *forced { "forced" } else { "" },
            c_path(primary),
        ),
        NotificationKind::Unprotected { reason } => (
            ApmNotificationKind::Unprotected,
            unprotected_reason(*reason),
            ApmPath::default(),
        ),
        NotificationKind::Lost { reason } => (
            ApmNotificationKind::Lost,
            match reason {
                LostReason::QpFatal => "qp_fatal",
                LostReason::DeviceFatal => "device_fatal",
                _ => "other",
            },
            ApmPath::default(),
        ),
        _ => (
            ApmNotificationKind::Unprotected,
            "other",
            ApmPath::default(),
        ),
    };
    ApmNotification {
        conn_id: n.conn.0,
        time_ns: n.time.as_nanos(),
        kind,
        reason: reason_text(reason),
        path,
    }
}
