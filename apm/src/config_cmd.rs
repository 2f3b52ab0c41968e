//! `apm config check FILE`: validate a deployment configuration and say exactly where
//! it is wrong.

use crate::out::{errln, outln};
use anyhow::bail;
use apm::config::{Config, LapTransport};
use apm::input::CONFIG_LIMIT;

/// `apm config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Check a TOML configuration: syntax, unknown keys, values, combinations.
    ///
    /// Prints a summary when it is valid; otherwise every problem with its line and
    /// column, and exits with status 1.
    Check {
        /// The file to check.
        file: std::path::PathBuf,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Run an `apm config` subcommand.
pub fn run(cmd: ConfigCommand) -> anyhow::Result<()> {
    let ConfigCommand::Check { file, json } = cmd;
    let text = apm::input::read_file(&file, CONFIG_LIMIT, "a configuration file")?;
    match Config::parse(&text) {
        Ok(config) => {
            let transport = match config.lap_transport() {
                LapTransport::Vendor => "vendor",
                LapTransport::Cm => "cm",
                LapTransport::Udp => "udp",
            };
            if json {
                let doc = serde_json::json!({
                    "file": file.display().to_string(),
                    "valid": true,
                    "devices": config.devices.iter().map(|d| d.name.get_ref().clone()).collect::<Vec<_>>(),
                    "lap_transport": transport,
                    "policy": config.engine_policy(),
                });
                outln!("{doc}")?;
            } else {
                outln!("{}: valid", file.display())?;
                for d in &config.devices {
                    outln!("  device {} ({:?})", d.name.get_ref(), d.provider.get_ref())?;
                }
                outln!("  LAP/APR transport: {transport}")?;
            }
            Ok(())
        }
        Err(errors) => {
            if json {
                let doc = serde_json::json!({
                    "file": file.display().to_string(),
                    "valid": false,
                    "errors": errors,
                });
                outln!("{doc}")?;
            } else {
                for e in &errors {
                    errln!("{}:{e}", file.display());
                }
            }
            bail!("{} problem(s) in {}", errors.len(), file.display())
        }
    }
}
