//! `apm status` and the metrics on loopback: a process's account reaches a status
//! request and a scrape, an ordinary user sees only their own processes, the counters
//! of a process that left stay, a status out of bounds is refused, and a metrics
//! address in use leaves nothing started.

use apm_agent::access::AgentSocket;
use apm_agent::client::AgentClient;
use apm_agent::host::LoopbackHost;
use apm_agent::server::{Agent, AgentConfig, StartError};
use apm_agent::status::{FailoverCause, MoveHistogram, ProcessStatus, QpEntry, QpState};
use apm_agent::wire::FromAgent;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

fn config(port: u16, dir: &Path) -> AgentConfig {
    AgentConfig {
        host: Arc::new(LoopbackHost::default()),
        metrics: Some("127.0.0.1:0".parse().expect("addr")),
        ..AgentConfig::new(port, Some(dir))
    }
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: apm\r\n\r\n")
        .await
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// The value of the series `line` (its name and labels) in a scrape.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

fn a_status() -> ProcessStatus {
    let mut moves = MoveHistogram::default();
    moves.observe(0.003);
    moves.observe(0.004);
    ProcessStatus {
        program: "ib_write_bw".into(),
        qps_seen_total: 2,
        protected_total: 1,
        looked_after: [(QpState::Protected, 1), (QpState::Moved, 1)].into(),
        qps: vec![QpEntry {
            qpn: 17,
            device: "rxe0".into(),
            state: QpState::Protected,
        }],
        failovers_total: [(FailoverCause::Fabric, 2)].into(),
        moves,
        unprotected_s: 1.5,
        ..ProcessStatus::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_account_reaches_status_and_metrics() {
    let port = 20_000 + ((std::process::id() + 3301) % 20_000) as u16;
    let dir = tempfile::tempdir().expect("dir");
    let socket = AgentSocket::in_dir(dir.path(), port);
    let agent = Agent::bind(config(port, dir.path())).await.expect("agent");
    let metrics = agent.metrics_addr().expect("metrics bound");
    let served = tokio::spawn(agent.run());

    let (tx, _events) = mpsc::unbounded_channel();
    let process = AgentClient::connect(&socket, tx).await.expect("process");
    process.report(a_status()).expect("report");
    process.synced().await.expect("synced");

    let (tx, _asker_events) = mpsc::unbounded_channel();
    let asker = AgentClient::connect(&socket, tx).await.expect("asker");
    let status = asker.status(None).await.expect("status");
    // The test runs as one user: root or not, its own processes are shown.
    assert_eq!(status.processes.len(), 1, "{status:?}");
    let p = &status.processes[0];
    assert_eq!(p.pid, Some(std::process::id()));
    assert_eq!(p.status.as_ref().map(|s| s.failovers()), Some(2));
    assert_eq!(
        status.agent.metrics,
        Some(format!("http://{metrics}/metrics"))
    );
    let nobody = asker.status(Some(1)).await.expect("status of pid 1");
    assert!(nobody.processes.is_empty());

    let text = scrape(metrics).await;
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert_eq!(value(&text, "apm_processes"), Some(1.0), "{text}");
    assert_eq!(value(&text, "apm_connections_protected"), Some(1.0));
    assert_eq!(
        value(&text, r#"apm_connections_unprotected{reason="moved"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(&text, r#"apm_failovers_total{cause="fabric"}"#),
        Some(2.0)
    );
    assert_eq!(
        value(&text, r#"apm_failovers_total{cause="device"}"#),
        Some(0.0)
    );
    assert_eq!(
        value(&text, r#"apm_move_duration_seconds_bucket{le="0.002"}"#),
        Some(0.0)
    );
    assert_eq!(
        value(&text, r#"apm_move_duration_seconds_bucket{le="0.005"}"#),
        Some(2.0)
    );
    assert_eq!(value(&text, "apm_move_duration_seconds_count"), Some(2.0));
    assert_eq!(
        value(&text, "apm_unprotected_connection_seconds_total"),
        Some(1.5)
    );
    assert_eq!(
        value(
            &text,
            r#"apm_peer_datagrams_dropped_total{reason="replayed"}"#
        ),
        Some(0.0)
    );
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    // The process leaves: its counters stay, its gauges go.
    drop(process);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = scrape(metrics).await;
    assert_eq!(
        value(&text, r#"apm_failovers_total{cause="fabric"}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(value(&text, "apm_connections_protected"), Some(0.0));
    assert_eq!(value(&text, "apm_processes"), Some(0.0));
    served.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_out_of_bounds_is_refused() {
    let port = 20_000 + ((std::process::id() + 5501) % 20_000) as u16;
    let dir = tempfile::tempdir().expect("dir");
    let socket = AgentSocket::in_dir(dir.path(), port);
    let agent = Agent::bind(config(port, dir.path())).await.expect("agent");
    let served = tokio::spawn(agent.run());
    let (tx, mut events) = mpsc::unbounded_channel();
    let process = AgentClient::connect(&socket, tx).await.expect("process");
    let mut status = a_status();
    status.unprotected_s = -1.0;
    process.report(status).expect("report");
    process.synced().await.expect("synced");
    match events.try_recv() {
        Ok(FromAgent::Refused { what }) => assert!(what.contains("non-negative"), "{what}"),
        other => panic!("not refused: {other:?}"),
    }
    let seen = process.status(None).await.expect("status");
    assert!(seen.processes.is_empty(), "{seen:?}");
    served.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_in_use_starts_nothing() {
    let port = 20_000 + ((std::process::id() + 7703) % 20_000) as u16;
    let dir = tempfile::tempdir().expect("dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let refused = Agent::bind(AgentConfig {
        metrics: Some(addr),
        ..config(port, dir.path())
    })
    .await;
    assert!(
        matches!(refused, Err(StartError::MetricsInUse { addr: a }) if a == addr),
        "{refused:?}"
    );
    // Nothing was left bound: the same agent starts without the metrics.
    let agent = Agent::bind(AgentConfig {
        metrics: None,
        ..config(port, dir.path())
    })
    .await
    .expect("the socket and ports were given back");
    assert_eq!(agent.metrics_addr(), None);
}
