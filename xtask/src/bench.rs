//! `cargo xtask bench [CARGO-BENCH-ARGS]`: the project's benchmarks (criterion).
//!
//! Runs each crate's benches in turn; extra arguments go to every `cargo bench` (for
//! instance a criterion filter after `--`). Crates add themselves to [`BENCH_CRATES`].

use anyhow::Result;

/// Crates with benches, run in this order.
/// provider-sim's bench is a plain harness: simulator events/s and `apm simulate` wall
/// time at 1k/10k/100k connections.
const BENCH_CRATES: &[&str] = &["apm-core", "ib-mad", "provider-sim"];

/// Run the benchmarks.
pub fn main(args: &[String]) -> Result<()> {
    for krate in BENCH_CRATES {
        let mut full = vec!["bench", "-p", krate];
        full.extend(args.iter().map(String::as_str));
        crate::util::run("cargo", &full)?;
    }
    Ok(())
}
