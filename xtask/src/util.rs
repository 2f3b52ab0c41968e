//! Small process helpers shared by the xtask commands.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// Run from the workspace root whatever directory `cargo xtask` was started in.
pub fn chdir_to_workspace_root() -> Result<()> {
    let root = workspace_root();
    std::env::set_current_dir(&root).with_context(|| format!("cd {}", root.display()))
}

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

/// Run a command, echoing it, and fail if it fails.
pub fn run(program: &str, args: &[&str]) -> Result<()> {
    run_env(program, args, &[])
}

/// Run a command with extra environment variables, echoing it, and fail if it fails.
pub fn run_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    eprintln!("$ {} {}", program, args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("could not start {program}"))?;
    if !status.success() {
        bail!("`{} {}` failed: {status}", program, args.join(" "));
    }
    Ok(())
}

/// A spawned command's status as a result: `what` names it in the error.
pub fn check_status(status: std::io::Result<std::process::ExitStatus>, what: &str) -> Result<()> {
    let status = status.with_context(|| format!("could not start {what}"))?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

/// FNV-1a, 64 bit: a content hash for the cache key (no crypto needed, no dependency).
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv::new()
    }
}

impl Fnv {
    pub fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub fn write(&mut self, data: &[u8]) {
        for b in data {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate fields so that ("ab","c") and ("a","bc") differ.
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }
    pub fn finish(&self) -> u64 {
        self.0
    }
}
