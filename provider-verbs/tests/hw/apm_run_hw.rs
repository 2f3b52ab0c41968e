//! `apm run` with hardware APM: unmodified programs on the APM-capable soft-RoCE (the VM
//! suite's second phase), through a silent cut and a link down of the rail in use, first
//! without apm (the cut ends them) and then under `apm run` on both ends.
//!
//! Nothing tells apm about the silent cut: each QP migrates by itself when its retries on
//! the dead rail run out, `PATH_MIG` reaching apm through the async event tee of the
//! program's contexts, and apm arms the rail it left. A link down is seen by apm's rail
//! watcher, which forces the migration at once (patched rxe treats an armed QP's packets
//! with nowhere to go as lost, as an HCA does, so the QP lives until then). Either way
//! the program must end with status 0 on both ends, its own checks passed, and each end's
//! report must hold a failover made by the device and nothing lost.
//!
//! The programs: `ibv_rc_pingpong`; perftest's `ib_send_bw` and `ib_write_bw` in
//! duration mode with `-b` (both ends send, so both QPs reach RTS; the one-way form,
//! whose server leaves its QP in RTR, is run apart: see its test); `rping` (rdma_cm, its
//! data verified), whose rail comes back while it still pings, because rdma_cm's
//! disconnect travels on the path the connection was set up on; and ucx_perftest over
//! `rc_verbs` (`apm_run_hw_ucx.rs`). Skips on stock rxe (the kernel refuses alternate
//! paths there).

use super::more::perftest_row;
use super::*;
use std::sync::mpsc;

// ucx_perftest: SRQ QPs under hardware APM.
#[path = "apm_run_hw_ucx.rs"]
mod ucx;

/// Whether rxe0 does hardware APM (the patched modules), or why not.
pub(super) fn hardware_apm_here() -> Result<(), String> {
    let ctx = verbs().open("rxe0").map_err(|e| e.to_string())?;
    provider_verbs::hw_apm::available(&ctx, 1).map_err(|e| e.to_string())
}

/// The rails and the config, on the patched modules only; `None` (said why) otherwise.
fn prepare_hw(program: &str) -> Option<(String, Rails)> {
    let (apm, rails) = prepare(program)?;
    if let Err(why) = hardware_apm_here() {
        println!("SKIPPED roce_hw_apm_run: no hardware APM on rxe0: {why}");
        return None;
    }
    Some((apm, rails))
}

/// What one end's `--report` says.
#[derive(Debug, Default)]
pub(super) struct EndReport {
    /// Failovers made by the device (hardware APM).
    pub(super) by_device: usize,
    /// Failovers in all.
    pub(super) failovers: usize,
    /// QPs lost.
    pub(super) lost: usize,
    /// QPs protected.
    pub(super) protected: u64,
    /// Why QPs were not protected.
    refusals: Vec<String>,
    /// How each port of the process's QPs moves them (`hardware_apm`, ...).
    pub(super) mechanisms: Vec<String>,
}

impl EndReport {
    pub(super) fn read(path: &str) -> EndReport {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let processes = v["processes"].as_array().cloned().unwrap_or_default();
        let each = |key: &str| -> Vec<serde_json::Value> {
            processes
                .iter()
                .flat_map(|p| p[key].as_array().cloned().unwrap_or_default())
                .collect()
        };
        let failovers = each("failovers");
        EndReport {
            by_device: failovers.iter().filter(|f| f["by"] == "hardware").count(),
            failovers: failovers.len(),
            lost: each("lost").len(),
            protected: processes
                .iter()
                .filter_map(|p| p["protected"].as_u64())
                .sum(),
            refusals: each("not_protected")
                .iter()
                .filter_map(|r| r["reason"].as_str().map(String::from))
                .collect(),
            mechanisms: each("ports")
                .iter()
                .filter_map(|p| p["mechanism"].as_str().map(String::from))
                .collect(),
        }
    }

    /// The report of end `end` ("server0", "client0") of case `name` under `apm run`.
    fn of(name: &str, end: &str) -> EndReport {
        EndReport::read(&format!("/tmp/{name}-apm-{end}.json"))
    }
}

/// Under `apm run`, bring rail 10 back once the device has moved both ends' QPs (and
/// `hold` later), or [`RETURN_CAP`] after the cut: a transient fault, for rping, whose
/// disconnect needs the rail its connection was set up on. The thread waits for the cut
/// to appear (a downed link or a netem qdisc on `vA.10`) and then for a failover by the
/// device in two running processes' reports; dropping the handle cancels it, so that it
/// never touches a later case's cut.
struct Flap {
    cancel: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The longest a flapping rail stays cut.
const RETURN_CAP: Duration = Duration::from_secs(30);

impl Flap {
    fn start(hold: Option<Duration>) -> Flap {
        let Some(hold) = hold else {
            return Flap {
                cancel: None,
                thread: None,
            };
        };
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let go_on = |d| rx.recv_timeout(d) == Err(mpsc::RecvTimeoutError::Timeout);
            // Every 50 ms: `tc` is a process, and the VM has two slow cores.
            while !rail10_cut() {
                if !go_on(Duration::from_millis(50)) {
                    return;
                }
            }
            let cut = Instant::now();
            while moved_by_device() < 2 && cut.elapsed() < RETURN_CAP {
                if !go_on(Duration::from_millis(100)) {
                    return;
                }
            }
            if go_on(hold) {
                println!(
                    "  rail 10 back {:.1} s after its cut",
                    cut.elapsed().as_secs_f64()
                );
                uncut();
            }
        });
        Flap {
            cancel: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Flap {
    fn drop(&mut self) {
        drop(self.cancel.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How many running `apm run`s report a failover made by the device (the library writes
/// its process's report in its `apm run`'s directory after every change).
fn moved_by_device() -> usize {
    let moved = |report: &serde_json::Value| {
        report["failovers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["by"] == "hardware"))
    };
    // Counted per `apm run` (one per end), whatever files its directory holds.
    crate::child::run_report_dirs(None)
        .into_iter()
        .filter(|d| {
            std::fs::read_dir(d)
                .into_iter()
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .any(|r| moved(&r))
        })
        .count()
}

/// Whether rail 10 is cut now: its link down on `vA`'s side, or netem on it.
fn rail10_cut() -> bool {
    let down =
        std::fs::read_to_string("/sys/class/net/vA.10/operstate").is_ok_and(|s| s.trim() == "down");
    down || Command::new("/usr/sbin/tc")
        .args(["qdisc", "show", "dev", "vA.10"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("netem"))
}

/// One unmodified program pair as the cases run it.
struct Program {
    name: &'static str,
    pair: Pair,
    /// When the rail is cut, after traffic started.
    cut_at: CutAt,
    /// Under `apm run`, the rail comes back this long after both ends moved ([`Flap`];
    /// `None`: it stays cut to the end). Without apm it stays cut: the program has failed
    /// or hangs by then.
    back_after_move: Option<Duration>,
    /// The program's own verdict beyond its exit status (from what it printed): what to
    /// say of it, or why it failed.
    check: Verdict,
    /// Whether a run got through the cut as the program sees it (without apm it must
    /// not).
    survived: Box<dyn Fn(&Outcome) -> bool>,
    /// The link-down case runs under apm first, then without (rping: see its test).
    bare_link_down_last: bool,
}

type Verdict = Box<dyn Fn(&Outcome) -> Result<String, String>>;

/// The program's view of a run: every end ended with status 0.
fn ended_ok() -> Box<dyn Fn(&Outcome) -> bool> {
    Box::new(Outcome::all_ok)
}

fn exit_status(s: &[Option<i32>]) -> String {
    s.iter()
        .map(|s| s.map_or("hung".to_owned(), |c| c.to_string()))
        .collect::<Vec<_>>()
        .join("/")
}

/// Run `prog` through a silent cut and then a link down of rail 10, each first without
/// apm (asserted not to get through) and then under `apm run` on both ends (asserted:
/// status 0, the program's checks, a failover by the device on each end, none lost);
/// with [`Program::bare_link_down_last`] the link down runs under apm first.
fn through_both_cuts(apm: &str, prog: &Program) {
    for cut in [Cut::SilentUnreported, Cut::LinkDown] {
        let name = format!("hw-{}-{cut:?}", prog.name);
        let pairs = std::slice::from_ref(&prog.pair);
        let run_bare = || case(&name, pairs, None, cut, prog.cut_at);
        let run_apm = || {
            let _flap = Flap::start(prog.back_after_move);
            case(&name, pairs, Some(apm), cut, prog.cut_at)
        };
        let (bare, out) = if cut == Cut::LinkDown && prog.bare_link_down_last {
            let out = run_apm();
            (run_bare(), out)
        } else {
            (run_bare(), run_apm())
        };
        assert!(
            !(prog.survived)(&bare),
            "without apm {name} cannot get through the cut:\n{}",
            bare.text
        );
        let ends = ["server0", "client0"].map(|e| EndReport::of(&name, e));
        let verdict = (prog.check)(&out);
        println!(
            "HW-APM {name}: without apm exit {}; under apm run exit {}, longest stall {:.0} ms, \
             failovers by hardware APM server {}/{} client {}/{}, lost {}+{}; {}",
            exit_status(&bare.status),
            exit_status(&out.status),
            out.stall.as_secs_f64() * 1000.0,
            ends[0].by_device,
            ends[0].failovers,
            ends[1].by_device,
            ends[1].failovers,
            ends[0].lost,
            ends[1].lost,
            verdict.as_deref().unwrap_or_else(|e| e),
        );
        assert!(
            out.all_ok(),
            "under apm run with hardware APM both ends end with status 0:\n{}",
            out.text
        );
        if let Err(why) = verdict {
            panic!("{name} under apm run: {why}:\n{}", out.text);
        }
        for (end, r) in ["server", "client"].iter().zip(&ends) {
            assert!(
                r.by_device >= 1 && r.lost == 0,
                "{name} {end}: the device moved the QP and nothing was lost ({r:?}):\n{}",
                out.text
            );
        }
    }
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_run_ibv_rc_pingpong_across_a_silent_cut_and_a_link_down() {
    let Some((apm, _rails)) = prepare_hw("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    let t0 = Instant::now();
    through_both_cuts(
        &apm,
        &Program {
            name: "ibv_rc_pingpong",
            pair: pingpong(18651, PINGPONG_ITERS),
            cut_at: CutAt::pingpong(Duration::from_millis(1000)),
            back_after_move: None,
            // Its own check: every iteration completed (it exits 1 otherwise).
            check: Box::new(|out| {
                Ok(out.outputs[1]
                    .lines()
                    .rev()
                    .find(|l| l.contains("iters in"))
                    .unwrap_or("")
                    .trim()
                    .to_owned())
            }),
            survived: ended_ok(),
            bare_link_down_last: false,
        },
    );
    println!(
        "HW-APM ibv_rc_pingpong: {:.0} s",
        t0.elapsed().as_secs_f64()
    );
}

/// perftest's verdict beyond its status (it exits non-zero on a failed completion): the
/// client printed its result row, with iterations. Its bandwidth figure is shown, not
/// judged: in duration mode this VM often prints 0.00 MB/s, with or without apm and
/// without any fault (perftest times the sample window with the cycle counter, under
/// qemu's TCG).
fn perftest_result(out: &Outcome) -> Result<String, String> {
    let client = out.outputs.last().map(String::as_str).unwrap_or_default();
    match perftest_row(client)[..] {
        [bytes, iters, _peak, average, ..] if iters > 0.0 => Ok(format!(
            "result row: {bytes} B x {iters} iterations, BW average {average:.2} MB/s"
        )),
        ref row => Err(format!("the client printed no result row ({row:?})")),
    }
}

/// A perftest pair on rail 10: `extra` on both ends (`-D 6 -b`: 6 s, both ways).
fn perftest(bw: &str, port: u16, extra: &str) -> Pair {
    let (ga, gb) = rail10();
    (
        v(&format!(
            "/usr/bin/{bw} -d rxe1 -x {gb} -p {port} -F {extra}"
        )),
        v(&format!(
            "/usr/bin/{bw} -d rxe0 -x {ga} -p {port} -F {extra} 127.0.0.1"
        )),
    )
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_run_perftest_bandwidth_across_a_silent_cut_and_a_link_down() {
    let Some((apm, _rails)) = prepare_hw("/usr/bin/ib_write_bw") else {
        return;
    };
    let t0 = Instant::now();
    for (bw, port) in [("ib_send_bw", 18653), ("ib_write_bw", 18654)] {
        // perftest's QPs: ACK timeout 14, 7 retries, a budget of ~0.6 s on a dead rail.
        through_both_cuts(
            &apm,
            &Program {
                name: bw,
                // 8 s: the cut comes once both ends are protected (1-4 s here).
                pair: perftest(bw, port, "-D 8 -b"),
                cut_at: Duration::from_secs(2).into(),
                back_after_move: None,
                check: Box::new(perftest_result),
                survived: ended_ok(),
                bare_link_down_last: false,
            },
        );
    }
    println!("HW-APM perftest -b: {:.0} s", t0.elapsed().as_secs_f64());
}

/// The one-way form of ib_write_bw (no `-b`): the server's QP stays in RTR (receive
/// only). Hardware APM cannot carry it, and apm leaves both ends unprotected:
/// - the server's QP can be given no armed alternate: REARM is an RTS state (IBA 17.2.8;
///   the patch set's `rxe_apm_chk_attr`), and no RTR -> RTR transition exists to load
///   one later;
/// - patched rxe's responder takes a packet only over its primary path or a loaded
///   alternate, and follows a MigReq=1 packet only when ARMED (`rxe_apm_rx_path`,
///   `rxe_apm_rx`): the client's packets on rail 20 would be dropped, and the server's
///   ACKs would still leave on its primary, the dead rail;
/// - so the server's process never registers the connection, the client's apm gets no
///   answer from a partner ("peer did not answer"), loads no alternate, and the client's
///   QP fails when its retries on the dead rail run out, as without apm.
///
/// Asserted: the server is reported unprotected for staying in RTR and the client for
/// want of a partner; the programs' statuses are shown (both fail).
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_run_one_way_ib_write_bw_across_a_silent_cut() {
    let Some((apm, _rails)) = prepare_hw("/usr/bin/ib_write_bw") else {
        return;
    };
    let t0 = Instant::now();
    let name = "hw-one-way";
    // `case` waits up to 20 s for both ends to be protected before it cuts, and the
    // server's end never is: 24 s of traffic put the cut inside the run.
    let out = case(
        name,
        &[perftest("ib_write_bw", 18655, "-D 24")],
        Some(&apm),
        Cut::SilentUnreported,
        Duration::from_secs(2),
    );
    let ends = ["server0", "client0"].map(|e| EndReport::of(name, e));
    let said = |o: &str| -> String {
        o.lines()
            .filter(|l| !l.contains("apm") && (l.contains("rror") || l.contains("ailed")))
            .take(3)
            .collect::<Vec<_>>()
            .join(" | ")
    };
    println!(
        "HW-APM {name}: under apm run exit {}, longest stall {:.0} ms; client said: {}; \
         server said: {}; protected {}+{}; {:.0} s",
        exit_status(&out.status),
        out.stall.as_secs_f64() * 1000.0,
        said(&out.outputs[1]),
        said(&out.outputs[0]),
        ends[0].protected,
        ends[1].protected,
        t0.elapsed().as_secs_f64()
    );
    assert!(
        ends[0].refusals.iter().any(|r| r.contains("RTR")) && ends[0].protected == 0,
        "the server's QP, left in RTR, is reported unprotected ({:?}):\n{}",
        ends[0],
        out.text
    );
    assert!(
        ends[1].protected == 0 && ends[1].failovers == 0,
        "the client's apm finds no partner: nothing armed, nothing moved ({:?}):\n{}",
        ends[1],
        out.text
    );
}

/// How many pings `rping -v -V` does per second here, from a short run without a fault.
fn rping_rate(port: u16) -> f64 {
    const PROBE: u32 = 300;
    let args = |c: &str| v(&format!("/usr/bin/rping {c} -p {port} -v -V -C {PROBE}"));
    let mut s = spawn(
        "rping-rate-s",
        &args("-s -a 10.0.10.2"),
        None,
        "/tmp/rr-s.json",
    );
    wait_listening(port, Duration::from_secs(30));
    let t = Instant::now();
    let c_args = args("-c -I 10.0.10.1 -a 10.0.10.2");
    let mut c = spawn("rping-rate-c", &c_args, None, "/tmp/rr-c.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = c.wait(deadline);
    let took = t.elapsed().as_secs_f64().max(0.1);
    let _ = s.wait(Instant::now() + Duration::from_secs(5));
    let rate = f64::from(PROBE) / took;
    println!("  rping: {PROBE} pings in {took:.2} s here (client {status:?}): {rate:.0}/s");
    rate
}

/// rping's own verdict: the client verified (`-V`) and printed its last ping, and so
/// did the server (its output is complete only when it exits by itself).
fn rping_verified(out: &Outcome, last: u32) -> Result<String, String> {
    let ping = format!("rdma-ping-{last}:");
    let (server, client) = (&out.outputs[0], &out.outputs[1]);
    if client.contains("data mismatch") || !client.contains(&format!("ping data: {ping}")) {
        return Err(format!("the client did not verify ping {last}"));
    }
    if !server.contains(&format!("server ping data: {ping}")) {
        return Err(format!("the server did not see ping {last}"));
    }
    Ok(format!(
        "ping {last} verified by the client, seen by the server"
    ))
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_run_rping_across_a_silent_cut_and_a_link_down() {
    let Some((apm, _rails)) = prepare_hw("/usr/bin/rping") else {
        return;
    };
    let t0 = Instant::now();
    // rdma_cm's QPs on RoCE: ACK timeout 19 (packet lifetime 18 + 1: 2.1 s), 7 retries:
    // the device finds a silent cut after ~17 s. The rail comes back 2 s after both ends
    // moved, while the client still pings: its disconnect (a DREQ on the path the
    // connection was set up on) must reach the server, which otherwise waits for ever.
    // Without apm, a link down ends the connection while its rail is down (its QP fails
    // at its first packet there, rping exits and rdma_cm tears the connection down), and
    // then no new rdma_cm connection between the two devices over that rail could be
    // set up for minutes after the rail came back (REQ/REP timeouts, -110; GSI QPs in RTS,
    // neighbours reachable; seen without apm, so not apm's): that case runs after the
    // one under apm.
    let cut_after = Duration::from_secs(2);
    let hold = Duration::from_secs(2);
    // Pings for 26 s at the pace of a run without a fault: the client must still ping
    // when the rail returns, and the cut comes only once both ends are protected, which
    // `case` waits for up to 20 s (seen: a client that had done most of 18 s of pings
    // before the cut ended before the rail's return, and its server waited for ever).
    let secs = 26.0;
    let count = ((rping_rate(18656) * secs) as u32).clamp(500, 200_000);
    let last = count - 1;
    println!("  rping: {count} pings");
    let pair = (
        v(&format!(
            "/usr/bin/rping -s -a 10.0.10.2 -p 18657 -v -V -C {count}"
        )),
        v(&format!(
            "/usr/bin/rping -c -I 10.0.10.1 -a 10.0.10.2 -p 18657 -v -V -C {count}"
        )),
    );
    through_both_cuts(
        &apm,
        &Program {
            name: "rping",
            pair,
            cut_at: cut_after.into(),
            back_after_move: Some(hold),
            check: Box::new(move |out| rping_verified(out, last)),
            survived: Box::new(move |out| rping_verified(out, last).is_ok()),
            bare_link_down_last: true,
        },
    );
    println!("HW-APM rping: {:.0} s", t0.elapsed().as_secs_f64());
}
