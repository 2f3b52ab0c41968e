//! Installing Debian packages that the tests and beds need, the one way they all use:
//! only what is missing, non-interactively (tshark's package asks a debconf question
//! otherwise), as root or through `sudo -n` (fails rather than prompts), with the lists
//! updated first (a fresh machine has none) and the dpkg lock waited for.

use anyhow::{bail, Result};
use std::process::Command;

/// The packages of `wanted` that dpkg does not report as installed.
pub fn missing<'a>(wanted: &[&'a str]) -> Vec<&'a str> {
    wanted
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect()
}

/// The installed version of `package`, if dpkg reports it installed.
fn installed_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}\t${Version}", package])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (status, version) = text.split_once('\t')?;
    status
        .contains("install ok installed")
        .then(|| version.trim().to_owned())
}

/// Install each `(package, version)` at exactly that version unless it is installed so
/// (the kernel source and headers must be the guest kernel's own).
pub fn ensure_exact(wanted: &[(&str, &str)]) -> Result<()> {
    let specs: Vec<String> = wanted
        .iter()
        .filter(|(p, v)| installed_version(p).as_deref() != Some(*v))
        .map(|(p, v)| format!("{p}={v}"))
        .collect();
    if specs.is_empty() {
        return Ok(());
    }
    let refs: Vec<&str> = specs.iter().map(String::as_str).collect();
    install(
        &refs,
        "the patched RDMA modules (version-locked to the VM kernel)",
    )
}

/// Install whatever of `wanted` is missing; `why` names the user of the packages for
/// the error when this machine cannot install them.
pub fn ensure(wanted: &[&str], why: &str) -> Result<()> {
    let missing = missing(wanted);
    if missing.is_empty() {
        return Ok(());
    }
    install(&missing, why)
}

/// `apt-get install` these package specs (names, or `name=version`).
fn install(missing: &[&str], why: &str) -> Result<()> {
    if Command::new("apt-get").arg("--version").output().is_err() {
        bail!("{why} needs the Debian packages {missing:?} and this machine has no apt-get");
    }
    eprintln!("{why}: installing {}", missing.join(" "));
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
        full.extend(["-o", "DPkg::Lock::Timeout=300"]);
        full.extend(args);
        crate::util::run_env(full[0], &full[1..], &env)
    };
    // One retry covers a lists lock held by a concurrent `apt-get update`.
    if apt(&["update", "-qq"]).is_err() {
        std::thread::sleep(std::time::Duration::from_secs(10));
        apt(&["update", "-qq"])?;
    }
    let mut cmd = vec!["install", "-y", "-qq", "--no-install-recommends"];
    cmd.extend(missing.iter().copied());
    apt(&cmd)
}
