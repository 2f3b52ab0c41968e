//! apm as a library: the deployment configuration, and the engine and driver from
//! `apm-core` re-exported, so an application needs one dependency.
#![forbid(unsafe_code)]

pub mod config;

pub use apm_core;
pub use config::{Config, ConfigError};
