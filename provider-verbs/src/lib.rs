//! apm Provider facets for InfiniBand HCAs through libibverbs (hardware APM).
//!
//! - [`ffi`]: the libibverbs binding (loaded at run time), shared with provider-rxe.
//! - [`hw_apm`]: hardware APM control of one RC QP (load the alternate path, REARM,
//!   force MIGRATED, query), refusing RoCE ports up front: the kernel bans alternate paths
//!   on RoCE, and provider-rxe migrates paths in software there.
//!
//! The engine's facet traits are not implemented yet; nothing here pretends they are.

pub mod ffi;
pub mod hw_apm;

pub use ffi::{Verbs, VerbsError};
