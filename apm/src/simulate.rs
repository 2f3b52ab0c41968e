//! `apm simulate`: the built-in simulated fabric.

use anyhow::bail;

/// Arguments of `apm simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run the simulation.
pub fn run(_args: Args) -> anyhow::Result<()> {
    bail!("apm simulate is not built yet")
}
