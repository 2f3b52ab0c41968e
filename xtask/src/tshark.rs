//! tshark for ib-mad's wire-layout proof (`ib-mad/tests/tshark.rs`): installed from
//! Debian when missing, before the tests run. The test fails in CI without it.

use anyhow::{bail, Result};
use std::process::Command;

fn tshark_runs() -> bool {
    Command::new("tshark")
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Install the Debian `tshark` package unless tshark already runs. Non-interactive:
/// the package otherwise asks a debconf question (non-root packet capture).
pub fn ensure_installed() -> Result<()> {
    if tshark_runs() {
        return Ok(());
    }
    crate::apt::ensure(&["tshark"], "ib-mad's tshark test")?;
    if !tshark_runs() {
        bail!("tshark was installed but does not run");
    }
    Ok(())
}
