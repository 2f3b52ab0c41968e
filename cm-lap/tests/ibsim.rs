//! Bed tests of the umad LAP/APR transport between two simulated nodes (`cargo xtask
//! ibsim`). Skipped with a printed reason outside the bed.
//!
//! One node answers every LAP with an APR (a stub peer); the other sends LAPs and times
//! the APRs, on CM class 0x07 and on a vendor class with an OUI. The end-to-end test runs
//! apm-core's engine on one node with umad-sa and the peer channel.
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use cm_lap::umad_transport::{CmChannel, Incoming, UmadCmTransport, DEFAULT_VENDOR_CLASS};
use ib_mad::cm::{ApStatus, Apr, CmBody, Lap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use umad::bed::{self, report, Bed};
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
    let Some(role) = bed::node_role() else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime"); // a test process without a runtime can do nothing
    let run = async {
        match role.strip_prefix("e2e-passive:") {
            Some(args) => e2e_passive(args).await,
            None => node(&role).await,
        }
    };
    if let Err(e) = rt.block_on(run) {
        report(&format!("FAIL {e}"));
        std::process::exit(1);
    }
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
            let mut rx = cm_rx;
            cm.send(Dest::gsi(dlid, 0), 0x5eed, &CmBody::Lap(lap))
                .map_err(|e| e.to_string())?;
            let m = tokio::time::timeout(Duration::from_secs(3), rx.recv())
                .await
                .map_err(|_| "no answer to the stranger's LAP".to_string())?
                .ok_or("closed")?;
            match m.body {
                CmBody::Apr(a) => report(&format!("STRANGER got APR {:?}", a.ap_status)),
                other => report(&format!("STRANGER got {other:?}")),
            }
            drop((vd, vd_rx));
        }
        other => return Err(format!("unknown role {other}")),
    }
    report("DONE");
    Ok(())
}

/// A simulated QP for the engine (the QP side of the end-to-end test): it keeps the
/// migration state as hardware would and reports every operation to the test.
struct FakeQp {
    info: apm_core::PortInfo,
    state: std::sync::Mutex<(apm_core::MigState, apm_core::Path, Option<apm_core::Path>)>,
}

#[async_trait::async_trait]
impl apm_core::QpControl for FakeQp {
    async fn start(&self, sink: apm_core::InputSink) -> Result<(), apm_core::ProviderError> {
        let _ = sink.send(apm_core::Input::PortInfo(self.info.clone()));
        Ok(())
    }
    async fn load_alternate(
        &self,
        _conn: apm_core::ConnId,
        path: apm_core::Path,
    ) -> Result<(), apm_core::ProviderError> {
        report(&format!("LOAD_ALT dlid={}", path.dlid));
        self.lock().2 = Some(path);
        Ok(())
    }
    async fn set_rearm(
        &self,
        _conn: apm_core::ConnId,
    ) -> Result<apm_core::MigState, apm_core::ProviderError> {
        let mut s = self.lock();
        // The peer's packets already carry MigReq=0: REARM becomes ARMED at once.
        s.0 = if s.2.is_some() {
            apm_core::MigState::Armed
        } else {
            apm_core::MigState::Migrated
        };
        report(&format!("REARM -> {:?}", s.0));
        Ok(s.0)
    }
    async fn force_migrate(&self, _conn: apm_core::ConnId) -> Result<(), apm_core::ProviderError> {
        let mut s = self.lock();
        if let Some(alt) = s.2.take() {
            s.1 = alt;
        }
        s.0 = apm_core::MigState::Migrated;
        report(&format!("FORCED primary dlid={}", s.1.dlid));
        Ok(())
    }
    async fn software_migrate(
        &self,
        _conn: apm_core::ConnId,
        _path: apm_core::Path,
    ) -> Result<(), apm_core::ProviderError> {
        Err(apm_core::ProviderError::Unsupported {
            provider: "test QP".into(),
            operation: "software migration".into(),
        })
    }
    async fn query_qp(
        &self,
        _conn: apm_core::ConnId,
    ) -> Result<apm_core::QpSnapshot, apm_core::ProviderError> {
        let s = self.lock();
        Ok(apm_core::QpSnapshot {
            operational: true,
            mig_state: s.0,
            primary_port: s.1.port,
            primary_dlid: s.1.dlid,
            primary_dgid: s.1.dgid,
        })
    }
}

impl FakeQp {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, (apm_core::MigState, apm_core::Path, Option<apm_core::Path>)>
    {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The passive side of seed 000 with the real engine: umad-sa for notices and paths,
/// cm-lap's peer channel for LAP/APR, a simulated QP. `args`: the peer's port-1 GUID,
/// port-2 GUID and port-1 LID (the only port that hosts the peer's MAD client).
async fn e2e_passive(args: &str) -> Result<(), String> {
    use apm_core::{ConnId, ConnSpec, FabricService, Gid, MigrationMode, PortKey, Qpn, Role};
    let f: Vec<&str> = args.split(',').collect();
    let [p1, p2, p1_lid] = f[..] else {
        return Err(format!("bad args {args}"));
    };
    let hexu = |s: &str| u64::from_str_radix(s, 16).map_err(|e| e.to_string());
    let (g1, g2) = (Gid::from_guid(hexu(p1)?), Gid::from_guid(hexu(p2)?));
    let p1_lid: u16 = p1_lid.parse().map_err(|_| "bad LID".to_string())?;
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
    let key = PortKey::new(0, 1);
    let (sa, sa_events) = umad_sa::SaClient::new(
        Arc::clone(&port),
        take(0x03)?,
        umad_sa::SaOptions::default(),
    );
    let fabric = umad_sa::SaFabric::new(sa.clone(), key, sa_events);
    let (cm, cm_rx) = UmadCmTransport::new(Arc::clone(&port), CmChannel::CmClass, take(0x07)?);
    let sources = Arc::new(cm_lap::peer_channel::SaSourceGid::new(sa.clone()));
    let peer =
        cm_lap::peer_channel::UmadPeerChannel::new(cm, cm_rx, key, sources).route(g2, p1_lid);

    let to_p2 = fabric
        .resolve_paths(key, g2)
        .await
        .map_err(|e| e.to_string())?;
    let to_p1 = fabric
        .resolve_paths(key, g1)
        .await
        .map_err(|e| e.to_string())?;
    let (Some(primary), Some(alt)) = (to_p2.first().copied(), to_p1.first().copied()) else {
        return Err("no paths to the peer".into());
    };
    let me = port.info();
    let info = apm_core::PortInfo {
        key,
        gids: vec![Gid(me.gid)],
        lid: apm_core::Lid::from_wire(me.lid),
        lmc: me.lmc,
        active: true,
        link_layer: apm_core::LinkLayer::InfiniBand,
    };
    let qp = FakeQp {
        info,
        state: std::sync::Mutex::new((apm_core::MigState::Migrated, primary, None)),
    };
    let stack = apm_core::Stack::new(qp, peer, fabric);
    let (mgr, handle) = apm_core::Manager::new(Arc::new(stack), apm_core::Policy::default())
        .map_err(|e| e.to_string())?;
    let mut notes = handle.notifications();
    tokio::spawn(mgr.run());
    let spec = ConnSpec {
        id: ConnId(1),
        role: Role::Passive,
        mode: MigrationMode::Hardware,
        local_qpn: Qpn::new(0x123).ok_or("qpn")?,
        remote_qpn: Qpn::new(0x456).ok_or("qpn")?,
        local_comm_id: 0x100,
        remote_comm_id: 0x200,
        primary,
        agreed_alternate: None,
        candidates: to_p1.iter().chain(&to_p2[1..]).copied().collect(),
    };
    handle.protect(spec).await.map_err(|e| e.to_string())?;
    report(&format!(
        "PROTECTING lid={} primary dlid={} alt dlid={}",
        me.lid, primary.dlid, alt.dlid
    ));
    let until = tokio::time::Instant::now() + Duration::from_secs(40);
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, notes.recv()).await {
        let what = match n.kind {
            apm_core::NotificationKind::Protected { alternate } => {
                format!("Protected alt dlid={}", alternate.dlid)
            }
            apm_core::NotificationKind::Rearmed { alternate } => {
                format!("Rearmed alt dlid={}", alternate.dlid)
            }
            apm_core::NotificationKind::Migrated { primary, forced } => {
                format!("Migrated forced={forced} primary dlid={}", primary.dlid)
            }
            other => format!("{other:?}"),
        };
        report(&format!("NOTE {what}"));
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

/// End to end, passive side of seed 000 on the real management stack: node A (apm-core's
/// engine and Manager, umad-sa for notices and paths, cm-lap's peer channel, a simulated
/// QP) protects a connection to node B's rail-B port and arms it through a LAP/APR
/// exchange with B; `Unlink` of B's rail-B port reaches A's engine as an SA notice and
/// the engine forces the migration, then re-arms on an LMC variant through another
/// LAP/APR; `ReLink` moves the alternate back to rail B; a LAP for the connection from
/// a third node is rejected and changes nothing. B answers LAPs with a stub (its own
/// engine is not needed for A's side).
#[test]
fn e2e_passive_side_forces_migration_and_rearms() {
    let Some(bed) = Bed::or_skip("e2e_passive_side_forces_migration_and_rearms") else {
        return;
    };
    let (a, b) = (bed.nodes[0].clone(), bed.nodes[1].clone());
    let ports = bed.hca_ports();
    let (b1, b2) = (ports[&(b.clone(), 1)], ports[&(b.clone(), 2)]);
    let mut responder = bed.spawn_node(&b, "bed_node", "apr-responder").unwrap();
    let (_, lid) = responder.expect("LID", Duration::from_secs(10)).unwrap();
    let b1_lid = lid.trim_start_matches("LID ").to_owned();
    let mut n = bed
        .spawn_node(
            &a,
            "bed_node",
            &format!("e2e-passive:{b1:x},{b2:x},{b1_lid}"),
        )
        .unwrap();
    let (_, p) = n.expect("PROTECTING", Duration::from_secs(10)).unwrap();
    println!("{p}");
    let t0 = Instant::now();
    let (t1, prot) = n.expect("NOTE Protected", Duration::from_secs(10)).unwrap();
    println!(
        "{prot} after {:.1} ms (LAP/APR with {b})",
        (t1 - t0).as_secs_f64() * 1e3
    );
    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{b}\"[2]")).unwrap();
    let (t1, forced) = n.expect("FORCED", Duration::from_secs(3)).unwrap();
    let (_, mig) = n.expect("NOTE Migrated", Duration::from_secs(3)).unwrap();
    assert!(mig.contains("forced=true"), "{mig}");
    println!(
        "Unlink {b}[2] -> engine forced migration {:.2} ms ({forced})",
        (t1 - t0).as_secs_f64() * 1e3
    );
    let (t2, re) = n.expect("NOTE Rearmed", Duration::from_secs(10)).unwrap();
    println!(
        "{re} {:.1} ms after the migration",
        (t2 - t1).as_secs_f64() * 1e3
    );
    // Both arming LAPs really crossed the fabric and were answered by B.
    responder
        .expect("ANSWERED LAP", Duration::from_secs(1))
        .unwrap();
    responder
        .expect("ANSWERED LAP", Duration::from_secs(1))
        .unwrap();
    // ReLink: trap 64 for B's rail-B port; the engine moves the alternate back to the
    // other rail (port-disjoint beats an LMC variant) through another LAP/APR.
    let t0 = Instant::now();
    bed.console(&format!("ReLink \"{b}\"[2]")).unwrap();
    // (Already armed, so no new notification: the QP shows the new alternate.)
    let (t1, back) = n.expect("LOAD_ALT", Duration::from_secs(10)).unwrap();
    n.expect("REARM -> Armed", Duration::from_secs(2)).unwrap();
    println!(
        "ReLink {b}[2] -> alternate back on rail B ({back}) after {:.1} ms",
        (t1 - t0).as_secs_f64() * 1e3
    );
    assert!(
        !back.ends_with("dlid=13"),
        "still on the LMC variant: {back}"
    );
    responder
        .expect("ANSWERED LAP", Duration::from_secs(1))
        .unwrap();
    let _ = n.drain();

    // A LAP for this connection from a third node is refused and changes nothing.
    let c = bed.nodes[2].clone();
    let a_lid: u16 = p
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lid="))
        .and_then(|l| l.parse().ok())
        .expect("A's LID in its PROTECTING report");
    let mut stranger = bed
        .spawn_node(&c, "bed_node", &format!("lap-stranger:{a_lid},100,200"))
        .unwrap();
    let (_, st) = stranger
        .expect("STRANGER", Duration::from_secs(10))
        .unwrap();
    println!("{st}");
    assert!(st.contains("APR Rejected"), "{st}");
    std::thread::sleep(Duration::from_millis(300));
    let after = n.drain();
    assert!(
        after
            .iter()
            .all(|l| !l.starts_with("LOAD_ALT") && !l.starts_with("FORCED")),
        "the stranger's LAP changed the QP: {after:?}"
    );
}
