//! `cargo xtask chaos [--seeds N] [--start S]`: the long chaos campaign of the simulated
//! fabric (default 10,000 seeds from 0), in release mode, every seed run twice with the
//! invariants checked after every step. The test suite runs the first 200 seeds; this
//! is the same test with more seeds. A failing seed is printed with the command that
//! replays it alone.

use anyhow::{bail, Context, Result};

/// Run the campaign.
pub fn main(args: &[String]) -> Result<()> {
    let mut seeds: u64 = 10_000;
    let mut start: u64 = 0;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            it.next()
                .with_context(|| format!("{name} needs a number"))?
                .parse()
                .with_context(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--seeds" => seeds = value("--seeds")?,
            "--start" => start = value("--start")?,
            other => bail!("unknown argument {other:?} (use --seeds N --start S)"),
        }
    }
    let (n, s) = (seeds.to_string(), start.to_string());
    crate::util::run_env(
        "cargo",
        &[
            "test",
            "--release",
            "-p",
            "provider-sim",
            "--test",
            "chaos",
            "--",
            "--nocapture",
        ],
        &[("APM_SIM_SEEDS", &n), ("APM_SIM_SEED_START", &s)],
    )
}
