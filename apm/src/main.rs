//! The `apm` command line: one binary, one subcommand per face of the toolkit.
//!
//! Subcommand modules own their arguments (`clap::Args`) and their output; this file only
//! dispatches and sets up logging. Errors reach the user through `anyhow` with context,
//! and every subcommand exits non-zero on failure. No subcommand prints with `println!`
//! (it panics on a closed pipe): output goes through [`out`], and a closed standard
//! output ends the process as SIGPIPE ends any filter, quietly.
#![forbid(unsafe_code)]

mod config_cmd;
mod generate;
mod log_writer;
mod mad;
mod out;
mod pingpong;
mod run;
mod service;
mod signals;
mod simulate;
mod status_cmd;
mod values;
mod watch;

use clap::{Parser, Subcommand};

/// How every subcommand exits (`apm run` and `apm agent` say more in their help).
const EXIT_STATUS_HELP: &str = "\
Exit status (every subcommand):
  0        success (`apm config check`: the file is valid);
  1        a failure, said on stderr (with --json, also as {\"error\": ..., \"exit_status\": 1}
           on stdout): a refused file or option, a missing device or library, an
           invalid configuration;
  2        a usage error (an unknown option, a missing argument);
  128 + N  ended by signal N (`apm watch` ends its --exec hooks first), 141 for a
           closed standard output (SIGPIPE).
`apm run` exits with its program's status (and 1, 126, 127 of its own: `apm run --help`).";

/// Keeps InfiniBand and RoCE RC connections alive when a path fails.
#[derive(Debug, Parser)]
#[command(name = "apm", version, about, long_about = None, after_help = EXIT_STATUS_HELP)]
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
    #[command(after_help = EXIT_STATUS_HELP)]
    Simulate(simulate::Args),
    /// Decode or encode management datagrams (SA, CM LAP/APR/MRA, vendor class).
    #[command(subcommand)]
    #[command(after_help = EXIT_STATUS_HELP)]
    Mad(mad::MadCommand),
    /// Check a deployment configuration file.
    #[command(subcommand)]
    #[command(after_help = EXIT_STATUS_HELP)]
    Config(config_cmd::ConfigCommand),
    /// RC ping-pong protected by apm: counts what a path failure costs (real devices).
    #[command(long_about = pingpong::LONG_ABOUT, after_help = EXIT_STATUS_HELP)]
    Pingpong(pingpong::Args),
    /// Watch port and fabric events (port up/down, LID/SM changes, SA traps 64/65).
    #[command(after_help = EXIT_STATUS_HELP)]
    Watch(watch::Args),
    /// Run an unmodified verbs program with its RC connections protected (LD_PRELOAD).
    Run(run::Args),
    /// This host's agent for `apm run` (started on demand by `apm run`, or as the
    /// apm-agent service).
    Agent(run::AgentArgs),
    /// What the host's agent and the processes under apm are doing now.
    Status(status_cmd::Args),
    /// The manual pages, shell completions and default configuration (packaging).
    #[command(subcommand, hide = true)]
    Generate(generate::Generate),
}

/// Logs to the journal, with their fields, when standard error is the journal's stream
/// (`apm agent` as a systemd service); else to standard error.
fn init_logs(filter: &str) {
    use tracing_subscriber::prelude::*;
    let filter = || tracing_subscriber::EnvFilter::new(filter);
    if service::stderr_is_journal() {
        if let Ok(journal) = tracing_journald::layer() {
            tracing_subscriber::registry()
                .with(filter())
                .with(journal.with_syslog_identifier("apm".to_owned()))
                .init();
            return;
        }
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter())
        // Colours for a person at a terminal, plain text for a pipe or a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // Lines go out from a writer thread, so that a slow or stuck standard error never
    // holds up a failover (see `log_writer`); written in place if it cannot start.
    match log_writer::LogWriter::start() {
        Ok(writer) => {
            log_writer::set_global(&writer);
            logs.with_writer(writer).init();
        }
        Err(_) => logs.with_writer(std::io::stderr).init(),
    }
}

/// The longest line of an error message printed (characters).
const ERROR_LINE_MAX: usize = 400;

/// Whether the command line asks for JSON output (`--json` before any `--`; `apm mad
/// encode --json` names its input, not its output): then every error is also one JSON
/// object on standard output, so that a machine reading it learns of the failure.
fn json_output() -> bool {
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .collect();
    let encode = args.windows(2).any(|w| w[0] == "mad" && w[1] == "encode");
    !encode && args.iter().any(|a| a == "--json")
}

/// Say `message` as the JSON error object `--json` commands end with.
fn json_error(message: &str, exit_status: i32) {
    let object = serde_json::json!({ "error": message, "exit_status": exit_status });
    let _ = out::outln!("{object}");
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if json_output() && e.use_stderr() {
                json_error(e.to_string().trim_end(), e.exit_code());
            }
            e.exit()
        }
    };
    init_logs(&cli.log);
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Mad(cmd) => mad::run(cmd),
        Command::Pingpong(args) => pingpong::run(args),
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Watch(args) => watch::run(args),
        Command::Run(args) => run::run(args),
        Command::Agent(args) => run::agent(args),
        Command::Status(args) => status_cmd::run(args),
        Command::Generate(what) => generate::run(what, <Cli as clap::CommandFactory>::command()),
    };
    // What was logged comes out before anything said below, and before exit.
    log_writer::flush();
    if let Err(err) = result {
        if out::is_stdout_closed(&err) {
            out::die_of_sigpipe();
        }
        // An error may quote its input (a TOML line, a value): each line is cut so that
        // a megabyte of input does not come back as a megabyte of message.
        let text = message(&err);
        for line in format!("apm: {text}").lines() {
            out::errln!("{}", apm::input::truncate_echo(line, ERROR_LINE_MAX));
        }
        if json_output() {
            json_error(&apm::input::truncate_echo(&text, 4 * ERROR_LINE_MAX), 1);
        }
        std::process::exit(1);
    }
}

/// `err` and its causes, `: `-separated, leaving out a cause its error already says
/// (most errors here print their source: "cannot read FILE: No such file", whose
/// source is that "No such file" again).
fn message(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_said_is_not_said_again() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(apm::input::InputError::Io {
            what: "/nope".into(),
            source: io,
        })
        .context("in the config");
        assert_eq!(
            super::message(&e),
            "in the config: cannot read /nope: No such file"
        );
    }
}
