//! `cargo xtask ibsim`: the OpenSM-over-ibsim test bed (docs/iba-facts.md §6).
//!
//! For every bed test it starts a fresh simulated fabric (ibsim on a dual-rail topology,
//! its console on a FIFO that this process keeps open), starts OpenSM under umad2sim,
//! waits for SUBNET UP, runs that one test with the bed described in `APM_IBSIM_*`
//! environment variables, then stops everything it started by PID. A fresh bed per test
//! because tests change the fabric (Unlink/ReLink) and because a dead ibsim client keeps
//! its slot (at most 10) until the console removes it.
//!
//! A test may stop the bed's OpenSM (SIGTERM to `APM_IBSIM_OPENSM_PID`) and start its
//! own to test an SM restart: the original stays this process's child until it is
//! reaped here, so its PID cannot be reused meanwhile; the test stops its own.
//!
//! Parallel runs are isolated: each bed has its own `IBSIM_SOCKNAME` and its own scratch
//! directory under `target/ibsim/`. This module must never leave a process running, and
//! it fails (never skips) when the bed cannot be built or a bed test does not run.
#![allow(clippy::disallowed_methods)] // a process supervisor: timeouts need the wall clock

use anyhow::{bail, Context, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian packages the bed needs, with one file each that proves the package is there.
const PACKAGES: &[(&str, &str)] = &[
    ("ibsim-utils", "/usr/bin/ibsim"),
    ("libumad2sim0", UMAD2SIM),
    ("opensm", "/usr/sbin/opensm"),
    ("infiniband-diags", "/usr/sbin/ibstat"),
    ("libibumad3", "/usr/lib/x86_64-linux-gnu/libibumad.so.3"),
    ("libibumad-dev", "/usr/include/infiniband/umad.h"),
];

/// Where Debian's libumad2sim0 puts the preload library.
const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";

/// The packages whose integration test target named `ibsim` holds bed tests.
const BED_PACKAGES: &[&str] = &["umad", "umad-sa", "cm-lap", "apm"];

/// OpenSM reaches SUBNET UP in ~0.1 s on this fabric; anything near this bound is broken.
const SUBNET_UP_TIMEOUT: Duration = Duration::from_secs(20);

/// One bed test may take this long before it is killed and reported as failed.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The node that runs OpenSM. Test clients use the others (one IsSM client per node,
/// never on OpenSM's node).
const SM_NODE: &str = "H1";
/// Nodes free for test processes (only port 1 of a node can host a client).
const CLIENT_NODES: &[&str] = &["H2", "H3", "H4"];

/// Dual rail: every host has port 1 on rail A (switch SWA) and port 2 on rail B (SWB).
/// The rails are joined by one inter-switch link so that one SM manages both (the usual
/// single-subnet dual-rail layout); paths between hosts exist on both rails.
fn topology() -> String {
    let hosts = std::iter::once(SM_NODE).chain(CLIENT_NODES.iter().copied());
    let mut swa = String::from("Switch 8 \"SWA\"\n");
    let mut swb = String::from("Switch 8 \"SWB\"\n");
    let mut hcas = String::new();
    for (i, h) in hosts.enumerate() {
        let p = i + 1;
        swa.push_str(&format!("[{p}] \"{h}\"[1]\n"));
        swb.push_str(&format!("[{p}] \"{h}\"[2]\n"));
        hcas.push_str(&format!(
            "Hca 2 \"{h}\"\n[1] \"SWA\"[{p}]\n[2] \"SWB\"[{p}]\n\n"
        ));
    }
    swa.push_str("[8] \"SWB\"[8]\n\n");
    swb.push_str("[8] \"SWA\"[8]\n\n");
    format!("# apm dual-rail test fabric (written by cargo xtask ibsim)\n{swa}{swb}{hcas}")
}

/// OpenSM options for the bed: flush the log on every line (tests and this module read
/// it live), no periodic sweep (sweeps come from trap 128 on Unlink/ReLink, which keeps
/// the timing the tests measure free of periodic noise), LMC 1 so every port has two
/// LIDs and PathRecord queries have LMC variants to return.
fn opensm_config(lmc: u8) -> String {
    format!("force_log_flush TRUE\nsweep_interval 0\nlmc {lmc}\nlog_flags 0x03\n")
}

/// Options of `cargo xtask ibsim`.
#[derive(Debug, Default)]
struct Opts {
    /// Only run bed tests whose name contains this.
    filter: Option<String>,
    /// Start the bed and wait (for manual experiments) instead of running tests.
    shell: bool,
}

/// Entry point of `cargo xtask ibsim [--shell] [FILTER]`.
pub fn ibsim(args: &[String]) -> Result<()> {
    let mut opts = Opts::default();
    for a in args {
        match a.as_str() {
            "--shell" => opts.shell = true,
            s if s.starts_with('-') => bail!("unknown option {s:?} for cargo xtask ibsim"),
            s => opts.filter = Some(s.to_owned()),
        }
    }
    ensure_packages()?;
    let root = crate::util::workspace_root();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bed_root = root.join("target").join("ibsim");
    fs::create_dir_all(&bed_root).with_context(|| format!("mkdir {}", bed_root.display()))?;

    if opts.shell {
        let bed = Bed::start(&bed_root, "shell")?;
        eprintln!("bed up; environment for test processes:");
        for (k, v) in bed.env() {
            eprintln!("export {k}={v:?}");
        }
        eprintln!("press Enter to stop the bed");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        return Ok(());
    }

    let t0 = Instant::now();
    let tests = list_tests(&target_dir)?;
    let tests: Vec<_> = tests
        .into_iter()
        .filter(|(_, t)| opts.filter.as_ref().is_none_or(|f| t.contains(f.as_str())))
        .collect();
    if tests.is_empty() {
        bail!("no bed tests found (packages {BED_PACKAGES:?}, test target `ibsim`)");
    }
    let mut failed = Vec::new();
    let mut startup = Vec::new();
    for (pkg, test) in &tests {
        let tag = test.replace("::", "-");
        let started = Instant::now();
        let bed = Bed::start(&bed_root, &tag)?;
        startup.push(started.elapsed());
        eprintln!(
            "ibsim bed {} up in {:.0} ms; running {pkg} {test}",
            bed.dir.display(),
            started.elapsed().as_secs_f64() * 1e3
        );
        let ok = run_one(pkg, test, &bed)?;
        let dir = bed.dir.clone();
        drop(bed);
        if ok {
            // Keep target/ small; a failed bed's files stay for the post-mortem.
            let _ = fs::remove_dir_all(&dir);
        } else {
            eprintln!("bed files kept in {}", dir.display());
            failed.push(format!("{pkg} {test}"));
        }
    }
    let max_start = startup.iter().max().copied().unwrap_or_default();
    eprintln!(
        "ibsim bed: {} tests, {} failed, {:.1} s total, slowest bed start {:.0} ms",
        tests.len(),
        failed.len(),
        t0.elapsed().as_secs_f64(),
        max_start.as_secs_f64() * 1e3
    );
    if !failed.is_empty() {
        bail!("bed tests failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Install the bed's Debian packages that are missing.
fn ensure_packages() -> Result<()> {
    let names: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
    crate::apt::ensure(&names, "the ibsim bed")?;
    // The bed runs the files themselves: say which one is absent if a package moved it.
    if let Some((p, f)) = PACKAGES.iter().find(|(_, f)| !Path::new(f).exists()) {
        bail!("package {p} is installed but {f} is missing");
    }
    Ok(())
}

/// Build the bed test binaries and list their tests as (package, test name).
fn list_tests(_target_dir: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let root = crate::util::workspace_root();
    for pkg in BED_PACKAGES {
        let tests = root.join(pkg).join("tests");
        if !tests.join("ibsim.rs").exists() && !tests.join("ibsim").join("main.rs").exists() {
            continue;
        }
        crate::util::run("cargo", &["test", "-p", pkg, "--test", "ibsim", "--no-run"])?;
        let o = Command::new("cargo")
            .args(["test", "-q", "-p", pkg, "--test", "ibsim", "--", "--list"])
            .stderr(Stdio::inherit())
            .output()
            .context("cargo test --list")?;
        if !o.status.success() {
            bail!("listing the bed tests of {pkg} failed");
        }
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            // `bed_node` is the entry point of the tests' child processes, not a test.
            if let Some(name) = line.strip_suffix(": test").filter(|n| *n != "bed_node") {
                out.push(((*pkg).to_owned(), name.to_owned()));
            }
        }
    }
    Ok(out)
}

/// Run one bed test against `bed`; `Ok(false)` when it failed or timed out.
fn run_one(pkg: &str, test: &str, bed: &Bed) -> Result<bool> {
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "-q", "-p", pkg, "--test", "ibsim", "--"])
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .envs(bed.env())
        // Its own process group, so that the test's node processes (grandchildren) can
        // be stopped with it whatever way the test ends.
        .process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn().context("cargo test")?;
    let group = format!("-{}", child.id());
    let deadline = Instant::now() + TEST_TIMEOUT;
    let ok = loop {
        if let Some(st) = child.try_wait()? {
            break st.success();
        }
        if Instant::now() > deadline {
            eprintln!("{pkg} {test}: timed out after {TEST_TIMEOUT:?}");
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Stragglers of a test that died without stopping its nodes (none after a clean run;
    // then `kill` finds no such group and its complaint is silenced).
    let _ = Command::new("kill")
        .args(["-KILL", "--", &group])
        .stderr(Stdio::null())
        .status();
    eprintln!(
        "{pkg} {test}: {} in {:.1} s",
        if ok { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    Ok(ok)
}

/// Numbers the beds of one run (socket names and scratch directories stay unique).
static BED_SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A running bed: ibsim and OpenSM, stopped (by PID) when dropped.
struct Bed {
    dir: PathBuf,
    sockname: String,
    console: PathBuf,
    opensm_log: PathBuf,
    lmc: u8,
    /// Our end of the console FIFO, opened read-write so that neither side blocks on
    /// open and ibsim never sees end-of-file while the bed lives.
    _console_keepalive: File,
    ibsim: Option<Child>,
    opensm: Option<Child>,
}

impl Bed {
    /// Start ibsim and OpenSM in a fresh scratch directory under `bed_root`.
    fn start(bed_root: &Path, tag: &str) -> Result<Bed> {
        let seq = BED_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{}-{seq}-{}", std::process::id(), sanitize(tag));
        let dir = bed_root.join(&id);
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("rm -r {}", dir.display()))?;
        }
        fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let net = dir.join("net");
        fs::write(&net, topology())?;
        let lmc = 1;
        fs::write(dir.join("opensm.conf"), opensm_config(lmc))?;
        let console = dir.join("console");
        crate::util::run("mkfifo", &[&console.to_string_lossy()])?;
        let keep = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&console)
            .with_context(|| format!("open {}", console.display()))?;
        // Unique per bed and short: ibsim builds unix socket addresses from it.
        let sockname = format!("apm-ibsim-{}-{seq}", std::process::id());
        let mut bed = Bed {
            opensm_log: dir.join("opensm.log"),
            dir,
            sockname,
            console,
            lmc,
            _console_keepalive: keep.try_clone()?,
            ibsim: None,
            opensm: None,
        };
        let ibsim_log = File::create(bed.dir.join("ibsim.log"))?;
        bed.ibsim = Some(
            Command::new("ibsim")
                .arg("-s")
                .arg(&net)
                .current_dir(&bed.dir)
                .env("IBSIM_SOCKNAME", &bed.sockname)
                .stdin(keep)
                .stdout(ibsim_log.try_clone()?)
                .stderr(ibsim_log)
                .spawn()
                .context("starting ibsim")?,
        );
        let ibsim_log = bed.dir.join("ibsim.log");
        bed.wait_for_file_line(&ibsim_log, "Network simulator ready")?;

        let osm_out = File::create(bed.dir.join("opensm.out"))?;
        bed.opensm = Some(
            Command::new("opensm")
                .arg("-F")
                .arg(bed.dir.join("opensm.conf"))
                .arg("-e")
                .arg("-f")
                .arg(&bed.opensm_log)
                .current_dir(&bed.dir)
                .env("LD_PRELOAD", UMAD2SIM)
                .env("SIM_HOST", SM_NODE)
                .env("IBSIM_SOCKNAME", &bed.sockname)
                .env("OSM_TMP_DIR", &bed.dir)
                .env("OSM_CACHE_DIR", &bed.dir)
                .stdin(Stdio::null())
                .stdout(osm_out.try_clone()?)
                .stderr(osm_out)
                .spawn()
                .context("starting opensm")?,
        );
        let log = bed.opensm_log.clone();
        bed.wait_for_file_line(&log, "SUBNET UP")?;
        Ok(bed)
    }

    /// The environment that describes this bed to test binaries.
    fn env(&self) -> Vec<(String, String)> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            ("IBSIM_SOCKNAME".into(), self.sockname.clone()),
            ("APM_IBSIM_SOCKNAME".into(), self.sockname.clone()),
            // Bed tests fail instead of skipping when the rest is missing.
            ("APM_IBSIM_REQUIRED".into(), "1".into()),
            ("APM_IBSIM_CONSOLE".into(), s(&self.console)),
            ("APM_IBSIM_OPENSM_LOG".into(), s(&self.opensm_log)),
            ("APM_IBSIM_SCRATCH".into(), s(&self.dir)),
            ("APM_IBSIM_UMAD2SIM".into(), UMAD2SIM.into()),
            ("APM_IBSIM_SM_NODE".into(), SM_NODE.into()),
            ("APM_IBSIM_NODES".into(), CLIENT_NODES.join(",")),
            ("APM_IBSIM_LMC".into(), self.lmc.to_string()),
            (
                "APM_IBSIM_OPENSM_CONF".into(),
                s(&self.dir.join("opensm.conf")),
            ),
            (
                "APM_IBSIM_OPENSM_PID".into(),
                self.opensm
                    .as_ref()
                    .map(|c| c.id())
                    .unwrap_or(0)
                    .to_string(),
            ),
        ]
    }

    /// Wait until `path` has a line containing `needle`, failing early if a bed process
    /// died and after [`SUBNET_UP_TIMEOUT`].
    fn wait_for_file_line(&mut self, path: &Path, needle: &str) -> Result<()> {
        let deadline = Instant::now() + SUBNET_UP_TIMEOUT;
        loop {
            if let Ok(f) = File::open(path) {
                if BufReader::new(f)
                    .lines()
                    .map_while(Result::ok)
                    .any(|l| l.contains(needle))
                {
                    return Ok(());
                }
            }
            for (name, child) in [("ibsim", &mut self.ibsim), ("opensm", &mut self.opensm)] {
                if let Some(c) = child {
                    if let Some(st) = c.try_wait()? {
                        bail!(
                            "{name} exited ({st}) before {needle:?} appeared in {}",
                            path.display()
                        );
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "no {needle:?} in {} after {SUBNET_UP_TIMEOUT:?}",
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Bed {
    /// Stop OpenSM, then ibsim: SIGTERM by PID, SIGKILL after a grace period; reap both.
    fn drop(&mut self) {
        for child in [self.opensm.take(), self.ibsim.take()]
            .into_iter()
            .flatten()
        {
            stop(child);
        }
    }
}

/// Stop one child by PID: SIGTERM, up to 2 s to exit, then SIGKILL; always reaped.
fn stop(mut child: Child) {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Keep a test name usable in a file name and a socket name.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}
