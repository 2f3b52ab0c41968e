//! apm Provider facets for InfiniBand HCAs through libibverbs (hardware APM).
//!
//! - [`ffi`]: the libibverbs binding (loaded at run time), shared with provider-rxe.
//! - [`capability`]: what a port can do to move a QP (hardware APM, the SQ-drain move,
//!   nothing), found by trying it on a pair of apm's own QPs.
//! - [`hw_apm`]: hardware APM control of one RC QP (load the alternate path, REARM,
//!   force MIGRATED, query), refusing up front the ports where it cannot work: on RoCE
//!   the stock kernel bans alternate paths (provider-rxe migrates in software there).
//! - [`roce_apm`]: whether the kernel accepts alternate paths on a RoCE port, asked of
//!   the kernel itself (an APM-capable RoCE driver, such as the patched soft-RoCE of
//!   `kernel/rxe-apm`, has them accepted).
//! - [`facet`]: [`VerbsQpControl`], apm-core's QP-control and local-event facet.
//! - [`rails`]: the link state of the interfaces behind a RoCE port's GIDs, which no
//!   port event reports.
#![deny(unsafe_code)] // only `ffi` opts out, with a SAFETY comment per block

pub mod capability;
pub mod facet;
pub mod ffi;
pub mod hw_apm;
pub mod rails;
pub mod roce_apm;

pub use facet::VerbsQpControl;
pub use ffi::{Verbs, VerbsError};
