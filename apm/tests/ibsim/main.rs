//! Bed tests of `apm watch` and of the library's InfiniBand deployment against OpenSM
//! over ibsim (`cargo xtask ibsim`).
//!
//! `apm watch`: the built `apm` binary runs as `apm watch --ibsim-bed --json` on a
//! client node (under umad2sim, which fakes umad and nothing else, so the watch takes
//! SA notices alone), the test Unlinks and ReLinks another node's port through ibsim's
//! console and checks what the watch prints: one trap 65 event, then one trap 64 event,
//! for that port's GID.
//!
//! The library: two node processes (this test binary re-run as `bed_node`) each start
//! an `apm::Apm` from a deployment TOML (`provider = "verbs"`, ports 1 and 2, the
//! default vendor-class LAP channel) through `apm::ib::UmadFacets` and
//! `Apm::start_with_facets`, with a test QP facet standing in for the HCA (the bed has
//! no verbs device): SA subscriptions, PathRecords and LAP/APR are the real umad half
//! against OpenSM.
//!
//! Skipped with a printed reason outside the bed (`umad::bed::Bed::or_skip`).
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use apm::apm_core::testing::{notification_line, paired_conn_spec, remote_gid_line, FakeQp};
use std::io::{BufRead, BufReader};
use std::net::Ipv6Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use umad::bed::{self, logged_gid, ms, report, stdin_commands, Bed};

// The host agent's InfiniBand side between two nodes.
mod agent;

/// What a watch process wrote: a stdout line (an event) or a stderr line.
#[derive(Debug)]
enum Out {
    Event(String),
    Note(String),
}

/// `apm watch` running as a node process of the bed; killed (by its PID) when dropped.
struct Watch {
    node: String,
    child: Child,
    lines: mpsc::Receiver<(Instant, Out)>,
}

impl Watch {
    /// Start `apm watch --ibsim-bed --json ARGS` on `node` and wait until it reports its
    /// SA subscription.
    fn start(bed: &Bed, node: &str, args: &[&str]) -> Watch {
        let mut w = Watch::spawn(bed, node, args);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match w.next(deadline.saturating_duration_since(Instant::now())) {
                Some((_, Out::Note(l))) if l.contains("SA notices (traps 64/65) through") => {
                    return w
                }
                Some((_, Out::Event(l))) => panic!("{node}: event before subscribing: {l}"),
                Some(_) => continue,
                None => panic!("{node}: apm watch did not subscribe within 10 s"),
            }
        }
    }

    fn spawn(bed: &Bed, node: &str, args: &[&str]) -> Watch {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        // umad2sim writes ./sys-<pid>: a fresh directory per process.
        let dir = bed.scratch.join(format!(
            "apm-watch-{node}-{}",
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_apm"))
            .args(["watch", "--ibsim-bed", "--json"])
            .args(args)
            .current_dir(&dir)
            .env("LD_PRELOAD", &bed.umad2sim)
            .env("SIM_HOST", node)
            .env("IBSIM_SOCKNAME", &bed.sockname)
            .env("APM_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("apm runs");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for (stream, is_event) in [
            (Box::new(out) as Box<dyn std::io::Read + Send>, true),
            (Box::new(err), false),
        ] {
            let tx = tx.clone();
            let name = node.to_owned();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let t = Instant::now();
                    println!("[{name} {}] {line}", if is_event { "out" } else { "err" });
                    let o = if is_event {
                        Out::Event(line)
                    } else {
                        Out::Note(line)
                    };
                    if tx.send((t, o)).is_err() {
                        break;
                    }
                }
            });
        }
        Watch {
            node: node.to_owned(),
            child,
            lines: rx,
        }
    }

    fn next(&mut self, timeout: Duration) -> Option<(Instant, Out)> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// The next event line within `timeout`, parsed, with the time it was read.
    fn event(&mut self, timeout: Duration) -> Option<(Instant, serde_json::Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now()))? {
                (t, Out::Event(l)) => {
                    let v = serde_json::from_str(&l)
                        .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", self.node));
                    return Some((t, v));
                }
                (_, Out::Note(_)) => continue,
            }
        }
    }

    /// Every event line within `window` (nothing expected: duplicates, filtered kinds).
    fn events_within(&mut self, window: Duration) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + window;
        let mut out = Vec::new();
        while let Some((_, v)) = self.event(deadline.saturating_duration_since(Instant::now())) {
            out.push(v);
        }
        out
    }

    /// Wait for the process to end by itself; whether it succeeded.
    fn wait(&mut self, timeout: Duration) -> bool {
        bed::wait_exit(&mut self.child, timeout).is_some_and(|st| st.success())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The GID OpenSM gives an HCA port: the default subnet prefix and its port GUID.
fn gid_of(guid: u64) -> Ipv6Addr {
    Ipv6Addr::from((0xfe80_u128 << 112) | u128::from(guid))
}

fn str_of<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k)
        .and_then(|x| x.as_str())
        .unwrap_or_else(|| panic!("no string {k:?} in {v}"))
}

fn num_of(v: &serde_json::Value, k: &str) -> u64 {
    v.get(k)
        .and_then(|x| x.as_u64())
        .unwrap_or_else(|| panic!("no number {k:?} in {v}"))
}

/// One SA event line as the watch must print it: `kind` for `gid`, arrived on the
/// watching node's port 1 (ibsim0), with that port read back (active, LIDs, LMC).
fn check_event(v: &serde_json::Value, kind: &str, gid: Ipv6Addr, bed: &Bed) {
    assert_eq!(str_of(v, "event"), kind, "{v}");
    let got: Ipv6Addr = str_of(v, "gid")
        .parse()
        .unwrap_or_else(|e| panic!("gid of {v}: {e}"));
    assert_eq!(got, gid, "the event names another port: {v}");
    assert_eq!(str_of(v, "source"), "sa", "{v}");
    assert_eq!(str_of(v, "device"), "ibsim0", "{v}");
    assert_eq!(num_of(v, "port"), 1, "{v}");
    assert_eq!(str_of(v, "state"), "active", "{v}");
    assert!(num_of(v, "lid") > 0, "{v}");
    assert!(num_of(v, "sm_lid") > 0, "{v}");
    assert_eq!(num_of(v, "lmc"), u64::from(bed.lmc), "{v}");
    assert!(str_of(v, "time").ends_with('Z'), "RFC 3339 UTC: {v}");
}

/// `apm watch` on a client node prints exactly one `gid_out_of_service` event (trap 65)
/// for another node's port when it is Unlinked, and exactly one `gid_in_service` (trap
/// 64) when it is ReLinked, with the GID OpenSM logs; every Report is answered.
#[test]
fn watch_prints_one_event_per_unlink_and_relink() {
    let Some(bed) = Bed::or_skip("watch_prints_one_event_per_unlink_and_relink") else {
        return;
    };
    let victim = bed.nodes[1].clone();
    // Read before any Unlink: OpenSM rewrites its subnet list without the lost port.
    let guid = bed.hca_ports()[&(victim.clone(), 2)];
    let gid = gid_of(guid);
    let mut w = Watch::start(&bed, &bed.nodes[0], &[]);
    let bound = Duration::from_secs(3);
    let mut lat = Vec::new();
    for round in 0..2 {
        let mark = bed.log_mark();
        let t0 = Instant::now();
        bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
        let (t1, out) = w
            .event(bound)
            .unwrap_or_else(|| panic!("round {round}: no event within {bound:?} of Unlink"));
        check_event(&out, "gid_out_of_service", gid, &bed);
        let logged = bed
            .wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(1))
            .expect("OpenSM logged no trap 65");
        assert_eq!(
            logged_gid(&logged),
            Some(gid),
            "OpenSM's trap 65 is for another GID: {logged}"
        );
        // Nothing else about the Unlink (a second Report, a resend taken as new).
        let extra = w.events_within(Duration::from_millis(500));
        assert!(
            extra.is_empty(),
            "round {round}: more after Unlink: {extra:?}"
        );

        let t2 = Instant::now();
        bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
        let (t3, inn) = w
            .event(bound)
            .unwrap_or_else(|| panic!("round {round}: no event within {bound:?} of ReLink"));
        check_event(&inn, "gid_in_service", gid, &bed);
        lat.push((t1 - t0, t3 - t2));
        let extra = w.events_within(Duration::from_millis(500));
        assert!(
            extra.is_empty(),
            "round {round}: more after ReLink: {extra:?}"
        );
    }
    // OpenSM resends an unanswered Report after 200 ms, 3 times: wait them out.
    let extra = w.events_within(Duration::from_millis(800));
    assert!(
        extra.is_empty(),
        "duplicate or unexpected events: {extra:?}"
    );
    bed.assert_reports_answered();
    for (i, (down, up)) in lat.iter().enumerate() {
        println!(
            "round {i}: Unlink -> apm watch gid_out_of_service line {:.2} ms, ReLink -> \
             gid_in_service line {:.2} ms",
            ms(*down),
            ms(*up)
        );
    }
}

/// `--event` drops the kinds not asked for: a watch for `gid_in_service` prints nothing
/// on Unlink while a watch for `gid_out_of_service` on another node does (so the trap
/// was sent), and prints the ReLink's event, which the other one drops; with `--count 1`
/// it then ends by itself, successfully. A `--device` naming no umad CA is an error.
#[test]
fn watch_event_filter_drops_other_kinds() {
    let Some(bed) = Bed::or_skip("watch_event_filter_drops_other_kinds") else {
        return;
    };
    let victim = bed.nodes[2].clone();
    let gid = gid_of(bed.hca_ports()[&(victim.clone(), 2)]);

    let mut bad = Watch::spawn(&bed, &victim, &["--device", "mlx5_0"]);
    assert!(
        !bad.wait(Duration::from_secs(10)),
        "--device mlx5_0 accepted"
    );
    let notes: Vec<String> = std::iter::from_fn(|| bad.next(Duration::from_millis(200)))
        .map(|(_, o)| match o {
            Out::Note(l) => l,
            // Under --json the refusal is a JSON error object on stdout, and no event.
            Out::Event(l) if l.starts_with("{\"error\":") => l,
            Out::Event(l) => panic!("an event from a refused watch: {l}"),
        })
        .collect();
    assert!(
        notes
            .iter()
            .any(|l| l.contains("no umad device \"mlx5_0\"") && l.contains("ibsim0")),
        "{notes:?}"
    );

    let mut ins = Watch::start(
        &bed,
        &bed.nodes[0],
        &["--event", "gid_in_service", "--count", "1"],
    );
    let mut outs = Watch::start(&bed, &bed.nodes[1], &["--event", "gid-out-of-service"]);

    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    let (t1, out) = outs
        .event(Duration::from_secs(3))
        .expect("the gid_out_of_service watch saw no Unlink");
    check_event(&out, "gid_out_of_service", gid, &bed);
    let dropped = ins.events_within(Duration::from_millis(500));
    assert!(
        dropped.is_empty(),
        "--event gid_in_service let through: {dropped:?}"
    );

    let t2 = Instant::now();
    bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
    let (t3, inn) = ins
        .event(Duration::from_secs(3))
        .expect("the gid_in_service watch saw no ReLink");
    check_event(&inn, "gid_in_service", gid, &bed);
    assert!(
        ins.wait(Duration::from_secs(5)),
        "--count 1: the watch did not end successfully after its event"
    );
    let dropped = outs.events_within(Duration::from_millis(500));
    assert!(
        dropped.is_empty(),
        "--event gid-out-of-service let through: {dropped:?}"
    );
    println!(
        "Unlink -> filtered watch's gid_out_of_service {:.2} ms, ReLink -> \
         gid_in_service {:.2} ms",
        ms(t1 - t0),
        ms(t3 - t2)
    );
}

/// `--ibsim-bed` is refused where umad2sim is not loaded (outside the bed, and inside it
/// for a process without the preload): a real fabric never sees the IsSM shim.
#[test]
fn ibsim_bed_flag_refused_without_umad2sim() {
    let out = Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(["watch", "--ibsim-bed", "--timeout", "1"])
        .env_remove("LD_PRELOAD")
        .current_dir(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .output()
        .expect("apm runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("test-bed mode refused"), "{err}");
    assert!(out.stdout.is_empty());
}

// ------------------------------------------------------------------ the library on IB

/// Entry point of node processes; a no-op in a normal test run.
#[test]
#[ignore = "runs only as a node process of the ibsim bed tests"]
fn bed_node() {
    bed::run_node(|role| async move { ib_node(&role).await });
}

/// A node's settings, `key=value;...` in its role: `config=` the deployment TOML's
/// path, `role=active|passive`, `me2=<guid>:<lid>` this node's port 2 (umad2sim shows
/// a node's port 1 only), `peer1=<guid>:<lid>` and `peer2=<guid>:<lid>` the peer's
/// ports. Without `peer1`, the node protects nothing (port 1 only, no path queries).
struct NodeArgs {
    config: String,
    active: bool,
    me2: (u64, u16),
    peer: Option<((u64, u16), (u64, u16))>,
    /// This node's port 1 (`me1=`, the agent's nodes).
    me1: Option<(u64, u16)>,
    /// The agent's UDP port (`port=`, the agent's nodes; two agents on one host need
    /// their own).
    port: u16,
}

fn parse_node_args(role: &str) -> Result<NodeArgs, String> {
    let mut kv = std::collections::BTreeMap::new();
    for item in role.split(';').filter(|s| !s.is_empty()) {
        let (k, v) = item.split_once('=').ok_or(format!("bad setting {item}"))?;
        kv.insert(k, v);
    }
    let get = |k: &str| kv.get(k).copied().ok_or(format!("no {k}= in {role}"));
    let pair = |k: &str| -> Result<(u64, u16), String> {
        let v = get(k)?;
        let (g, l) = v.split_once(':').ok_or(format!("{k}: want guid:lid"))?;
        Ok((
            u64::from_str_radix(g, 16).map_err(|e| format!("{k}: {e}"))?,
            l.parse().map_err(|e| format!("{k}: {e}"))?,
        ))
    };
    let port = match kv.get("port") {
        Some(p) => p.parse().map_err(|e| format!("port: {e}"))?,
        None => apm_agent::DEFAULT_PEER_PORT,
    };
    if !kv.contains_key("peer1") {
        return Ok(NodeArgs {
            config: get("config")?.to_owned(),
            active: false,
            me2: (0, 0),
            peer: None,
            me1: None,
            port,
        });
    }
    Ok(NodeArgs {
        config: get("config")?.to_owned(),
        active: get("role")? == "active",
        me2: pair("me2")?,
        peer: Some((pair("peer1")?, pair("peer2")?)),
        me1: kv.contains_key("me1").then(|| pair("me1")).transpose()?,
        port,
    })
}

/// A node running `apm::Apm` on the deployment TOML: the umad half from
/// `apm::ib::UmadFacets` (umad's test-bed mode, port 2 carried by port 1, messages for
/// the peer's port 2 routed to its port 1), the test's QP facet for the HCA.
///
/// Reports `READY`; takes `protect`, `port <n> down|up` (the HCA's PORT_ERR and
/// PORT_ACTIVE), `stall` (`Apm::report_stall` for connection 1) and `stats`; reports
/// the QP operations, the engine's SA inputs (`INPUT`) and the notifications (`NOTE`).
async fn ib_node(role: &str) -> Result<(), String> {
    use apm::apm_core::{
        ConnId, FabricService, Gid, LinkLayer, PortEvent, PortInfo, PortKey, Role,
    };
    use apm::ib::{UmadFacets, UmadOptions};
    let a = parse_node_args(role)?;
    let text = std::fs::read_to_string(&a.config).map_err(|e| format!("{}: {e}", a.config))?;
    let config = apm::Config::parse(&text).map_err(|e| e.to_string())?;
    let Some((peer1, peer2)) = a.peer else {
        return quiet_node(&config).await;
    };
    let (key1, key2) = (PortKey::new(0, 1), PortKey::new(0, 2));
    let opts = UmadOptions {
        testbed: umad::TestBedMode::IbsimOnly,
        carried: vec![(key2, Gid::from_guid(a.me2.0))],
        routes: vec![(Gid::from_guid(peer2.0), peer1.1)],
        ..Default::default()
    };
    // Without port 2 carried, the deployment names what is missing: umad2sim shows a
    // node's port 1 only.
    let alone = UmadOptions {
        carried: Vec::new(),
        ..opts.clone()
    };
    match UmadFacets::open(&config, &alone) {
        Ok(_) => return Err("port 2 without a umad port was accepted".into()),
        Err(e) => report(&format!("UNCARRIED {e}")),
    }
    let facets = UmadFacets::open(&config, &opts).map_err(|e| e.to_string())?;
    let uses: Vec<String> = facets
        .ports()
        .iter()
        .map(|p| format!("{}/{} via {}", p.device, p.port, p.carrier))
        .collect();
    report(&format!(
        "UMAD {:?} ports {}",
        facets.channel(),
        uses.join(", ")
    ));
    let me = facets
        .umad_ports()
        .first()
        .ok_or("no umad port opened")?
        .info()
        .clone();

    // The connection as the application would have set it up: its primary from port 2
    // to the peer's port 2 (rail B), every other path the SA knows to the peer's ports
    // as candidates.
    let mut paths = Vec::new();
    for local in [key1, key2] {
        for g in [peer1.0, peer2.0] {
            let p = facets
                .fabric()
                .resolve_paths(local, Gid::from_guid(g))
                .await
                .map_err(|e| format!("paths from {local} to {g:x}: {e}"))?;
            paths.push(p);
        }
    }
    let primary = *paths[3]
        .first()
        .ok_or("no path from port 2 to the peer's port 2")?;
    let candidates: Vec<_> = paths
        .iter()
        .flatten()
        .copied()
        .filter(|p| *p != primary)
        .collect();
    let role = if a.active {
        Role::Active
    } else {
        Role::Passive
    };
    let spec = paired_conn_spec(1, role, primary, candidates).ok_or("qpn")?;
    let port1 = PortInfo {
        key: key1,
        gids: vec![Gid(me.gid)],
        lid: apm::apm_core::Lid::from_wire(me.lid),
        lmc: me.lmc,
        active: true,
        link_layer: LinkLayer::InfiniBand,
    };
    let port2 = PortInfo {
        key: key2,
        gids: vec![Gid::from_guid(a.me2.0)],
        lid: apm::apm_core::Lid::from_wire(a.me2.1),
        ..port1.clone()
    };
    // The simulated HCA: every QP operation (connection 1's) is reported.
    let qp = std::sync::Arc::new(
        FakeQp::new(vec![port1, port2]).on_operation(|op| report(&op.to_string())),
    );
    qp.add_qp(ConnId(1), primary);
    let apm = apm::Apm::start_with_facets(&config, std::sync::Arc::clone(&qp), facets)
        .await
        .map_err(|e| e.to_string())?;
    let mut notes = apm.notifications();
    let mut inputs = apm.fabric_events();
    report(&format!(
        "READY lid={} primary port={} dlid={} candidates={}",
        me.lid,
        primary.port.port,
        primary.dlid,
        spec.candidates.len()
    ));
    let mut spec = Some(spec);
    let mut commands = stdin_commands();
    let until = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            c = commands.recv() => {
                let Some(c) = c else { break };
                let w: Vec<&str> = c.split_whitespace().collect();
                match w[..] {
                    ["protect"] => {
                        let s = spec.take().ok_or("protected twice")?;
                        apm.protect(s).await.map_err(|e| e.to_string())?;
                        report("PROTECTING");
                    }
                    ["port", n, ev] => {
                        let n: u8 = n.parse().map_err(|_| format!("bad port {n}"))?;
                        let ev = if ev == "down" { PortEvent::Down } else { PortEvent::Active };
                        qp.port_event(PortKey::new(0, n), ev);
                    }
                    ["stall"] => match apm.report_stall(ConnId(1)).await {
                        Ok(()) => report("STALL reported"),
                        Err(e) => report(&format!("STALL refused: {e}")),
                    },
                    ["stats"] => {
                        let s = apm.handle().stats().await.map_err(|e| e.to_string())?;
                        report(&format!(
                            "STATS laps_sent={} aprs_sent={} forced={} subscriptions={}",
                            s.laps_sent, s.aprs_sent, s.migrations_forced, s.subscriptions
                        ));
                    }
                    _ => report(&format!("FAIL unknown command {c}")),
                }
            }
            ev = inputs.recv() => {
                if let Some(l) = ev.ok().and_then(|e| remote_gid_line(&e.kind)) {
                    report(&format!("INPUT {l}"));
                }
            }
            n = notes.recv() => {
                let Ok(n) = n else { continue };
                report(&format!("NOTE {}", notification_line(&n.kind)));
            }
        }
    }
    apm.shutdown().await.map_err(|e| e.to_string())
}

/// A node that protects nothing: `Apm` on the TOML's ports with a test QP facet that
/// reports port 1; reports `READY` once started and the engine's SA inputs (`INPUT`)
/// until stdin closes; `stats` reports the subscriptions the engine asked for.
async fn quiet_node(config: &apm::Config) -> Result<(), String> {
    use apm::apm_core::{Gid, LinkLayer, PortInfo, PortKey};
    let opts = apm::ib::UmadOptions {
        testbed: umad::TestBedMode::IbsimOnly,
        ..Default::default()
    };
    let t0 = tokio::time::Instant::now();
    let facets = apm::ib::UmadFacets::open(config, &opts).map_err(|e| e.to_string())?;
    let me = facets
        .umad_ports()
        .first()
        .ok_or("no umad port opened")?
        .info()
        .clone();
    let qp = FakeQp::new(vec![PortInfo {
        key: PortKey::new(0, 1),
        gids: vec![Gid(me.gid)],
        lid: apm::apm_core::Lid::from_wire(me.lid),
        lmc: me.lmc,
        active: true,
        link_layer: LinkLayer::InfiniBand,
    }]);
    let apm = apm::Apm::start_with_facets(config, qp, facets)
        .await
        .map_err(|e| e.to_string())?;
    let mut inputs = apm.fabric_events();
    report(&format!(
        "READY in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    ));
    let mut commands = stdin_commands();
    loop {
        tokio::select! {
            c = commands.recv() => {
                let Some(c) = c else { break };
                if c == "stats" {
                    let s = apm.handle().stats().await.map_err(|e| e.to_string())?;
                    report(&format!("STATS subscriptions={}", s.subscriptions));
                }
            }
            ev = inputs.recv() => {
                if let Some(l) = ev.ok().and_then(|e| remote_gid_line(&e.kind)) {
                    report(&format!("INPUT {l}"));
                }
            }
        }
    }
    apm.shutdown().await.map_err(|e| e.to_string())
}

/// The library's InfiniBand deployment between two nodes, from a deployment TOML:
/// H2 (active) and H3 (passive) each start `apm::Apm` with the umad half built by
/// `apm::ib::UmadFacets` (one SA client and vendor-class LAP channel on port 1, port 2
/// carried by it) and a test QP facet; their connection's primary runs H2 port 2 <->
/// H3 port 2 (rail B).
/// 1. Protect: both arm a rail A alternate through a LAP/APR exchange, with paths the
///    SA returned.
/// 2. `Unlink "H2"[2]`, H2's engine not told (no PORT_ERR: what is tested is the
///    passive side): H3's engine learns it from the SA (trap 65) and asks H2 over rail A
///    to move first (apm's Migrate on the vendor channel); H2's QP is forced, then H3's
///    on H2's answer. Both arm the rail they left (port 2) at once, with no message.
/// 3. `ReLink "H2"[2]`: trap 64 makes H3's armed alternate count again (re-armed). Then
///    `Apm::report_stall` on H2 asks H3 to move to rail B, and both QPs are forced there.
///
/// Before that, each node checks that the same TOML without port 2 carried is refused
/// with the port named (umad2sim lists a node's port 1 only).
#[test]
fn library_ib_deployment_arms_and_migrates_on_unlink() {
    let Some(bed) = Bed::or_skip("library_ib_deployment_arms_and_migrates_on_unlink") else {
        return;
    };
    let (h2, h3) = (bed.nodes[0].clone(), bed.nodes[1].clone());
    let ports = bed.hca_ports();
    let lids = bed.guid2lid();
    let port = |node: &str, n: u8| {
        let g = ports[&(node.to_owned(), n)];
        (g, lids[&g].0)
    };
    let spawn = |me: &str, peer: &str, role: &str, policy: &str| {
        let config = bed.scratch.join(format!("apm-{me}.toml"));
        // The deployment as an operator would write it for an HCA named ibsim0 (the
        // name umad2sim gives every node's CA); `[lap]` left at its default (vendor
        // class 0x30 with apm's OUI).
        let toml = format!(
            "[[device]]\nname = \"ibsim0\"\nprovider = \"verbs\"\nports = [1, 2]\n\n\
             [sa]\nsubscribe = true\n\n[policy]\n{policy}"
        );
        std::fs::write(&config, toml).unwrap();
        let (me2, peer1, peer2) = (port(me, 2), port(peer, 1), port(peer, 2));
        let args = format!(
            "config={};role={role};me2={:x}:{};peer1={:x}:{};peer2={:x}:{}",
            config.display(),
            me2.0,
            me2.1,
            peer1.0,
            peer1.1,
            peer2.0,
            peer2.1
        );
        bed.spawn_node(me, "bed_node", &args).unwrap()
    };
    let mut passive = spawn(&h3, &h2, "passive", "");
    let mut active = spawn(&h2, &h3, "active", "");
    for n in [&mut passive, &mut active] {
        let (_, e) = n.expect("UNCARRIED", Duration::from_secs(10)).unwrap();
        assert!(
            e.contains("device \"ibsim0\" has no umad port 2 (its umad ports: 1)"),
            "{e}"
        );
        let (_, u) = n.expect("UMAD", Duration::from_secs(10)).unwrap();
        println!("{}: {u}", n.node);
        assert!(
            u.contains("Vendor { class: 48, oui: [2, 65, 80] }")
                && u.contains("ibsim0/1 via dev0/1")
                && u.contains("ibsim0/2 via dev0/1"),
            "{u}"
        );
        let (_, r) = n.expect("READY", Duration::from_secs(10)).unwrap();
        println!("{}: {r}", n.node);
        assert!(r.contains("primary port=2"), "{r}");
    }

    // 1. Armed through LAP/APR on rail A.
    let t0 = Instant::now();
    bed::protect_passive_first(&mut passive, &mut active);
    let (ta, prot) = active
        .expect("NOTE Protected", Duration::from_secs(10))
        .unwrap();
    let (tp, pprot) = passive
        .expect("NOTE Protected", Duration::from_secs(10))
        .unwrap();
    println!(
        "armed: {h2} {prot} after {:.1} ms, {h3} {pprot} after {:.1} ms",
        ms(ta - t0),
        ms(tp - t0)
    );
    assert!(prot.contains("alt port=1"), "{h2}: {prot}");
    assert!(pprot.contains("alt port=1"), "{h3}: {pprot}");

    // 2. Unlink H2's primary port; only the SA tells (H3).
    let mark = bed.log_mark();
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{h2}\"[2]")).unwrap();
    let want = format!("INPUT remote {:x} out", port(&h2, 2).0);
    let got = passive.expect_all(
        &[&want, "FORCED", "NOTE Migrated", "LOAD_ALT port=2"],
        Duration::from_secs(10),
    );
    let [(t_in, _), (t_f3, f3), (_, m3), _] = &got[..] else {
        unreachable!("NodeProc::expect_all returns one report per prefix")
    };
    assert!(m3.contains("forced=true"), "{m3}");
    assert!(f3.contains("port=1"), "{h3}: {f3}");
    let got = active.expect_all(
        &["FORCED", "NOTE Migrated", "LOAD_ALT port=2"],
        Duration::from_secs(10),
    );
    let [(t_f2, f2), (_, m2), _] = &got[..] else {
        unreachable!("NodeProc::expect_all returns one report per prefix")
    };
    assert!(f2.contains("port=1"), "{h2}: {f2}");
    println!(
        "Unlink {h2}[2] -> {h3} trap 65 input {:.2} ms; {h2} forced on {h3}'s request \
         {:.2} ms ({f2}, {m2}), {h3} forced on {h2}'s answer {:.2} ms ({f3}); both armed \
         port 2 again at once",
        ms(*t_in - t0),
        ms(*t_f2 - t0),
        ms(*t_f3 - t0)
    );
    assert!(
        *t_f3 - t0 < Duration::from_millis(1000),
        "{h3} did not migrate on the SA notice"
    );
    bed.wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(1))
        .expect("OpenSM logged no trap 65");
    let s3 = passive.stats();
    assert_eq!(s3["forced"], 1, "{s3:?}");

    // 3. ReLink: H3's alternate counts again; then the application reports a stall on
    // H2, and both move to rail B, H3 first.
    bed.console(&format!("ReLink \"{h2}\"[2]")).unwrap();
    let want = format!("INPUT remote {:x} in", port(&h2, 2).0);
    let _ = passive.expect_all(&[&want, "NOTE Rearmed"], Duration::from_secs(10));
    let _ = active.drain();
    let _ = passive.drain();
    let t0 = Instant::now();
    active.send("stall").unwrap();
    let got = active.expect_all(
        &["STALL reported", "FORCED", "NOTE Migrated"],
        Duration::from_secs(5),
    );
    let (t3, f3) = passive.expect("FORCED", Duration::from_secs(5)).unwrap();
    println!(
        "report_stall -> {h3} {f3} after {:.2} ms, {h2} {} after {:.2} ms",
        ms(t3 - t0),
        got[1].1,
        ms(got[1].0 - t0)
    );
    assert!(
        got[1].1.contains("port=2") && f3.contains("port=2"),
        "{} / {f3}",
        got[1].1
    );
    assert!(got[2].1.contains("forced=true"), "{}", got[2].1);
    let s2 = active.stats();
    assert_eq!(s2["forced"], 2, "{s2:?}");
    assert!(s2["laps_sent"] >= 1, "{s2:?}");
    bed.assert_reports_answered();
}

/// An SA that cannot be reached when the deployment starts is not an error: with the
/// bed's OpenSM stopped, H2 starts `apm::Apm` from its TOML (every umad port, one SA
/// client); its engine's subscriptions time out and are retried (`subscribe_retry_ms`
/// from the TOML). Once an OpenSM runs again, an Unlink of H4's port 2 reaches H2's
/// engine as trap 65.
#[test]
fn library_ib_deployment_starts_without_an_sa() {
    let Some(bed) = Bed::or_skip("library_ib_deployment_starts_without_an_sa") else {
        return;
    };
    let (h2, h4) = (bed.nodes[0].clone(), bed.nodes[2].clone());
    let victim = bed.hca_ports()[&(h4.clone(), 2)];
    // Stop the bed's OpenSM (`cargo xtask ibsim` reaps it); another starts below.
    bed.stop_opensm(Duration::from_secs(10)).unwrap();

    let config = bed.scratch.join(format!("apm-{h2}.toml"));
    std::fs::write(
        &config,
        "[[device]]\nname = \"ibsim0\"\nprovider = \"verbs\"\n\n[policy]\nsubscribe_retry_ms = 200\n",
    )
    .unwrap();
    let mut n = bed
        .spawn_node(&h2, "bed_node", &format!("config={}", config.display()))
        .unwrap();
    let (_, r) = n.expect("READY", Duration::from_secs(10)).unwrap();
    println!("{h2} started with no SA: {r}");
    // A few subscription attempts fail (traps 64 and 65: up to 1.6 s each), and the
    // engine retries.
    n.stats_until(
        |s| s.get("subscriptions").is_some_and(|&k| k >= 2),
        Duration::from_secs(5),
    );

    let sm = bed.start_opensm(Duration::from_secs(10)).unwrap();
    let up = Instant::now();

    // Unlink/ReLink H4's port 2 until the engine hears of it (its subscription is
    // retried every ~1 s: a 800 ms timeout, then 200 ms).
    let want = format!("INPUT remote {victim:x} out");
    let mut rounds = 0;
    let got = loop {
        rounds += 1;
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "no trap 65 at {h2} within 10 s of the SM's return ({rounds} rounds)"
        );
        let mark = bed.log_mark();
        bed.console(&format!("Unlink \"{h4}\"[2]")).unwrap();
        bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
            .expect("no sweep after Unlink");
        if let Ok(l) = n.expect(&want, Duration::from_millis(300)) {
            break l;
        }
        let mark = bed.log_mark();
        bed.console(&format!("ReLink \"{h4}\"[2]")).unwrap();
        bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
            .expect("no sweep after ReLink");
        // Pacing, not synchronisation: each round leaves the engine's subscription
        // retry (every ~1 s) time to reach the new SM before the next Unlink.
        std::thread::sleep(Duration::from_millis(300));
    };
    println!(
        "{h2}: {} {:.0} ms after the SM's SUBNET UP ({rounds} Unlink rounds)",
        got.1,
        ms(got.0 - up)
    );
    drop(n);
    drop(sm);
}
