//! The host agent's InfiniBand side on the bed: two nodes, each running `apm agent`'s
//! agent in-process on the umad half (`apm::agent_ib::AgentInfiniBand`, umad's test-bed
//! mode) and one "process" beside it, connected to the agent's socket as a protected
//! process is: its engine on a test QP facet, its peer and fabric facets over the agent
//! (`AgentPeer`, `AgentFabric`), so every SA question, notice and LAP/APR/Migrate
//! travels through the agents, never from the process itself.
//!
//! 1. The process learns its primary and its alternates from the agent (PathRecords,
//!    the peer node's ports from NodeRecords), and both engines arm an alternate through
//!    LAP/APR between the agents over apm's vendor class.
//! 2. `Unlink` of the active side's primary port: the passive agent's trap 65 becomes
//!    the passive engine's forced migration; the node measures the Report's arrival at
//!    its agent to the QP's forced migration (the goal: under 10 ms).
//! 3. `ReLink`: trap 64; the passive side's alternate counts again.
//! 4. The SA questions: the agent asked the SA once per (port, destination), whatever
//!    the number of questions the process asked (`STATS sa_queries`).
//! 5. CLIENT_REREGISTER: the SM restarts (and forgets the subscriptions); each node's
//!    HCA reports CLIENT_REREGISTER, the engine subscribes again through its agent, and
//!    an Unlink of a third node's port reaches both processes as trap 65.

use super::{parse_node_args, FakeQp};
use apm::apm_core::testing::notification_line;
use apm::apm_core::{
    ConnId, Gid, GidService, Input, InputSink, Lid, LinkLayer, Path, PeerAddr, PeerMsg, PortInfo,
    PortKey, ProviderError, Role,
};
use apm_agent::client::AgentClient;
use apm_agent::facets::{ib_connection, AgentFabric, AgentPeer, IbPeer, Ports};
use apm_agent::host::{Host, OwnerError};
use apm_agent::ib::{IbPort, InfiniBand};
use apm_agent::rdma_nl::QpRecord;
use apm_agent::server::{Agent, AgentConfig};
use apm_agent::wire::{FromAgent, Route};
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use umad::bed::{self, ms, report, stdin_commands, Bed};

/// This node's two ports, as the agent knows its host.
#[derive(Debug)]
struct BedHost {
    ports: Vec<(Gid, u8)>,
}

impl Host for BedHost {
    fn port_of(&self, gid: &Gid) -> Option<(String, u8)> {
        self.ports
            .iter()
            .find(|(g, _)| g == gid)
            .map(|(_, p)| ("ibsim0".to_owned(), *p))
    }

    fn device_addresses(&self, _gid: &Gid) -> Option<Vec<apm_agent::local::Addr>> {
        None
    }

    fn qp(&self, _gid: &Gid, _qpn: u32) -> Result<Option<QpRecord>, OwnerError> {
        // The bed has no verbs device: the test's process is the QP's owner.
        Ok(Some(QpRecord {
            pid: Some(std::process::id()),
            remote_qpn: None,
        }))
    }
}

/// The umad half, with the moment each SA notice reached the agent noted, and the
/// subscriptions the SA took counted.
#[derive(Debug)]
struct Timed {
    inner: apm::agent_ib::AgentInfiniBand,
    noticed: Arc<Mutex<Option<Instant>>>,
    subscribed: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl InfiniBand for Timed {
    fn ports(&self) -> Vec<IbPort> {
        self.inner.ports()
    }

    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Input>();
        let noticed = self.noticed.clone();
        tokio::spawn(async move {
            while let Some(i) = rx.recv().await {
                if matches!(i, Input::RemoteGid { .. }) {
                    *noticed.lock().expect("lock") = Some(Instant::now());
                }
                if sink.send(i).is_err() {
                    return;
                }
            }
        });
        self.inner.start(tx).await
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        self.inner.resolve_paths(port, dgid).await
    }

    async fn gid_of_lid(&self, port: PortKey, lid: Lid) -> Result<Option<Gid>, ProviderError> {
        self.inner.gid_of_lid(port, lid).await
    }

    async fn node_ports(
        &self,
        port: PortKey,
        lid: Lid,
    ) -> Result<Vec<(Gid, Lid, u8)>, ProviderError> {
        self.inner.node_ports(port, lid).await
    }

    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError> {
        self.inner.subscribe(port).await?;
        self.subscribed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        self.inner.send(port, to, msg).await
    }

    fn sa_queries(&self) -> u64 {
        self.inner.sa_queries()
    }
}

/// Entry point of the agent's node processes; a no-op in a normal test run.
#[test]
#[ignore = "runs only as a node process of the ibsim bed tests"]
fn agent_bed_node() {
    bed::run_node(|role| async move { agent_node(&role).await });
}

/// A node: its agent and one process on a test QP facet (see the module docs). Reports
/// `READY`; takes `protect` and `stats`; reports the QP operations (`FORCED`, ...),
/// the notifications (`NOTE`), and `NOTICE->FORCED <ms>` for each SA notice that led to
/// a forced migration.
async fn agent_node(role: &str) -> Result<(), String> {
    // The agent's own account on stderr (the test's output), as `apm agent` logs.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("APM_LOG").unwrap_or_else(|_| "apm_agent=info,umad_sa=debug".into()),
        ))
        .with_writer(std::io::stderr)
        .try_init();
    let a = parse_node_args(role)?;
    let text = std::fs::read_to_string(&a.config).map_err(|e| format!("{}: {e}", a.config))?;
    let config = apm::Config::parse(&text).map_err(|e| e.to_string())?;
    let ((peer1, peer2), me1) = (a.peer.ok_or("no peer")?, a.me1.ok_or("no me1")?);
    let (key1, key2) = (PortKey::new(0, 1), PortKey::new(0, 2));
    let (gid1, gid2) = (Gid::from_guid(me1.0), Gid::from_guid(a.me2.0));
    let opts = apm::ib::UmadOptions {
        testbed: umad::TestBedMode::IbsimOnly,
        carried: vec![(key2, gid2)],
        routes: vec![(Gid::from_guid(peer2.0), peer1.1)],
        ..Default::default()
    };
    let noticed = Arc::new(Mutex::new(None));
    let side = Timed {
        inner: apm::agent_ib::AgentInfiniBand::open(&config, &opts)?,
        noticed: noticed.clone(),
        subscribed: Default::default(),
    };
    let side = Arc::new(side);
    // A short path: a Unix socket's path has at most 107 bytes, and the bed's scratch
    // directories are long.
    let dir = std::env::temp_dir().join(format!("apm-bed-{}", std::process::id()));
    let agent_config = AgentConfig {
        host: Arc::new(BedHost {
            ports: vec![(gid1, 1), (gid2, 2)],
        }),
        infiniband: Some(side.clone()),
        ..AgentConfig::new(a.port, Some(&dir))
    };
    let socket = agent_config.socket.clone();
    let agent = Agent::bind(agent_config).await.map_err(|e| e.to_string())?;
    tokio::spawn(agent.run());

    // The process.
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let client = Arc::new(
        AgentClient::connect(&socket, events_tx)
            .await
            .map_err(|e| e.to_string())?,
    );
    let ports = Ports::default();
    ports.set(key1, gid1);
    ports.set(key2, gid2);
    let peer = AgentPeer::new(client.clone(), key1).with_ports(ports.clone());
    let fabric = AgentFabric::new(client.clone(), ports.clone());
    // Its primary: port 2 to the peer's port 2 (rail B), named by the peer's LID as a
    // QP without a GRH names it; its candidates: every other path the agent knows from
    // either port to the peer's node.
    let conn = ib_connection(
        &client,
        &[(key1, gid1), (key2, gid2)],
        key2,
        IbPeer::Lid(peer2.1),
    )
    .await
    .map_err(|e| format!("the connection's paths: {e}"))?;
    let primary = *conn
        .paths
        .iter()
        .find(|p| p.port == key2 && p.dgid == conn.dgid)
        .ok_or("no path from port 2 to the peer's port 2")?;
    let candidates: Vec<Path> = conn
        .paths
        .iter()
        .copied()
        .filter(|p| *p != primary)
        .collect();
    let role = if a.active {
        Role::Active
    } else {
        Role::Passive
    };
    let spec =
        apm::apm_core::testing::paired_conn_spec(1, role, primary, candidates).ok_or("qpn")?;
    for (g, _) in &conn.peer_ports {
        peer.learn([(gid1, *g), (gid2, *g)]);
    }
    client
        .register(Route {
            local_qpn: spec.local_comm_id,
            remote_qpn: spec.remote_comm_id,
            peer_gids: conn.peer_ports.iter().map(|(g, _)| *g).collect(),
            local_gids: vec![gid1, gid2],
            paths: Vec::new(),
            peer_lids: conn.peer_ports.iter().map(|(_, l)| *l).collect(),
        })
        .map_err(|e| e.to_string())?;
    client.synced().await.map_err(|e| e.to_string())?;

    let forced_at = Arc::new(Mutex::new(None::<Instant>));
    let seen = forced_at.clone();
    let port = |key: PortKey, gid: Gid, lid: u16| PortInfo {
        key,
        gids: vec![gid],
        lid: Lid::from_wire(lid),
        lmc: 0,
        active: true,
        link_layer: LinkLayer::InfiniBand,
    };
    let qp = Arc::new(
        FakeQp::new(vec![port(key1, gid1, me1.1), port(key2, gid2, a.me2.1)]).on_operation(
            move |op| {
                let line = op.to_string();
                if line.starts_with("FORCED") {
                    *seen.lock().expect("lock") = Some(Instant::now());
                }
                report(&line);
            },
        ),
    );
    qp.add_qp(ConnId(1), primary);
    let stack = apm::apm_core::Stack::new(qp.clone(), peer.clone(), fabric.clone());
    let (manager, handle) = apm::apm_core::Manager::new(Arc::new(stack), config.engine_policy())
        .map_err(|e| e.to_string())?;
    tokio::spawn(manager.run());
    let mut notes = handle.notifications();
    report(&format!(
        "READY primary port={} dlid={} candidates={} peer_ports={}",
        primary.port.port,
        primary.dlid,
        spec.candidates.len(),
        conn.peer_ports.len()
    ));
    let mut spec = Some(spec);
    let mut commands = stdin_commands();
    let until = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            c = commands.recv() => {
                let Some(c) = c else { break };
                match c.as_str() {
                    "protect" => {
                        let s = spec.take().ok_or("protected twice")?;
                        handle.protect(s).await.map_err(|e| e.to_string())?;
                        client.subscribe(gid1).map_err(|e| e.to_string())?;
                        report("PROTECTING");
                    }
                    "reregister" => {
                        // The SA forgot its subscriptions (a new SM): the HCA says so on
                        // every port, and the engine subscribes again through the agent.
                        qp.port_event(key1, apm::apm_core::PortEvent::ClientReregister);
                        report("REREGISTERED");
                    }
                    "stats" => {
                        let s = handle.stats().await.map_err(|e| e.to_string())?;
                        report(&format!(
                            "STATS laps_sent={} aprs_sent={} forced={} sa_queries={} subscriptions={} \
                             agent_subscribed={}",
                            s.laps_sent, s.aprs_sent, s.migrations_forced, side.sa_queries(),
                            s.subscriptions,
                            side.subscribed.load(std::sync::atomic::Ordering::SeqCst)
                        ));
                    }
                    _ => report(&format!("FAIL unknown command {c}")),
                }
            }
            ev = events.recv() => {
                let Some(ev) = ev else { return Err("the agent went away".into()) };
                match ev {
                    FromAgent::Peer { from, msg } => {
                        peer.deliver(from, msg);
                    }
                    FromAgent::RemoteGid { gid, service } => {
                        let dir = if service == GidService::InService { "in" } else { "out" };
                        report(&format!("INPUT remote {gid} {dir}"));
                        fabric.deliver(gid, service);
                    }
                    other => report(&format!("AGENT {other:?}")),
                }
            }
            n = notes.recv() => {
                let Ok(n) = n else { continue };
                report(&format!("NOTE {}", notification_line(&n.kind)));
                if notification_line(&n.kind).starts_with("Migrated forced=true") {
                    let (t0, t1) = (*noticed.lock().expect("lock"), *forced_at.lock().expect("lock"));
                    if let (Some(t0), Some(t1)) = (t0, t1) {
                        if t1 >= t0 {
                            report(&format!("NOTICE->FORCED {:.3}", ms(t1 - t0)));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Two nodes' agents carry a protected connection's every SA question, notice and
/// LAP/APR (see the module docs).
#[test]
fn agents_arm_and_migrate_an_adopted_qp_on_infiniband() {
    let Some(bed) = Bed::or_skip("agents_arm_and_migrate_an_adopted_qp_on_infiniband") else {
        return;
    };
    let (h2, h3) = (bed.nodes[0].clone(), bed.nodes[1].clone());
    let ports = bed.hca_ports();
    let lids = bed.guid2lid();
    let port = |node: &str, n: u8| {
        let g = ports[&(node.to_owned(), n)];
        (g, lids[&g].0)
    };
    let spawn = |me: &str, peer: &str, role: &str, udp: u16| {
        let config = bed.scratch.join(format!("apm-agent-{me}.toml"));
        std::fs::write(
            &config,
            "[[device]]\nname = \"ibsim0\"\nprovider = \"verbs\"\nports = [1, 2]\n",
        )
        .unwrap();
        let (me1, me2, peer1, peer2) = (port(me, 1), port(me, 2), port(peer, 1), port(peer, 2));
        let args = format!(
            "config={};role={role};port={udp};me1={:x}:{};me2={:x}:{};peer1={:x}:{};peer2={:x}:{}",
            config.display(),
            me1.0,
            me1.1,
            me2.0,
            me2.1,
            peer1.0,
            peer1.1,
            peer2.0,
            peer2.1
        );
        bed.spawn_node(me, "agent::agent_bed_node", &args).unwrap()
    };
    // Agents of their own ports (both nodes are processes of this host).
    let base = 30_000 + (std::process::id() % 5_000) as u16 * 4;
    let mut passive = spawn(&h3, &h2, "passive", base);
    let mut active = spawn(&h2, &h3, "active", base + 2);
    for n in [&mut passive, &mut active] {
        let (_, r) = n.expect("READY", Duration::from_secs(20)).unwrap();
        println!("{}: {r}", n.node);
        assert!(r.contains("primary port=2"), "{r}");
        assert!(
            r.contains("peer_ports=2"),
            "the peer's two ports, from NodeRecords: {r}"
        );
    }

    // 1. Armed through LAP/APR between the agents.
    let t0 = Instant::now();
    bed::protect_passive_first(&mut passive, &mut active);
    let (ta, prot) = active
        .expect("NOTE Protected", Duration::from_secs(10))
        .unwrap();
    let (tp, pprot) = passive
        .expect("NOTE Protected", Duration::from_secs(10))
        .unwrap();
    println!(
        "armed through the agents: {h2} {prot} after {:.1} ms, {h3} {pprot} after {:.1} ms",
        ms(ta - t0),
        ms(tp - t0)
    );
    assert!(
        prot.contains("alt port=1") && pprot.contains("alt port=1"),
        "{prot} / {pprot}"
    );
    let s2 = active.stats();
    assert!(s2["laps_sent"] >= 1, "{s2:?}");

    // 2. Unlink the active side's primary port: only the SA tells (the passive side).
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{h2}\"[2]")).unwrap();
    let got = passive.expect_all(
        &["INPUT remote", "FORCED", "NOTE Migrated", "NOTICE->FORCED"],
        Duration::from_secs(10),
    );
    let (_, latency) = &got[3];
    let notice_to_forced: f64 = latency
        .trim_start_matches("NOTICE->FORCED ")
        .parse()
        .expect("ms");
    println!(
        "Unlink {h2}[2] -> {h3}: trap 65 at its agent, forced migration {notice_to_forced:.3} ms \
         later ({:.1} ms after the Unlink)",
        ms(got[1].0 - t0)
    );
    assert!(
        notice_to_forced < 10.0,
        "trap 65 at the agent -> forced migration took {notice_to_forced} ms"
    );
    let _ = active.expect_all(&["FORCED", "NOTE Migrated"], Duration::from_secs(10));

    // 3. ReLink: trap 64 reaches the passive engine through its agent.
    bed.console(&format!("ReLink \"{h2}\"[2]")).unwrap();
    let _ = passive.expect_all(&["INPUT remote", "NOTE Rearmed"], Duration::from_secs(10));

    // 4. The SA questions of each node: one per (port, destination) and NodeRecord
    // pair, whatever the process asked (two paths questions, the engine's own through
    // AgentFabric answered from the agent's cache).
    for n in [&mut passive, &mut active] {
        let s = n.stats();
        assert!(s["sa_queries"] <= 12, "{}: {s:?}", n.node);
    }

    // 5. A new SM, CLIENT_REREGISTER, and the notices come again.
    let before: Vec<u64> = [&mut passive, &mut active]
        .into_iter()
        .map(|n| n.stats()["agent_subscribed"])
        .collect();
    let sm = bed.restart_opensm(Duration::from_secs(10)).unwrap();
    for n in [&mut passive, &mut active] {
        n.send("reregister").unwrap();
        n.expect("REREGISTERED", Duration::from_secs(5)).unwrap();
    }
    // The engine asked its agent, and the new SM took the agent's subscription.
    for (n, b) in [&mut passive, &mut active].into_iter().zip(before) {
        n.stats_until(|s| s["agent_subscribed"] > b, Duration::from_secs(10));
    }
    // A new SM's first sweeps may swallow a trap (the library's bed test of an SM that
    // comes back does the same): Unlink and ReLink a third node's port until both
    // processes hear of it.
    let h4 = bed.nodes[2].clone();
    let victim = apm::apm_core::Gid::from_guid(port(&h4, 2).0).to_string();
    let up = Instant::now();
    let mut heard = [false, false];
    let mut rounds = 0;
    while heard.iter().any(|h| !h) {
        rounds += 1;
        assert!(
            up.elapsed() < Duration::from_secs(15),
            "no trap 65 at both nodes within 15 s of CLIENT_REREGISTER ({rounds} rounds)"
        );
        let mark = bed.log_mark();
        let t0 = Instant::now();
        bed.console(&format!("Unlink \"{h4}\"[2]")).unwrap();
        bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
            .expect("no sweep after Unlink");
        for (i, n) in [&mut passive, &mut active].into_iter().enumerate() {
            if heard[i] {
                continue;
            }
            if let Ok((t, l)) = n.expect(
                &format!("INPUT remote {victim} out"),
                Duration::from_millis(500),
            ) {
                println!(
                    "after CLIENT_REREGISTER, {}: {l} {:.1} ms after the Unlink (round {rounds})",
                    n.node,
                    ms(t - t0)
                );
                heard[i] = true;
            }
        }
        let mark = bed.log_mark();
        bed.console(&format!("ReLink \"{h4}\"[2]")).unwrap();
        bed.wait_log_after(mark, "SUBNET UP", Duration::from_secs(2))
            .expect("no sweep after ReLink");
    }
    drop(sm);
    bed.assert_reports_answered();
}
