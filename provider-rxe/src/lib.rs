//! apm Provider facets for soft-RoCE (rxe): software path migration.
//!
//! Filled in by its own issue; nothing here pretends to work yet.
