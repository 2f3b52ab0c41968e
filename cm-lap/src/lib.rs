//! Userspace CM LAP/APR exchange: protocol engine and transports.
//!
//! So far: the libibumad transport ([`umad_transport`]: CM class 0x07 or a vendor class
//! with an OUI) and the engine's peer facet on it ([`peer_channel`]: apm-core's LAP,
//! APR and MRA to and from the wire, senders named by the SA). apm-core's engine runs
//! the exchange (timeouts, retries, sender checks); a sans-IO engine of this crate's
//! own and the UDP transport for RoCE are still to come in its issue. Nothing here
//! answers a LAP by itself.
#![forbid(unsafe_code)]

pub mod apm_msg;
pub mod peer_channel;
pub mod udp;
pub mod umad_transport;
