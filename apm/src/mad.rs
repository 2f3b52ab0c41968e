//! `apm mad`: decode and encode management datagrams.

use anyhow::bail;

/// `apm mad` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum MadCommand {
    /// Decode a MAD given as hex.
    Decode {
        /// The MAD as hex (256 bytes; whitespace allowed).
        hex: String,
    },
}

/// Run an `apm mad` subcommand.
pub fn run(_cmd: MadCommand) -> anyhow::Result<()> {
    bail!("apm mad is not built yet")
}
