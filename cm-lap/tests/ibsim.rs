//! Bed tests of the umad LAP/APR transport between two simulated nodes (`cargo xtask
//! ibsim`). Skipped with a printed reason outside the bed.
//!
//! One node answers every LAP with an APR (a stand-in for the protocol engine, which is
//! not written yet); the other sends LAPs and times the APRs, on CM class 0x07 and on a
//! vendor class with an OUI.
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
    if let Err(e) = rt.block_on(node(&role)) {
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
        other => return Err(format!("unknown role {other}")),
    }
    report("DONE");
    Ok(())
}

/// Answer every LAP with APR(Success), comm IDs swapped, same TID, to the sender.
async fn answer(t: &UmadCmTransport, mut rx: UnboundedReceiver<Incoming>) {
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Ok(Some(m)) = tokio::time::timeout_at(until, rx.recv()).await {
        if let CmBody::Lap(lap) = &m.body {
            let apr = Apr::answer(lap.remote_comm_id, lap.local_comm_id, ApStatus::Success);
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
