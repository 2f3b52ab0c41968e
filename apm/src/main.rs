//! The `apm` command line.
#![forbid(unsafe_code)]

fn main() {
    eprintln!("apm: no subcommands yet");
    std::process::exit(2);
}
