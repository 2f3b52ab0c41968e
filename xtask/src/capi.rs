//! apm-capi's C header: cbindgen (a cargo tool, installed when missing) generates
//! `apm-capi/include/apm.h` from `apm-capi/src/lib.rs`; the committed header is checked
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
