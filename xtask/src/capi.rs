//! apm-capi's C header: cbindgen (a cargo tool, installed when missing) generates
//! `apm-capi/include/apm.h` from `apm-capi/src`; the committed header is checked
//! current by `apm-capi/tests/c_api.rs`, which needs cbindgen too.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// The cbindgen version the committed header is generated with.
const CBINDGEN_VERSION: &str = "0.29.4";

fn cbindgen_version() -> Option<String> {
    let out = Command::new("cbindgen").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Install cbindgen with `cargo install` unless it runs already.
pub fn ensure_cbindgen() -> Result<()> {
    if cbindgen_version().is_some() {
        return Ok(());
    }
    crate::util::run(
        "cargo",
        &[
            "install",
            "cbindgen",
            "--locked",
            "--version",
            CBINDGEN_VERSION,
        ],
    )?;
    if cbindgen_version().is_none() {
        bail!("cbindgen was installed but does not run (is ~/.cargo/bin on PATH?)");
    }
    Ok(())
}

/// `cargo xtask capi-header`: regenerate the header.
pub fn main(_args: &[String]) -> Result<()> {
    ensure_cbindgen()?;
    let out = Command::new("cbindgen")
        .current_dir("apm-capi")
        .args([
            "--config",
            "cbindgen.toml",
            "--crate",
            "apm-capi",
            "--quiet",
        ])
        .output()
        .context("could not run cbindgen")?;
    if !out.status.success() {
        bail!("cbindgen failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::write("apm-capi/include/apm.h", &out.stdout)
        .context("writing apm-capi/include/apm.h")?;
    println!(
        "apm-capi/include/apm.h regenerated ({})",
        cbindgen_version().unwrap_or_default()
    );
    Ok(())
}

/// Build `apm-capi/examples/rc_rxe.c` against the header and the cdylib (for the
/// hardware suite in the VM, which runs it on rxe) and return the executable's path.
/// The cdylib is found through an rpath, so `ldd` (and the VM's library copy) see it.
pub fn build_c_example() -> Result<std::path::PathBuf> {
    crate::util::run("cargo", &["build", "-p", "apm-capi"])?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::PathBuf::from("target"),
        std::path::PathBuf::from,
    );
    let dir = std::env::current_dir()?.join(target).join("debug");
    let exe = dir.join("rc_rxe");
    let status = Command::new("gcc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg("apm-capi/examples/rc_rxe.c")
        .args(["-I", "apm-capi/include", "-libverbs", "-L"])
        .arg(&dir)
        .arg("-lapm_capi")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .context("could not run gcc")?;
    if !status.success() {
        bail!("building apm-capi/examples/rc_rxe.c failed");
    }
    Ok(exe)
}
