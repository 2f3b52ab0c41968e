//! `cargo xtask bench [CARGO-BENCH-ARGS]`: the project's benchmarks (criterion).
//!
//! Runs each crate's benches in turn; extra arguments go to every `cargo bench` (for
//! instance a criterion filter after `--`). Crates add themselves to [`BENCH_CRATES`].

use anyhow::Result;

/// Crates with benches, run in this order.
const BENCH_CRATES: &[&str] = &["apm-core", "ib-mad"];

/// Run the benchmarks.
pub fn main(args: &[String]) -> Result<()> {
    for krate in BENCH_CRATES {
        let mut full = vec!["bench", "-p", krate];
        full.extend(args.iter().map(String::as_str));
        crate::util::run("cargo", &full)?;
    }
    Ok(())
}
