//! apm Provider facets for InfiniBand HCAs through libibverbs (hardware APM).
//!
//! Filled in by its own issue; nothing here pretends to work yet.
