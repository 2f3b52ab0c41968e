//! SA client over libibumad: InformInfo subscriptions, Reports, PathRecords.
//!
//! Filled in by its own issue; nothing here pretends to work yet.
