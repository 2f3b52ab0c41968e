//! apm Provider facets for InfiniBand HCAs through libibverbs (hardware APM).
//!
//! - [`ffi`]: the libibverbs binding (loaded at run time), shared with provider-rxe.
//! - [`hw_apm`]: hardware APM control of one RC QP (load the alternate path, REARM,
//!   force MIGRATED, query), refusing RoCE ports up front: the kernel bans alternate paths
//!   on RoCE, and provider-rxe migrates paths in software there.
//! - [`facet`]: [`VerbsQpControl`], apm-core's QP-control and local-event facet.

pub mod facet;
pub mod ffi;
pub mod hw_apm;

pub use facet::VerbsQpControl;
pub use ffi::{Verbs, VerbsError};
