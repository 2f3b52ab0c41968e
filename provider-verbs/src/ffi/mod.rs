//! The libibverbs binding shared by apm's device providers (provider-rxe uses it through
//! this crate's public API).
//!
//! libibverbs is loaded at run time with `libloading`, so the workspace builds and the
//! simulator runs on machines without rdma-core; [`Verbs::load`] says which Debian
//! packages to install when the library is missing. The raw bindings in [`sys`] are
//! generated from rdma-core's `infiniband/verbs.h` by `cargo xtask codegen` and checked by
//! the layout test against the header compiled with gcc.
//!
//! Several verbs are `static inline` in `verbs.h` and dispatch through the context's
//! function tables: [`Context::query_port`] (through `verbs_context::query_port`, falling
//! back to the exported compat symbol as the header does), and `ibv_post_send`,
//! `ibv_post_recv`, `ibv_poll_cq` (through `ibv_context::ops`). They are re-implemented
//! here exactly as the header does them; calling the exported symbols of the same name
//! instead would use the old ABI.
//!
//! This module must never hand out a raw pointer whose owner could be dropped first:
//! every object holds an `Arc` to what it was created from, so destruction happens in the
//! order libibverbs requires (QPs before CQs and PDs, everything before the context).
// Unsafe is the point of this module: it is the FFI boundary to libibverbs. Every block
// carries a `// SAFETY:` comment; nothing outside `ffi` uses unsafe.
#![allow(unsafe_code)]

pub mod child;
mod device;
mod events;
mod netlink;
mod qp;
mod qp_attr;
pub mod resident;
mod resources;
pub mod sched;
pub mod sys;

pub use device::{
    Context, DeviceAttr, DeviceInfo, GidEntry, GidType, LinkLayer, PortAttr, PortState,
};
pub use events::{AsyncEvent, AsyncEventKind, AsyncEvents, EventElement};
pub use netlink::LinkChanges;
pub use qp::{Qp, QpCaps};
pub use qp_attr::{AddressVector, MigState, Mtu, QpAttr, QpAttrMask, QpState};
pub use resources::{Cq, Mr, Pd, WcOpcode, WcStatus, WorkCompletion};

use std::sync::Arc;

/// The sonames tried, newest ABI first (libibverbs has kept `.so.1` since 2006).
const SONAMES: &[&str] = &["libibverbs.so.1"];

/// Errors of the libibverbs binding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs could not be loaded (not installed, or too old for a symbol we use).
    #[error(
        "cannot load libibverbs ({detail}): install the Debian package `libibverbs1`, \
         and `ibverbs-providers` for the device drivers (rdma-core)"
    )]
    LibraryMissing {
        /// What the dynamic loader said.
        detail: String,
    },
    /// A verb failed; `source` is the errno it reported.
    #[error("{call} failed: {source}")]
    Call {
        /// The libibverbs function.
        call: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// No RDMA device of that name.
    #[error("no RDMA device named {0:?}")]
    NoSuchDevice(String),
    /// An argument a verb would reject, caught before the call.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Hardware APM asked of a RoCE port where the kernel refuses alternate paths (the
    /// stock RDMA core bans them on RoCE; see [`crate::roce_apm`]).
    #[error(
        "hardware APM is not available on {device} port {port}: it is a RoCE port and \
         the kernel refuses alternate paths there (the stock RDMA core bans them on RoCE, \
         and stock rxe never migrates); use provider-rxe, which migrates paths in software"
    )]
    HardwareApmOnRoce {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
    },
    /// The device does not advertise `IBV_DEVICE_AUTO_PATH_MIG`.
    #[error("{device} does not support automatic path migration (no IBV_DEVICE_AUTO_PATH_MIG)")]
    NoApmCapability {
        /// Device name.
        device: String,
    },
    /// An operation this provider does not implement (yet); never a fake success.
    #[error("not supported by provider-verbs: {0}")]
    Unsupported(&'static str),
}

impl VerbsError {
    /// The errno of a failed verb, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Call { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Build from a verb's return value: negative errno, positive errno, or -1 with errno.
    pub(crate) fn from_ret(call: &'static str, ret: i32) -> Self {
        let source = if ret > 0 {
            std::io::Error::from_raw_os_error(ret)
        } else if ret < -1 {
            std::io::Error::from_raw_os_error(-ret)
        } else {
            std::io::Error::last_os_error()
        };
        VerbsError::Call { call, source }
    }

    /// Build from errno after a call that returned NULL.
    pub(crate) fn last(call: &'static str) -> Self {
        VerbsError::Call {
            call,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Result of the binding.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

/// A loaded libibverbs. Cheap to clone; the library stays loaded while any clone, or any
/// object created through it, lives.
#[derive(Clone)]
pub struct Verbs {
    pub(crate) lib: Arc<sys::IbvLib>,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs").finish_non_exhaustive()
    }
}

impl Verbs {
    /// Load libibverbs and resolve every function the binding uses.
    pub fn load() -> Result<Verbs> {
        let mut detail = String::new();
        for name in SONAMES {
            // SAFETY: loading libibverbs runs its ELF constructors, which only initialise
            // its own state (provider list, fork-safety flags); resolving the symbols
            // gives function pointers whose signatures bindgen took from the same
            // library's header, so calling them with the declared types is sound.
            match unsafe { sys::IbvLib::new(name) } {
                Ok(lib) => return Ok(Verbs { lib: Arc::new(lib) }),
                Err(e) => {
                    if !detail.is_empty() {
                        detail.push_str("; ");
                    }
                    detail.push_str(&e.to_string());
                }
            }
        }
        Err(VerbsError::LibraryMissing { detail })
    }

    /// The RDMA devices libibverbs sees (those with a provider library installed).
    pub fn devices(&self) -> Result<Vec<DeviceInfo>> {
        device::list(self)
    }

    /// Open a device by name (e.g. `mlx5_0`, `rxe0`).
    pub fn open(&self, name: &str) -> Result<Context> {
        device::open(self, name)
    }
}

/// Copy a NUL-terminated C string from libibverbs, lossily.
fn c_string(ptr: *const std::os::raw::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: callers pass strings libibverbs returned (device names, status strings),
    // which are NUL-terminated and live at least as long as the call.
    unsafe { std::ffi::CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// A fixed-size C char array (e.g. `ibv_device::name`) up to its first NUL.
fn c_array(chars: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
