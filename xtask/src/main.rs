//! `cargo xtask`: the project's automation, one binary with subcommands.
//!
//! `cargo xtask test` is the whole check that CI runs (`.ci/run` calls it): formatting,
//! clippy, rustdoc, every unit/integration test, and the real-peer beds. It installs what
//! those need on a Debian machine and starts what they need. It never touches anything
//! outside the repository except installing packages and cargo tools.
#![forbid(unsafe_code)]

mod apt;
mod bench;
mod bench_failover;
mod capi;
mod chaos;
mod codegen;
mod deb;
mod fuzz;
mod hwtest;
mod ibsim;
mod kernel;
mod tshark;
mod util;
mod vm;
mod vmsuite;

use anyhow::{bail, Result};

const HELP: &str = "\
cargo xtask <COMMAND>

Commands:
  test      everything CI checks: fmt, clippy, docs, all tests, the real-peer beds
  hwtest    the hardware suite on this machine's RDMA devices, or in a VM with --vm
  deb       the Debian package apm into target/debian/, checked by lintian;
            --install-check: also installed here, used and purged (as `test` does)
  codegen   regenerate provider-verbs' libibverbs bindings from rdma-core's headers
  capi-header  regenerate apm-capi/include/apm.h (cbindgen, installed when missing)
  ibsim     the OpenSM-over-ibsim bed: [--shell] [TEST-NAME-FILTER]
  bench     the benchmarks (criterion): cargo bench per crate, extra args passed on;
            `bench apm-run`: apm run's overhead (perftest) in the VM;
            `bench failover [--reps N] [--probe MS,N] [--idle] [--json]`: apm vs bonding in the VM
  chaos     the simulator's long chaos run: [--seeds N (10000)] [--start S]
  fuzz      the fuzz targets, every reader of outside input: [--seconds N] [TARGET...] (cargo-fuzz)
  help      this text
";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_else(|| "help".into());
    let rest: Vec<String> = args.collect();
    util::chdir_to_workspace_root()?;
    match cmd.as_str() {
        "test" => test(&rest),
        "hwtest" => hwtest::main(&rest),
        "codegen" => codegen::main(&rest),
        "deb" => deb::main(&rest),
        "capi-header" => capi::main(&rest),
        "ibsim" => ibsim::ibsim(&rest),
        "bench" => bench::main(&rest),
        "chaos" => chaos::main(&rest),
        "fuzz" => fuzz::main(&rest),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n\n{HELP}"),
    }
}

/// The README's test command: every check, in the order that fails fastest.
fn test(_args: &[String]) -> Result<()> {
    util::run("cargo", &["fmt", "--all", "--", "--check"])?;
    util::run(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    util::run_env(
        "cargo",
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    // ib-mad's wire-layout proof runs tshark (and fails without it in CI).
    tshark::ensure_installed()?;
    // provider-verbs' layout and freshness tests need rdma-core's headers; the VM run
    // below needs qemu and the guest userspace: install them first.
    vm::ensure_host_packages()?;
    // apm-capi's test checks the committed C header against cbindgen's output.
    capi::ensure_cbindgen()?;
    util::run("cargo", &["test", "--workspace"])?;
    // The Debian package: built, lintian-clean, installed here, used from its installed
    // paths and purged again.
    let deb = deb::build()?;
    deb::lintian(&deb)?;
    deb::install_check(&deb)?;
    // Real peers: OpenSM over ibsim (installs its Debian packages when missing).
    ibsim::ibsim(&[])?;
    // Real rxe devices: the hardware suite in a qemu VM (about 17 minutes on 2 cores,
    // most of it unmodified programs under `apm run` across rail cuts; the limit leaves
    // room for a slower machine, inside CI's own).
    hwtest::main(&["--vm".to_owned(), "--timeout".to_owned(), "2400".to_owned()])?;
    Ok(())
}
