//! Bed tests of the SA client against OpenSM over ibsim (`cargo xtask ibsim`).
//!
//! Skipped with a printed reason outside the bed. Node processes (this binary re-run as
//! `bed_node` under umad2sim) do the SA work and report with `@@` lines; the tests drive
//! the ibsim console, time what the nodes report and read OpenSM's log.
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use apm_core::{FabricService, GidService};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use umad::bed::{self, logged_gid, ms, report, stdin_commands, Bed, NodeProc};
use umad::{Port, PortOptions, PortSelector, TestBedMode};
use umad_sa::{SaClient, SaEvent, SaFabric, SaOptions, SA_AGENT};

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
    let refresh = role
        .strip_prefix("subscriber-refresh:")
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis);
    let sa_opts = if role.starts_with("lossy:") {
        // Many short attempts: the test drops half the MADs into this port.
        SaOptions {
            request: umad::RequestOptions {
                timeout: Duration::from_millis(30),
                retries: 40,
            },
            ..SaOptions::default()
        }
    } else {
        SaOptions {
            // Only the refresh test refreshes: the others count exact MADs and events.
            refresh_interval: refresh,
            ..SaOptions::default()
        }
    };
    let (sa, mut events) = SaClient::new(Arc::clone(&port), unsolicited, sa_opts);
    match role {
        r if r == "subscriber" || r.starts_with("subscriber-refresh:") => {
            let t = Instant::now();
            sa.subscribe_gid_traps().await.map_err(|e| e.to_string())?;
            report(&format!("SUBSCRIBED us={}", t.elapsed().as_micros()));
            // Commands from the test on stdin (e.g. "resubscribe", what an engine asks for
            // on CLIENT_REREGISTER, which umad2sim cannot deliver).
            let mut commands = stdin_commands();
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
                        if c.as_deref() == Some("unsubscribe") {
                            sa.unsubscribe_gid_traps().await.map_err(|e| e.to_string())?;
                            report("UNSUBSCRIBED");
                        }
                        if c.as_deref() == Some("refreshes") {
                            report(&format!("REFRESHES {}", sa.subscription_refreshes()));
                        }
                        continue;
                    }
                    ev = events.recv() => match ev {
                        Some(ev) => ev,
                        None => break,
                    },
                };
                match ev {
                    SaEvent::Gid {
                        gid,
                        service: GidService::OutOfService,
                    } => report(&format!("EVENT out {}", hex(&gid.0))),
                    SaEvent::Gid {
                        gid,
                        service: GidService::InService,
                    } => report(&format!("EVENT in {}", hex(&gid.0))),
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
        r if r.starts_with("fabric:") => fabric_node(&r["fabric:".len()..], sa, events).await?,
        r if r.starts_with("lossy:") => {
            let guid = u64::from_str_radix(&r["lossy:".len()..], 16).map_err(|e| e.to_string())?;
            let dgid = ib_mad::types::Gid::new(0xfe80_0000_0000_0000, guid);
            let me = ib_mad::types::Gid(port.info().gid);
            let mut commands = stdin_commands();
            report("READY");
            if commands.recv().await.as_deref() != Some("go") {
                return Err("no go".into());
            }
            let mut sizes = BTreeSet::new();
            let rounds = 20;
            for _ in 0..rounds {
                let p = sa.path_records(me, dgid).await.map_err(|e| e.to_string())?;
                sizes.insert(p.len());
            }
            let c = port.counters();
            report(&format!(
                "LOSS ok={rounds} sizes={sizes:?} sent={} retransmits={} timeouts={} pending={}",
                c.requests_sent,
                c.retransmits,
                c.timeouts,
                port.pending_requests()
            ));
            let _ = commands.recv().await; // "done": the test has restored the port
        }
        other => return Err(format!("unknown role {other}")),
    }
    report("DONE");
    Ok(())
}

/// The engine's view: [`SaFabric`] turns notices into `Input::RemoteGid` and caches
/// paths per destination. `args` is `<guid>,<guid>`: the destinations; the first one is
/// the port the test unlinks.
async fn fabric_node(
    args: &str,
    sa: SaClient,
    events: tokio::sync::mpsc::UnboundedReceiver<SaEvent>,
) -> Result<(), String> {
    let guids: Vec<u64> = args
        .split(',')
        .filter_map(|g| u64::from_str_radix(g, 16).ok())
        .collect();
    let [victim, other] = guids[..] else {
        return Err(format!("want two GUIDs, got {args}"));
    };
    let key = apm_core::PortKey::new(0, 1);
    let fabric = SaFabric::new(sa, key, events);
    let (sink, mut inputs) = tokio::sync::mpsc::unbounded_channel();
    fabric.start(sink).await.map_err(|e| e.to_string())?;
    fabric.subscribe(key).await.map_err(|e| e.to_string())?;
    report("SUBSCRIBED");
    let gid = |g: u64| apm_core::Gid::from_guid(g);
    // A rearm storm: 3 connections to each of 2 destinations.
    let t = Instant::now();
    let mut counts = Vec::new();
    for _conn in 0..3 {
        for g in [victim, other] {
            let paths = fabric
                .resolve_paths(key, gid(g))
                .await
                .map_err(|e| e.to_string())?;
            counts.push(paths.len());
        }
    }
    report(&format!(
        "RESOLVED queries={} paths={counts:?} us={}",
        fabric.sa_queries(),
        t.elapsed().as_micros()
    ));
    report("READY");
    let input = tokio::time::timeout(Duration::from_secs(10), inputs.recv())
        .await
        .map_err(|_| "no engine input after Unlink".to_string())?
        .ok_or("sink closed")?;
    match input {
        apm_core::Input::RemoteGid { gid: g, service } => report(&format!(
            "INPUT {} {}",
            hex(&g.0),
            service == GidService::InService
        )),
        other => report(&format!("INPUT other {other:?}")),
    }
    // The notice dropped the victim's cached paths only.
    fabric
        .resolve_paths(key, gid(other))
        .await
        .map_err(|e| e.to_string())?;
    let before = fabric.sa_queries();
    let again = fabric.resolve_paths(key, gid(victim)).await;
    report(&format!(
        "AFTER other_cached={} victim_requeried={} victim={:?}",
        before == 2,
        fabric.sa_queries() == 3,
        again.map(|p| p.len())
    ));
    Ok(())
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
    // Read before any Unlink: OpenSM rewrites its subnet list without the lost port.
    let guid = bed.hca_ports()[&(victim.clone(), 2)];
    let mut lat = Vec::new();
    for round in 0..3 {
        let mark = bed.log_mark();
        let t0 = Instant::now();
        bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
        let (t1, out) = n.expect("EVENT out", bound).unwrap();
        let line = bed
            .wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(1))
            .expect("OpenSM logged no trap 65");
        let gid = hex(&logged_gid(&line)
            .expect("GID in OpenSM's log line")
            .octets());
        assert!(
            gid.ends_with(&format!("{guid:016x}")),
            "trap for {gid}, not {victim}[2]"
        );
        assert_eq!(out, format!("EVENT out {gid}"), "round {round}");
        let t2 = Instant::now();
        bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
        let (t3, inn) = n.expect("EVENT in", bound).unwrap();
        assert_eq!(inn, format!("EVENT in {gid}"), "round {round}");
        lat.push((t1 - t0, t3 - t2));
    }
    // OpenSM resends an unanswered Report after 200 ms, 3 times: wait them out (a
    // window: what must not come is the test's subject).
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

/// The subscription refresh interval the restart test gives its subscriber.
const TEST_REFRESH: Duration = Duration::from_millis(300);

/// An OpenSM restart loses every subscription and, under umad2sim, no CLIENT_REREGISTER
/// tells the subscriber. Nobody tells the node to resubscribe here: its periodic,
/// idempotent refresh of the InformInfo Set ([`SaOptions::refresh_interval`]) makes
/// traps arrive again within one interval of the new SM's SUBNET UP; refreshes never
/// double a subscription (one event per Unlink); unsubscribing stops the Reports and
/// the refresh.
#[test]
fn subscription_refreshed_after_opensm_restart() {
    let Some(bed) = Bed::or_skip("subscription_refreshed_after_opensm_restart") else {
        return;
    };
    let victim = bed.nodes[1].clone();
    let role = format!("subscriber-refresh:{}", TEST_REFRESH.as_millis());
    let mut n = bed.spawn_node(&bed.nodes[0], "bed_node", &role).unwrap();
    n.expect("SUBSCRIBED", Duration::from_secs(10)).unwrap();
    let t = Instant::now();
    let _sm = bed.restart_opensm(Duration::from_secs(10)).unwrap();
    let up = Instant::now();
    println!("OpenSM restarted in {:.0} ms", ms(up - t));

    // Unlink/ReLink until a trap comes through again.
    let bound = TEST_REFRESH + Duration::from_millis(1500);
    let mut tries = 0;
    let first = loop {
        tries += 1;
        assert!(
            up.elapsed() < bound,
            "no trap within {bound:?} of the restart ({tries} Unlink/ReLink rounds)"
        );
        let mark = bed.log_mark();
        bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
        bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
            .expect("no sweep after Unlink");
        let out = n.expect("EVENT", Duration::from_millis(100));
        let mark = bed.log_mark();
        bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
        bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
            .expect("no sweep after ReLink");
        let inn = n.expect("EVENT", Duration::from_millis(100));
        if let Some((t, l)) = out.ok().or(inn.ok()) {
            break (t, l);
        }
    };
    println!(
        "traps delivered again {:.0} ms after the new SM's SUBNET UP ({}; refresh every {:?}, \
         {tries} Unlink/ReLink rounds)",
        ms(first.0 - up),
        first.1,
        TEST_REFRESH
    );
    let _ = n.expect("EVENT in", Duration::from_millis(500));

    // Several refreshes later, still one event per Unlink and per ReLink: the node
    // counts its refreshes when asked, asked every tenth of an interval.
    let refreshes = |n: &mut NodeProc| -> u64 {
        n.send("refreshes").unwrap();
        let (_, r) = n.expect("REFRESHES", Duration::from_secs(2)).unwrap();
        r.trim_start_matches("REFRESHES ").parse().unwrap()
    };
    let start = refreshes(&mut n);
    let until = Instant::now() + TEST_REFRESH * 10;
    while refreshes(&mut n) < start + 2 {
        assert!(
            Instant::now() < until,
            "no two refreshes within {:?}",
            TEST_REFRESH * 10
        );
        std::thread::sleep(TEST_REFRESH / 10);
    }
    let _ = n.drain();
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    let (t1, _) = n.expect("EVENT out", Duration::from_secs(2)).unwrap();
    bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
    n.expect("EVENT in", Duration::from_secs(2)).unwrap();
    // A doubled subscription would give a second Report at once; OpenSM resends an
    // unanswered one after 200 ms (a window: what must not come is the subject).
    std::thread::sleep(Duration::from_millis(300));
    let extra = n.drain();
    assert!(
        extra.iter().all(|l| !l.starts_with("EVENT")),
        "a refresh doubled the subscription: {extra:?}"
    );
    n.send("refreshes").unwrap();
    let (_, r) = n.expect("REFRESHES", Duration::from_secs(2)).unwrap();
    println!(
        "after the refreshes ({r}): Unlink -> trap 65 event {:.2} ms, one event each",
        ms(t1 - t0)
    );

    // Unsubscribing stops the Reports, and the refresh does not bring them back.
    n.send("unsubscribe").unwrap();
    n.expect("UNSUBSCRIBED", Duration::from_secs(5)).unwrap();
    // A window: a refresh interval passes, and no refresh may subscribe again.
    std::thread::sleep(TEST_REFRESH + Duration::from_millis(100));
    let mark = bed.log_mark();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    bed.wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(2))
        .expect("OpenSM saw no port going away");
    assert!(
        n.expect("EVENT", Duration::from_millis(300)).is_err(),
        "an event arrived after unsubscribing"
    );
    assert!(
        !bed.opensm_log().contains("ERR 1A06"),
        "a Report went unanswered"
    );
}

/// The fabric facet the engine uses: a rearm storm of 3 connections to each of 2
/// destinations costs 2 SA path queries (cache); Unlink of one destination port becomes
/// an `Input::RemoteGid` out of service for the engine and drops only that
/// destination's cached paths.
#[test]
fn fabric_facet_inputs_and_path_cache() {
    let Some(bed) = Bed::or_skip("fabric_facet_inputs_and_path_cache") else {
        return;
    };
    let victim = bed.nodes[1].clone();
    let ports = bed.hca_ports();
    let (v, o) = (ports[&(victim.clone(), 2)], ports[&(victim.clone(), 1)]);
    let mut n = bed
        .spawn_node(&bed.nodes[0], "bed_node", &format!("fabric:{v:x},{o:x}"))
        .unwrap();
    let (_, r) = n.expect("RESOLVED", Duration::from_secs(10)).unwrap();
    println!("{r}");
    assert!(
        r.starts_with("RESOLVED queries=2 paths=[4, 4, 4, 4, 4, 4]"),
        "{r}"
    );
    n.expect("READY", Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    let (t1, input) = n.expect("INPUT", Duration::from_secs(2)).unwrap();
    let want = format!(
        "INPUT {} false",
        hex(&{
            let mut g = [0u8; 16];
            g[..8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
            g[8..].copy_from_slice(&v.to_be_bytes());
            g
        })
    );
    assert_eq!(input, want);
    println!(
        "Unlink -> engine input (RemoteGid out of service) {:.2} ms",
        (t1 - t0).as_secs_f64() * 1e3
    );
    let (_, after) = n.expect("AFTER", Duration::from_secs(5)).unwrap();
    println!("{after}");
    assert!(
        after.starts_with("AFTER other_cached=true victim_requeried=true"),
        "{after}"
    );
}

/// With ibsim dropping 50% of the MADs into the querying node's port (`Error`), every
/// PathRecord query still completes, by retransmission, with the full result.
#[test]
fn sa_queries_survive_mad_loss() {
    let Some(bed) = Bed::or_skip("sa_queries_survive_mad_loss") else {
        return;
    };
    let me = bed.nodes[0].clone();
    let dest = bed.hca_ports()[&(bed.nodes[1].clone(), 1)];
    let mut n = bed
        .spawn_node(&me, "bed_node", &format!("lossy:{dest:x}"))
        .unwrap();
    n.expect("READY", Duration::from_secs(10)).unwrap();
    // Let OpenSM finish the sweep our new IsSM client caused before dropping anything.
    std::thread::sleep(Duration::from_millis(500));
    bed.console(&format!("Error \"{me}\"[1] 50")).unwrap();
    n.send("go").unwrap();
    let r = n.expect("LOSS", Duration::from_secs(60));
    bed.console(&format!("Error \"{me}\"[1] 0")).unwrap();
    let (_, r) = r.unwrap();
    println!("{r}");
    n.send("done").unwrap();
    assert!(r.contains("ok=20 sizes={4}"), "{r}");
    assert!(!r.contains("retransmits=0 "), "no MAD was lost? {r}");
    assert!(r.ends_with("timeouts=0 pending=0"), "{r}");
}

/// With LMC 1, PathRecord queries from one port return, for every other HCA port, every
/// SLID x DLID combination (2 x 2), all reversible, with the LIDs OpenSM assigned.
#[test]
fn path_records_every_lmc_path() {
    let Some(bed) = Bed::or_skip("path_records_every_lmc_path") else {
        return;
    };
    assert_eq!(bed.lmc, 1, "the bed runs OpenSM with LMC 1");
    let lids = bed.guid2lid();
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
