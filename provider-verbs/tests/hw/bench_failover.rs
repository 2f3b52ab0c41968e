//! `cargo xtask bench failover` in the VM: one RC connection's traffic (`apm pingpong`,
//! numbered messages both ways every 2 ms) under five protections, each through the same
//! faults of the rail in use, repeated; one line `FAILOVER-BENCH key=value ...` per run, which
//! xtask gathers into the table.
//!
//! - `apm`: software migration with liveness probes, rxe0 <-> rxe1 over the two VLAN
//!   rails (one NIC, two GIDs); each rail's probes over that rail.
//! - `apm-no-probes`: the same without probes (a silent cut is found by the progress
//!   monitor, a link down by the rail watcher).
//! - `bond-miimon`: Linux bonding, active-backup, link monitoring every 10 ms, rxe on each
//!   bond (two veth pairs, one per rail); the traffic on one unprotected QP.
//! - `bond-arp`: the same with ARP monitoring (every 50 ms, each bond probing the
//!   other's address), which also sees a silent cut.
//! - `none`: the unprotected QP on rail 10 alone.
//!
//! Faults: the rail in use taken down (`ip link set ... down`), or cut silently (netem
//! 100% loss both ways), for 2.5 s, then back. Per run: what became of the connection
//! (`kept`: every message arrived once; `lost`: messages lost or the QP failed; `hung`:
//! a side did not finish), the stall at the fault (last message before it to the first
//! after, the longer side) and after the rail came back, lost and duplicated messages,
//! failovers. A benchmark, not a test: it runs only with `APM_BENCH=1`.

use super::bonds::{bond_routes, bonds_down, bonds_up, BOND_A, BOND_B};
use super::child::{unix_ms, Pingpong};
use super::guest_pauses::{pauses_within, GuestPauses};
use super::guest_perf::GuestPerf;
use super::guest_sched::{self, read_events, summarise, threads_of, SchedTrace};
use super::rails::{
    has_netem, ip_quiet, link_is_down, rail_routes, setup_rails, wait_for_rail_gids, FaultInjector,
};
use super::*;
use std::collections::BTreeMap;

/// The protections compared.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Apm,
    ApmNoProbes,
    BondMiimon,
    BondArp,
    None,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Apm => "apm",
            Variant::ApmNoProbes => "apm-no-probes",
            Variant::BondMiimon => "bond-miimon",
            Variant::BondArp => "bond-arp",
            Variant::None => "none",
        }
    }
}

/// The faults.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    LinkDown,
    Silent,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::LinkDown => "link-down",
            Fault::Silent => "silent-cut",
        }
    }
}

/// The rail in use, as the two ends of it to cut (the active slaves for a bond). apm's
/// connection starts on rail 10 and is on the rail its client's last `FAILOVER` line
/// names (a move before the fault, on a probe's false verdict, left it on rail 20, and
/// cutting rail 10 then cut the alternate, not the rail in use).
fn rail_in_use(v: Variant, client: &mut Pingpong) -> [String; 2] {
    match v {
        Variant::Apm | Variant::ApmNoProbes => {
            while let Ok(l) = client.0.lines.try_recv() {
                client.0.log.push(l);
            }
            let on20 = client
                .0
                .log
                .iter()
                .rev()
                .find(|l| l.contains("FAILOVER at"))
                .is_some_and(|l| l.contains("-> ::ffff:10.0.20."));
            let rail = if on20 { "20" } else { "10" };
            [format!("vA.{rail}"), format!("vB.{rail}")]
        }
        Variant::None => ["vA.10".into(), "vB.10".into()],
        Variant::BondMiimon | Variant::BondArp => {
            let active = |bond: &str, default: &str| {
                std::fs::read_to_string(format!("/sys/class/net/{bond}/bonding/active_slave"))
                    .map(|s| s.trim().to_owned())
                    .ok()
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| default.to_owned())
            };
            [active("bondA", "vA1"), active("bondB", "vB1")]
        }
    }
}

/// Put the fault on `ends`.
fn cut(inject: &mut FaultInjector, fault: Fault, ends: &[String; 2]) {
    match fault {
        Fault::LinkDown => inject.ip(&format!("link set {} down", ends[0])),
        Fault::Silent => {
            for dev in ends {
                inject.tc(&format!("qdisc change dev {dev} root netem loss 100%"));
            }
        }
    }
}

/// Ahead of a silent cut: a netem qdisc that drops nothing on both ends, which the cut
/// then only changes. Adding a root qdisc deactivates the device and waits for RCU
/// (tens of milliseconds of both vCPUs in this guest); changing netem's loss does not,
/// so the cut itself disturbs nothing but the rail it cuts.
fn prepare(inject: &mut FaultInjector, fault: Fault, ends: &[String; 2]) {
    if fault == Fault::Silent {
        for dev in ends {
            inject.tc(&format!("qdisc add dev {dev} root netem loss 0%"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether the fault `cut` asked for is in place (it went through `-batch` processes,
/// which report nothing back).
fn fault_in_place(fault: Fault, ends: &[String; 2]) -> bool {
    match fault {
        Fault::LinkDown => link_is_down(&ends[0]),
        Fault::Silent => ends.iter().all(|d| has_netem(d, "loss 100%")),
    }
}

/// Take the fault off `ends` and put back what a link going down drops (routes).
fn heal(v: Variant, ends: &[String; 2]) {
    for dev in ends {
        let _ = std::process::Command::new("/usr/sbin/tc")
            .args(["qdisc", "del", "dev", dev, "root"])
            .output();
        let _ = ip_quiet(&["link", "set", dev, "up"]);
    }
    match v {
        Variant::Apm | Variant::ApmNoProbes | Variant::None => {
            for (vlan, a, b) in super::rails::RAILS {
                rail_routes(vlan, a, b);
            }
        }
        Variant::BondMiimon | Variant::BondArp => bond_routes(),
    }
}

/// apm's probe interval (ms) and multiplier in the `apm` runs: `APM_BENCH_PROBE`
/// (`INTERVAL,MULTIPLIER`), else apm's defaults.
fn probe_setting() -> (u32, u8) {
    let d = apm_core::probe::ProbePolicy::default();
    std::env::var("APM_BENCH_PROBE")
        .ok()
        .and_then(|v| {
            let (i, m) = v.split_once(',')?;
            Some((i.trim().parse().ok()?, m.trim().parse().ok()?))
        })
        .unwrap_or((d.interval_ms, d.multiplier))
}

/// The `apm pingpong` arguments of each side: (server, client).
fn sides(v: Variant, port: u16) -> (Vec<String>, Vec<String>) {
    let listen = format!("127.0.0.1:{port}");
    let (devs, rails): ([&str; 2], Vec<[&str; 2]>) = match v {
        Variant::Apm | Variant::ApmNoProbes => (
            ["rxe1", "rxe0"],
            vec![["10.0.10.2", "10.0.10.1"], ["10.0.20.2", "10.0.20.1"]],
        ),
        Variant::None => (["rxe1", "rxe0"], vec![["10.0.10.2", "10.0.10.1"]]),
        Variant::BondMiimon | Variant::BondArp => (["rxe3", "rxe2"], vec![[BOND_B, BOND_A]]),
    };
    let mut mode: Vec<String> = if v == Variant::ApmNoProbes {
        vec!["--mode".into(), "software".into()]
    } else if v == Variant::Apm {
        let (interval, multiplier) = probe_setting();
        [
            "--mode",
            "software",
            "--probes",
            "--probe-interval-ms",
            &interval.to_string(),
            "--probe-multiplier",
            &multiplier.to_string(),
        ]
        .map(String::from)
        .to_vec()
    } else {
        vec!["--mode".into(), "none".into()]
    };
    if let (Some(p), Variant::Apm | Variant::ApmNoProbes) = (realtime_priority(), v) {
        mode.extend(["--realtime".to_owned(), p.to_string()]);
    }
    let interval_ms = traffic_interval_ms().to_string();
    let common = [
        "--json",
        "--until-stdin-eof",
        "--interval-ms",
        &interval_ms,
        "--drain-secs",
        "3",
        "--control",
        "127.0.0.1:0",
    ];
    let build = |k: usize| -> Vec<String> {
        let mut a: Vec<String> = vec!["--device".into(), devs[k].into()];
        for r in &rails {
            a.push("--rail".into());
            a.push(r[k].into());
        }
        a.push(if k == 0 { "--listen" } else { "--connect" }.into());
        a.push(listen.clone());
        a.extend(mode.iter().cloned());
        a.extend(common.iter().map(|s| (*s).to_owned()));
        a
    };
    (build(0), build(1))
}

/// One side's report, or `None` when it did not finish (hung, killed); the side's last
/// lines are printed when it gave no report.
fn finish(p: Pingpong, limit: Duration) -> Option<serde_json::Value> {
    let name = p.0.name;
    let (report, log) = finish_logged(p, limit);
    if std::env::var_os("APM_PINGPONG_LOG").is_some() {
        // A traced run (`--log`): the whole log, for reading the failover step by step.
        println!("  {name} log:\n    {}", log.join("\n    "));
    } else if report.is_none() {
        let tail = &log[log.len().saturating_sub(12)..];
        println!(
            "  {name} gave no report; its last lines:\n    {}",
            tail.join("\n    ")
        );
    }
    report
}

fn finish_logged(mut p: Pingpong, limit: Duration) -> (Option<serde_json::Value>, Vec<String>) {
    p.stop();
    let until = Instant::now() + limit;
    loop {
        while let Ok(l) = p.0.lines.try_recv() {
            p.0.log.push(l);
        }
        match p.0.child.try_wait() {
            Ok(Some(_)) => break,
            _ if Instant::now() > until => {
                let _ = p.0.child.kill();
                let _ = p.0.child.wait();
                p.0.log.push("(killed: no exit in time)".into());
                return (None, std::mem::take(&mut p.0.log));
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let log = std::mem::take(&mut p.0.log);
    let Ok(out) = p.0.child.wait_with_output() else {
        return (None, log);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    (
        serde_json::from_str(text.lines().last().unwrap_or("")).ok(),
        log,
    )
}

/// The longest stall of one side's report (times in its own clock) that ends after
/// `from_ms` and begins before `to_ms`: the fault's (from the fault to the rail's return),
/// or the return's (from the return on). A pingpong records a stall as the time of the
/// last arrival before it and its length (only those over 100 ms). Returns when it
/// began and how long it was.
fn longest_stall_in(report: &serde_json::Value, from_ms: f64, to_ms: f64) -> Option<(f64, f64)> {
    report["stalls"]
        .as_array()?
        .iter()
        .filter_map(|s| Some((s["at_ms"].as_f64()?, s["ms"].as_f64()?)))
        .filter(|(at, ms)| at + ms > from_ms && *at < to_ms)
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// The pingpongs' log filter unless `--log` traces a run: apm's own default, what a
/// deployment runs with. The suite's filter logs every step of a failover, for reading
/// a failing test; under emulation each line costs the guest CPU that the failover
/// shares, which is not what the figures are about.
const BENCH_LOG: &str = "warn";

/// Start the pair of variant `v` on `port` and wait until it exchanges traffic (and,
/// under apm, until both sides are protected): (server, client).
fn start_pair(apm: &str, v: Variant, port: u16) -> (Pingpong, Pingpong) {
    let (server, client) = sides(v, port);
    let mut s = Pingpong::start_logging(apm, "server", &argv(&server), BENCH_LOG);
    std::thread::sleep(Duration::from_millis(300));
    let mut c = Pingpong::start_logging(apm, "client", &argv(&client), BENCH_LOG);
    let protected = matches!(v, Variant::Apm | Variant::ApmNoProbes);
    let ready = if protected {
        "software migration mode"
    } else {
        "unprotected mode"
    };
    c.0.wait_for(ready, Duration::from_secs(60));
    s.0.wait_for("qpn", Duration::from_secs(30));
    if protected {
        c.0.wait_for("protected", Duration::from_secs(30));
    }
    (s, c)
}

/// apm's control threads' SCHED_FIFO priority in the apm runs: `APM_BENCH_REALTIME`,
/// else ordinary threads.
fn realtime_priority() -> Option<u8> {
    std::env::var("APM_BENCH_REALTIME").ok()?.parse().ok()
}

/// The traffic's message interval (ms) each way: `APM_BENCH_INTERVAL_MS`, else 2.
fn traffic_interval_ms() -> f64 {
    std::env::var("APM_BENCH_INTERVAL_MS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|ms: &f64| ms.is_finite() && *ms > 0.0)
        .unwrap_or(2.0)
}

/// Repetitions per row: `APM_BENCH_REPS`, else `default`.
fn bench_reps(default: u32) -> u32 {
    std::env::var("APM_BENCH_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
}

/// `apm pingpong`'s arguments as the child helper takes them.
fn argv(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// One run: start the pair, cut the rail in use, heal it, stop; the record as
/// `key=value` words (xtask reads them).
fn one_run(apm: &str, v: Variant, fault: Fault, rep: u32, port: u16) -> String {
    let mut inject = FaultInjector::start();
    let t0 = Instant::now();
    let pauses = GuestPauses::start(t0);
    let t0_unix_ms = unix_ms();
    let (s, mut c) = start_pair(apm, v, port);
    // perf starts long before the fault (its start costs the guest CPU seconds), its
    // events off until the fault.
    let perf = (std::env::var("APM_BENCH_PERF").as_deref() == Ok("1"))
        .then(|| GuestPerf::start(&[c.0.child.id(), s.0.child.id()]))
        .flatten();
    std::thread::sleep(Duration::from_millis(1500));
    let ends = rail_in_use(v, &mut c);
    prepare(&mut inject, fault, &ends);
    let sched = guest_sched::wanted().then(|| SchedTrace::start(t0));
    let fault_ms = t0.elapsed().as_secs_f64() * 1e3;
    println!("  fault {} at unix ms {:.1}", fault.name(), unix_ms());
    cut(&mut inject, fault, &ends);
    if let Some(p) = perf {
        p.control("enable");
        std::thread::sleep(Duration::from_millis(400));
        p.control("disable");
        p.report();
        std::thread::sleep(Duration::from_millis(2100));
    } else {
        std::thread::sleep(Duration::from_millis(2500));
    }
    // The trace ends before the heal; the pingpongs' threads are named while they run.
    let sched = sched.map(|t| {
        let names = [(&c, "client"), (&s, "server")]
            .into_iter()
            .flat_map(|(p, name)| {
                threads_of(p.0.child.id())
                    .into_iter()
                    .map(move |t| (t, name))
            })
            .collect::<BTreeMap<u32, &str>>();
        (t.and_then(SchedTrace::finish), names)
    });
    assert!(
        fault_in_place(fault, &ends),
        "the {} of {ends:?} did not take (see ip/tc above)",
        fault.name()
    );
    heal(v, &ends);
    let heal_ms = t0.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(2500));
    let (rc, rs) = (
        finish(c, Duration::from_secs(20)),
        finish(s, Duration::from_secs(20)),
    );
    heal(v, &ends);
    let pauses = pauses.finish();
    let reports = [rc, rs];
    // Kept: every message arrived once on both sides, and traffic still flowed after the
    // rail came back (a connection that died stops arriving at the fault). Each report's
    // times count from its own origin, which it states on the wall clock (both sides
    // start theirs once connected, not at their start).
    let offset = |k: usize| {
        reports[k]
            .as_ref()
            .and_then(|r| r["clock_origin_unix_ms"].as_f64())
            .map_or(0.0, |o| o - t0_unix_ms)
    };
    // Why a side does not count as kept (empty: it does).
    let why_not = |k: usize, r: &serde_json::Value| -> String {
        let mut why = Vec::new();
        if r["lost"].as_u64() != Some(0) {
            why.push(format!("lost {}", r["lost"]));
        }
        if r["duplicated"].as_u64() != Some(0) {
            why.push(format!("duplicated {}", r["duplicated"]));
        }
        let last = r["last_arrival_ms"].as_f64().map(|t| t + offset(k));
        if last.is_none_or(|t| t <= heal_ms) {
            why.push(format!(
                "last arrival {last:?} ms, rail back at {heal_ms:.0} ms"
            ));
        }
        why.join(", ")
    };
    let whys: Vec<String> = reports
        .iter()
        .enumerate()
        .filter_map(|(k, r)| Some(why_not(k, r.as_ref()?)))
        .filter(|w| !w.is_empty())
        .collect();
    let outcome = if reports.iter().any(Option::is_none) {
        "hung"
    } else if whys.is_empty() {
        "kept"
    } else {
        println!("  not kept: {}", whys.join("; "));
        "lost"
    };
    for r in reports.iter().flatten() {
        println!("FAILOVER-BENCH-DETAIL {r}");
    }
    let sum = |k: &str| {
        reports
            .iter()
            .flatten()
            .filter_map(|r| r[k].as_u64())
            .sum::<u64>()
    };
    // Each side's longest stall in a window of the test's clock, its start on that clock.
    let stalls = |from: f64, to: f64| -> Vec<(f64, f64)> {
        reports
            .iter()
            .enumerate()
            .filter_map(|(k, r)| {
                let (at, ms) = longest_stall_in(r.as_ref()?, from - offset(k), to - offset(k))?;
                Some((at + offset(k), ms))
            })
            .collect()
    };
    let kept = outcome == "kept";
    // The fault's stall began at most a message interval before it (five of slack:
    // 10 ms at the default 2); anything that began after the rail came back is the
    // return's. Both only over a kept connection.
    let (at_fault, after_return) = if kept {
        let before = traffic_interval_ms().max(2.0) * 5.0;
        (
            stalls(fault_ms - before, heal_ms),
            stalls(heal_ms, f64::MAX),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    // The longer side's.
    let stall = at_fault.iter().map(|&(_, ms)| ms).reduce(f64::max);
    let after_heal = after_return
        .iter()
        .map(|&(_, ms)| ms)
        .reduce(f64::max)
        .unwrap_or(0.0);
    let ms = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.1}"));
    // Kept with no gap a pingpong records (ten message intervals, 20 ms at least) on
    // either side: the stall was shorter than that, not absent from the table.
    let stall_field = match stall {
        None if kept => format!("below:{:.0}", (traffic_interval_ms() * 10.0).max(20.0)),
        _ => ms(stall),
    };
    // Where the stall went: when each side's move was done, from the fault's stall's
    // start (the last message before it: the cut command itself takes a few hundred ms
    // of the guest's wall time before anything is dropped).
    let moves = at_fault
        .iter()
        .map(|&(at, _)| at)
        .reduce(f64::min)
        .map_or_else(Vec::new, |began| {
            moves_after(&reports, &offset, began, heal_ms)
        });
    // The guest's own pauses within the fault's stall (from its earliest start to its
    // latest end, both sides).
    let window = at_fault
        .iter()
        .map(|&(at, ms)| (at, at + ms))
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)));
    if let Some((trace, names)) = &sched {
        let (from, to) = window.unwrap_or((fault_ms, fault_ms + 500.0));
        match trace
            .as_ref()
            .map_err(String::clone)
            .and_then(|t| read_events(t))
        {
            Ok(events) => {
                for line in summarise(&events, from, to, names) {
                    println!("  sched: {line}");
                }
                // As long a window 1.5 s after the fault, on the new path with nothing
                // moving: what the traffic and apm's steady work cost alone (for a
                // protection whose stall lasts seconds it is still the stall).
                let (from, to) = (fault_ms + 1500.0, fault_ms + 1500.0 + (to - from));
                for line in summarise(&events, from, to, names) {
                    println!("  sched, steady: {line}");
                }
            }
            Err(e) => println!("  sched: no trace: {e}"),
        }
    }
    let (pause_max, paused) = match window {
        Some((from, to)) => {
            let (longest, sum) = pauses_within(&pauses, from, to);
            (Some(longest), Some(sum))
        }
        None => (None, None),
    };
    format!(
        "variant={} fault={} rep={rep} outcome={outcome} stall_ms={} heal_stall_ms={:.1} \
         lost={} duplicated={} failovers={} first_move_ms={} last_move_ms={} \
         guest_pause_max_ms={} guest_paused_ms={}",
        v.name(),
        fault.name(),
        stall_field,
        after_heal,
        sum("lost"),
        sum("duplicated"),
        sum("failovers"),
        ms(moves.first().copied()),
        ms(moves.last().copied()),
        ms(pause_max),
        ms(paused),
    )
}

/// The times (ms after `from`, sorted) at which either side reported a failover done
/// between `from` and `to` on the test's clock; `offset(k)` puts report `k`'s times
/// on that clock. `from` is the fault's stall's start.
fn moves_after(
    reports: &[Option<serde_json::Value>],
    offset: &dyn Fn(usize) -> f64,
    from: f64,
    to: f64,
) -> Vec<f64> {
    let mut at: Vec<f64> = reports
        .iter()
        .enumerate()
        .filter_map(|(k, r)| Some((k, r.as_ref()?["events"].as_array()?)))
        .flat_map(|(k, events)| {
            events
                .iter()
                .filter(|e| e["kind"] == "failover")
                .filter_map(move |e| Some(e["at_ms"].as_f64()? + offset(k)))
        })
        .filter(|t| (from..to).contains(t))
        .map(|t| t - from)
        .collect();
    at.sort_by(f64::total_cmp);
    at
}

#[test]
fn moves_are_timed_from_the_stall_on_one_clock() {
    let side = |at: &[f64]| {
        let events: Vec<serde_json::Value> = at
            .iter()
            .map(|t| serde_json::json!({"kind": "failover", "at_ms": t}))
            .chain([serde_json::json!({"kind": "rearmed", "at_ms": 10.0})])
            .collect();
        Some(serde_json::json!({ "events": events }))
    };
    // Side 0's clock starts 100 ms after the test's, side 1's 50 ms after.
    let reports = [side(&[1950.0, 9000.0]), side(&[2080.0])];
    let offset = |k: usize| [100.0, 50.0][k];
    // The stall from 2000 ms, the rail back at 4500: side 0 moved at 2050, side 1 at 2130;
    // side 0's move at 9100 came after the return.
    assert_eq!(
        moves_after(&reports, &offset, 2000.0, 4500.0),
        vec![50.0, 130.0]
    );
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask bench failover`"]
fn bench_failover() {
    if std::env::var("APM_BENCH").as_deref() != Ok("1") {
        println!("SKIPPED: a benchmark: `cargo xtask bench failover` runs it");
        return;
    }
    let (apm, v) = match super::pingpong_cuts::prerequisites() {
        Ok(p) => p,
        Err(why) => return println!("SKIPPED bench_failover: {why}"),
    };
    let reps = bench_reps(10);
    let (interval, multiplier) = probe_setting();
    println!(
        "FAILOVER-BENCH-SETTING probe_interval_ms={interval} probe_multiplier={multiplier} traffic_interval_ms={}",
        traffic_interval_ms()
    );
    let mut port = 18700;
    let only = std::env::var("APM_BENCH_ONLY").unwrap_or_default();
    for variant in [
        Variant::Apm,
        Variant::ApmNoProbes,
        Variant::None,
        Variant::BondMiimon,
        Variant::BondArp,
    ] {
        // `--only NAME,...`: the other protections are left out of this run.
        if !only.is_empty() && !only.split(',').any(|n| n.trim() == variant.name()) {
            continue;
        }
        match variant {
            Variant::Apm | Variant::ApmNoProbes | Variant::None => {
                bonds_down();
                setup_rails();
                wait_for_rail_gids(&v);
            }
            Variant::BondMiimon => bonds_up(&["miimon", "10"]),
            Variant::BondArp => bonds_up(&[
                "arp_interval",
                "50",
                "arp_ip_target",
                "TARGET",
                "arp_validate",
                "all",
            ]),
        }
        for fault in [Fault::LinkDown, Fault::Silent] {
            for rep in 0..reps {
                port += 1;
                // A pair that cannot even connect (seen with bonding: after earlier
                // runs the bond's GID was gone and the QP's modify to RTR failed) is a
                // lost connection of that run, not the end of the benchmark.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    one_run(&apm, variant, fault, rep, port)
                }));
                let record = run.unwrap_or_else(|_| {
                    println!("  not kept: the pair could not be set up (see above)");
                    format!(
                        "variant={} fault={} rep={rep} outcome=lost stall_ms=- \
                         heal_stall_ms=0.0 lost=0 duplicated=0 failovers=0 \
                         first_move_ms=- last_move_ms=-",
                        variant.name(),
                        fault.name()
                    )
                });
                println!("FAILOVER-BENCH {record}");
            }
        }
    }
    bonds_down();
}

/// CPU seconds (user + system) `pid` has used so far (`/proc/PID/stat` fields 14 and
/// 15, in clock ticks of 1/100 s on Linux).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count from after its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // After ')' the fields are 3 (state, not a number, skipped) onwards: utime is field
    // 14, the 11th number here; stime the 12th.
    f.get(10)
        .zip(f.get(11))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

/// What apm costs with no fault: the same traffic for `secs` under `--mode none`, apm
/// without probes and apm with them, side by side. Per configuration: gaps of 20 ms or
/// more in arrivals per second (the traffic runs every 2 ms), the longest gap, failovers
/// (there is no fault: any is a false verdict) and CPU used by the two processes. One
/// line `FAILOVER-IDLE key=value ...` each. A benchmark: only with `APM_BENCH=1`.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask bench failover --idle`"]
fn bench_idle_cost() {
    if std::env::var("APM_BENCH").as_deref() != Ok("1") {
        println!("SKIPPED: a benchmark: `cargo xtask bench failover --idle` runs it");
        return;
    }
    let (apm, v) = match super::pingpong_cuts::prerequisites() {
        Ok(p) => p,
        Err(why) => return println!("SKIPPED bench_idle_cost: {why}"),
    };
    bonds_down();
    setup_rails();
    wait_for_rail_gids(&v);
    let secs = 8.0;
    let mut port = 18900;
    for rep in 0..bench_reps(3) {
        for (config, variant) in [
            ("none", Variant::None),
            ("apm-no-probes", Variant::ApmNoProbes),
            ("apm-probes", Variant::Apm),
        ] {
            port += 1;
            let (s, c) = start_pair(&apm, variant, port);
            let cpu0 = cpu_secs(s.0.child.id()) + cpu_secs(c.0.child.id());
            std::thread::sleep(Duration::from_secs_f64(secs));
            let cpu = cpu_secs(s.0.child.id()) + cpu_secs(c.0.child.id()) - cpu0;
            let (rc, log_c) = finish_logged(c, Duration::from_secs(20));
            let (rs, log_s) = finish_logged(s, Duration::from_secs(20));
            // Why a session went down with no fault: the prober's own line says how long
            // it heard nothing.
            for l in log_c
                .iter()
                .chain(&log_s)
                .filter(|l| l.contains("probe session down"))
                .take(6)
            {
                println!("  {config}: {l}");
            }
            let reports = [rc, rs];
            let (mut gaps, mut longest, mut failovers, mut elapsed) = (0usize, 0f64, 0u64, 0f64);
            for r in reports.iter().flatten() {
                let st: Vec<f64> = r["stalls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s["ms"].as_f64())
                    .collect();
                gaps += st.len();
                longest = st.iter().copied().fold(longest, f64::max);
                failovers += r["failovers"].as_u64().unwrap_or(0);
                elapsed += r["elapsed_ms"].as_f64().unwrap_or(0.0) / 1e3;
            }
            println!(
                "FAILOVER-IDLE config={config} rep={rep} gaps_per_s={:.2} longest_gap_ms={longest:.0} \
                 failovers={failovers} cpu_percent={:.0}",
                gaps as f64 / elapsed.max(1e-9),
                100.0 * cpu / secs
            );
        }
    }
}
