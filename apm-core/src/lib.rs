//! The apm engine: never reads a clock, never does IO; time and events come in as inputs,
//! commands and notifications come out.
#![forbid(unsafe_code)]

pub mod types;

pub use types::*;
