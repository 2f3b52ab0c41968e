//! Bed tests of the umad LAP/APR transport between two simulated nodes (`cargo xtask
//! ibsim`). Skipped with a printed reason outside the bed.
//!
//! Transport: one node answers every LAP with an APR (a stub peer); the other sends LAPs
//! and times the APRs, on CM class 0x07 and on a vendor class with an OUI.
//!
//! End to end: engine nodes run apm-core's Manager with umad-sa (notices, paths),
//! cm-lap's peer channel (LAP/APR on real MADs) and a simulated QP per connection; two
//! of them protect connections between each other (Unlink/ReLink, MAD loss, a stranger's
//! LAP), one of them drives a rearm storm against stub peers to count SA queries.
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use apm_core::testing::{notification_line, paired_conn_spec, remote_gid_line, FakeQp};
use cm_lap::umad_transport::{CmChannel, Incoming, UmadCmTransport, DEFAULT_VENDOR_CLASS};
use ib_mad::cm::{ApStatus, Apr, CmBody, Lap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use umad::bed::{self, ms, report, stdin_commands, Bed};
use umad::{split_by_class, AgentSpec, Dest, Port, PortOptions, PortSelector, TestBedMode};

/// A test OUI (the IEEE's "private" block is not needed on a simulated fabric).
const TEST_OUI: [u8; 3] = [0x00, 0x14, 0x05];
const VENDOR: CmChannel = CmChannel::Vendor {
    class: DEFAULT_VENDOR_CLASS,
    oui: TEST_OUI,
};
/// LAPs per channel in the round-trip test.
const ROUNDS: usize = 50;

/// Entry point of node processes; a no-op in a normal test run.
#[test]
#[ignore = "runs only as a node process of the ibsim bed tests"]
fn bed_node() {
    bed::run_node(|role| async move {
        match role.strip_prefix("engine:") {
            Some(args) => engine_node(args).await,
            None => node(&role).await,
        }
    });
}

async fn node(role: &str) -> Result<(), String> {
    let opts = PortOptions {
        // Every class that could reach a bed node needs an agent (umad2sim).
        agents: vec![
            AgentSpec::class(0x03, 2),
            CmChannel::CmClass.agent(),
            VENDOR.agent(),
        ],
        testbed: TestBedMode::IbsimOnly,
        ..Default::default()
    };
    let (port, unsolicited) = Port::open(&PortSelector::First, opts).map_err(|e| e.to_string())?;
    let port = Arc::new(port);
    let mut streams = split_by_class(unsolicited, &[0x07, DEFAULT_VENDOR_CLASS]);
    let mut take = |c| streams.remove(&c).ok_or("no stream");
    let (cm, cm_rx) = UmadCmTransport::new(Arc::clone(&port), CmChannel::CmClass, take(0x07)?);
    let (vd, vd_rx) = UmadCmTransport::new(Arc::clone(&port), VENDOR, take(DEFAULT_VENDOR_CLASS)?);
    report(&format!("LID {}", port.info().lid));
    match role {
        "apr-responder" => {
            tokio::join!(answer(&cm, cm_rx), answer(&vd, vd_rx));
        }
        r if r.starts_with("lap:") => {
            let dlid: u16 = r[4..].parse().map_err(|_| format!("bad role {r}"))?;
            for (name, t, rx) in [("cm", &cm, cm_rx), ("vendor", &vd, vd_rx)] {
                let mut rtts = send_laps(t, rx, dlid).await?;
                rtts.sort();
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                report(&format!(
                    "RTT {name} n={} min_us={:.0} median_us={:.0} max_us={:.0}",
                    rtts.len(),
                    us(rtts[0]),
                    us(rtts[rtts.len() / 2]),
                    us(rtts[rtts.len() - 1])
                ));
            }
        }
        r if r.starts_with("lap-stranger:") => {
            // A LAP naming the protected connection's comm IDs, from a node that is not
            // its peer.
            let f: Vec<&str> = r["lap-stranger:".len()..].split(',').collect();
            let [dlid, their_comm, our_comm] = f[..] else {
                return Err(format!("bad role {r}"));
            };
            let num = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16);
            let dlid: u16 = dlid.parse().map_err(|_| "bad LID".to_string())?;
            let (their, ours) = (
                num(their_comm).map_err(|e| e.to_string())?,
                num(our_comm).map_err(|e| e.to_string())?,
            );
            let lap = Lap {
                local_comm_id: ours,
                remote_comm_id: their,
                remote_qpn: ib_mad::types::Qpn::new(0x123).map_err(|e| e.to_string())?,
                alt_local_lid: ib_mad::types::Lid(port.info().lid),
                alt_remote_lid: ib_mad::types::Lid(dlid),
                alt_local_gid: ib_mad::types::Gid(port.info().gid),
                ..Lap::default()
            };
            // The engines' channel (see `engine_node`).
            let mut rx = vd_rx;
            vd.send(Dest::gsi(dlid, 0), 0x5eed, &CmBody::Lap(lap))
                .map_err(|e| e.to_string())?;
            let m = tokio::time::timeout(Duration::from_secs(3), rx.recv())
                .await
                .map_err(|_| "no answer to the stranger's LAP".to_string())?
                .ok_or("closed")?;
            match m.body {
                CmBody::Apr(a) => report(&format!("STRANGER got APR {:?}", a.ap_status)),
                other => report(&format!("STRANGER got {other:?}")),
            }
            drop((cm, cm_rx));
        }
        other => return Err(format!("unknown role {other}")),
    }
    report("DONE");
    Ok(())
}

/// The connection whose every QP operation is reported.
const WATCHED: apm_core::ConnId = apm_core::ConnId(1);

/// Settings of an engine node, from its role string `engine:key=value;...`.
#[derive(Debug)]
struct EngineArgs {
    /// `role=active|passive`.
    active: bool,
    /// `n=`: how many connections (ids 1..=n).
    n: u32,
    /// `dst=<guid>,...`: connection k goes to port GUID `dst[(k-1) % len]`.
    dst: Vec<u64>,
    /// `from=1|2`: the local port of the primaries.
    from: u8,
    /// `peer=<guid>,...`: other port GUIDs of the peer, whose paths join the candidates.
    peer: Vec<u64>,
    /// `route=<guid>:<lid>,...`: where messages for a peer GID go (its MAD client).
    route: Vec<(u64, u16)>,
    /// `me2=<guid>:<lid>`: this node's port 2 (known to the engine; no MAD client).
    me2: Option<(u64, u16)>,
    /// `cands=all|none`: candidates from the SA in the spec, or none (the engine asks).
    cands: bool,
    /// `lap_ms=`, `tries=`: the engine's LAP retransmission policy; `defer_ms=`: its
    /// `lap_defer_ms`.
    policy: apm_core::Policy,
}

fn parse_engine_args(args: &str) -> Result<EngineArgs, String> {
    let mut a = EngineArgs {
        active: true,
        n: 1,
        dst: Vec::new(),
        from: 1,
        peer: Vec::new(),
        route: Vec::new(),
        me2: None,
        cands: true,
        policy: apm_core::Policy::default(),
    };
    let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|e| format!("{s}: {e}"));
    let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
    let pair = |s: &str| -> Result<(u64, u16), String> {
        let (g, l) = s.split_once(':').ok_or(format!("want guid:lid, got {s}"))?;
        Ok((hex(g)?, l.parse().map_err(|_| format!("bad LID {l}"))?))
    };
    for kv in args.split(';').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or(format!("bad setting {kv}"))?;
        let list = || v.split(',').filter(|s| !s.is_empty());
        match k {
            "role" => a.active = v == "active",
            "n" => a.n = u32::try_from(num(v)?).map_err(|e| e.to_string())?,
            "dst" => a.dst = list().map(hex).collect::<Result<_, _>>()?,
            "from" => a.from = if v == "2" { 2 } else { 1 },
            "peer" => a.peer = list().map(hex).collect::<Result<_, _>>()?,
            "route" => a.route = list().map(pair).collect::<Result<_, _>>()?,
            "me2" => a.me2 = Some(pair(v)?),
            "cands" => a.cands = v == "all",
            "lap_ms" => a.policy.lap_timeout_ms = num(v)?,
            "defer_ms" => a.policy.lap_defer_ms = num(v)?,
            "tries" => {
                a.policy.lap_max_tries = u32::try_from(num(v)?).map_err(|e| e.to_string())?
            }
            other => return Err(format!("unknown setting {other}")),
        }
    }
    if a.dst.is_empty() {
        return Err("no destination".into());
    }
    Ok(a)
}

/// The engine's counters and the SA's, as one report line.
fn stats_line(
    s: &apm_core::Stats,
    fabric_queries: u64,
    port: &umad::Port,
    sa: &umad_sa::SaClient,
) -> String {
    let c = port.counters();
    format!(
        "STATS laps_sent={} lap_retransmits={} aprs_sent={} mras_sent={} arms={} forced={} \
         engine_path_queries={} sa_path_queries={} sa_mad_requests={} sa_mad_retransmits={} \
         strangers={} refreshes={}",
        s.laps_sent,
        s.lap_retransmits,
        s.aprs_sent,
        s.mras_sent,
        s.arms,
        s.migrations_forced,
        s.path_queries,
        fabric_queries,
        c.requests_sent,
        c.retransmits,
        s.laps_from_strangers,
        sa.subscription_refreshes()
    )
}

/// A node running apm-core's engine (Manager) with umad-sa for notices and paths,
/// cm-lap's peer channel for LAP/APR and a simulated QP per connection.
///
/// Reports `READY` once its paths are known, protects its connections on the stdin
/// command `protect`, takes `port <n> down|up` (the HCA's PORT_ERR/PORT_ACTIVE, which
/// umad2sim cannot deliver) and `stats`; reports the engine's inputs from the SA
/// (`INPUT`), connection 1's QP operations and notifications (`NOTE`), and
/// `ALL ARMED` each time every connection is armed again.
async fn engine_node(args: &str) -> Result<(), String> {
    use apm_core::{ConnId, FabricService, Gid, PortKey, Role};
    let a = parse_engine_args(args)?;
    let opts = PortOptions {
        agents: vec![
            umad_sa::SA_AGENT,
            CmChannel::CmClass.agent(),
            VENDOR.agent(),
        ],
        testbed: TestBedMode::IbsimOnly,
        ..Default::default()
    };
    let (port, unsolicited) = Port::open(&PortSelector::First, opts).map_err(|e| e.to_string())?;
    let port = Arc::new(port);
    let mut streams = split_by_class(unsolicited, &[0x03, 0x07, DEFAULT_VENDOR_CLASS]);
    let mut take = |c| streams.remove(&c).ok_or("no stream");
    let key1 = PortKey::new(0, 1);
    let key2 = PortKey::new(0, 2);
    let (sa, sa_events) = umad_sa::SaClient::new(
        Arc::clone(&port),
        take(0x03)?,
        umad_sa::SaOptions::default(),
    );
    let me = port.info();
    let mut fabric = umad_sa::SaFabric::new(sa.clone(), key1, sa_events);
    // The specs' paths come through a facet of their own, so that the engine's facet
    // starts with an empty cache and counts only the engine's queries.
    let (_, no_events) = tokio::sync::mpsc::unbounded_channel();
    let mut setup = umad_sa::SaFabric::new(sa.clone(), key1, no_events);
    let mut ports = vec![apm_core::PortInfo {
        key: key1,
        gids: vec![Gid(me.gid)],
        lid: apm_core::Lid::from_wire(me.lid),
        lmc: me.lmc,
        active: true,
        link_layer: apm_core::LinkLayer::InfiniBand,
    }];
    if let Some((g2, lid2)) = a.me2 {
        fabric = fabric.serve_port(key2, Gid::from_guid(g2));
        setup = setup.serve_port(key2, Gid::from_guid(g2));
        ports.push(apm_core::PortInfo {
            key: key2,
            gids: vec![Gid::from_guid(g2)],
            lid: apm_core::Lid::from_wire(lid2),
            ..ports[0].clone()
        });
    }
    // The vendor channel: the CM class has no room for apm's Migrate, which a
    // hardware-APM engine sends its peer before it forces a migration.
    let (vd, vd_rx) = UmadCmTransport::new(Arc::clone(&port), VENDOR, take(DEFAULT_VENDOR_CLASS)?);
    let sources = Arc::new(cm_lap::peer_channel::SaSourceGid::new(sa.clone()));
    let mut peer = cm_lap::peer_channel::UmadPeerChannel::new(
        vd,
        vd_rx,
        key1,
        Arc::clone(&sources) as Arc<dyn cm_lap::peer_channel::SourceGid>,
    )
    .carry_for(key2);
    for &(g, lid) in &a.route {
        peer = peer.route(Gid::from_guid(g), lid);
        // Learn who sends from that LID now, not on the first LAP.
        use cm_lap::peer_channel::SourceGid;
        sources
            .gid_of(lid)
            .await
            .ok_or(format!("LID {lid} unknown to the SA"))?;
    }

    // The paths the specs need: every local port to every destination and peer port.
    let locals: Vec<PortKey> = ports.iter().map(|p| p.key).collect();
    let mut paths: std::collections::BTreeMap<(u8, u64), Vec<apm_core::Path>> =
        std::collections::BTreeMap::new();
    for &l in &locals {
        for &g in a.dst.iter().chain(&a.peer) {
            let p = setup
                .resolve_paths(l, Gid::from_guid(g))
                .await
                .map_err(|e| e.to_string())?;
            paths.insert((l.port, g), p);
        }
    }
    // The QP side (the simulated HCA): the QPs of the protected connections, the
    // node's ports, and the port events the test injects (umad2sim delivers no async
    // events). Operations on connection 1 are reported to the test.
    let qp = Arc::new(FakeQp::new(ports).on_operation(|op| {
        if op.conn() == WATCHED {
            report(&op.to_string());
        }
    }));
    let role = if a.active {
        Role::Active
    } else {
        Role::Passive
    };
    let mut specs = Vec::new();
    for k in 1..=a.n {
        let dst = a.dst[(k as usize - 1) % a.dst.len()];
        let primary = *paths
            .get(&(a.from, dst))
            .and_then(|p| p.first())
            .ok_or(format!("no path from port {} to {dst:x}", a.from))?;
        let candidates: Vec<apm_core::Path> = if a.cands {
            paths
                .iter()
                .filter(|((_, g), _)| *g == dst || a.peer.contains(g))
                .flat_map(|(_, p)| p.iter().copied())
                .filter(|p| *p != primary)
                .collect()
        } else {
            Vec::new()
        };
        specs.push(paired_conn_spec(k, role, primary, candidates).ok_or("qpn")?);
        qp.add_qp(ConnId(u64::from(k)), primary);
    }
    let stack = apm_core::Stack::new(Arc::clone(&qp), peer, fabric);
    let stack = Arc::new(stack);
    let (mgr, handle) =
        apm_core::Manager::new(Arc::clone(&stack), a.policy.clone()).map_err(|e| e.to_string())?;
    let mut notes = handle.notifications();
    let mut inputs = handle.fabric_events();
    tokio::spawn(mgr.run());
    let first = specs.first().map(|s| s.primary);
    report(&format!(
        "READY lid={} n={} primary={}",
        me.lid,
        a.n,
        first
            .map(|p| format!("port={} dlid={}", p.port.port, p.dlid))
            .unwrap_or_default()
    ));

    let mut commands = stdin_commands();
    let mut armed = std::collections::BTreeSet::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            c = commands.recv() => {
                let Some(c) = c else { break };
                let w: Vec<&str> = c.split_whitespace().collect();
                match w[..] {
                    ["protect"] => {
                        for s in specs.drain(..) {
                            handle.protect(s).await.map_err(|e| e.to_string())?;
                        }
                        report(&format!("PROTECTING n={}", a.n));
                    }
                    ["port", n, ev] => {
                        let n: u8 = n.parse().map_err(|_| format!("bad port {n}"))?;
                        let ev = if ev == "down" { apm_core::PortEvent::Down } else { apm_core::PortEvent::Active };
                        qp.port_event(PortKey::new(0, n), ev);
                    }
                    ["stats"] => {
                        let s = handle.stats().await.map_err(|e| e.to_string())?;
                        report(&stats_line(&s, stack.fabric.sa_queries(), &port, &sa));
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
                let was_all = armed.len() == a.n as usize;
                match n.kind {
                    apm_core::NotificationKind::Protected { .. } | apm_core::NotificationKind::Rearmed { .. } => {
                        armed.insert(n.conn);
                    }
                    apm_core::NotificationKind::Migrated { .. } | apm_core::NotificationKind::Unprotected { .. } | apm_core::NotificationKind::Lost { .. } => {
                        armed.remove(&n.conn);
                    }
                    _ => {}
                }
                if n.conn == WATCHED {
                    report(&format!("NOTE {}", notification_line(&n.kind)));
                }
                if !was_all && armed.len() == a.n as usize {
                    report(&format!("ALL ARMED n={}", a.n));
                }
            }
        }
    }
    Ok(())
}

/// Answer every LAP with APR(Success), comm IDs swapped, same TID, to the sender.
async fn answer(t: &UmadCmTransport, mut rx: UnboundedReceiver<Incoming>) {
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Ok(Some(m)) = tokio::time::timeout_at(until, rx.recv()).await {
        if let CmBody::Lap(lap) = &m.body {
            let apr = Apr::answer(lap.remote_comm_id, lap.local_comm_id, ApStatus::Success);
            report(&format!(
                "ANSWERED LAP from lid {} comm {:#x}",
                m.from.lid, lap.local_comm_id
            ));
            if let Err(e) = t.send(Dest::reply_to(&m.from), m.tid, &CmBody::Apr(apr)) {
                report(&format!("FAIL sending APR: {e}"));
            }
        }
    }
}

/// Send [`ROUNDS`] LAPs one after the other and time each APR.
async fn send_laps(
    t: &UmadCmTransport,
    mut rx: UnboundedReceiver<Incoming>,
    dlid: u16,
) -> Result<Vec<Duration>, String> {
    let mut rtts = Vec::new();
    for i in 0..ROUNDS {
        let comm_id = 0x0100_0000 + i as u32;
        let lap = Lap {
            local_comm_id: comm_id,
            remote_comm_id: 0x0200_0000,
            ..Lap::default()
        };
        let t0 = Instant::now();
        t.send(Dest::gsi(dlid, 0), 0x77_0000 + i as u64, &CmBody::Lap(lap))
            .map_err(|e| e.to_string())?;
        loop {
            let m = tokio::time::timeout(Duration::from_secs(2), rx.recv())
                .await
                .map_err(|_| format!("no APR for LAP {i} on {:?}", t.channel()))?
                .ok_or("transport closed")?;
            if let CmBody::Apr(apr) = m.body {
                if apr.remote_comm_id == comm_id && apr.ap_status == ApStatus::Success {
                    rtts.push(t0.elapsed());
                    break;
                }
            }
        }
    }
    Ok(rtts)
}

/// LAP -> APR round trips between two nodes, on CM class 0x07 and on a vendor class
/// with an OUI, every LAP answered.
#[test]
fn lap_apr_round_trip() {
    let Some(bed) = Bed::or_skip("lap_apr_round_trip") else {
        return;
    };
    let mut responder = bed
        .spawn_node(&bed.nodes[1], "bed_node", "apr-responder")
        .unwrap();
    let (_, lid) = responder.expect("LID", Duration::from_secs(10)).unwrap();
    let dlid = lid.trim_start_matches("LID ").to_owned();
    let mut sender = bed
        .spawn_node(&bed.nodes[0], "bed_node", &format!("lap:{dlid}"))
        .unwrap();
    for ch in ["cm", "vendor"] {
        let (_, rtt) = sender
            .expect(&format!("RTT {ch}"), Duration::from_secs(30))
            .unwrap();
        println!("LAP -> APR {rtt}");
        assert!(rtt.contains(&format!("n={ROUNDS}")), "{rtt}");
    }
    sender.expect("DONE", Duration::from_secs(5)).unwrap();
}

/// Two engine nodes of one bed: H2 (active) and H3 (passive), protecting `n`
/// connections whose primaries run port 2 to port 2 (rail B), their MADs on port 1.
struct Pair {
    active: bed::NodeProc,
    passive: bed::NodeProc,
    /// Port GUIDs and base LIDs: (active p1, active p2, passive p1, passive p2).
    guids: [u64; 4],
    lids: [u16; 4],
}

fn start_pair(bed: &Bed, n: u32, active_policy: &str, passive_policy: &str) -> Pair {
    let (a, p) = (&bed.nodes[0], &bed.nodes[1]);
    let ports = bed.hca_ports();
    let lids = bed.guid2lid();
    let g = [(a, 1), (a, 2), (p, 1), (p, 2)].map(|(node, pn)| ports[&(node.clone(), pn)]);
    let l = g.map(|guid| lids[&guid].0);
    let args = |role: &str, me: usize, them: usize, policy: &str| {
        format!(
            "engine:role={role};n={n};from=2;dst={:x};peer={:x};route={:x}:{},{:x}:{};me2={:x}:{}{policy}",
            g[them + 1],
            g[them],
            g[them],
            l[them],
            g[them + 1],
            l[them],
            g[me + 1],
            l[me + 1],
        )
    };
    let mut passive = bed
        .spawn_node(p, "bed_node", &args("passive", 2, 0, passive_policy))
        .unwrap();
    let mut active = bed
        .spawn_node(a, "bed_node", &args("active", 0, 2, active_policy))
        .unwrap();
    let (_, r) = passive.expect("READY", Duration::from_secs(10)).unwrap();
    println!("{p}: {r}");
    let (_, r) = active.expect("READY", Duration::from_secs(10)).unwrap();
    println!("{a}: {r}");
    Pair {
        active,
        passive,
        guids: g,
        lids: l,
    }
}

impl Pair {
    fn protect(&mut self) {
        bed::protect_passive_first(&mut self.passive, &mut self.active);
    }
}

/// End to end with two real engines (failover on both sides and the re-arm
/// race, docs/iba-facts.md §2, on the real management stack).
/// H2 (active) and H3 (passive) each run apm-core's Manager with umad-sa, cm-lap's peer
/// channel (the vendor class) and a simulated QP; the connection's primary runs H2 port
/// 2 <-> H3 port 2.
/// 1. Both arm through a LAP/APR exchange between the engines (rail A alternate).
/// 2. `Unlink "H2"[2]`: H2's engine learns it from its own PORT_ERR (injected into its
///    simulated HCA with the Unlink: umad2sim has no async events) and asks H3 over rail
///    A to move first (apm's Migrate); H3's QP is forced, then H2's on H3's answer. Both
///    arm the rail they left (port 2, dead) at once, with no message; H3 also hears
///    trap 65 (the passive side's own notice: `apm/tests/ibsim.rs` moves on it).
/// 3. `ReLink "H2"[2]`: trap 64 at H3, PORT_ACTIVE at H2; the armed alternate on rail B
///    counts again on both sides (re-armed), with no exchange.
/// 4. H4 sends H3 a LAP with the connection's comm IDs: H3's engine answers APR
///    rejected and its QP is untouched.
#[test]
fn two_engines_unlink_relink_rearm() {
    let Some(bed) = Bed::or_skip("two_engines_unlink_relink_rearm") else {
        return;
    };
    let mut pair = start_pair(&bed, 1, "", "");
    let (h2, h3) = (bed.nodes[0].clone(), bed.nodes[1].clone());
    let t0 = Instant::now();
    pair.protect();
    let (ta, prot) = pair
        .active
        .expect("NOTE Protected", Duration::from_secs(10))
        .unwrap();
    let (tp, pprot) = pair
        .passive
        .expect("NOTE Protected", Duration::from_secs(10))
        .unwrap();
    println!(
        "armed: {h2} {prot} after {:.1} ms, {h3} {pprot} after {:.1} ms",
        ms(ta - t0),
        ms(tp - t0)
    );
    assert!(prot.contains("port=1"), "{h2} not armed on rail A: {prot}");
    assert!(
        pprot.contains("port=1"),
        "{h3} not armed on rail A: {pprot}"
    );

    // Unlink H2's primary port.
    let mark = bed.log_mark();
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{h2}\"[2]")).unwrap();
    pair.active.send("port 2 down").unwrap();
    let want = format!("INPUT remote {:x} out", pair.guids[1]);
    let got = pair.passive.expect_all(
        &["FORCED", "NOTE Migrated", "LOAD_ALT port=2", &want],
        Duration::from_secs(10),
    );
    let [(t_f3, f3), (_, m3), _, (t_in, _)] = &got[..] else {
        unreachable!("NodeProc::expect_all returns one report per prefix")
    };
    let (t_in, t_f3) = (*t_in, *t_f3);
    assert!(m3.contains("forced=true"), "{m3}");
    let got = pair.active.expect_all(
        &["FORCED", "NOTE Migrated", "LOAD_ALT port=2"],
        Duration::from_secs(10),
    );
    let [(t_f2, f2), (_, m2), _] = &got[..] else {
        unreachable!("NodeProc::expect_all returns one report per prefix")
    };
    let t_f2 = *t_f2;
    assert!(m2.contains("forced=true"), "{m2}");
    println!(
        "Unlink {h2}[2] -> {h3} forced on {h2}'s request {:.2} ms ({f3}), {h2} forced on \
         {h3}'s answer {:.2} ms ({f2}); {h3} engine input (trap 65) {:.2} ms; both armed \
         port 2 again at once",
        ms(t_f3 - t0),
        ms(t_f2 - t0),
        ms(t_in - t0)
    );
    assert!(
        t_f3 - t0 < Duration::from_millis(300) && t_f2 - t0 < Duration::from_millis(300),
        "the pair did not move at once on {h2}'s PORT_ERR"
    );
    assert!(
        f3.contains("port=1") && f2.contains("port=1"),
        "{f3} / {f2}"
    );
    bed.wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(1))
        .expect("OpenSM logged no trap 65");

    // ReLink: the alternate armed on rail B counts again on both sides, no exchange.
    let (b2, b3) = (pair.active.stats(), pair.passive.stats());
    let t0 = Instant::now();
    bed.console(&format!("ReLink \"{h2}\"[2]")).unwrap();
    pair.active.send("port 2 up").unwrap();
    let want = format!("INPUT remote {:x} in", pair.guids[1]);
    // The passive side re-arms on trap 64 or, sooner, when its probe session to the
    // relinked port comes back: either may come first.
    let got = pair
        .passive
        .expect_all(&[&want, "NOTE Rearmed"], Duration::from_secs(10));
    let [(t_in, _), (t3, l3)] = &got[..] else {
        unreachable!("NodeProc::expect_all returns one report per prefix")
    };
    let t_in = *t_in;
    let (t2, l2) = pair
        .active
        .expect("NOTE Rearmed", Duration::from_secs(10))
        .unwrap();
    for (node, t, l) in [(&pair.active.node, t2, &l2), (&pair.passive.node, *t3, l3)] {
        assert!(l.contains("port=2"), "{node}: {l}");
        println!(
            "ReLink {h2}[2] -> {node} re-armed on rail B ({l}) {:.1} ms",
            ms(t - t0)
        );
    }
    println!(
        "ReLink {h2}[2] -> {h3} engine input (trap 64) {:.2} ms",
        ms(t_in - t0)
    );
    let s2 = pair.active.stats();
    let s3 = pair.passive.stats();
    let d = |a: &std::collections::BTreeMap<String, u64>,
             b: &std::collections::BTreeMap<String, u64>,
             k: &str| a[k] - b[k];
    println!(
        "during the ReLink: {h2} sent {} LAPs and {} APRs, {h3} sent {} LAPs and {} APRs",
        d(&s2, &b2, "laps_sent"),
        d(&s2, &b2, "aprs_sent"),
        d(&s3, &b3, "laps_sent"),
        d(&s3, &b3, "aprs_sent")
    );
    // Only the initial arm took an exchange.
    assert!(s2["laps_sent"] >= 1, "{s2:?}");
    assert!(s3["aprs_sent"] >= 1, "{s3:?}");
    assert_eq!(d(&s2, &b2, "laps_sent"), 0, "{s2:?}");
    // One forced migration each for the Unlink; a second when the SM's trap 65 reached
    // an engine before its peer's Migrate did (the trap is then a reason of its own to
    // move, onto the same path): seen on a loaded machine.
    assert!((1..=2).contains(&s3["forced"]), "{s3:?}");
    assert!((1..=2).contains(&s2["forced"]), "{s2:?}");

    // A LAP for the connection from H4, which is not its peer.
    let _ = pair.passive.drain();
    let h4 = bed.nodes[2].clone();
    let mut stranger = bed
        .spawn_node(
            &h4,
            "bed_node",
            &format!("lap-stranger:{},2001,1001", pair.lids[2]),
        )
        .unwrap();
    let (_, st) = stranger
        .expect("STRANGER", Duration::from_secs(10))
        .unwrap();
    println!("{h4} -> {h3}: {st}");
    assert!(st.contains("APR Rejected"), "{st}");
    // A window: nothing the stranger's LAP could set off may show at H3.
    std::thread::sleep(Duration::from_millis(300));
    let after = pair.passive.drain();
    assert!(
        after.iter().all(|l| !l.starts_with("LOAD_ALT")
            && !l.starts_with("FORCED")
            && !l.starts_with("REARM")),
        "the stranger's LAP changed {h3}'s QP: {after:?}"
    );
    let s3b = pair.passive.stats();
    assert_eq!(s3b["strangers"], 1, "{s3b:?}");
    assert_eq!(s3b["arms"], s3["arms"], "{s3b:?}");
    bed.assert_reports_answered();
}

/// With ibsim dropping half the MADs through H3's port 1 (`Error`), 20 connections
/// still get armed on both sides by the engines' LAP retransmission (20 ms, doubling,
/// up to 10 tries); the retransmissions are counted.
#[test]
fn two_engines_arm_through_mad_loss() {
    let Some(bed) = Bed::or_skip("two_engines_arm_through_mad_loss") else {
        return;
    };
    let n = 20;
    let policy = ";lap_ms=20;tries=10";
    let mut pair = start_pair(&bed, n, policy, policy);
    let h3 = bed.nodes[1].clone();
    // Let OpenSM finish the sweeps our new IsSM clients caused before dropping anything
    // (it waits forever for a MAD that is lost under umad2sim).
    std::thread::sleep(Duration::from_millis(500));
    bed.console(&format!("Error \"{h3}\"[1] 50")).unwrap();
    let t0 = Instant::now();
    pair.protect();
    let a = pair.active.expect("ALL ARMED", Duration::from_secs(30));
    let p = pair.passive.expect("ALL ARMED", Duration::from_secs(30));
    bed.console(&format!("Error \"{h3}\"[1] 0")).unwrap();
    let (ta, _) = a.unwrap();
    let (tp, _) = p.unwrap();
    println!(
        "{n} connections armed through 50% MAD loss: active after {:.0} ms, passive after {:.0} ms",
        ms(ta - t0),
        ms(tp - t0)
    );
    let s2 = pair.active.stats();
    let s3 = pair.passive.stats();
    let retx = s2["lap_retransmits"] + s3["lap_retransmits"];
    println!(
        "LAP retransmits: active {}, passive {}; LAPs sent {} + {}; APRs sent {} + {}; MRAs {} + {}",
        s2["lap_retransmits"],
        s3["lap_retransmits"],
        s2["laps_sent"],
        s3["laps_sent"],
        s2["aprs_sent"],
        s3["aprs_sent"],
        s2["mras_sent"],
        s3["mras_sent"]
    );
    assert!(retx > 0, "no LAP was retransmitted: was anything lost?");
}

/// The SA cost of a rearm storm with the engine driving: 50 connections from H2 to two
/// destinations (H3 and H4, each answering LAPs with a stub), with no candidate paths
/// in their specs, so the engine must ask the SA: once per (local port, destination).
#[test]
fn rearm_storm_sa_queries() {
    let Some(bed) = Bed::or_skip("rearm_storm_sa_queries") else {
        return;
    };
    let n: u32 = 50;
    let ports = bed.hca_ports();
    let mut stubs = Vec::new();
    let mut dst = Vec::new();
    let mut route = Vec::new();
    for node in &bed.nodes[1..3] {
        let mut s = bed.spawn_node(node, "bed_node", "apr-responder").unwrap();
        let (_, lid) = s.expect("LID", Duration::from_secs(10)).unwrap();
        stubs.push(s);
        let guid = ports[&(node.clone(), 1)];
        dst.push(format!("{guid:x}"));
        // Routes make the node learn the stubs' GIDs before the storm.
        route.push(format!("{guid:x}:{}", lid.trim_start_matches("LID ")));
    }
    let mut e = bed
        .spawn_node(
            &bed.nodes[0],
            "bed_node",
            &format!(
                "engine:role=active;n={n};from=1;cands=none;dst={};route={}",
                dst.join(","),
                route.join(",")
            ),
        )
        .unwrap();
    e.expect("READY", Duration::from_secs(10)).unwrap();
    // Let the engine's own subscription (at start) finish before counting. Only the
    // printed count of SA request MADs depends on it, no assertion: the node counts
    // the MADs its port sent, its setup's queries among them, and says nothing when
    // the subscription is answered.
    std::thread::sleep(Duration::from_millis(200));
    let before = e.stats();
    let t0 = Instant::now();
    e.send("protect").unwrap();
    let (t1, _) = e.expect("ALL ARMED", Duration::from_secs(20)).unwrap();
    let after = e.stats();
    let d = |k: &str| after[k] - before[k];
    println!(
        "rearm of {n} connections to {} destinations: {:.1} ms, {} engine path queries, \
         {} SA PathRecord queries (cache misses), {} SA request MADs, {} LAPs",
        dst.len(),
        ms(t1 - t0),
        d("engine_path_queries"),
        d("sa_path_queries"),
        d("sa_mad_requests"),
        d("laps_sent")
    );
    assert_eq!(d("engine_path_queries"), 2, "{after:?}");
    assert_eq!(d("sa_path_queries"), 2, "{after:?}");
    assert_eq!(d("laps_sent"), u64::from(n), "{after:?}");
}
