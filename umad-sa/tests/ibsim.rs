//! Bed tests of the SA client against OpenSM over ibsim (`cargo xtask ibsim`).
//!
//! Skipped with a printed reason outside the bed. Node processes (this binary re-run as
//! `bed_node` under umad2sim) do the SA work and report with `@@` lines; the tests drive
//! the ibsim console, time what the nodes report and read OpenSM's log.
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use umad::bed::{self, report, Bed};
use umad::{Port, PortOptions, PortSelector, TestBedMode};
use umad_sa::{SaClient, SaEvent, SaOptions, SA_AGENT};

/// Entry point of node processes; a no-op in a normal test run.
#[test]
#[ignore = "runs only as a node process of the ibsim bed tests"]
fn bed_node() {
    let Some(role) = bed::node_role() else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime"); // a test process without a runtime can do nothing
    if let Err(e) = rt.block_on(node(&role)) {
        report(&format!("FAIL {e}"));
        std::process::exit(1);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn node(role: &str) -> Result<(), String> {
    let opts = PortOptions {
        // CM too: every class that could reach a bed node needs an agent (umad2sim).
        agents: vec![SA_AGENT, umad::AgentSpec::class(0x07, 2)],
        testbed: TestBedMode::IbsimOnly,
        ..Default::default()
    };
    let (port, unsolicited) = Port::open(&PortSelector::First, opts).map_err(|e| e.to_string())?;
    let port = Arc::new(port);
    report(&format!("GID {}", hex(&port.info().gid)));
    let (sa, mut events) = SaClient::new(Arc::clone(&port), unsolicited, SaOptions::default());
    match role {
        "subscriber" => {
            let t = Instant::now();
            sa.subscribe_gid_traps().await.map_err(|e| e.to_string())?;
            report(&format!("SUBSCRIBED us={}", t.elapsed().as_micros()));
            // Commands from the test on stdin (e.g. "resubscribe" after an SM restart,
            // standing in for the CLIENT_REREGISTER event umad2sim cannot deliver).
            let (ctx, mut commands) = tokio::sync::mpsc::unbounded_channel::<String>();
            std::thread::spawn(move || {
                for line in std::io::stdin().lines().map_while(Result::ok) {
                    if ctx.send(line).is_err() {
                        break;
                    }
                }
            });
            let until = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let ev = tokio::select! {
                    _ = tokio::time::sleep_until(until) => break,
                    c = commands.recv() => {
                        if c.as_deref() == Some("resubscribe") {
                            let t = Instant::now();
                            sa.subscribe_gid_traps().await.map_err(|e| e.to_string())?;
                            report(&format!("SUBSCRIBED again us={}", t.elapsed().as_micros()));
                        }
                        continue;
                    }
                    ev = events.recv() => match ev {
                        Some(ev) => ev,
                        None => break,
                    },
                };
                match ev {
                    SaEvent::GidOutOfService { gid } => {
                        report(&format!("EVENT out {}", hex(&gid.0)))
                    }
                    SaEvent::GidInService { gid } => report(&format!("EVENT in {}", hex(&gid.0))),
                    other => report(&format!("EVENT other {other:?}")),
                }
            }
        }
        r if r.starts_with("paths:") => {
            let me = ib_mad::types::Gid(port.info().gid);
            let t = Instant::now();
            let mut total = 0;
            for guid in r["paths:".len()..].split(',').filter(|g| !g.is_empty()) {
                let guid = u64::from_str_radix(guid.trim_start_matches("0x"), 16)
                    .map_err(|e| e.to_string())?;
                let dgid = ib_mad::types::Gid::new(0xfe80_0000_0000_0000, guid);
                if dgid == me {
                    continue;
                }
                let paths = sa.path_records(me, dgid).await.map_err(|e| e.to_string())?;
                total += paths.len();
                for p in &paths {
                    report(&format!(
                        "PATH {guid:#x} {} {} {}",
                        p.slid.0, p.dlid.0, p.reversible
                    ));
                }
            }
            report(&format!("PATHS {total} us={}", t.elapsed().as_micros()));
            report(&format!("PENDING {}", port.pending_requests()));
        }
        other => return Err(format!("unknown role {other}")),
    }
    report("DONE");
    Ok(())
}

/// The GID (hex) in OpenSM's "GID out of service"/"GID in service" log line.
fn logged_gid(line: &str) -> Option<String> {
    let g = line.split("GID:").nth(1)?.split_whitespace().next()?;
    let ip: std::net::Ipv6Addr = g.trim_end_matches(',').parse().ok()?;
    Some(hex(&ip.octets()))
}

/// OpenSM accepts Set(InformInfo) for traps 64 and 65 (the GetResp is checked inside).
#[test]
fn subscription_accepted() {
    let Some(bed) = Bed::or_skip("subscription_accepted") else {
        return;
    };
    let mut n = bed
        .spawn_node(&bed.nodes[0], "bed_node", "subscriber")
        .unwrap();
    let (_, s) = n.expect("SUBSCRIBED", Duration::from_secs(10)).unwrap();
    println!("subscription of traps 64+65: {s}");
}

/// Unlink of a remote HCA port gives a trap 65 event at the subscriber, ReLink a trap 64
/// event, each once, for the GID OpenSM reports; every Report is answered (no ERR 1A06).
#[test]
fn unlink_relink_traps() {
    let Some(bed) = Bed::or_skip("unlink_relink_traps") else {
        return;
    };
    let bound = Duration::from_secs(2);
    let mut n = bed
        .spawn_node(&bed.nodes[0], "bed_node", "subscriber")
        .unwrap();
    n.expect("SUBSCRIBED", Duration::from_secs(10)).unwrap();
    let victim = &bed.nodes[1];
    let mut lat = Vec::new();
    for round in 0..3 {
        let mark = bed.log_mark();
        let t0 = Instant::now();
        bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
        let (t1, out) = n.expect("EVENT out", bound).unwrap();
        let line = bed
            .wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(1))
            .expect("OpenSM logged no trap 65");
        let gid = logged_gid(&line).expect("GID in OpenSM's log line");
        assert_eq!(out, format!("EVENT out {gid}"), "round {round}");
        let t2 = Instant::now();
        bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
        let (t3, inn) = n.expect("EVENT in", bound).unwrap();
        assert_eq!(inn, format!("EVENT in {gid}"), "round {round}");
        lat.push((t1 - t0, t3 - t2));
    }
    // OpenSM resends an unanswered Report after 200 ms, 3 times: wait them out.
    std::thread::sleep(Duration::from_millis(1000));
    let extra = n.drain();
    assert!(
        extra.iter().all(|l| !l.starts_with("EVENT")),
        "duplicate or unexpected events: {extra:?}"
    );
    let log = bed.opensm_log();
    assert!(
        !log.contains("ERR 1A06"),
        "a Report went unanswered:\n{log}"
    );
    for (i, (down, up)) in lat.iter().enumerate() {
        println!(
            "round {i}: Unlink -> trap 65 event {:.2} ms, ReLink -> trap 64 event {:.2} ms",
            down.as_secs_f64() * 1e3,
            up.as_secs_f64() * 1e3
        );
    }
}

/// After an OpenSM restart the subscription is gone (an Unlink gives no event); after
/// resubscribing (what CLIENT_REREGISTER triggers on real ports) traps arrive again.
#[test]
fn resubscribe_after_opensm_restart() {
    let Some(bed) = Bed::or_skip("resubscribe_after_opensm_restart") else {
        return;
    };
    let victim = bed.nodes[1].clone();
    let mut n = bed
        .spawn_node(&bed.nodes[0], "bed_node", "subscriber")
        .unwrap();
    n.expect("SUBSCRIBED", Duration::from_secs(10)).unwrap();
    let t = Instant::now();
    let _sm = bed.restart_opensm(Duration::from_secs(10)).unwrap();
    println!(
        "OpenSM restarted in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let mark = bed.log_mark();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    bed.wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(2))
        .expect("the new OpenSM saw no port going away");
    assert!(
        n.expect("EVENT", Duration::from_millis(500)).is_err(),
        "an event arrived without a subscription at the new SM"
    );
    let mark = bed.log_mark();
    bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
    bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
        .expect("no sweep after ReLink");

    n.send("resubscribe").unwrap();
    n.expect("SUBSCRIBED again", Duration::from_secs(5))
        .unwrap();
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    let (t1, _) = n.expect("EVENT out", Duration::from_secs(2)).unwrap();
    bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
    n.expect("EVENT in", Duration::from_secs(2)).unwrap();
    println!(
        "after resubscription: Unlink -> trap 65 event {:.2} ms",
        (t1 - t0).as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        !bed.opensm_log().contains("ERR 1A06"),
        "a Report went unanswered"
    );
}

/// OpenSM's port GUID -> LID range table (its guid2lid cache file in the bed directory).
fn guid2lid(bed: &Bed) -> BTreeMap<u64, (u16, u16)> {
    let text = std::fs::read_to_string(bed.scratch.join("guid2lid")).unwrap_or_default();
    let num = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (g, lo, hi) = (num(f.first()?)?, num(f.get(1)?)?, num(f.get(2)?)?);
            Some((g, (u16::try_from(lo).ok()?, u16::try_from(hi).ok()?)))
        })
        .collect()
}

/// With LMC 1, PathRecord queries from one port return, for every other HCA port, every
/// SLID x DLID combination (2 x 2), all reversible, with the LIDs OpenSM assigned.
#[test]
fn path_records_every_lmc_path() {
    let Some(bed) = Bed::or_skip("path_records_every_lmc_path") else {
        return;
    };
    assert_eq!(bed.lmc, 1, "the bed runs OpenSM with LMC 1");
    let lids = guid2lid(&bed);
    // HCA ports have LMC 1 (two LIDs); switch management ports have one.
    let hca: Vec<u64> = lids
        .iter()
        .filter(|(_, (lo, hi))| hi > lo)
        .map(|(g, _)| *g)
        .collect();
    assert_eq!(hca.len(), 2 * (bed.nodes.len() + 1), "guid2lid: {lids:?}");
    let role = format!(
        "paths:{}",
        hca.iter()
            .map(|g| format!("{g:x}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut n = bed.spawn_node(&bed.nodes[0], "bed_node", &role).unwrap();
    let (_, gid) = n.expect("GID", Duration::from_secs(10)).unwrap();
    let my_guid = u64::from_str_radix(&gid[gid.len() - 16..], 16).unwrap();
    let (mlo, mhi) = lids[&my_guid];
    let mut got: BTreeMap<u64, BTreeSet<(u16, u16)>> = BTreeMap::new();
    let summary = loop {
        let (_, l) = n.expect("PATH", Duration::from_secs(20)).unwrap();
        if l.starts_with("PATHS") {
            break l;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 5, "{l}");
        assert_eq!(f[4], "true", "not reversible: {l}");
        let g = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
        let pair = (f[2].parse().unwrap(), f[3].parse().unwrap());
        assert!(got.entry(g).or_default().insert(pair), "duplicate {l}");
    };
    println!("{summary} for {} destinations", got.len());
    n.expect("PENDING 0", Duration::from_secs(5)).unwrap();
    assert_eq!(got.len(), hca.len() - 1, "destinations: {got:?}");
    for (g, set) in &got {
        let (lo, hi) = lids[g];
        let want: BTreeSet<(u16, u16)> = (mlo..=mhi)
            .flat_map(|s| (lo..=hi).map(move |d| (s, d)))
            .collect();
        assert_eq!(set, &want, "paths to {g:#x}");
    }
}
