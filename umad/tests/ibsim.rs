//! Bed tests of the umad transport against ibsim and OpenSM (`cargo xtask ibsim`).
//!
//! Each test skips with a printed reason when no bed is described in the environment.
//! The work that needs umad2sim runs in node processes (this binary re-executed through
//! `bed_node`); the test itself only drives the console and reads reports and logs.
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use std::time::Duration;
use umad::bed::{self, report, Bed};
use umad::{AgentSpec, Dest, Port, PortOptions, PortSelector, RequestOptions, TestBedMode};

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
        agents: vec![AgentSpec::class(0x03, 2), AgentSpec::class(0x07, 2)],
        testbed: TestBedMode::IbsimOnly,
        ..Default::default()
    };
    let (port, _unsolicited) = Port::open(&PortSelector::First, opts).map_err(|e| e.to_string())?;
    let info = port.info().clone();
    report(&format!(
        "OPEN ca={} port={} lid={} lmc={} sm_lid={}",
        info.ca, info.port, info.lid, info.lmc, info.sm_lid
    ));
    match role {
        "open" => {
            // Stay IsSM for a while so that OpenSM sweeps (and queries our SMInfo).
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        "sa-get" => {
            // SubnAdmGet(ClassPortInfo) to the SA: a request/response through OpenSM.
            let mut mad = vec![0u8; 256];
            mad[0] = 1;
            mad[1] = 0x03;
            mad[2] = 2;
            mad[3] = 0x01;
            mad[16..18].copy_from_slice(&0x0001u16.to_be_bytes());
            let sm = port.refresh_info().map_err(|e| e.to_string())?;
            let t = std::time::Instant::now();
            let r = port
                .request(
                    &mad,
                    Dest::gsi(sm.sm_lid, sm.sm_sl),
                    RequestOptions::default(),
                )
                .await
                .map_err(|e| e.to_string())?;
            report(&format!(
                "RESP method={:#04x} status={:#06x} rtt_us={}",
                r.method(),
                u16::from_be_bytes([r.mad[4], r.mad[5]]),
                t.elapsed().as_micros()
            ));
            report(&format!("PENDING {}", port.pending_requests()));
            // A request to a LID nobody answers: times out, leaves nothing pending.
            let r = port
                .request(
                    &mad,
                    Dest::gsi(0x7ff0, 0),
                    RequestOptions {
                        timeout: Duration::from_millis(50),
                        retries: 1,
                    },
                )
                .await;
            report(&format!(
                "TIMEOUT {} PENDING {}",
                matches!(r, Err(umad::Error::Timeout { attempts: 2, .. })),
                port.pending_requests()
            ));
        }
        other => return Err(format!("unknown role {other}")),
    }
    report("DONE");
    Ok(())
}

/// A node becomes IsSM in test-bed mode; OpenSM keeps working (it still resweeps and
/// reaches SUBNET UP again after an Unlink) and never sees a competing SM.
#[test]
fn testbed_node_coexists_with_opensm() {
    let Some(bed) = Bed::or_skip("testbed_node_coexists_with_opensm") else {
        return;
    };
    let mut n = bed
        .spawn_node(&bed.nodes[0], "bed_node", "open")
        .expect("spawn");
    let (_, open) = n.expect("OPEN", Duration::from_secs(10)).unwrap();
    assert!(open.contains("lid="), "{open}");
    let before = bed.opensm_log().matches("SUBNET UP").count();
    bed.console(&format!("Unlink \"{}\"[2]", bed.nodes[1]))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while bed.opensm_log().matches("SUBNET UP").count() <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "no resweep after Unlink"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    n.expect("DONE", Duration::from_secs(10)).unwrap();
    assert!(n.wait(Duration::from_secs(5)), "node exited with failure");
    let log = bed.opensm_log();
    assert!(
        !log.contains("Entering STANDBY"),
        "OpenSM handed over:\n{log}"
    );
}

/// A request to the SA is matched to its response; a request nobody answers times out
/// after its retries; neither leaves a pending entry.
#[test]
fn request_response_and_timeout() {
    let Some(bed) = Bed::or_skip("request_response_and_timeout") else {
        return;
    };
    let mut n = bed
        .spawn_node(&bed.nodes[0], "bed_node", "sa-get")
        .expect("spawn");
    let (_, r) = n.expect("RESP", Duration::from_secs(10)).unwrap();
    assert!(r.contains("method=0x81"), "{r}");
    let (_, p) = n.expect("PENDING", Duration::from_secs(5)).unwrap();
    assert_eq!(p, "PENDING 0");
    let (_, t) = n.expect("TIMEOUT", Duration::from_secs(5)).unwrap();
    assert_eq!(t, "TIMEOUT true PENDING 0");
    n.expect("DONE", Duration::from_secs(5)).unwrap();
    assert!(n.wait(Duration::from_secs(5)));
}
