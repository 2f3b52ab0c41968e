//! One `apm pingpong` scenario for both protections: rxe1 (server) and rxe0 (client)
//! over rails 10 and 20; rail 10 cut silently, restored; rail 20's link taken down,
//! brought back. Software migration on stock rxe and hardware APM on the patched one run
//! the same steps, so their stalls compare (lines `APM-FIGURE <scenario> <mode> <ms>`,
//! gathered by `cargo xtask hwtest --vm` into one figure).

use super::child::Pingpong;
use super::rails::*;
use super::*;

/// The `apm` binary and the VM layout, or why not (the skip line).
pub(crate) fn prerequisites() -> Result<(String, Verbs), String> {
    if !link_toggle_allowed() {
        return Err("cuts rails; set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)".into());
    }
    let apm = std::env::var("APM_BIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
        .ok_or("APM_BIN does not name the apm binary (hwtest sets it)")?;
    let v = verbs();
    let names = device_names(&v);
    if netdev_of("rxe0", 1).as_deref() != Some("vA")
        || netdev_of("rxe1", 1).as_deref() != Some("vB")
    {
        return Err(format!(
            "needs the VM layout (rxe0 on vA, rxe1 on vB); devices: {names:?}"
        ));
    }
    Ok((apm, v))
}

/// Start both sides in `mode` (`software`, `hardware`) over the two rails.
fn start(apm: &str, v: &Verbs, mode: &str) -> (Pingpong, Pingpong) {
    let t_setup = Instant::now();
    setup_rails();
    wait_for_rail_gids(v);
    println!("rails up in {:?}", t_setup.elapsed());
    let common = [
        "--json",
        "--until-stdin-eof",
        "--interval-ms",
        "2",
        "--stall-ms",
        "300",
        "--control",
        "127.0.0.1:0",
        "--mode",
        mode,
    ];
    let server: Vec<&str> = ["--device", "rxe1", "--rail", "10.0.10.2", "--rail"]
        .into_iter()
        .chain(["10.0.20.2", "--listen", "127.0.0.1:18515"])
        .chain(common)
        .collect();
    let client: Vec<&str> = ["--device", "rxe0", "--rail", "10.0.10.1", "--rail"]
        .into_iter()
        .chain(["10.0.20.1", "--connect", "127.0.0.1:18515"])
        .chain(common)
        .collect();
    let mut s = Pingpong::start(apm, "server", &server);
    let mut c = Pingpong::start(apm, "client", &client);
    c.wait_for(
        &format!("{} mode", mode_label(mode)),
        Duration::from_secs(60),
    );
    s.wait_for("qpn", Duration::from_secs(30));
    (c, s)
}

fn mode_label(mode: &str) -> &'static str {
    if mode == "hardware" {
        "hardware APM"
    } else {
        "software migration"
    }
}

/// Run the scenario in `mode`; returns the client's and the server's reports. After
/// each failure, `after_failover` runs with both sides (e.g. to wait for the re-arm).
pub(crate) fn run(
    apm: &str,
    v: &Verbs,
    mode: &str,
    mut after_failover: impl FnMut(&mut Pingpong, &mut Pingpong),
) -> [serde_json::Value; 2] {
    let (mut client, mut server) = start(apm, v, mode);
    // Checked once both sides have exited and printed all they had to say.
    let mut problems = Vec::new();
    let mut expect = |ok: bool, what: &str| {
        if !ok {
            println!("PROBLEM: {what}");
            problems.push(what.to_owned());
        }
    };
    std::thread::sleep(Duration::from_millis(1500));
    let on10 = rail_rate("vA.10", Duration::from_millis(500));
    println!("before the cut: vA.10 sent {on10} packets in 0.5 s");
    expect(on10 > 0, "traffic does not start on rail 10");

    // (a) Silent cut of rail 10 (A's side drops everything it sends).
    let cut = Instant::now();
    tc(&[
        "qdisc", "add", "dev", "vA.10", "root", "netem", "loss", "100%",
    ]);
    let moved = client.wait_for("FAILOVER", Duration::from_secs(20));
    server.wait_for("FAILOVER", Duration::from_secs(20));
    println!(
        "(a) {mode}: netem loss 100% on vA.10: client failover {:?} after the cut",
        moved - cut
    );
    std::thread::sleep(Duration::from_millis(800));
    let on20 = rail_rate("vA.20", Duration::from_millis(500));
    println!("(a) after failover: vA.20 sent {on20} packets in 0.5 s");
    expect(on20 > 0, "traffic did not move to rail 20");

    // The path returns: traffic stays where it is (apm re-arms rail 10 as the alternate).
    tc(&["qdisc", "del", "dev", "vA.10", "root"]);
    after_failover(&mut client, &mut server);
    std::thread::sleep(Duration::from_millis(500));
    let back10 = rail_rate("vA.10", Duration::from_millis(500));
    let still20 = rail_rate("vA.20", Duration::from_millis(500));
    println!(
        "rail 10 restored: traffic returns to the original rail: {} (vA.10 {back10}, vA.20 \
         {still20} packets in 0.5 s); rail 10 is the re-armed alternate",
        if back10 > still20 { "yes" } else { "no" }
    );

    // (b) Link down on rail 20.
    let down = Instant::now();
    ip(&["link", "set", "vA.20", "down"]);
    let moved = client.wait_for("FAILOVER", Duration::from_secs(20));
    server.wait_for("FAILOVER", Duration::from_secs(20));
    println!(
        "(b) {mode}: link vA.20 down: client failover {:?} after the link went down",
        moved - down
    );
    std::thread::sleep(Duration::from_millis(800));
    let on10 = rail_rate("vA.10", Duration::from_millis(500));
    println!("(b) after failover: vA.10 sent {on10} packets in 0.5 s (back on the original rail)");
    expect(on10 > 0, "traffic did not move back to rail 10");
    ip(&["link", "set", "vA.20", "up"]);
    rail_routes(20, "10.0.20.1", "10.0.20.2");
    after_failover(&mut client, &mut server);
    std::thread::sleep(Duration::from_millis(1000));

    client.stop();
    server.stop();
    let reports = [
        client.finish(Duration::from_secs(60)),
        server.finish(Duration::from_secs(60)),
    ];
    assert!(problems.is_empty(), "{mode}: {problems:?}");
    reports
}

/// The longest gap in arriving messages that began in the 3 s before each failover
/// (the path was cut, then the connection moved), in failover order.
fn failover_stalls(r: &serde_json::Value) -> Vec<Option<f64>> {
    let stalls = r["stalls"].as_array().cloned().unwrap_or_default();
    let events = r["events"].as_array().cloned().unwrap_or_default();
    events
        .iter()
        .filter(|e| e["kind"] == "failover")
        .map(|e| {
            let t = e["at_ms"].as_f64().unwrap_or(0.0);
            stalls
                .iter()
                .filter(|g| {
                    let at = g["at_ms"].as_f64().unwrap_or(0.0);
                    t - 3000.0 <= at && at <= t
                })
                .filter_map(|g| g["ms"].as_f64())
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
        })
        .collect()
}

/// Print both reports and the figure lines, and check that nothing was lost or
/// duplicated, each side failed over twice and re-armed.
pub(crate) fn check(mode: &str, reports: &[serde_json::Value; 2]) {
    let [c, s] = reports;
    for (name, r) in [("client", c), ("server", s)] {
        println!(
            "{name} ({mode}): sent {} received {} (peer sent {}) lost {} duplicated {} \
             out-of-order {} longest stall {:.1} ms, failovers {}, drain {} reinit {}, flushed \
             sends replayed {} receives reposted {}, primary {} (was {})",
            r["sent"],
            r["received"],
            r["peer_sent"],
            r["lost"],
            r["duplicated"],
            r["out_of_order"],
            r["longest_stall_ms"].as_f64().unwrap_or(-1.0),
            r["failovers"],
            r["drain_migrations"],
            r["reinit_migrations"],
            r["flushed_sends_replayed"],
            r["flushed_recvs_reposted"],
            r["final_primary"],
            r["initial_primary"],
        );
        let stalls = failover_stalls(r);
        println!("{name}: failover stalls (path cut to messages arriving again): {stalls:?}");
        for (scenario, stall) in ["silent-cut", "link-down"].iter().zip(&stalls) {
            // No gap over 100 ms (the report's threshold) is recorded as 100.
            println!("APM-FIGURE {scenario} {mode} {:.0}", stall.unwrap_or(100.0));
        }
    }
    for (name, r, peer) in [("client", c, s), ("server", s, c)] {
        assert_eq!(r["mode"], mode, "{name}: protected in {mode} mode");
        assert_eq!(r["lost"], 0, "{name} lost messages");
        assert_eq!(r["duplicated"], 0, "{name} got duplicates");
        assert_eq!(r["received"], peer["sent"], "{name} did not receive all");
        assert!(
            r["failovers"].as_u64().unwrap_or(0) >= 2,
            "{name}: two failovers"
        );
        let rearms = r["events"]
            .as_array()
            .map_or(0, |e| e.iter().filter(|e| e["kind"] == "rearmed").count());
        assert!(rearms >= 1, "{name}: never re-armed after a failover");
    }
}
