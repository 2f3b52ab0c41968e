//! `apm run` in the VM: unmodified Debian verbs programs on rxe0 <-> rxe1 over two
//! rails (VLANs 10 and 20 of one veth pair, so both rails are GIDs of each device: a
//! QP can only move between GIDs of its own device), first without apm and then under
//! `apm run` on both ends, while the rail in use is cut.
//!
//! The cut is silent (netem drops everything on rail 10 both ways): rxe keeps the QPs
//! alive and retransmits (retry count 7 retries forever). apm's verdict that the rail
//! is dead comes from outside the programs, through the agent (`apm agent --rail-down
//! 10.0.10.1`): the agent's liveness probes are off by default (in this VM, under load,
//! they flapped). A rail's
//! link down (`ip link set vA.10 down`) is a different fault on rxe: its route
//! vanishes and the next packet the QP sends fails it (local QP operation error, ERR)
//! within microseconds, before any software can move it; a port-wide PORT_ERR takes
//! every GID of the device at once. Neither leaves an rxe QP anything to move to; the
//! link-down case is run under apm to show that apm then changes nothing.
//!
//! Per program: exit status of both ends, their last words, the longest stall of the
//! traffic (no packet received on either rail), the rate before and after the cut.

use super::rails::{setup_rails, tc, wait_for_rail_gids};
use super::{link_toggle_allowed, netdev_of, verbs};
use provider_verbs::ffi::GidType;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// UCX and the overhead benchmark.
#[path = "apm_run_more.rs"]
mod more;
// Hardware APM under `apm run` (the patched soft-RoCE).
#[path = "apm_run_hw.rs"]
mod hw;
// The agent's liveness probes finding a cut nothing reports.
#[path = "apm_run_probes.rs"]
mod probes;
// What apm-preload must keep invisible, and programs that load libibverbs themselves.
#[path = "apm_run_shim.rs"]
mod shim;
// What an operator sees: apm status and the agent's metrics during a cut.
#[path = "apm_run_ops.rs"]
mod ops;
// `apm run` on InfiniBand ports (real HCAs only).
#[path = "apm_run_ib.rs"]
mod ib;

/// The agent's UDP port in these tests (not the default, so nothing else answers).
const PORT: &str = "47950";

fn apm_bin() -> Option<String> {
    std::env::var("APM_BIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
}

fn gid_index(dev: &str, ip: &str) -> String {
    let v = verbs();
    let ctx = v.open(dev).expect("open");
    let e = ctx
        .find_gid(1, ip.parse().expect("ip"), GidType::RoceV2)
        .expect("gid table")
        .unwrap_or_else(|| panic!("{dev} has no RoCE v2 GID for {ip}"));
    e.index.to_string()
}

fn counter(dev: &str, what: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/{what}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Packets received on both rails, both sides: traffic that got through.
fn received() -> u64 {
    ["vA.10", "vA.20", "vB.10", "vB.20"]
        .iter()
        .map(|d| counter(d, "rx_packets"))
        .sum()
}

/// RDMA packets the two rxe devices received (their `rcvd_pkts` counters): the
/// programs' traffic alone, not the agents' datagrams nor the kernel's own on the
/// rails; the rails' counters where the devices have none.
fn rdma_received() -> u64 {
    let read = |dev: &str| {
        std::fs::read_to_string(format!(
            "/sys/class/infiniband/{dev}/ports/1/hw_counters/rcvd_pkts"
        ))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    };
    match (read("rxe0"), read("rxe1")) {
        (Some(a), Some(b)) => a + b,
        _ => received(),
    }
}

/// Bytes per second received on `dev` over `window`.
fn rate(dev: &str, window: Duration) -> f64 {
    let a = counter(dev, "rx_bytes");
    std::thread::sleep(window);
    (counter(dev, "rx_bytes").saturating_sub(a)) as f64 / window.as_secs_f64()
}

/// The longest interval without a received packet, sampled every 5 ms until stopped.
struct StallMeter {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Duration>,
}

impl StallMeter {
    fn start() -> StallMeter {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut last = received();
            let mut since = Instant::now();
            let mut worst = Duration::ZERO;
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                let now = received();
                if now != last {
                    worst = worst.max(since.elapsed());
                    last = now;
                    since = Instant::now();
                }
            }
            worst
        });
        StallMeter { stop, handle }
    }

    fn finish(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// One end of a program run: the child and where its output goes.
struct End {
    child: Child,
    out: std::path::PathBuf,
}

fn spawn(tag: &str, argv: &[String], apm: Option<&str>, report: &str) -> End {
    spawn_opts(tag, argv, apm, &["--config", "/tmp/apm-run.toml"], report)
}

/// [`spawn`] with `apm run`'s options `opts` (its config file among them).
fn spawn_opts(tag: &str, argv: &[String], apm: Option<&str>, opts: &[&str], report: &str) -> End {
    let out = std::path::PathBuf::from(format!("/tmp/{tag}.out"));
    let file = std::fs::File::create(&out).expect("output file");
    let mut cmd = match apm {
        Some(bin) => {
            let mut c = Command::new(bin);
            c.arg("run")
                .args(opts)
                .args(["--report", report, "--"])
                .args(argv);
            c
        }
        None => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
    };
    // Its own process group: a hung end is killed with everything it started (`apm
    // run`'s program too: SIGKILL is not forwarded), so that no QP outlives its test.
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup"))
        .stderr(file)
        .env(
            "APM_LOG",
            "warn,provider_rxe=info,apm_preload=info,apm_core=info",
        )
        .env("APM_AGENT_LOG_FILE", format!("/tmp/{tag}-agent.log"));
    End {
        child: cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {argv:?}: {e}")),
        out,
    }
}

impl Drop for End {
    /// An end still running when its test is over (a panic before the wait) goes with
    /// its whole group.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_group(&self.child);
            let _ = self.child.wait();
        }
    }
}

/// SIGKILL to every process of the group `child` leads, found in /proc (the guest's
/// busybox `kill` takes no `-- -PGID` and its `pkill` no `-g`; a plain pid works with
/// every `kill`).
fn kill_group(child: &Child) {
    let group = child.id().to_string();
    let members: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().into_owned();
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid pgrp ...: comm may hold spaces, so after the ')'.
            let after = stat.rsplit_once(')')?.1;
            (after.split_whitespace().nth(2)? == group).then_some(pid)
        })
        .collect();
    if !members.is_empty() {
        let _ = Command::new("kill").arg("-KILL").args(&members).status();
    }
}

impl End {
    /// Wait until `deadline`; `None` if it is still running (then it is killed).
    fn wait(&mut self, deadline: Instant) -> Option<i32> {
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                use std::os::unix::process::ExitStatusExt;
                return Some(s.code().unwrap_or(128 + s.signal().unwrap_or(0)));
            }
            if Instant::now() >= deadline {
                kill_group(&self.child);
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The program's last lines, and every line apm wrote.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let apm: Vec<&str> = lines
            .iter()
            .filter(|l| l.contains("apm"))
            .copied()
            .take(40)
            .collect();
        let last: Vec<&str> = lines
            .iter()
            .filter(|l| !l.contains("apm"))
            .copied()
            .collect();
        format!(
            "{}\n    [apm] {}",
            last[last.len().saturating_sub(4)..].join("\n    "),
            apm.join("\n    [apm] ")
        )
    }

    /// Under apm run: the program's own report so far (written by the library).
    fn protected(&self) -> u64 {
        crate::child::run_report_dirs(Some(self.child.id()))
            .into_iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .filter_map(|v| v.get("protected").and_then(|p| p.as_u64()))
            .sum()
    }
}

/// The TCP port a program pair meets on (`-p PORT`).
fn tcp_port(argv: &[String]) -> u16 {
    argv.iter()
        .position(|a| a == "-p")
        .and_then(|i| argv.get(i + 1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(18515)
}

/// Wait until something listens on TCP `port` (the server is ready for its client), or
/// an rdma_cm id on that port (rping's server: no TCP socket).
fn wait_listening(port: u16, limit: Duration) {
    let start = Instant::now();
    let hex = format!(":{port:04X} ");
    let cm = format!(":{port} ");
    for round in 0u32.. {
        if start.elapsed() >= limit {
            return;
        }
        // `rdma` is a process: asked every 100 ms only.
        if round % 5 == 4 && rdma_listening(&cm) {
            return;
        }
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines().any(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|a| format!("{a} ").contains(&hex))
                        && l.split_whitespace().nth(3) == Some("0A")
                })
            })
        });
        if listening {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether an rdma_cm id listens on `port` (`:PORT `, as `rdma resource show cm_id`
/// writes its source address).
fn rdma_listening(port: &str) -> bool {
    Command::new("/usr/bin/rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.contains("LISTEN") && format!("{l} ").contains(port))
        })
}

/// `rdma resource show qp`: every QP's state and PSNs (what a hung program's QPs do).
fn qp_table() -> String {
    Command::new("/usr/bin/rdma")
        .args(["resource", "show", "qp"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// How a rail is cut.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    /// netem 100% loss on rail 10, both ways; apm told through the agent.
    Silent,
    /// netem 100% loss on rail 10, both ways; nothing tells apm (hardware APM: the
    /// device's own retry budget finds it).
    SilentUnreported,
    /// `ip link set vA.10 down`.
    LinkDown,
}

/// Take every cut off rail 10 and put back its routes (a link going down drops them).
fn uncut() {
    for dev in ["vA.10", "vB.10"] {
        let _ = Command::new("/usr/sbin/tc")
            .args(["qdisc", "del", "dev", dev, "root"])
            .output();
        let _ = Command::new("/usr/bin/ip")
            .args(["link", "set", dev, "up"])
            .output();
    }
    // Only if the rails exist (the Rails guard deletes them at the end).
    if super::rails::ip_quiet(&["link", "show", "vA.10"]) {
        for (vlan, a, b) in super::rails::RAILS {
            super::rails::rail_routes(vlan, a, b);
        }
    }
}

struct Outcome {
    /// Exit status per process (servers then clients); `None`: hung and killed.
    status: Vec<Option<i32>>,
    /// Each process's output (same order).
    outputs: Vec<String>,
    /// The longest interval without a received packet on either rail.
    stall: Duration,
    text: String,
}

impl Outcome {
    fn all_ok(&self) -> bool {
        self.status.iter().all(|s| *s == Some(0))
    }
}

type Pair = (Vec<String>, Vec<String>);

/// Run program pairs at once, cut rail 10 when `cut_at` says (after traffic started).
fn case(
    name: &str,
    pairs: &[Pair],
    apm: Option<&str>,
    cut: Cut,
    cut_at: impl Into<CutAt>,
) -> Outcome {
    let cut_at: CutAt = cut_at.into();
    let cut_after = cut_at.after;
    // Without apm a hang is the expected outcome: 15 s of it show it. Under apm a bound,
    // not a measure: a fixed count runs for minutes on a loaded machine.
    let limit = if apm.is_some() {
        Duration::from_secs(600)
    } else {
        cut_after + Duration::from_secs(15)
    };
    uncut();
    let tag = format!("{name}-{}", if apm.is_some() { "apm" } else { "bare" });
    let mut ends = Vec::new();
    for (i, (server, _)) in pairs.iter().enumerate() {
        let t = format!("{tag}-server{i}");
        ends.push(spawn(&t, server, apm, &format!("/tmp/{t}.json")));
        wait_listening(tcp_port(server), Duration::from_secs(30));
    }
    for (i, (_, client)) in pairs.iter().enumerate() {
        let t = format!("{tag}-client{i}");
        ends.push(spawn(&t, client, apm, &format!("/tmp/{t}.json")));
    }
    let start = Instant::now();
    // Traffic on rail 10, and under apm every end protected, before the cut.
    let base = counter("vB.10", "rx_packets");
    while counter("vB.10", "rx_packets") < base + 50 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let want = ends.len() as u64;
    let protected = || ends.iter().map(End::protected).sum::<u64>();
    if apm.is_some() {
        // A bound, not a measure: on a loaded machine adopting a QP took 17 s in the VM.
        while protected() < want && start.elapsed() < Duration::from_secs(180) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let protected = if apm.is_some() {
        format!(", {} of {want} ends protected", protected())
    } else {
        String::new()
    };
    let progress_cap = cut_at
        .or_packets
        .map_or(u64::MAX, |p| base.saturating_add(p));
    while start.elapsed() < cut_after && counter("vB.10", "rx_packets") < progress_cap {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = rate("vB.10", Duration::from_millis(250));
    let meter = StallMeter::start();
    match cut {
        Cut::SilentUnreported => {
            for dev in ["vA.10", "vB.10"] {
                tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
            }
        }
        Cut::Silent => {
            for dev in ["vA.10", "vB.10"] {
                tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
            }
            if let Some(bin) = apm {
                let out = Command::new(bin)
                    .args(["agent", "--port", PORT, "--rail-down", "10.0.10.1"])
                    .output()
                    .expect("apm agent --rail-down");
                if !out.status.success() {
                    println!(
                        "  rail-down refused: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
            }
        }
        Cut::LinkDown => {
            let _ = Command::new("/usr/bin/ip")
                .args(["link", "set", "vA.10", "down"])
                .output();
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let after = rate("vB.20", Duration::from_millis(500));
    let qps = qp_table();
    let deadline = start + limit;
    // Wait for every process, or the deadline, or a minute in which no RDMA packet
    // arrived (the programs are hung: a live one under any load moves packets every
    // second; the agents' own datagrams on the rails do not count); then the QPs are
    // read before the kill.
    let (mut seen, mut moving) = (rdma_received(), Instant::now());
    while Instant::now() < deadline
        && moving.elapsed() < HUNG_AFTER
        && ends
            .iter_mut()
            .any(|e| matches!(e.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(50));
        let now = rdma_received();
        if now != seen {
            (seen, moving) = (now, Instant::now());
        }
    }
    let qps_end = qp_table();
    let n = pairs.len();
    let mut status = vec![None; ends.len()];
    for (i, e) in ends.iter_mut().enumerate() {
        status[i] = e.wait(Instant::now());
    }
    let stall = meter.finish();
    uncut();
    let fmt = |s: &Option<i32>| s.map_or("hung (killed)".to_owned(), |c| format!("exit {c}"));
    let mut text = format!(
        "{tag} ({cut:?} cut){protected}: {}; longest stall {:.0} ms; rail 10 before {:.2} MB/s, \
         rail 20 after {:.2} MB/s",
        status.iter().map(fmt).collect::<Vec<_>>().join(", "),
        stall.as_secs_f64() * 1000.0,
        before / 1e6,
        after / 1e6,
    );
    for (i, e) in ends.iter().enumerate() {
        let role = if i < n { "server" } else { "client" };
        text.push_str(&format!("\n  {role} {}: {}", i % n, e.tail()));
    }
    if status.iter().any(Option::is_none) {
        text.push_str(&format!(
            "\n  QPs 2 s after the cut:\n{qps}  QPs at the deadline:\n{qps_end}"
        ));
        let agent =
            std::fs::read_to_string(format!("/tmp/{tag}-server0-agent.log")).unwrap_or_default();
        let lines: Vec<&str> = agent.lines().collect();
        text.push_str(&format!(
            "\n  agent log:\n    {}",
            lines[lines.len().saturating_sub(15)..].join("\n    ")
        ));
    }
    println!("{text}");
    let outputs = ends
        .iter()
        .map(|e| std::fs::read_to_string(&e.out).unwrap_or_default())
        .collect();
    Outcome {
        status,
        outputs,
        stall,
        text,
    }
}

fn v(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// The GID indexes of rail 10 on rxe0 and rxe1.
fn rail10() -> (String, String) {
    (
        gid_index("rxe0", "10.0.10.1"),
        gid_index("rxe1", "10.0.10.2"),
    )
}

fn pingpong(port: u16, iters: u32) -> Pair {
    pingpong_with(port, iters, "")
}

/// [`pingpong`] with more options for both ends (`-e`: sleep on completion events).
fn pingpong_with(port: u16, iters: u32, more: &str) -> Pair {
    let (ga, gb) = rail10();
    (
        v(&format!(
            "/usr/bin/ibv_rc_pingpong -d rxe1 -g {gb} -p {port} -s 1024 -n {iters}{more}"
        )),
        v(&format!(
            "/usr/bin/ibv_rc_pingpong -d rxe0 -g {ga} -p {port} -s 1024 -n {iters}{more} 127.0.0.1"
        )),
    )
}

/// Iterations of `ibv_rc_pingpong` (1 KiB messages) in every case: a fixed count, never
/// one sized from a timing sample (a count calibrated while the machine was slow ended
/// before the cut once it was fast again). The VM ran an iteration in 84 us on a quiet
/// machine and in 3.6 ms under apm on one loaded four times over: 1.7 s to 72 s. The
/// fast end must still outlast the QPs' adoption (a few thousand iterations there);
/// what keeps the cut inside the run is [`CutAt`]: the cut comes after `after` or once
/// the pair exchanged [`PINGPONG_CUT_PACKETS`] packets (about a quarter of the run),
/// whichever is first, once every end is protected (or 180 s passed).
const PINGPONG_ITERS: u32 = 20_000;

/// Packets received on rail 10 (`vB.10`) after which a pingpong case cuts at the latest:
/// each iteration brings `vB.10` about two (the peer's message and the ACK of its own).
const PINGPONG_CUT_PACKETS: u64 = 10_000;

/// No packet on either rail for this long after a cut: the programs are hung.
const HUNG_AFTER: Duration = Duration::from_secs(60);

/// When a case cuts rail 10: `after` the traffic started (the time its ends need to be
/// protected and settle), or sooner once `vB.10` received `or_packets` packets since
/// the start: a program that runs a fixed count is then still running whatever the
/// machine's speed.
#[derive(Clone, Copy, Debug)]
struct CutAt {
    after: Duration,
    or_packets: Option<u64>,
}

impl CutAt {
    /// For an `ibv_rc_pingpong` case of [`PINGPONG_ITERS`].
    fn pingpong(after: Duration) -> CutAt {
        CutAt {
            after,
            or_packets: Some(PINGPONG_CUT_PACKETS),
        }
    }
}

impl From<Duration> for CutAt {
    /// Programs that run for a time (`-D`, rping's count at its own pace): by time only.
    fn from(after: Duration) -> CutAt {
        CutAt {
            after,
            or_packets: None,
        }
    }
}

/// The rails' VLAN links, deleted when a test is done: the suite's other tests toggle
/// `vA` and expect no VLAN above it (each sets the rails up again when it needs them).
struct Rails;

impl Drop for Rails {
    fn drop(&mut self) {
        uncut();
        for dev in ["vA.10", "vA.20", "vB.10", "vB.20"] {
            let _ = Command::new("/usr/bin/ip")
                .args(["link", "del", dev])
                .output();
        }
    }
}

/// Set up the rails and the config; `None` (with the reason printed) when the test
/// cannot run here.
fn prepare(program: &str) -> Option<(String, Rails)> {
    let Some(apm) = apm_bin() else {
        println!("SKIPPED: APM_BIN does not name the apm binary (hwtest sets it)");
        return None;
    };
    if !link_toggle_allowed() {
        println!("SKIPPED: cuts rails; set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)");
        return None;
    }
    if netdev_of("rxe0", 1).as_deref() != Some("vA")
        || netdev_of("rxe1", 1).as_deref() != Some("vB")
    {
        println!("SKIPPED: needs the VM layout (rxe0 on vA, rxe1 on vB)");
        return None;
    }
    if !std::path::Path::new(program).is_file() {
        println!("SKIPPED: {program} is not installed");
        return None;
    }
    let rails = Rails;
    setup_rails();
    wait_for_rail_gids(&verbs());
    std::fs::write(
        "/tmp/apm-run.toml",
        format!("[lap]\nudp_listen = \"0.0.0.0:{PORT}\"\n"),
    )
    .expect("config");
    Some((apm, rails))
}

/// Without apm, then under `apm run`: the latter must end with status 0 everywhere.
fn without_then_with(name: &str, pairs: &[Pair], cut_at: impl Into<CutAt>, apm: &str) {
    let cut_at: CutAt = cut_at.into();
    let bare = case(name, pairs, None, Cut::Silent, cut_at);
    if bare.all_ok() {
        println!("  note: without apm {name} still ended with status 0 (see its own figures)");
    }
    let with = case(name, pairs, Some(apm), Cut::Silent, cut_at);
    assert!(
        with.all_ok(),
        "under apm run every process must end with status 0:\n{}",
        with.text
    );
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_ibv_rc_pingpong_across_a_silent_rail_cut() {
    let Some((apm, _rails)) = prepare("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    without_then_with(
        "ibv_rc_pingpong",
        &[pingpong(18601, PINGPONG_ITERS)],
        CutAt::pingpong(Duration::from_millis(1500)),
        &apm,
    );
}

/// perftest's bandwidth tests run with `-b`: one-way, the server's QP stays in RTR
/// (receive only), which rxe cannot move; that case is shown, not asserted.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_perftest_bandwidth_across_a_silent_rail_cut() {
    let Some((apm, _rails)) = prepare("/usr/bin/ib_write_bw") else {
        return;
    };
    let (ga, gb) = rail10();
    for bw in ["ib_send_bw", "ib_write_bw"] {
        let pair = (
            v(&format!(
                "/usr/bin/{bw} -d rxe1 -x {gb} -p 18602 -F -D 8 -b"
            )),
            v(&format!(
                "/usr/bin/{bw} -d rxe0 -x {ga} -p 18602 -F -D 8 -b 127.0.0.1"
            )),
        );
        without_then_with(bw, &[pair], Duration::from_secs(2), &apm);
    }
    let one_way = (
        v(&format!(
            "/usr/bin/ib_write_bw -d rxe1 -x {gb} -p 18602 -F -D 4"
        )),
        v(&format!(
            "/usr/bin/ib_write_bw -d rxe0 -x {ga} -p 18602 -F -D 4 127.0.0.1"
        )),
    );
    let _ = case(
        "ib_write_bw-one-way",
        &[one_way],
        Some(&apm),
        Cut::Silent,
        Duration::from_secs(2),
    );
}

/// rping (rdma_cm, data verified with `-V`). The data moves with the QP; rdma_cm's own
/// disconnect (DREQ/DREP, kernel CM MADs) travels on the path the connection was set
/// up on, which stays cut: the client ends once its pings are done, and the server,
/// whose disconnect event never comes, has verified the last ping and is stopped by
/// the test. Without apm both hang in the middle.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_rping_across_a_silent_rail_cut() {
    let Some((apm, _rails)) = prepare("/usr/bin/rping") else {
        return;
    };
    let pair = (
        v("/usr/bin/rping -s -a 10.0.10.2 -p 18603 -v -V -C 2000"),
        v("/usr/bin/rping -c -I 10.0.10.1 -a 10.0.10.2 -p 18603 -v -V -C 2000"),
    );
    let bare = case(
        "rping",
        std::slice::from_ref(&pair),
        None,
        Cut::Silent,
        Duration::from_secs(2),
    );
    let with = case(
        "rping",
        &[pair],
        Some(&apm),
        Cut::Silent,
        Duration::from_secs(2),
    );
    // The client's pings complete only when the server did its part of each (reads,
    // writes, sends), and `-V` checks the data: its last ping verified is both ends'.
    // (The server's own output is block-buffered and lost when the test stops it.)
    let last = "rdma-ping-1999:";
    assert_eq!(
        with.status[1],
        Some(0),
        "the client ends with status 0:\n{}",
        with.text
    );
    assert!(
        with.outputs[1].contains(last),
        "the client verified the last ping:\n{}",
        with.text
    );
    assert!(
        !bare.outputs[1].contains(last) || bare.status[1] != Some(0),
        "without apm the client could not finish across the cut"
    );
}

/// An MPI job has one process per core: two pairs at once, all four processes behind
/// the same addresses and one agent per host.
///
/// The programs sleep on completion events (`-e`): both "hosts" share the VM's two
/// vCPUs, and four processes spinning on their CQs there are twice oversubscribed.
/// Busy-polling pairs then crawl without apm and without any fault (seen: two bare
/// pairs of 20,000 iterations killed after 60 s in two rounds of three, ~130
/// round trips a second, while one pair alone took 1.8 s), because each round trip
/// waits for the scheduler to run the one process of four that has something to do.
/// An MPI job runs one process per core, which this VM cannot give four processes.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_two_processes_per_side() {
    let Some((apm, _rails)) = prepare("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    let pairs = [
        pingpong_with(18611, PINGPONG_ITERS, " -e"),
        pingpong_with(18612, PINGPONG_ITERS, " -e"),
    ];
    let with = case(
        "two-pairs",
        &pairs,
        Some(&apm),
        Cut::Silent,
        CutAt::pingpong(Duration::from_millis(1500)),
    );
    assert!(
        with.all_ok(),
        "every process must end with status 0:\n{}",
        with.text
    );
}

/// Link down of the rail in use: fatal for an rxe QP with or without apm (see the
/// module docs); shown, not asserted.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_link_down_of_the_rail_in_use_on_rxe() {
    let Some((apm, _rails)) = prepare("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    let _ = case(
        "link-down",
        &[pingpong(18621, PINGPONG_ITERS)],
        Some(&apm),
        Cut::LinkDown,
        CutAt::pingpong(Duration::from_millis(1500)),
    );
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_bad_input_and_programs_without_verbs() {
    let Some(apm) = apm_bin() else {
        println!("SKIPPED: APM_BIN does not name the apm binary (hwtest sets it)");
        return;
    };
    // A program that does not exist: apm run says so and exits 127, like a shell.
    let out = Command::new(&apm)
        .args(["run", "--", "/nonexistent/program"])
        .output()
        .expect("apm run");
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run /nonexistent/program"));
    // A program using no verbs runs unchanged: same output, same status, nothing more.
    let out = Command::new(&apm)
        .args(["run", "--", "/bin/sh", "-c", "echo unchanged; exit 7"])
        .output()
        .expect("apm run");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "unchanged\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "apm says nothing");
    // A bad configuration is refused before the program starts.
    std::fs::write("/tmp/apm-bad.toml", "[policy]\nlap_timout_ms = 5\n").expect("write");
    let out = Command::new(&apm)
        .args([
            "run",
            "--config",
            "/tmp/apm-bad.toml",
            "--",
            "/bin/sh",
            "-c",
            "echo RAN",
        ])
        .output()
        .expect("apm run");
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RAN"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lap_timout_ms"));
    println!("apm run: nonexistent program 127, no-verbs program unchanged, bad config refused");
}
