//! The apm engine: never reads a clock, never does IO; time and events come in as inputs,
//! commands and notifications come out.
//!
//! - [`Engine`] is the pure, deterministic state machine that keeps RC connections armed
//!   with a healthy alternate path (module [`engine`]).
//! - [`io`] holds the `Input`/`Command`/`Notification` enums: the engine's whole contract.
//! - [`provider`] holds the async [`Provider`] trait and the facets (QP control, peer
//!   channel, fabric service) that deployments compose with [`Stack`].
//! - [`Manager`] drives an engine with a provider on tokio: the only async part.
//! - [`Policy`] holds every knob with its documented default.
//! - `testing` (feature `testing`) holds fakes for other crates' tests: a QP facet that
//!   simulates an HCA's QPs.
#![forbid(unsafe_code)]

pub mod engine;
pub mod io;
pub mod manager;
pub mod policy;
pub mod probe;
pub mod provider;
mod provider_error;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod types;

pub use engine::{ConnStatus, Engine, EngineError, Protection, Stats};
pub use io::*;
pub use manager::{FabricEvent, FabricEventKind, Manager, ManagerError, ManagerHandle};
pub use policy::{FastMoves, Policy, PolicyError, UnexpectedLap};
pub use provider::*;
pub use types::*;
