//! The `apm` command line: one binary, one subcommand per face of the toolkit.
//!
//! Subcommand modules own their arguments (`clap::Args`) and their output; this file only
//! dispatches and sets up logging. Errors reach the user through `anyhow` with context,
//! and every subcommand exits non-zero on failure.
#![forbid(unsafe_code)]

mod config_cmd;
mod mad;
mod pingpong;
mod run;
mod simulate;
mod watch;

use clap::{Parser, Subcommand};

/// Keeps InfiniBand and RoCE RC connections alive when a path fails.
#[derive(Debug, Parser)]
#[command(name = "apm", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `apm_core=debug`. Logs go to stderr.
    #[arg(long, global = true, env = "APM_LOG", default_value = "warn")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a fault scenario on the built-in simulated fabric, apm against baselines.
    Simulate(simulate::Args),
    /// Decode or encode management datagrams (SA, CM LAP/APR/MRA, vendor class).
    #[command(subcommand)]
    Mad(mad::MadCommand),
    /// Check a deployment configuration file.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// RC ping-pong protected by apm: counts what a path failure costs (real devices).
    #[command(long_about = pingpong::LONG_ABOUT)]
    Pingpong(pingpong::Args),
    /// Watch port and fabric events (port up/down, LID/SM changes, SA traps 64/65).
    Watch(watch::Args),
    /// Run an unmodified verbs program with its RC connections protected (LD_PRELOAD).
    Run(run::Args),
    /// This host's agent for `apm run` (started on demand by `apm run`).
    Agent(run::AgentArgs),
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Mad(cmd) => mad::run(cmd),
        Command::Pingpong(args) => pingpong::run(args),
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Watch(args) => watch::run(args),
        Command::Run(args) => run::run(args),
        Command::Agent(args) => run::agent(args),
    };
    if let Err(err) = result {
        eprintln!("apm: {err:#}");
        std::process::exit(1);
    }
}
