//! `cargo xtask bench [CARGO-BENCH-ARGS]`: the project's benchmarks (criterion);
//! `cargo xtask bench apm-run`: `apm run`'s overhead on real rxe in the VM;
//! `cargo xtask bench failover`: apm against Linux bonding on real rxe in the VM.
//!
//! Runs each crate's benches in turn; extra arguments go to every `cargo bench` (for
//! instance a criterion filter after `--`). Crates add themselves to [`BENCH_CRATES`].

use anyhow::Result;

/// Crates with benches, run in this order.
/// provider-sim's bench is a plain harness: on the 4,096-host fat-tree scenario at
/// 10k/100k/1M connections, simulator events/s and bytes per connection, and the wall
/// and CPU time and peak memory of `apm simulate`'s three policies.
const BENCH_CRATES: &[&str] = &["apm-core", "ib-mad", "provider-sim"];

/// Run the benchmarks. `apm-run` instead runs the `apm run` overhead benchmark in the
/// VM (ib_write_bw and ib_send_lat with and without `apm run`, no fault).
pub fn main(args: &[String]) -> Result<()> {
    if args.first().map(String::as_str) == Some("failover") {
        return crate::bench_failover::main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("apm-run") {
        let vm = [
            "--vm",
            "--timeout",
            "900",
            "--filter",
            "bench_apm_run",
            "--env",
            "APM_BENCH=1",
        ];
        return crate::hwtest::main(&vm.map(String::from));
    }
    for krate in BENCH_CRATES {
        let mut full = vec!["bench", "-p", krate];
        full.extend(args.iter().map(String::as_str));
        crate::util::run("cargo", &full)?;
    }
    Ok(())
}
