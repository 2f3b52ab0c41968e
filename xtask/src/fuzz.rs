//! `cargo xtask fuzz [--seconds N] [TARGET...]`: run the cargo-fuzz targets: every
//! ib-mad decoder and every other reader of outside input (the deployment
//! configuration, simulator scenarios, the peer channel's datagrams, what `apm agent`
//! reads).
//!
//! Each target in `fuzz/` runs for N seconds (default 60) with a corpus in
//! `fuzz/corpus/TARGET` (git-ignored), seeded when empty: the TOML targets with the
//! project's example files, `agent_wire` with one line of each message, the others
//! with one valid MAD of every kind (`ib-mad/examples/fuzz_seeds.rs`). Crashes land in
//! `fuzz/artifacts/`.
//! Prints the executions per target at the end. Installs cargo-fuzz when missing.
//!
//! cargo-fuzz passes `-Z` flags (sanitizers, coverage); this project has only a stable
//! toolchain, so the run sets `RUSTC_BOOTSTRAP=1`, which lets stable rustc accept them.
//! That is confined to the fuzz build; nothing else in the project relies on it.

use anyhow::{bail, Context, Result};
use std::process::Command;

const HELP: &str = "\
cargo xtask fuzz [--seconds N] [TARGET...]

Runs every fuzz target (or the ones named) for N seconds each (default 60): the ib-mad
decoders, config (apm config TOML), scenario (simulator TOML, then the simulation it
builds), peer_datagram (the peer channel's authentication and decoding, UDP and vendor
MADs), agent_wire (apm agent's hellos and Unix socket lines).
";

/// Entry point of `cargo xtask fuzz`.
pub fn main(args: &[String]) -> Result<()> {
    let mut seconds: u64 = 60;
    let mut targets: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                let v = it.next().context("--seconds needs a number")?;
                seconds = v.parse().with_context(|| format!("--seconds {v:?}"))?;
            }
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            t if !t.starts_with('-') => targets.push(t.to_string()),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    ensure_cargo_fuzz()?;
    if targets.is_empty() {
        targets = all_targets()?;
    }
    if targets.is_empty() {
        bail!("no fuzz targets found in fuzz/");
    }
    let mut summary = Vec::new();
    for t in &targets {
        let corpus = format!("fuzz/corpus/{t}");
        seed_corpus(t, &corpus)?;
        let execs = run_target(t, &corpus, seconds)?;
        eprintln!("fuzz target {t}: {execs} executions in {seconds} s, no failure");
        summary.push(format!("{t}: {execs} executions"));
    }
    println!("fuzzing done ({seconds} s per target):");
    for s in summary {
        println!("  {s}");
    }
    Ok(())
}

/// Every target `cargo fuzz list` knows.
fn all_targets() -> Result<Vec<String>> {
    let out = Command::new("cargo")
        .args(["fuzz", "list", "--fuzz-dir", "fuzz"])
        .output()
        .context("cargo fuzz list")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// An empty corpus is seeded: with the project's own files of the target's kind, or
/// with one valid MAD of every kind.
fn seed_corpus(target: &str, corpus: &str) -> Result<()> {
    let empty = std::fs::read_dir(corpus)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true);
    if !empty || seed_with_files(target, corpus)? {
        return Ok(());
    }
    crate::util::run(
        "cargo",
        &[
            "run",
            "-q",
            "-p",
            "ib-mad",
            "--example",
            "fuzz_seeds",
            "--",
            corpus,
        ],
    )
}

/// Run one target for `seconds`: the number of executions libFuzzer reports, or the
/// end of its crash report as the error.
fn run_target(target: &str, corpus: &str, seconds: u64) -> Result<String> {
    let max_time = format!("-max_total_time={seconds}");
    let args = [
        "fuzz",
        "run",
        "--fuzz-dir",
        "fuzz",
        "-O",
        target,
        corpus,
        "--",
        max_time.as_str(),
        "-print_final_stats=1",
    ];
    eprintln!("$ RUSTC_BOOTSTRAP=1 cargo {}", args.join(" "));
    let out = Command::new("cargo")
        .args(args)
        .env("RUSTC_BOOTSTRAP", "1")
        .output()
        .context("could not start cargo fuzz")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let execs = stderr
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "?".into());
    if !out.status.success() {
        // Show the end of libFuzzer's report: the crash and where its input went.
        let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
        for l in tail.into_iter().rev() {
            eprintln!("{l}");
        }
        bail!("fuzz target {target} failed after {execs} executions (see fuzz/artifacts/{target})");
    }
    Ok(execs)
}

/// One line of each kind `apm agent` reads, for `agent_wire`'s corpus.
const AGENT_SEEDS: [&str; 6] = [
    r#"{"apm_hello":"ask","gid":"::ffff:10.0.10.2"}"#,
    r#"{"apm_hello":"answer","gid":"::ffff:10.0.10.2","addrs":[]}"#,
    r#"{"op":"register","route":{"local_qpn":1,"remote_qpn":2,"peer_gids":["::ffff:10.0.10.2"],"local_gids":["::ffff:10.0.10.1"],"paths":[]}}"#,
    r#"{"op":"unregister","local_qpn":1,"remote_qpn":2}"#,
    r#"{"op":"rail_down","gid":"::ffff:10.0.20.1"}"#,
    r#"{"op":"candidates","req":3,"result":{"Err":"no apm at the peer"}}"#,
];

/// Seed the corpus of a TOML target with the project's example files of its kind;
/// false for targets that take MADs.
fn seed_with_files(target: &str, corpus: &str) -> Result<bool> {
    if target == "agent_wire" {
        std::fs::create_dir_all(corpus).with_context(|| format!("creating {corpus}"))?;
        for (i, line) in AGENT_SEEDS.iter().enumerate() {
            let path = std::path::Path::new(corpus).join(format!("seed{i}"));
            std::fs::write(&path, line).with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(true);
    }
    let dir = match target {
        "config" => "examples/config",
        "scenario" => "provider-sim/scenarios",
        _ => return Ok(false),
    };
    std::fs::create_dir_all(corpus).with_context(|| format!("creating {corpus}"))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {dir}"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "toml") {
            let name = path.file_name().context("a file name")?;
            std::fs::copy(&path, std::path::Path::new(corpus).join(name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(true)
}

fn ensure_cargo_fuzz() -> Result<()> {
    let ok = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        crate::util::run("cargo", &["install", "cargo-fuzz", "--locked"])?;
    }
    Ok(())
}
