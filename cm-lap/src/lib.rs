//! Userspace CM LAP/APR exchange: the transports that carry apm-core's peer messages.
//!
//! - [`umad_transport`] and [`peer_channel`]: LAP, APR and MRA as CM MADs on libibumad,
//!   on CM class 0x07 (only where no kernel CM holds it) or a vendor class with apm's
//!   OUI (the default on stock Linux, whose ib_cm owns class 0x07); senders are named
//!   by the SA from the source LID, never by the payload.
//! - [`udp`] and [`apm_msg`]: the same messages plus software-migration requests as
//!   vendor MADs in UDP datagrams, for RoCE; senders named by the source address.
//! - [`auth`]: the UDP datagrams' MAC and replay window under a deployment's key;
//!   [`auth_mad`]: the same inside the vendor MADs of the InfiniBand channel.
//!
//! The exchange itself (timeouts, retransmission, duplicates, sender checks, every
//! APStatus) is apm-core's engine: a channel only carries, and never answers a LAP by
//! itself. An answer travels with its LAP's transaction id (`answer_tids`).
#![forbid(unsafe_code)]

mod answer_tids;
pub mod apm_msg;
pub mod auth;
pub mod auth_mad;
pub mod peer_channel;
pub mod udp;
pub mod umad_transport;
