//! Engine tests: one per behaviour of the engine's contract, on the two-node bench.

mod arming;
mod commands;
mod failover;
mod harness;
mod hostile_peer;
mod lifecycle;
mod move_at_once;
mod peer_there;
mod probed;
mod properties;
mod rearm;
mod recovery;
mod sa_pacing;
mod software;
mod table;
mod validation;
