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
    /// Prints a summary when it is valid; otherwise every problem with its line, column
    /// and key, and exits with status 1. Also checks the files it names: the `[sim]`
    /// scenario exists, the `[lap] key_file` is a usable key readable by its owner only.
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
    let parsed = Config::parse(&text).and_then(|config| {
        // What the file names outside itself: only once the file itself is sound.
        let errors = config.check_files(&text);
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(errors)
        }
    });
    match parsed {
        Ok(config) => {
            let transport = match config.lap_transport() {
                LapTransport::Vendor => "vendor",
                LapTransport::Cm => "cm",
                LapTransport::Udp => "udp",
            };
            let auth = match (
                transport,
                &config.lap.key_file,
                config.lap.require_auth.as_ref().map(|r| *r.get_ref()),
            ) {
                ("udp" | "vendor", Some(_), Some(false)) => {
                    "key_file; unauthenticated peers accepted too"
                }
                ("udp" | "vendor", Some(_), _) => "key_file; unauthenticated peers refused",
                ("udp", None, _) => {
                    "none: any host on the rail can send peer messages (set [lap] key_file)"
                }
                ("vendor", None, _) => {
                    "none: senders are named by their source LID only (set [lap] key_file)"
                }
                _ => "none (the CM class has no room for it)",
            };
            if json {
                let doc = serde_json::json!({
                    "file": file.display().to_string(),
                    "valid": true,
                    "devices": config.devices.iter().map(|d| d.name.get_ref().clone()).collect::<Vec<_>>(),
                    "lap_transport": transport,
                    "peer_authentication": auth,
                    "policy": config.engine_policy(),
                });
                outln!("{doc}")?;
            } else {
                outln!("{}: valid", file.display())?;
                for d in &config.devices {
                    outln!("  device {} ({:?})", d.name.get_ref(), d.provider.get_ref())?;
                }
                outln!("  LAP/APR transport: {transport}")?;
                outln!("  peer authentication: {auth}")?;
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
                // The document says it all: no second JSON object (main's error) after it.
                errln!("apm: {} problem(s) in {}", errors.len(), file.display());
                crate::log_writer::flush();
                std::process::exit(1);
            } else {
                for e in &errors {
                    errln!("{}:{e}", file.display());
                }
            }
            bail!("{} problem(s) in {}", errors.len(), file.display())
        }
    }
}
