//! Booting the image under qemu (TCG) with one program to run: the 9p share that carries
//! the program, its libraries and its output, the guest script, the wall-clock and boot
//! limits, and the timings. What it must never do: leave a qemu running (a guard kills
//! it on every early return) or leave the share (a copy of the binary) behind.

// A driver, not the engine: it times a real VM and enforces a wall-clock timeout.
#![allow(clippy::disallowed_methods)]

use super::{copy, file_name, ldd, Image, MARK_BOOTED, MARK_DONE};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One program to run inside a fresh VM.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Host binary to run in the guest (copied to the share).
    pub binary: PathBuf,
    /// More host binaries the run uses (copied to the share as `/mnt/<name>`, with their
    /// libraries), e.g. the `apm` command the suite drives.
    pub extra_binaries: Vec<PathBuf>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Shell commands run in the guest before the binary (device set-up); a failure
    /// fails the run.
    pub setup: String,
    /// Wall-clock limit for the whole VM, boot to power-off.
    pub timeout: Duration,
    /// Boot with the patched RDMA modules (`apm.rdma=patched`) instead of the stock ones.
    pub patched_rdma: bool,
}

/// What came back from the VM.
#[derive(Debug)]
pub struct Outcome {
    /// Exit code of the run script (set-up and binary); `None` if none came back.
    pub exit_code: Option<i32>,
    /// Combined stdout and stderr of the run script.
    pub output: String,
    /// The serial console (kernel and init messages).
    pub console: String,
    pub timed_out: bool,
    /// The guest never reached its init within [`BOOT_TIMEOUT`] (qemu was killed).
    pub boot_hung: bool,
    /// qemu start to the guest's "booted" marker.
    pub boot: Option<Duration>,
    /// "booted" marker to "done" marker.
    pub run: Option<Duration>,
    /// qemu start to qemu exit.
    pub total: Duration,
}

/// A guest that has not reached init by now is stuck: TCG boots it in ~10 s (~30 s
/// with both host cores busy). Seen once in a CI run: the kernel silent after
/// "Booting from ROM..." for 300 s, with the same image that booted before and after.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Boot a VM from `image`, run `spec` inside, and power off. A boot that hangs before
/// init ([`BOOT_TIMEOUT`]) is retried once, and said so: nothing of the test had run.
pub fn run(image: &Image, spec: &RunSpec, work: &Path) -> Result<Outcome> {
    let first = run_once(image, spec, work)?;
    if !first.boot_hung {
        return Ok(first);
    }
    eprintln!(
        "hwtest --vm: the guest did not reach init within {BOOT_TIMEOUT:?} (console:\n{}); \
         booting once more",
        first.console.trim_end()
    );
    run_once(image, spec, work)
}

fn run_once(image: &Image, spec: &RunSpec, work: &Path) -> Result<Outcome> {
    let share = work.join("share");
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(share.join("lib"))?;
    let result = run_in(image, spec, work, &share);
    // The share holds a copy of the binary: never leave it behind.
    let _ = std::fs::remove_dir_all(work);
    result
}

fn run_in(image: &Image, spec: &RunSpec, work: &Path, share: &Path) -> Result<Outcome> {
    stage_share(spec, share)?;
    let start = Instant::now();
    let child = qemu_command(image, spec, share)
        .spawn()
        .context("could not start qemu-system-x86_64")?;
    let mut guard = QemuGuard(child);
    let pid = guard.0.id();

    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let stdout = guard.0.stdout.take();
    let reader = std::thread::spawn(move || {
        if let Some(out) = stdout {
            for line in BufReader::new(out).split(b'\n') {
                let Ok(line) = line else { break };
                let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                if tx.send((Instant::now(), text)).is_err() {
                    break;
                }
            }
        }
    });
    let stderr = guard.0.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    });

    let mut w = watch_console(&rx, start, spec);
    if w.boot_hung {
        eprintln!("hwtest --vm: no init after {BOOT_TIMEOUT:?}: killing qemu (pid {pid})");
    }
    if w.timed_out {
        eprintln!(
            "hwtest --vm: timeout after {:?}: killing qemu (pid {pid})",
            spec.timeout
        );
    }
    let status = if w.exited {
        // stdout closed: qemu is exiting; give it a moment, then make sure.
        wait_timeout(&mut guard.0, Duration::from_secs(10))?
    } else {
        None
    };
    if status.is_none() {
        let _ = guard.0.kill();
        let _ = guard.0.wait();
    }
    let total = start.elapsed();
    let _ = reader.join();
    while let Ok((_, line)) = rx.try_recv() {
        w.console.push_str(&line);
        w.console.push('\n');
    }
    let qemu_err = err_reader.join().unwrap_or_default();
    if !qemu_err.trim().is_empty() {
        let _ = writeln!(w.console, "[qemu stderr] {}", qemu_err.trim());
    }
    let output = std::fs::read_to_string(share.join("output.txt")).unwrap_or_default();
    let exit_code = std::fs::read_to_string(share.join("exit-code"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    // Kept for a look after a failure; one file, overwritten by the next run.
    if let Some(dir) = work.parent() {
        let _ = std::fs::write(dir.join("last-console.log"), &w.console);
    }
    Ok(Outcome {
        exit_code,
        output,
        console: w.console,
        timed_out: w.timed_out || w.boot_hung,
        boot_hung: w.boot_hung,
        boot: w.booted.map(|b| b - start),
        run: w
            .booted
            .zip(w.done)
            .map(|(b, d)| d.saturating_duration_since(b)),
        total,
    })
}

/// Copy the binaries and their libraries into the share and write the guest's
/// `run.sh`, which runs `spec`'s binary with its setup, environment and arguments.
fn stage_share(spec: &RunSpec, share: &Path) -> Result<()> {
    let bin_name = file_name(&spec.binary);
    for bin in std::iter::once(&spec.binary).chain(&spec.extra_binaries) {
        copy(bin, &share.join(file_name(bin)))?;
        // The binary's libraries go to the share (the image only has what its own tools
        // need, e.g. no libgcc_s); the dynamic loader is in the image already.
        for lib in ldd(bin)? {
            let name = file_name(&lib);
            if !name.starts_with("ld-linux") {
                copy(&lib, &share.join("lib").join(name))?;
            }
        }
    }
    let mut script = String::from(
        "set -e\n\
         export PATH=/bin:/usr/bin:/usr/sbin\n\
         export LD_LIBRARY_PATH=/mnt/lib:/usr/lib/x86_64-linux-gnu\n\
         export HOME=/tmp RUST_BACKTRACE=1\n\
         cd /tmp\n",
    );
    script.push_str(&spec.setup);
    script.push('\n');
    for (k, v) in &spec.env {
        let _ = writeln!(script, "export {k}={}", shell_quote(v));
    }
    let _ = write!(script, "exec /mnt/{}", shell_quote(&bin_name));
    for a in &spec.args {
        let _ = write!(script, " {}", shell_quote(a));
    }
    script.push('\n');
    std::fs::write(share.join("run.sh"), script)?;
    Ok(())
}

/// qemu booting `image` with the share mounted, console on stdout.
fn qemu_command(image: &Image, spec: &RunSpec, share: &Path) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    // TCG, not KVM: the build machines are themselves guests with a `/dev/kvm` that
    // creates VMs and vCPUs, but a guest kernel on it never got past its decompressor
    // (90 s, with `-cpu host` and `-cpu max` alike), and an accelerator that hangs the
    // boot costs the whole boot timeout. A probe that starts an empty KVM machine passes
    // there, so it cannot tell.
    cmd.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-smp",
        "2",
        "-m",
        "1024",
    ])
    .args(["-nographic", "-no-reboot", "-nic", "none"])
    .arg("-kernel")
    .arg(&image.kernel)
    .arg("-initrd")
    .arg(&image.initramfs)
    .arg("-append")
    .arg(if spec.patched_rdma {
        "console=ttyS0 panic=-1 quiet apm.rdma=patched"
    } else {
        "console=ttyS0 panic=-1 quiet"
    })
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag=share,security_model=none,id=share",
        share.display()
    ))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// What the console showed until the guest finished, hung or ran out of time.
struct ConsoleWatch {
    console: String,
    booted: Option<Instant>,
    done: Option<Instant>,
    timed_out: bool,
    boot_hung: bool,
    exited: bool,
}

/// Read console lines until qemu closes stdout, the run's timeout passes, or the guest
/// has not booted within [`BOOT_TIMEOUT`].
fn watch_console(
    rx: &mpsc::Receiver<(Instant, String)>,
    start: Instant,
    spec: &RunSpec,
) -> ConsoleWatch {
    let deadline = start + spec.timeout;
    let mut w = ConsoleWatch {
        console: String::new(),
        booted: None,
        done: None,
        timed_out: false,
        boot_hung: false,
        exited: false,
    };
    loop {
        let now = Instant::now();
        if now >= deadline {
            w.timed_out = true;
            break;
        }
        if w.booted.is_none() && now >= start + BOOT_TIMEOUT.min(spec.timeout) {
            w.boot_hung = true;
            break;
        }
        match rx.recv_timeout((deadline - now).min(Duration::from_millis(200))) {
            Ok((at, line)) => {
                if line.contains(MARK_BOOTED) && w.booted.is_none() {
                    w.booted = Some(at);
                }
                if line.contains(MARK_DONE) && w.done.is_none() {
                    w.done = Some(at);
                }
                w.console.push_str(&line);
                w.console.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                w.exited = true;
                break;
            }
        }
    }
    w
}

/// Kills qemu if it is still running when the runner returns early.
struct QemuGuard(Child);

impl Drop for QemuGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Result<Option<std::process::ExitStatus>> {
    let until = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `s` as one single-quoted shell word.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
