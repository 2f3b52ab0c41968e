//! Test support: find the ibsim bed that `cargo xtask ibsim` started, drive its console,
//! read OpenSM's log, and run node processes under umad2sim.
//!
//! The bed is described by `APM_IBSIM_*` environment variables. A test that needs it calls
//! [`Bed::or_skip`], which prints why it skips when they are absent (plain `cargo test`
//! on a machine without the bed passes); `cargo xtask ibsim` always sets them, so there
//! the tests run or fail. Node processes are the test binary itself, re-executed with
//! `LD_PRELOAD` and `SIM_HOST`: the parent test never loads umad2sim.
//!
//! A node entry runs its work through [`run_node`]. Node processes report to their
//! parent with stdout lines starting with [`REPORT`] and take its commands from stdin
//! ([`stdin_commands`], [`NodeProc::send`]). Tests that need the SM gone for a while
//! stop the bed's OpenSM and start another ([`Bed::stop_opensm`],
//! [`Bed::start_opensm`]). The rest is what several crates' bed tests read alike:
//! OpenSM's LIDs ([`Bed::guid2lid`]) and logged GIDs ([`logged_gid`]), a node's reports
//! in any order ([`NodeProc::expect_all`]) and its `STATS` counters
//! ([`NodeProc::stats`]), protecting a pair of engine nodes ([`protect_passive_first`]),
//! OpenSM's unanswered Reports ([`Bed::assert_reports_answered`]), a child's exit
//! ([`wait_exit`]), latencies in ms ([`ms`]).
#![allow(clippy::disallowed_methods)] // a test driver: it measures wall-clock latencies

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Why the bed's OpenSM could not be stopped or started, or a node did not report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BedError {
    /// A process or file of the bed could not be used.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// `kill -TERM` of OpenSM failed.
    #[error("kill -TERM {0} failed")]
    Kill(String),
    /// OpenSM did not log its exit in time.
    #[error("OpenSM did not exit")]
    NotExited,
    /// The started OpenSM did not log SUBNET UP in time.
    #[error("the started OpenSM reached no SUBNET UP")]
    NoSubnetUp,
    /// The node process reported a failure.
    #[error("{node}: node failed: {line}")]
    NodeFailed {
        /// The node.
        node: String,
        /// Its FAIL report.
        line: String,
    },
    /// The node sent no report with the prefix in time.
    #[error("{node}: no report {prefix:?} within {timeout:?}")]
    NoReport {
        /// The node.
        node: String,
        /// The report awaited.
        prefix: String,
        /// How long it was awaited.
        timeout: Duration,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> BedError {
    move |source| BedError::Io { what, source }
}

/// Prefix of the stdout lines a node process reports with.
pub const REPORT: &str = "@@ ";

/// The bed, as its environment describes it.
#[derive(Debug, Clone)]
pub struct Bed {
    /// ibsim's socket name (`IBSIM_SOCKNAME`).
    pub sockname: String,
    /// The ibsim console FIFO.
    pub console: PathBuf,
    /// OpenSM's log file.
    pub opensm_log: PathBuf,
    /// A writable directory for this bed's node processes.
    pub scratch: PathBuf,
    /// libumad2sim.so.
    pub umad2sim: PathBuf,
    /// The node OpenSM runs on.
    pub sm_node: String,
    /// Nodes free for test processes.
    pub nodes: Vec<String>,
    /// OpenSM's LMC.
    pub lmc: u8,
    /// OpenSM's configuration file.
    pub opensm_conf: PathBuf,
    /// The PID of the bed's OpenSM (a child of `cargo xtask ibsim`).
    pub opensm_pid: u32,
}

impl Bed {
    /// The bed from the environment, if this process runs inside one.
    pub fn from_env() -> Option<Bed> {
        let v = |k: &str| std::env::var(k).ok();
        Some(Bed {
            sockname: v("APM_IBSIM_SOCKNAME")?,
            console: v("APM_IBSIM_CONSOLE")?.into(),
            opensm_log: v("APM_IBSIM_OPENSM_LOG")?.into(),
            scratch: v("APM_IBSIM_SCRATCH")?.into(),
            umad2sim: v("APM_IBSIM_UMAD2SIM")?.into(),
            sm_node: v("APM_IBSIM_SM_NODE")?,
            nodes: v("APM_IBSIM_NODES")?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            lmc: v("APM_IBSIM_LMC")?.parse().ok()?,
            opensm_conf: v("APM_IBSIM_OPENSM_CONF")?.into(),
            opensm_pid: v("APM_IBSIM_OPENSM_PID")?.parse().ok()?,
        })
    }

    /// The bed, or `None` after printing why `test` skips. Panics instead when
    /// `APM_IBSIM_REQUIRED` is set (by `cargo xtask ibsim`): there a skip would hide a
    /// test that did not run.
    pub fn or_skip(test: &str) -> Option<Bed> {
        let bed = Bed::from_env();
        if bed.is_none() && std::env::var_os("APM_IBSIM_REQUIRED").is_some() {
            panic!("{test}: APM_IBSIM_REQUIRED is set but the bed's environment is incomplete");
        }
        if bed.is_none() {
            println!("skipping {test}: no ibsim bed here (run it with `cargo xtask ibsim`)");
        }
        bed
    }

    /// Send one command line to the ibsim console (`Unlink "H3"[2]`).
    pub fn console(&self, line: &str) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.console)?;
        writeln!(f, "{line}")
    }

    /// OpenSM's log so far (lossy UTF-8; empty if unreadable).
    pub fn opensm_log(&self) -> String {
        std::fs::read(&self.opensm_log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The port GUIDs of the HCAs by (node name, port number), from OpenSM's subnet list
    /// (`opensm-subnet.lst` in its cache directory, written at every SUBNET UP).
    pub fn hca_ports(&self) -> BTreeMap<(String, u8), u64> {
        let text =
            std::fs::read_to_string(self.scratch.join("opensm-subnet.lst")).unwrap_or_default();
        let mut out = BTreeMap::new();
        for line in text.lines() {
            // The first `{ ... }` group describes the local end of a link.
            // (the node name's own braces, `{H1}`, have no space before the `}`).
            let Some(first) = line.split(" }").next() else {
                continue;
            };
            if !first.trim_start().starts_with("{ CA") {
                continue;
            }
            let field = |key: &str| {
                first
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(key).map(str::to_owned))
            };
            let name = first
                .split('{')
                .nth(2)
                .and_then(|n| n.split('}').next())
                .map(str::to_owned);
            let guid = field("PortGUID:").and_then(|g| u64::from_str_radix(&g, 16).ok());
            let pn = field("PN:").and_then(|p| p.parse::<u8>().ok());
            if let (Some(name), Some(guid), Some(pn)) = (name, guid, pn) {
                out.insert((name, pn), guid);
            }
        }
        out
    }

    /// OpenSM's port GUID -> (base LID, last LID) of the port's LID range, from its
    /// guid2lid cache file in the bed directory (the two are equal with LMC 0 and for
    /// switch management ports).
    pub fn guid2lid(&self) -> BTreeMap<u64, (u16, u16)> {
        let text = std::fs::read_to_string(self.scratch.join("guid2lid")).unwrap_or_default();
        let num = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        let lid = |s: Option<&&str>| u16::try_from(num(s?)?).ok();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((num(f.first()?)?, (lid(f.get(1))?, lid(f.get(2))?)))
            })
            .collect()
    }

    /// The current length of OpenSM's log, to search only what is logged after it.
    pub fn log_mark(&self) -> usize {
        self.opensm_log().len()
    }

    /// Wait until OpenSM's log has a line containing `needle`; returns it.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        self.wait_log_after(0, needle, timeout)
    }

    /// Like [`Bed::wait_log`], only looking past `mark` (from [`Bed::log_mark`]).
    pub fn wait_log_after(&self, mark: usize, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.opensm_log();
            let new = log.get(mark..).unwrap_or("");
            if let Some(l) = new.lines().find(|l| l.contains(needle)) {
                return Some(l.to_owned());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Restart the SM: [`Bed::stop_opensm`], then [`Bed::start_opensm`] (the same node,
    /// configuration, log and cache, so LIDs stay), each within `timeout`. The new one is
    /// stopped when the returned handle is dropped.
    pub fn restart_opensm(&self, timeout: Duration) -> Result<OpenSm, BedError> {
        self.stop_opensm(timeout)?;
        self.start_opensm(timeout)
    }

    /// Stop the bed's OpenSM (SIGTERM by PID; `cargo xtask ibsim` reaps it) and wait
    /// until it logs its exit.
    pub fn stop_opensm(&self, timeout: Duration) -> Result<(), BedError> {
        let pid = self.opensm_pid.to_string();
        let before = self.log_mark();
        let st = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .map_err(io("kill"))?;
        if !st.success() {
            return Err(BedError::Kill(pid));
        }
        // Gone (or a zombie waiting for the bed to reap it) once it stops logging.
        if self.wait_log_after(before, "Exiting SM", timeout).is_none() {
            return Err(BedError::NotExited);
        }
        Ok(())
    }

    /// Start an OpenSM as the bed starts its own (on [`Bed::sm_node`], with
    /// [`Bed::opensm_conf`], logging to [`Bed::opensm_log`], its cache in
    /// [`Bed::scratch`]; stdout and stderr in `opensm-<n>.out` there) and wait for its
    /// SUBNET UP. It is stopped when the returned handle is dropped. The bed's own
    /// OpenSM must be stopped first ([`Bed::stop_opensm`]).
    pub fn start_opensm(&self, timeout: Duration) -> Result<OpenSm, BedError> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let mark = self.log_mark();
        let name = format!("opensm-{}.out", SEQ.fetch_add(1, Ordering::Relaxed));
        let out = std::fs::File::create(self.scratch.join(name))
            .map_err(io("creating OpenSM's output file"))?;
        let err = out
            .try_clone()
            .map_err(io("creating OpenSM's output file"))?;
        let child = Command::new("opensm")
            .arg("-F")
            .arg(&self.opensm_conf)
            .arg("-f")
            .arg(&self.opensm_log)
            .current_dir(&self.scratch)
            .env("LD_PRELOAD", &self.umad2sim)
            .env("SIM_HOST", &self.sm_node)
            .env("IBSIM_SOCKNAME", &self.sockname)
            .env("OSM_TMP_DIR", &self.scratch)
            .env("OSM_CACHE_DIR", &self.scratch)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io("starting opensm"))?;
        let sm = OpenSm { child };
        self.wait_log_after(mark, "SUBNET UP", timeout)
            .ok_or(BedError::NoSubnetUp)?;
        Ok(sm)
    }

    /// Panics with OpenSM's `ERR 1A06` line if it logged one: a Report (a trap it
    /// forwarded to a subscriber) that went unanswered.
    pub fn assert_reports_answered(&self) {
        let log = self.opensm_log();
        if let Some(l) = log.lines().find(|l| l.contains("ERR 1A06")) {
            panic!("a Report went unanswered: {l}");
        }
    }

    /// Start the current test binary as a node process on `node`, running the test
    /// `entry` (an `#[ignore]`d test that does the node's work) with `role` in
    /// `APM_IBSIM_ROLE`. Its working directory is a fresh writable directory (umad2sim
    /// writes `./sys-<pid>` there).
    pub fn spawn_node(&self, node: &str, entry: &str, role: &str) -> std::io::Result<NodeProc> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = self.scratch.join(format!(
            "node-{node}-{}",
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                entry,
                "--nocapture",
                "--test-threads=1",
            ])
            .current_dir(&dir)
            .env("LD_PRELOAD", &self.umad2sim)
            .env("SIM_HOST", node)
            .env("IBSIM_SOCKNAME", &self.sockname)
            .env("APM_IBSIM_ROLE", role)
            .env("APM_IBSIM_NODE", node)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            let name = node.to_owned();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let t = Instant::now();
                    println!("[{name}] {line}");
                    // libtest prints "test bed_node ... " without a newline first.
                    if let Some(i) = line.find(REPORT) {
                        let r = &line[i + REPORT.len()..];
                        if tx.send((t, r.to_owned())).is_err() {
                            break;
                        }
                    }
                }
            });
        }
        Ok(NodeProc {
            node: node.to_owned(),
            child,
            stdin,
            reports: rx,
        })
    }
}

/// The role this process plays when it was started by [`Bed::spawn_node`], if any.
pub fn node_role() -> Option<String> {
    std::env::var("APM_IBSIM_ROLE").ok()
}

/// The body of a bed test's node entry (the `#[ignore]`d test [`Bed::spawn_node`]
/// names): outside a node process nothing; inside one, `node(role)` on a
/// current-thread tokio runtime, an error reported as `FAIL <error>` and the process
/// ended with status 1.
pub fn run_node<F, Fut>(node: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let Some(role) = node_role() else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime"); // a test process without a runtime can do nothing
    if let Err(e) = rt.block_on(node(role)) {
        report(&format!("FAIL {e}"));
        std::process::exit(1);
    }
}

/// Wait up to `timeout` for `child` to exit by itself: its status, or `None` while it
/// still runs.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Protect the connections of two engine nodes, whose entries take the command
/// `protect` and answer it with a `PROTECTING` report: on the passive side first (an
/// active side's LAP for a connection the passive side does not protect yet gets
/// "invalid comm ID"), then, once it answered, on the active side. Panics when the
/// passive node does not answer within 5 s.
pub fn protect_passive_first(passive: &mut NodeProc, active: &mut NodeProc) {
    passive.send("protect").unwrap();
    passive
        .expect("PROTECTING", Duration::from_secs(5))
        .unwrap();
    active.send("protect").unwrap();
}

/// Report one line to the parent test (see [`REPORT`]).
pub fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{REPORT}{line}");
    let _ = out.flush();
}

/// In a node process: the command lines its parent test sends ([`NodeProc::send`]), as
/// an async stream (a thread reads stdin until it closes or the receiver is dropped).
pub fn stdin_commands() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The GID in OpenSM's `Reporting Informational Notice "GID out of service",
/// GID:fe80::...` log lines (and their "GID in service" twins).
pub fn logged_gid(line: &str) -> Option<Ipv6Addr> {
    let g = line.split("GID:").nth(1)?.split_whitespace().next()?;
    g.trim_end_matches(',').parse().ok()
}

/// A duration in milliseconds, for printing latencies.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A node process started by [`Bed::spawn_node`]; killed (by its PID) when dropped.
#[derive(Debug)]
pub struct NodeProc {
    /// The node it runs as.
    pub node: String,
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    reports: mpsc::Receiver<(Instant, String)>,
}

impl NodeProc {
    /// The next report starting with `prefix` within `timeout` (other reports are
    /// skipped), with the time it was read.
    pub fn expect(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<(Instant, String), BedError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok((t, l)) if l.starts_with(prefix) => return Ok((t, l)),
                Ok((_, l)) if l.starts_with("FAIL") => {
                    return Err(BedError::NodeFailed {
                        node: self.node.clone(),
                        line: l,
                    })
                }
                Ok(_) => continue,
                Err(_) => {
                    return Err(BedError::NoReport {
                        node: self.node.clone(),
                        prefix: prefix.to_owned(),
                        timeout,
                    })
                }
            }
        }
    }

    /// The first report starting with each of `prefixes`, in that order, whatever order
    /// they come in (reports from different tasks of a node interleave; other reports
    /// are skipped). Panics, naming what is still missing, when `timeout` passes first.
    pub fn expect_all(&mut self, prefixes: &[&str], timeout: Duration) -> Vec<(Instant, String)> {
        let deadline = Instant::now() + timeout;
        let mut got: Vec<Option<(Instant, String)>> = vec![None; prefixes.len()];
        while got.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let (t, l) = self
                .expect("", left)
                .unwrap_or_else(|e| panic!("{e}; still waiting for {prefixes:?}, got {got:?}"));
            for (i, p) in prefixes.iter().enumerate() {
                if got[i].is_none() && l.starts_with(p) {
                    got[i] = Some((t, l.clone()));
                }
            }
        }
        got.into_iter().flatten().collect()
    }

    /// The engine counters of a node whose entry answers the command `stats` with a
    /// `STATS name=value ...` report, as name -> value (printed too). Panics when the
    /// node does not answer within 5 s.
    pub fn stats(&mut self) -> BTreeMap<String, u64> {
        let (l, stats) = self.read_stats();
        println!("[{}] {l}", self.node);
        stats
    }

    /// [`NodeProc::stats`] once `done` holds for them, asked again every 20 ms (the
    /// node tells its counters only when asked); the last ones are printed. Panics
    /// when `timeout` passes first.
    pub fn stats_until(
        &mut self,
        done: impl Fn(&BTreeMap<String, u64>) -> bool,
        timeout: Duration,
    ) -> BTreeMap<String, u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let (l, stats) = self.read_stats();
            if done(&stats) {
                println!("[{}] {l}", self.node);
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "[{}] not there within {timeout:?}: {l}",
                self.node
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `STATS` report's line and its counters.
    fn read_stats(&mut self) -> (String, BTreeMap<String, u64>) {
        self.send("stats").unwrap();
        let (_, l) = self.expect("STATS", Duration::from_secs(5)).unwrap();
        let stats = l
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
            .collect();
        (l, stats)
    }

    /// Send one command line to the node (its stdin).
    pub fn send(&mut self, line: &str) -> std::io::Result<()> {
        match &mut self.stdin {
            Some(s) => {
                writeln!(s, "{line}")?;
                s.flush()
            }
            None => Err(std::io::Error::other("node stdin closed")),
        }
    }

    /// Every report received so far and not yet consumed.
    pub fn drain(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.reports.try_recv().ok().map(|(_, l)| l)).collect()
    }

    /// Wait for the process to exit by itself; its success.
    pub fn wait(mut self, timeout: Duration) -> bool {
        wait_exit(&mut self.child, timeout).is_some_and(|st| st.success())
    }

    /// The node's working directory name is not needed by callers; its PID is.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// An OpenSM started by a test ([`Bed::start_opensm`]); stopped by PID when dropped.
#[derive(Debug)]
pub struct OpenSm {
    child: Child,
}

impl Drop for OpenSm {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if wait_exit(&mut self.child, Duration::from_secs(2)).is_some() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
