//! The libibumad transport shared by `umad-sa` and `cm-lap`.
//!
//! libibumad is loaded at run time ([`ffi`]); a [`Port`] is one opened local port with
//! its agents (one per management class) and one blocking receive thread bridged to
//! async with tokio channels. Requests are matched to responses on the low 32 bits of the
//! transaction ID (ibsim and the kernel rewrite the high bits), with a timeout and
//! retries per request; a request's pending entry is removed when its future completes or
//! is dropped, so unanswered requests never leak.
//!
//! [`testbed`] holds the ibsim-only mode that makes a node process look like a
//! NOT_ACTIVE SM so stock ibsim delivers it unsolicited MADs (docs/iba-facts.md §6); it refuses to
//! run outside the simulator. [`bed`] lets tests find the bed that `cargo xtask ibsim`
//! started.
//!
//! Routing looks only at the common header's class, method and TID; every MAD layout
//! (the test-bed SMInfo answer included) comes from `ib-mad`.
#![deny(unsafe_code)] // only `ffi` opts out, with a SAFETY comment per block

pub mod bed;
mod dest;
pub mod ffi;
pub mod testbed;
mod transport;

pub use ffi::{PortInfo, RecvAddr, MAD_SIZE};
pub use testbed::TestBedMode;
pub use transport::split_by_class;
pub use transport::{
    Agent, AgentSpec, Counters, Dest, Pending, Port, PortOptions, PortSelector, Received,
    RequestOptions, Unsolicited, QP1_QKEY,
};

/// Errors of the umad transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libibumad (or one of its symbols) could not be loaded.
    #[error("cannot load {library} ({detail}); install the package {package}")]
    LibraryMissing {
        /// The shared object looked for.
        library: &'static str,
        /// The Debian package that ships it.
        package: &'static str,
        /// What the loader said.
        detail: String,
    },
    /// A libibumad call returned an error (`rc` is a negative errno or -1).
    #[error("{func} failed: {rc}")]
    Call {
        /// The C function.
        func: &'static str,
        /// Its return value.
        rc: i32,
    },
    /// No local port matches the selector.
    #[error("no such local port: {0}")]
    NoSuchPort(String),
    /// The test-bed mode was asked for outside the ibsim bed.
    #[error("test-bed mode refused: {0}")]
    TestBedRefused(String),
    /// The class has no agent on this port.
    #[error("no agent registered for management class {0:#04x}")]
    NoAgent(u8),
    /// A MAD buffer was malformed (too short or too long).
    #[error("bad MAD: {0}")]
    BadMad(String),
    /// No response after every attempt.
    #[error("no response to TID {tid:#010x} after {attempts} attempts")]
    Timeout {
        /// The low 32 bits of the TID.
        tid: u32,
        /// How many times the request was sent.
        attempts: u32,
    },
    /// The port was closed (its receive thread ended).
    #[error("port closed")]
    Closed,
}
