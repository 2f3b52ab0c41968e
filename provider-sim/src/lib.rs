//! A deterministic simulated InfiniBand fabric implementing every apm Provider facet.
//!
//! Filled in by its own issue; nothing here pretends to work yet.
