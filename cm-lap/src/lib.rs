//! Userspace CM LAP/APR exchange: protocol engine and transports.
//!
//! So far only the libibumad transport exists ([`umad_transport`]: CM class 0x07 or a
//! vendor class with an OUI); the sans-IO protocol engine (transactions by comm IDs,
//! retransmission, MRA, duplicate detection, sender validation) and the UDP transport
//! for RoCE are still to come in this crate's own issue. Nothing here answers a LAP by
//! itself.
#![forbid(unsafe_code)]

pub mod umad_transport;
