//! apm-preload kept invisible to the program, and programs that load libibverbs
//! themselves, with the project's own verbs program (`apm-preload/tests/c/rc_dlopen.c`:
//! `APM_SHIM_PROGRAM` binds libibverbs as NCCL does, dlopen and dlvsym, and
//! `APM_SHIM_LINKED` is the same program linked to it), on rxe0 <-> rxe1 over rail 10.
//!
//! Each test makes one point and then ends the programs: a fault comes only once the
//! programs' own count of round trips shows traffic (and apm's report shows the QPs
//! protected), and a stop file ends them once the count shows traffic after the fault.
//! Nothing is sized from a timing sample; the limits below only bound a failure.

use super::*;
use serde_json::Value;

/// The agent's config of these tests, and `apm run`'s options with it.
const CONFIG: &[&str] = &["--config", "/tmp/apm-run.toml"];

/// At most this long for any one thing to happen (a failure, not a measure).
const LIMIT: Duration = Duration::from_secs(60);

/// The program `var` names, with the rails and the config; `None` (said why) when the
/// test cannot run here.
fn shim_prepare(var: &str) -> Option<(String, String, Rails)> {
    let program = std::env::var(var).unwrap_or_else(|_| format!("/mnt/{var}"));
    let (apm, rails) = prepare(&program)?;
    Some((apm, program, rails))
}

/// One pair of the program: the server on rxe1, the client on rxe0, rail 10.
struct Shim {
    tag: String,
    server: End,
    client: End,
    stop: String,
    reports: [String; 2],
}

/// What a [`Shim`] runs: the program, its TCP port, `apm run`'s options (`None`: no
/// apm), and more arguments for the server's and the client's command lines.
struct Setup<'a> {
    tag: &'a str,
    program: &'a str,
    port: u16,
    apm: Option<(&'a str, &'a [&'a str])>,
    server: &'a str,
    client: &'a str,
}

/// Both ends once they have exited.
struct Ended {
    status: [Option<i32>; 2],
    outputs: [String; 2],
    /// `apm run --report` of each end (`Value::Null` without apm).
    reports: [Value; 2],
    text: String,
}

impl Shim {
    fn start(s: &Setup<'_>) -> Shim {
        uncut();
        let (ga, gb) = rail10();
        let stop = format!("/tmp/{}.stop", s.tag);
        let _ = std::fs::remove_file(&stop);
        let common = format!("-p {} -S {stop}", s.port);
        let server = v(&format!(
            "{} -d rxe1 -g {gb} {common} {}",
            s.program, s.server
        ));
        let client = v(&format!(
            "{} -d rxe0 -g {ga} {common} {} 127.0.0.1",
            s.program, s.client
        ));
        let reports = [
            format!("/tmp/{}-server.json", s.tag),
            format!("/tmp/{}-client.json", s.tag),
        ];
        for r in &reports {
            let _ = std::fs::remove_file(r);
        }
        let (apm, opts) = s.apm.unzip();
        let opts = opts.unwrap_or(&[]);
        let server_end = spawn_opts(
            &format!("{}-server", s.tag),
            &server,
            apm,
            opts,
            &reports[0],
        );
        wait_listening(s.port, Duration::from_secs(30));
        let client_end = spawn_opts(
            &format!("{}-client", s.tag),
            &client,
            apm,
            opts,
            &reports[1],
        );
        Shim {
            tag: s.tag.to_owned(),
            server: server_end,
            client: client_end,
            stop,
            reports,
        }
    }

    fn output(e: &End) -> String {
        std::fs::read_to_string(&e.out).unwrap_or_default()
    }

    /// Round trips the client has counted so far.
    fn progress(&self) -> u64 {
        Self::output(&self.client)
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("progress ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Wait until `done` says so (both ends still running), or fail saying `what`.
    fn wait(&mut self, what: &str, done: impl Fn(&Shim) -> bool) -> Result<(), String> {
        let since = Instant::now();
        while !done(self) {
            let exited = [&mut self.server, &mut self.client]
                .iter_mut()
                .any(|e| !matches!(e.child.try_wait(), Ok(None)));
            if exited || since.elapsed() > LIMIT {
                let why = if exited { "an end exited" } else { "timed out" };
                return Err(format!(
                    "{}: {what}: {why}\n  server: {}\n  client: {}",
                    self.tag,
                    self.server.tail(),
                    self.client.tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Wait for `n` more round trips than now.
    fn more_trips(&mut self, n: u64, what: &str) -> Result<(), String> {
        let from = self.progress();
        self.wait(what, |s| s.progress() >= from + n)
    }

    /// Wait until each end's apm has protected `n` QPs.
    fn protected(&mut self, n: u64) -> Result<(), String> {
        self.wait(&format!("{n} QPs protected at each end"), |s| {
            s.server.protected() >= n && s.client.protected() >= n
        })
    }

    /// Ask both ends to stop and wait for them.
    fn stop(self) -> Ended {
        std::fs::write(&self.stop, "").expect("stop file");
        self.finish()
    }

    /// Wait for both ends to exit by themselves.
    fn finish(mut self) -> Ended {
        let deadline = Instant::now() + LIMIT;
        let status = [self.server.wait(deadline), self.client.wait(deadline)];
        let outputs = [Self::output(&self.server), Self::output(&self.client)];
        let reports = self.reports.clone().map(|r| {
            std::fs::read_to_string(r)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null)
        });
        let text = format!(
            "{}: server {:?}, client {:?}\n  server: {}\n  client: {}",
            self.tag,
            status[0],
            status[1],
            self.server.tail(),
            self.client.tail()
        );
        Ended {
            status,
            outputs,
            reports,
            text,
        }
    }
}

impl Ended {
    /// Both ends exited with status 0, every message checked.
    fn kept(&self) -> bool {
        self.status == [Some(0), Some(0)]
            && self
                .outputs
                .iter()
                .all(|o| o.contains("every message once and in order"))
    }
}

/// The processes of a run's report.
fn processes(report: &Value) -> Vec<&Value> {
    report["processes"]
        .as_array()
        .map(|p| p.iter().collect())
        .unwrap_or_default()
}

/// Failovers over every process of a run's report.
fn failovers(report: &Value) -> usize {
    processes(report)
        .iter()
        .map(|p| p["failovers"].as_array().map_or(0, Vec::len))
        .sum()
}

/// The reasons a process's QPs were not protected.
fn refusals(process: &Value) -> Vec<String> {
    process["not_protected"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|r| r["reason"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A silent cut of rail 10 both ways, and the operator's verdict that it is dead.
fn cut_rail10(apm: &str) {
    for dev in ["vA.10", "vB.10"] {
        tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
    }
    let out = Command::new(apm)
        .args(["agent", "--port", PORT, "--rail-down", "10.0.10.1"])
        .output()
        .expect("apm agent --rail-down");
    assert!(out.status.success(), "rail-down refused: {out:?}");
}

/// The common course: traffic, both ends protected, a silent cut of the rail in use,
/// traffic again, stop.
fn through_a_cut(s: &Setup<'_>, apm: &str, qps: u64) -> Result<Ended, String> {
    let t0 = Instant::now();
    let mut run = Shim::start(s);
    run.more_trips(200, "traffic before the cut")?;
    let traffic = t0.elapsed();
    run.protected(qps)?;
    let protected = t0.elapsed();
    cut_rail10(apm);
    run.more_trips(200, "traffic after the cut")?;
    let recovered = t0.elapsed();
    let ended = run.stop();
    uncut();
    println!(
        "  {}: traffic {:.1} s, protected {:.1} s, traffic again after the cut {:.1} s, \
         ended {:.1} s",
        s.tag,
        traffic.as_secs_f64(),
        protected.as_secs_f64(),
        recovered.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(ended)
}

/// NCCL's way of loading libibverbs (dlopen, dlvsym "IBVERBS_1.1", no link): the
/// program is protected exactly like a linked one, and is kept through a silent cut. A
/// program that holds a device and uses no verb apm can see is said "not seen".
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn shim_a_program_that_dlopens_libibverbs_is_kept_across_a_silent_cut() {
    let Some((apm, program, _rails)) = shim_prepare("APM_SHIM_PROGRAM") else {
        return;
    };
    let t0 = Instant::now();
    // It reads its async events from the start, as NCCL does: the SQ_DRAINED of apm's
    // moves must not reach it (the tee's filter in its reads), its own drain's must.
    let setup = Setup {
        tag: "shim-dlopen",
        program: &program,
        port: 18701,
        apm: Some((&apm, CONFIG)),
        server: "-e early -q",
        client: "-e early -q",
    };
    let ended = through_a_cut(&setup, &apm, 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(ended.kept(), "{}", ended.text);
    for r in &ended.reports {
        let p = processes(r);
        assert_eq!(p.len(), 1, "{r}");
        assert_eq!(p[0]["protected"], 1, "its QP protected: {r}");
        assert!(failovers(r) >= 1, "moved off the cut rail: {r}");
    }
    assert_own_drain_only(&ended);
    let unseen = Instant::now();
    let out = Command::new(&apm)
        .args([
            "run",
            "--report",
            "/tmp/shim-unseen.json",
            "--",
            &program,
            "-R",
        ])
        .output()
        .expect("apm run");
    let unseen = unseen.elapsed();
    let summary = String::from_utf8_lossy(&out.stderr);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string("/tmp/shim-unseen.json").unwrap_or_default())
            .unwrap_or(Value::Null);
    let why = processes(&report)
        .first()
        .and_then(|p| p["not_seen"].as_str().map(str::to_owned));
    assert!(
        out.status.success() && summary.contains("1 process not seen") && why.is_some(),
        "a program holding uverbs0 with no verb apm saw: {out:?}"
    );
    println!(
        "shim dlopen: kept across the cut, protected, {} failovers, no SQ_DRAINED of \
         apm's for its early reader; a program apm cannot see ({:.1} s): {}; {:.1} s",
        failovers(&ended.reports[1]),
        unseen.as_secs_f64(),
        why.unwrap_or_default(),
        t0.elapsed().as_secs_f64()
    );
}

/// Each end saw no `SQ_DRAINED` before it drained its QP itself, and then its own.
fn assert_own_drain_only(ended: &Ended) {
    for o in &ended.outputs {
        assert!(
            o.contains("own-sqd: 1 of 1 drained; SQ_DRAINED before: 0"),
            "no SQ_DRAINED of apm's, the program's own once:\n{}",
            ended.text
        );
    }
}

/// The drains of apm's software moves raise `SQ_DRAINED` on the program's context (rxe
/// does for every RTS -> SQD): none reaches the program that reads its events only at
/// the end, whether the tee's pump took them meanwhile (`--migration auto`) or they
/// waited in the kernel's queue (`software`: no tee), while the drain it asks for
/// itself reaches it, once. (A program that reads them from the start is
/// `shim_a_program_that_dlopens_libibverbs_is_kept_across_a_silent_cut`.)
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn shim_apm_moves_raise_no_sq_drained_for_the_program() {
    let Some((apm, dlopen, _rails)) = shim_prepare("APM_SHIM_PROGRAM") else {
        return;
    };
    let linked = std::env::var("APM_SHIM_LINKED").unwrap_or_else(|_| "/mnt/rc_linked".into());
    let cases = [
        ("auto", "late", linked.as_str()),
        ("software", "late", dlopen.as_str()),
    ];
    for (i, (migration, events, program)) in cases.into_iter().enumerate() {
        let t0 = Instant::now();
        let opts = [CONFIG[0], CONFIG[1], "--migration", migration];
        let args = format!("-e {events} -q");
        let tag = format!("shim-drained-{migration}-{events}");
        let setup = Setup {
            tag: &tag,
            program,
            port: 18702 + i as u16,
            apm: Some((&apm, &opts)),
            server: &args,
            client: &args,
        };
        let ended = through_a_cut(&setup, &apm, 1).unwrap_or_else(|e| panic!("{e}"));
        assert!(ended.kept(), "{}", ended.text);
        for (end, r) in ended.reports.iter().enumerate() {
            assert!(failovers(r) >= 1, "{tag}: end {end} moved (a drain): {r}");
        }
        assert_own_drain_only(&ended);
        println!(
            "shim SQ_DRAINED, --migration {migration}, events read {events}: none of apm's \
             moves' reached the program, its own did; {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
}

/// fork without exec (the child's own pair is refused with the reason: apm's threads
/// stayed in the parent) and with exec (an apm of its own): every child ends, each
/// process writes its own report, and the parent's is kept.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn shim_fork_with_and_without_exec() {
    let Some((apm, program, _rails)) = shim_prepare("APM_SHIM_PROGRAM") else {
        return;
    };
    let t0 = Instant::now();
    let (_, gb) = rail10();
    let client = format!("-D rxe1 -G {gb} -f both");
    let setup = Setup {
        tag: "shim-fork",
        program: &program,
        port: 18706,
        apm: Some((&apm, CONFIG)),
        server: "",
        client: &client,
    };
    let mut run = Shim::start(&setup);
    let waited = run
        .more_trips(300, "traffic past both forks")
        .and_then(|()| run.protected(1));
    let ended = run.stop();
    waited.unwrap_or_else(|e| panic!("{e}\n{}", ended.text));
    assert!(ended.kept(), "{}", ended.text);
    let client_out = &ended.outputs[1];
    let children: Vec<&str> = client_out
        .lines()
        .filter(|l| {
            ["child", "rc_dlopen", "forked", "apm", "(+0x", ")["]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    for mode in ["noexec", "exec"] {
        assert!(
            client_out.contains(&format!("({mode}): exit 0")),
            "the {mode} child ended with status 0:\n  {}\n{}",
            children.join("\n  "),
            ended.text
        );
    }
    let procs = processes(&ended.reports[1]);
    let mut pids: Vec<u64> = procs.iter().filter_map(|p| p["pid"].as_u64()).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(
        pids.len(),
        3,
        "parent and two children, each its own report: {procs:?}"
    );
    let forked: Vec<&&Value> = procs
        .iter()
        .filter(|p| refusals(p).iter().any(|r| r.contains("forked")))
        .collect();
    assert_eq!(forked.len(), 1, "the child without exec: {procs:?}");
    assert_eq!(forked[0]["qps_seen"], 2, "{procs:?}");
    let parent = procs
        .iter()
        .find(|p| p["qps_seen"] == 1)
        .unwrap_or_else(|| panic!("the parent's report: {procs:?}"));
    assert_eq!(
        parent["protected"], 1,
        "the parent's report kept: {procs:?}"
    );
    let exec = procs
        .iter()
        .find(|p| p["qps_seen"] == 2 && refusals(p).iter().all(|r| !r.contains("forked")));
    assert!(
        exec.is_some(),
        "the child that exec'ed, apm of its own: {procs:?}"
    );
    println!(
        "shim fork: children without and with exec ended; {} reports (parent kept, the \
         child without exec refused: forked); {:.1} s",
        pids.len(),
        t0.elapsed().as_secs_f64()
    );
}

/// Four connections whose QPs give up after one retry (`-r 1`) lose their rail
/// silently: the QPs with a send in flight fail (ERR), and the program, told only to
/// note it, keeps them. Then the verdict that the rail is dead: apm's move of each
/// failed QP fails, and the engine queries it. As soon as the first such failure shows
/// in apm's log, both ends destroy every QP (failed, moved, or being moved or queried):
/// every `ibv_destroy_qp` returns 0.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn shim_destroy_right_after_a_failed_move_returns_0() {
    let Some((apm, program, _rails)) = shim_prepare("APM_SHIM_LINKED") else {
        return;
    };
    let t0 = Instant::now();
    let now = "/tmp/shim-destroy.now";
    let _ = std::fs::remove_file(now);
    let args = format!("-c 4 -r 1 -x {now}");
    let setup = Setup {
        tag: "shim-destroy",
        program: &program,
        port: 18707,
        apm: Some((&apm, CONFIG)),
        server: &args,
        client: &args,
    };
    let mut run = Shim::start(&setup);
    let failed_move = run
        .more_trips(400, "traffic on four connections")
        .and_then(|()| run.protected(4))
        .and_then(|()| {
            for dev in ["vA.10", "vB.10"] {
                tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
            }
            run.wait("a QP failed (retries exhausted)", |s| {
                Shim::output(&s.client).contains("failed qp")
            })
        })
        .and_then(|()| {
            let out = Command::new(&apm)
                .args(["agent", "--port", PORT, "--rail-down", "10.0.10.1"])
                .output()
                .expect("apm agent --rail-down");
            assert!(out.status.success(), "rail-down refused: {out:?}");
            run.wait("apm's move of a failed QP failed", |s| {
                Shim::output(&s.client)
                    .contains("software migration of the application's QP failed")
            })
        });
    std::fs::write(now, "").expect("destroy file");
    let ended = run.finish();
    uncut();
    failed_move.unwrap_or_else(|e| panic!("{e}\n{}", ended.text));
    let destroys: Vec<usize> = ended
        .outputs
        .iter()
        .map(|o| o.lines().filter(|l| l.starts_with("destroy qp")).count())
        .collect();
    assert_eq!(ended.status, [Some(0), Some(0)], "{}", ended.text);
    assert_eq!(destroys, [4, 4], "{}", ended.text);
    assert!(
        ended
            .outputs
            .iter()
            .all(|o| !o.contains("a destroy failed"))
            && ended.outputs[1].contains("rc=0 errno=0 (failed, "),
        "{}",
        ended.text
    );
    println!(
        "shim destroy: 8 QPs destroyed right after apm's moves of the failed ones failed, \
         every ibv_destroy_qp 0; {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// One process with a QP on each device, both numbered alike (rxe0 and rxe1 count QP
/// numbers from the same start): apm must give each connection the peer messages that
/// name it, and both are protected and kept through a cut.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn shim_two_devices_in_one_process() {
    let Some((apm, program, _rails)) = shim_prepare("APM_SHIM_PROGRAM") else {
        return;
    };
    let t0 = Instant::now();
    let (ga, gb) = rail10();
    let server = format!("-D rxe0 -G {ga} -c 2 -A");
    let client = format!("-D rxe1 -G {gb} -c 2 -A");
    let setup = Setup {
        tag: "shim-two-devices",
        program: &program,
        port: 18708,
        apm: Some((&apm, CONFIG)),
        server: &server,
        client: &client,
    };
    let ended = through_a_cut(&setup, &apm, 2).unwrap_or_else(|e| panic!("{e}"));
    assert!(ended.kept(), "{}", ended.text);
    let qpns: Vec<&str> = ended.outputs[1]
        .lines()
        .filter_map(|l| l.strip_prefix("qp ")?.split_whitespace().next())
        .collect();
    assert!(
        qpns.len() == 2 && qpns[0] == qpns[1],
        "the client's two QPs have one number: {qpns:?}\n{}",
        ended.text
    );
    for r in &ended.reports {
        assert_eq!(processes(r)[0]["protected"], 2, "{r}");
        assert!(failovers(r) >= 2, "both connections moved: {r}");
    }
    println!(
        "shim two devices: QP {} on rxe0 and on rxe1 in one process, both protected and \
         kept across the cut; {:.1} s",
        qpns[0],
        t0.elapsed().as_secs_f64()
    );
}

/// A move that outlives its command deadline (300 ms here; the drain on the dead rail
/// lasts until the QP's retransmit timer, about 1 s at ACK timeout 18) still ends with
/// the QP in RTS on the new path: the traffic goes on.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn shim_a_move_past_its_deadline_ends_in_rts() {
    let Some((apm, program, _rails)) = shim_prepare("APM_SHIM_PROGRAM") else {
        return;
    };
    let t0 = Instant::now();
    let config = "/tmp/apm-run-deadline.toml";
    std::fs::write(
        config,
        format!("[lap]\nudp_listen = \"0.0.0.0:{PORT}\"\n[policy]\ncommand_timeout_ms = 300\n"),
    )
    .expect("config");
    let opts = ["--config", config];
    let setup = Setup {
        tag: "shim-deadline",
        program: &program,
        port: 18709,
        apm: Some((&apm, &opts)),
        server: "-t 18",
        client: "-t 18",
    };
    let ended = through_a_cut(&setup, &apm, 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(ended.kept(), "{}", ended.text);
    // Whether a move outlives 300 ms depends on the machine's speed (on a quiet VM
    // every drain here ended in 130 ms, as soon as the cut was told): the case shows
    // the guard when it happens and asserts only what holds at any speed, that the
    // program was kept. A deterministic form needs a drain apm can be made to wait on
    // (a test hook in provider-rxe's move): not built yet.
    let outlived = ended
        .outputs
        .iter()
        .any(|o| o.contains("no answer within 300 ms"));
    println!(
        "shim deadline: {}, traffic went on; {:.1} s",
        if outlived {
            "a move past its 300 ms deadline ended in RTS"
        } else {
            "no move outlived its 300 ms deadline in this run (shown, not asserted)"
        },
        t0.elapsed().as_secs_f64()
    );
}

/// With hardware APM (the patched soft-RoCE) the device migrates the program's QP onto
/// apm's alternate and raises `PATH_MIG`: the program, which has no alternate of its
/// own, sees none of it, and its own drain's `SQ_DRAINED` still reaches it.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_shim_device_migrations_raise_no_event_for_the_program() {
    let Some((apm, program, _rails)) = shim_prepare("APM_SHIM_PROGRAM") else {
        return;
    };
    if let Err(why) = hw::hardware_apm_here() {
        println!("SKIPPED roce_hw_apm_shim: no hardware APM on rxe0: {why}");
        return;
    }
    let t0 = Instant::now();
    let opts = [CONFIG[0], CONFIG[1], "--migration", "hardware"];
    let setup = Setup {
        tag: "shim-hw-events",
        program: &program,
        port: 18710,
        apm: Some((&apm, &opts)),
        server: "-e early -q",
        client: "-e early -q",
    };
    let mut run = Shim::start(&setup);
    let moved = run
        .more_trips(200, "traffic before the cut")
        .and_then(|()| run.protected(1))
        .and_then(|()| {
            // Nothing tells apm: the device migrates when its retries run out.
            for dev in ["vA.10", "vB.10"] {
                tc(&["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"]);
            }
            run.more_trips(200, "traffic after the cut")
        });
    let ended = run.stop();
    uncut();
    moved.unwrap_or_else(|e| panic!("{e}\n{}", ended.text));
    assert!(ended.kept(), "{}", ended.text);
    for r in &ended.reports {
        assert!(failovers(r) >= 1, "the device migrated: {r}");
    }
    for o in &ended.outputs {
        assert!(
            !o.contains("event path migrat"),
            "no path migration event reached the program:\n{}",
            ended.text
        );
    }
    assert_own_drain_only(&ended);
    println!(
        "roce_hw_apm shim: device migrations raised no event for the program, its own \
         SQ_DRAINED did; {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
