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
    if Command::new("apt-get").arg("--version").output().is_err() {
        bail!("tshark is missing and this machine has no apt-get: install tshark by hand");
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let sudo: &[&str] = if root { &[] } else { &["sudo", "-n"] };
    let env = [("DEBIAN_FRONTEND", "noninteractive")];
    let apt = |args: &[&str]| {
        let mut full: Vec<&str> = sudo.to_vec();
        full.push("apt-get");
        // Other installers may hold the dpkg lock for a while (CI installs in parallel).
        full.extend(["-o", "DPkg::Lock::Timeout=300"]);
        full.extend(args);
        crate::util::run_env(full[0], &full[1..], &env)
    };
    // The package lists may be stale or absent on a fresh machine: update first; one
    // retry covers a lists lock held by a concurrent `apt-get update`.
    if apt(&["update", "-qq"]).is_err() {
        std::thread::sleep(std::time::Duration::from_secs(10));
        apt(&["update", "-qq"])?;
    }
    apt(&["install", "-y", "-qq", "tshark"])?;
    if !tshark_runs() {
        bail!("tshark was installed but does not run");
    }
    Ok(())
}
