//! The command line's standard output and error, without panics.
//!
//! `println!` panics when standard output is a closed pipe (`apm mad encode lap | head
//! -1`), and `eprintln!` when standard error is. Subcommands print through [`outln!`]
//! and [`out!`], which return an error instead: a closed standard output becomes
//! [`StdoutClosed`], which `main` turns into the quiet end every Unix filter has (killed
//! by SIGPIPE, status 141 in a shell), after the subcommand has cleaned up. Messages to
//! standard error go through [`errln!`], which drops them if standard error is gone.
//! Nothing here is for data files: only the process's own standard streams.

use std::fmt;
use std::io::Write;

/// Standard output was closed by its reader: nothing more can be shown.
#[derive(Debug, thiserror::Error)]
#[error("standard output is closed")]
pub struct StdoutClosed;

/// Write `args` to standard output and flush (so a closed pipe is seen at once).
pub fn write_out(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
            _ => anyhow::Error::new(e).context("writing to standard output"),
        })
}

/// Write `args` to standard error, best effort: with standard error gone there is
/// nowhere left to complain to.
pub fn write_err(args: fmt::Arguments<'_>) {
    // After what was logged before it, as it happened.
    crate::log_writer::flush();
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.flush());
}

/// True when `err` (or anything in its chain) is [`StdoutClosed`].
pub fn is_stdout_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StdoutClosed>())
}

/// End the process as a closed pipe ends any Unix filter: by SIGPIPE's default action.
pub fn die_of_sigpipe() -> ! {
    crate::log_writer::flush();
    // Rust ignores SIGPIPE at start-up; restoring the default and raising it ends the
    // process the way `yes | head -1` ends `yes`. Should that not happen, the status a
    // shell would have shown.
    let _ = signal_hook::low_level::emulate_default_handler(signal_hook::consts::SIGPIPE);
    std::process::exit(128 + signal_hook::consts::SIGPIPE)
}

/// `println!` that returns `anyhow::Result<()>` ([`StdoutClosed`] on a closed pipe).
macro_rules! outln {
    () => { $crate::out::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that returns `anyhow::Result<()>`.
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write_out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::out::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
