//! Engine tests: one per behaviour of the engine's contract, on the two-node bench.

mod commands;
mod harness;
mod properties;
mod scenarios;
mod table;
mod validation;
