//! `cargo xtask hwtest`: the hardware suite (`provider-verbs/tests/hw.rs`) on real RDMA
//! devices — the ones of this machine, or a soft-RoCE pair in a qemu VM with `--vm`.
//!
//! The suite is a test binary built on the host; its tests are `#[ignore]`d so that a plain
//! `cargo test` never touches devices, and this command runs them with `--ignored`.
//! Natively it never changes the machine's links (toggling a real port could cut a user
//! off); inside the VM it may, because the devices there are its own.

// A driver, not the engine: it times a real VM and enforces a wall-clock timeout.
#![allow(clippy::disallowed_methods)]

use crate::vm;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const HELP: &str = "\
cargo xtask hwtest [--vm] [--patched] [--timeout SECS] [--filter NAME] [--env K=V]
                   [--release] [--run PROGRAM [ARGS...]]

Runs provider-verbs' hardware suite (tests/hw.rs) on the RDMA devices of this machine,
skipping with a message when there are none.

  --vm              boot a stock Debian kernel under qemu (TCG) with two soft-RoCE devices
                    (rxe0 on veth vA, rxe1 on its peer vB) and run the suite inside: on the
                    stock rdma_rxe, then on the APM-capable modules of kernel/rxe-apm
                    (their own test, then the suite's hardware-APM tests)
  --patched         with --vm: boot with the APM-capable RDMA modules (kernel/rxe-apm)
                    instead of the stock ones (the suite: its second phase alone)
  --timeout SECS    wall-clock limit for the VM, boot to power-off (default 1200)
  --filter NAME     only the suite's tests whose names contain NAME (repeatable; in the
                    VM, in both phases)
  --env K=V         with --vm: set K=V for the suite in the guest
  --release         build the suite, apm and its preload library optimised (cargo's
                    release profile) instead of the dev profile: what a benchmark
                    measures (the dev profile's unoptimised code costs every step of a
                    failover several times over under emulation)
  --run PROGRAM ... with --vm: run this host program in the VM instead of the suite
";

/// Guest set-up for the suite: a veth pair with an rxe device on each end. DAD is off so
/// the IPv6 link-local addresses (the GIDs the suite uses) exist as soon as links are up.
const VM_SETUP: &str = "\
echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
/usr/bin/ip link set lo up
/usr/bin/ip link add vA type veth peer name vB
/usr/bin/ip link set vA up
/usr/bin/ip link set vB up
/usr/bin/rdma link add rxe0 type rxe netdev vA
/usr/bin/rdma link add rxe1 type rxe netdev vB
";

pub fn main(args: &[String]) -> Result<()> {
    let mut use_vm = false;
    let mut patched = false;
    let mut timeout = Duration::from_secs(1200);
    let mut program: Option<Vec<String>> = None;
    let mut filter: Vec<String> = Vec::new();
    let mut env: Vec<(String, String)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--vm" => use_vm = true,
            "--release" => RELEASE.store(true, Ordering::Relaxed),
            "--patched" => patched = true,
            "--timeout" => {
                let v = it.next().context("--timeout needs a number of seconds")?;
                timeout = Duration::from_secs(v.parse().context("--timeout SECS")?);
            }
            "--filter" => filter.push(it.next().context("--filter needs a test name")?.clone()),
            "--env" => {
                let kv = it.next().context("--env needs K=V")?;
                let (k, v) = kv.split_once('=').context("--env needs K=V")?;
                env.push((k.to_owned(), v.to_owned()));
            }
            "--run" => {
                program = Some(it.by_ref().cloned().collect());
            }
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            other => bail!("unknown hwtest argument {other:?}\n\n{HELP}"),
        }
    }
    if use_vm {
        in_vm(program, timeout, patched, &filter, env)
    } else {
        if program.is_some() || patched {
            bail!("--run and --patched only make sense with --vm");
        }
        native()
    }
}

/// The suite on this machine's own devices.
fn native() -> Result<()> {
    let devices = local_devices();
    if devices.is_empty() {
        println!(
            "hwtest: SKIPPED: this machine has no RDMA devices (/sys/class/infiniband is \
             empty or absent). Run `cargo xtask hwtest --vm` for soft-RoCE in a VM."
        );
        return Ok(());
    }
    println!("hwtest: devices: {}", devices.join(" "));
    let bin = build_suite()?;
    let apm = build_apm()?;
    let status = Command::new(&bin)
        .args(["--ignored", "--test-threads=1", "--nocapture"])
        .env("APM_HWTEST", "1")
        .env("APM_BIN", &apm)
        .status()
        .with_context(|| format!("could not run {}", bin.display()))?;
    if !status.success() {
        bail!("hwtest failed: {status}");
    }
    Ok(())
}

fn local_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The suite inside a fresh VM.
fn in_vm(
    program: Option<Vec<String>>,
    timeout: Duration,
    patched: bool,
    filter: &[String],
    more_env: Vec<(String, String)>,
) -> Result<()> {
    let t0 = Instant::now();
    vm::ensure_host_packages()?;
    let prepare_start = Instant::now();
    // Absolute: the initramfs is packed from inside its staging directory.
    let vm_dir = std::env::current_dir()?.join("target").join("vm");
    let kernel = vm::guest_kernel(&vm_dir)?;
    let modules = crate::kernel::prepare(&vm_dir, &kernel)?;
    let image = vm::prepare_image(&vm_dir, &kernel, &modules)?;
    let prepare = prepare_start.elapsed();
    let suite = program.is_none();
    let (binary, args, env, extra) = match program {
        Some(p) => {
            let Some((first, rest)) = p.split_first() else {
                bail!("--run needs a program");
            };
            (which(first)?, rest.to_vec(), Vec::new(), Vec::new())
        }
        None => suite_run(&vm_dir, &modules.key, patched, filter)?,
    };
    let env = env.into_iter().chain(more_env).collect();
    let spec = vm::RunSpec {
        binary,
        extra_binaries: extra,
        args,
        env,
        setup: VM_SETUP.to_owned(),
        timeout,
        patched_rdma: patched,
    };
    let work = vm_dir.join(format!("run-{}", std::process::id()));
    let out = vm::run(&image, &spec, &work)?;
    print!("{}", out.output);
    // A caller that reads the output (`bench failover`) names a file for it.
    if let Some(path) = std::env::var_os("APM_VM_OUTPUT") {
        std::fs::write(&path, &out.output)
            .with_context(|| format!("writing {}", std::path::Path::new(&path).display()))?;
    }
    let ok = out.exit_code == Some(0) && !out.timed_out;
    if !ok {
        eprintln!("---- guest console ----\n{}----", out.console);
    }
    let fmt =
        |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()));
    println!(
        "hwtest --vm: kernel {}; image {:.1}s, boot {}, run {}, VM total {:.1}s, all {:.1}s",
        image.kernel_version,
        prepare.as_secs_f64(),
        fmt(out.boot),
        fmt(out.run),
        out.total.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    if suite && !patched && filter.is_empty() {
        match crate::vmsuite::figure(&out.output) {
            Ok(f) => print!("{f}"),
            Err(e) => eprintln!("hwtest --vm: {e}"),
        }
    }
    if out.timed_out {
        bail!("hwtest --vm: the VM did not finish within {timeout:?} and was killed");
    }
    match out.exit_code {
        Some(0) => Ok(()),
        Some(c) => bail!("hwtest --vm: the run in the VM failed with exit code {c}"),
        None => bail!("hwtest --vm: the VM powered off without reporting an exit code"),
    }
}

/// Build apm-preload's own verbs program (`apm-preload/tests/c/rc_dlopen.c`) twice under
/// `vm_dir`: as NCCL loads libibverbs (`rc_dlopen`: dlopen and dlvsym, no link to it) and
/// linked to it (`rc_linked`). The first must not link libibverbs: the link fails if it
/// uses a verb it did not bind.
fn build_shim_programs(vm_dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    let dir = vm_dir.join("suite");
    std::fs::create_dir_all(&dir)?;
    let source = crate::util::workspace_root().join("apm-preload/tests/c/rc_dlopen.c");
    let mut out = Vec::new();
    for (name, how) in [
        ("rc_dlopen", &["-ldl"][..]),
        ("rc_linked", &["-DAPM_LINKED", "-libverbs"][..]),
    ] {
        let exe = dir.join(name);
        let status = Command::new("gcc")
            .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(&source)
            .args(how)
            .arg("-lpthread")
            .status();
        crate::util::check_status(status, &format!("building {name} from rc_dlopen.c"))?;
        out.push(exe);
    }
    Ok(out)
}

/// What the VM runs for the suite: the guest script, no arguments, the suite's
/// environment and every binary it uses (built here, shipped on the share).
type SuiteRun = (PathBuf, Vec<String>, Vec<(String, String)>, Vec<PathBuf>);

fn suite_run(
    vm_dir: &std::path::Path,
    modules_key: &str,
    patched: bool,
    filter: &[String],
) -> Result<SuiteRun> {
    let env = [
        ("APM_HWTEST", "1"),
        // The devices in the VM are the suite's own: it may take links down.
        ("APM_HWTEST_LINK_TOGGLE", "1"),
        // The failover tests drive `apm pingpong`, shipped next to the suite.
        ("APM_BIN", "/mnt/apm"),
        // apm-capi's C example (its own RC QPs handed to apm), shipped likewise.
        ("APM_C_EXAMPLE", "/mnt/rc_rxe"),
        // apm-preload's own verbs program, as NCCL loads libibverbs and linked.
        ("APM_SHIM_PROGRAM", "/mnt/rc_dlopen"),
        ("APM_SHIM_LINKED", "/mnt/rc_linked"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let apm = build_apm()?;
    // `apm run`'s interposition library, found beside the binary.
    let preload = build_preload(&apm)?;
    let mut bins = vec![
        fixed_name(&build_suite()?, vm_dir, "hw")?,
        apm,
        preload,
        crate::capi::build_c_example()?,
        crate::kernel::build_test(vm_dir)?,
    ];
    bins.extend(build_shim_programs(vm_dir)?);
    Ok((
        suite_script(vm_dir, modules_key, patched, filter)?,
        Vec::new(),
        env.to_vec(),
        bins,
    ))
}

/// The guest script that runs the suite's two phases (see `vmsuite`), written under
/// `vm_dir` for the share.
fn suite_script(
    vm_dir: &std::path::Path,
    modules_key: &str,
    patched: bool,
    filter: &[String],
) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = vm_dir.join("suite");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("suite.sh");
    std::fs::write(&path, crate::vmsuite::script(modules_key, patched, filter))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// A copy of `bin` named `name` under `vm_dir` (the guest script calls it by that name;
/// cargo's test binaries carry a hash).
fn fixed_name(bin: &std::path::Path, vm_dir: &std::path::Path, name: &str) -> Result<PathBuf> {
    let dir = vm_dir.join("suite");
    std::fs::create_dir_all(&dir)?;
    let to = dir.join(name);
    std::fs::copy(bin, &to)
        .with_context(|| format!("copy {} to {}", bin.display(), to.display()))?;
    Ok(to)
}

/// `--release`: the suite, apm and the preload library in cargo's release profile.
static RELEASE: AtomicBool = AtomicBool::new(false);

/// `args`, with `--release` when `--release` was asked for.
fn profiled<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if RELEASE.load(Ordering::Relaxed) {
        v.push("--release");
    }
    v
}

/// Build the suite's test binary and return its path.
fn build_suite() -> Result<PathBuf> {
    cargo_executable(
        &profiled(&["test", "-p", "provider-verbs", "--test", "hw", "--no-run"]),
        "hw",
    )
}

/// Build the `apm` command (the failover tests drive `apm pingpong`) and return its path.
fn build_apm() -> Result<PathBuf> {
    cargo_executable(&profiled(&["build", "-p", "apm", "--bin", "apm"]), "apm")
}

/// Build `apm run`'s interposition library beside the `apm` binary and return its path.
fn build_preload(apm: &std::path::Path) -> Result<PathBuf> {
    cargo(&profiled(&["build", "-p", "apm-preload"]))?;
    let lib = apm.with_file_name("libapm_preload.so");
    if !lib.is_file() {
        bail!("cargo built no {}", lib.display());
    }
    Ok(lib)
}

/// Run `cargo <args>` (JSON messages on stdout, rendered diagnostics on stderr) and
/// return what it printed on stdout, or an error if it failed.
fn cargo(args: &[&str]) -> Result<std::process::Output> {
    eprintln!("$ cargo {}", args.join(" "));
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("could not run cargo")?;
    let stderr = child.stderr.take().context("cargo's stderr")?;
    let forward = std::thread::spawn(move || forward_shortened(stderr));
    let out = child.wait_with_output().context("could not run cargo")?;
    let _ = forward.join();
    if !out.status.success() {
        bail!("`cargo {}` failed", args.join(" "));
    }
    Ok(out)
}

/// Run `cargo <args>` and return the executable of the artifact named `name`.
fn cargo_executable(args: &[&str], name: &str) -> Result<PathBuf> {
    let out = cargo(args)?;
    // One JSON object per line; the artifact names its executable. A string search keeps
    // xtask free of a JSON dependency.
    let want = format!(r#""name":"{name}""#);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if !line.contains(r#""reason":"compiler-artifact""#) || !line.contains(&want) {
            continue;
        }
        if let Some(rest) = line.split(r#""executable":""#).nth(1) {
            if let Some(path) = rest.split('"').next() {
                if !path.is_empty() {
                    return Ok(PathBuf::from(path));
                }
            }
        }
    }
    bail!("cargo did not report the {name} executable")
}

/// Copy cargo's diagnostics to our stderr, shortening lines longer than a screenful.
///
/// A failed link prints the whole linker command line (tens of kilobytes on one line)
/// before the linker's own message; CI logs that keep only part of a long output then
/// lose the message that says what went wrong. The head and tail of such a line are kept.
fn forward_shortened(from: impl std::io::Read) {
    use std::io::{BufRead, Write};
    const KEEP: usize = 300;
    let mut err = std::io::stderr().lock();
    for line in std::io::BufReader::new(from).split(b'\n') {
        let Ok(line) = line else { break };
        let text = String::from_utf8_lossy(&line);
        let chars: Vec<char> = text.chars().collect();
        let shown = if chars.len() > 3 * KEEP {
            let head: String = chars[..KEEP].iter().collect();
            let tail: String = chars[chars.len() - KEEP..].iter().collect();
            format!(
                "{head} [... {} characters left out ...] {tail}",
                chars.len() - 2 * KEEP
            )
        } else {
            text.into_owned()
        };
        let _ = writeln!(err, "{shown}");
    }
}

fn which(program: &str) -> Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(program);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("{program} not found in PATH")
}
