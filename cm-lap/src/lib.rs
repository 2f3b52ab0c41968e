//! Userspace CM LAP/APR exchange: protocol engine and transports.
//!
//! Filled in by its own issue; nothing here pretends to work yet.
