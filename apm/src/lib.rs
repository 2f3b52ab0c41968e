//! apm as a library: protect RC connections from an application.
//!
//! - [`Apm`] ([`deployment`]): start apm for a deployment [`Config`], protect and
//!   unprotect connections, receive notifications and unaffiliated fabric events, shut
//!   down. [`SimFabric`] runs it on the simulated fabric anywhere.
//! - [`config`]: the deployment TOML (`apm config check FILE` validates it).
//! - [`start_error`]: why a deployment cannot start ([`StartError`]).
//! - [`input`]: reading configuration, scenario and MAD input with a size limit;
//!   [`scenario_file`]: a simulator scenario file, every problem located.
//! - [`ib`]: the umad half of an InfiniBand deployment (SA and LAP/APR MADs per port),
//!   also for deployments on a QP facet of the caller's ([`Apm::start_with_qp`]);
//!   [`agent_ib`]: the same as the host agent's InfiniBand side (`apm agent`).
//! - [`apm_core`] re-exported (the engine, its types, the `Manager`), so an application
//!   needs one dependency.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = apm::Config::parse("[[device]]\nname = \"h0\"\nprovider = \"sim\"\n")?;
//! let apm = apm::Apm::start(&config).await?;
//! let mut events = apm.fabric_events();
//! apm.sim().expect("simulated").run_for(std::time::Duration::from_secs(1)).await;
//! // The built-in scenario takes rail A's switch down at 0.5 s: h0's port 1 goes down.
//! let ev = events.recv().await?;
//! println!("{ev:?}");
//! apm.shutdown().await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod agent_ib;
pub mod config;
pub mod control_runtime;
pub mod deployment;
pub mod ib;
pub mod input;
pub mod scenario_file;
pub mod start_error;

pub use apm_core;
pub use config::{Config, ConfigError, ConfigErrors};
pub use deployment::{Apm, ProtectError, SimFabric};
/// The work request id apm's kick on an application's RoCE QP once carried; the kick is
/// now the send doorbell alone and no completion carries it (kept for old programs).
pub use provider_rxe::KICK_WR_ID;
/// A simulated fabric's scenario (topology, faults, workload), for [`SimFabric::new`].
pub use provider_sim::Scenario;
/// provider-verbs' QP handle ([`Qp::adopt`] wraps an application's `ibv_qp`) and device
/// context, for [`Apm::protect_qp`].
pub use provider_verbs::ffi::{Context, Qp};
pub use start_error::{SimUnavailable, StartError, Unavailable};
