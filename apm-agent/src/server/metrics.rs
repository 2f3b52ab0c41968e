//! The agent's metrics (off unless an address is given): what its processes say of
//! themselves, summed, and what the agent itself sees, in the exposition format of the
//! Prometheus project's client library, served by [`crate::metrics_http`].
//!
//! Every name starts with `apm_` (beside node_exporter's `node_infiniband_*`, never
//! clashing), counters end in `_total`, durations are in seconds. Counters sum the
//! live processes' last words and those of the processes that have left (`retired`),
//! so they only grow while the agent runs; gauges are the live processes' alone.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `apm_processes` | gauge | |
//! | `apm_connections_protected` | gauge | |
//! | `apm_connections_unprotected` | gauge | `reason` ([`UNPROTECTED_REASONS`]) |
//! | `apm_qps_seen_total` | counter | |
//! | `apm_qps_refused_total` | counter | `reason` ([`REFUSAL_CLASSES`]) |
//! | `apm_failovers_total` | counter | `cause` ([`CAUSES`]) |
//! | `apm_move_duration_seconds` | histogram | |
//! | `apm_unprotected_connection_seconds_total` | counter | |
//! | `apm_connections_lost_total` | counter | |
//! | `apm_probe_sessions` | gauge | `state` (`down`, `init`, `up`, `admin_down`) |
//! | `apm_peer_datagrams_dropped_total` | counter | `reason` (`unauthenticated`, `forged`, `other_key`, `replayed`, `stale`, `malformed`) |

use super::{lock, Shared, State, StartError};
use crate::status::{
    Totals, CAUSES, MOVE_BUCKETS_S, REFUSAL_CLASSES, UNPROTECTED_REASONS,
};
use apm_core::probe::SessionState;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::info;

/// Bind the metrics address (nothing is served until [`start`]).
pub(super) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AddrInUse => StartError::MetricsInUse { addr },
            _ => StartError::Metrics { addr, source },
        })
}

/// Serve the metrics on `listener` (bound by [`bind`]).
pub(super) fn start(state: &Shared, listener: tokio::net::TcpListener) {
    let Ok(addr) = listener.local_addr() else {
        return;
    };
    let mut registry = Registry::with_prefix("apm");
    registry.register_collector(Box::new(Figures(state.clone())));
    let registry = Arc::new(registry);
    let render = Arc::new(move || {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    });
    let task = tokio::spawn(crate::metrics_http::serve(listener, render));
    info!(%addr, "serving metrics at http://{addr}/metrics");
    if let Some((_, old)) = lock(state).metrics.replace((addr, task)) {
        old.abort();
    }
}

/// Stop serving the metrics.
pub(super) fn stop(state: &Shared) {
    if let Some((addr, task)) = lock(state).metrics.take() {
        task.abort();
        info!(%addr, "metrics no longer served");
    }
}

/// The collector: reads the agent's state at each scrape.
#[derive(Debug)]
struct Figures(Shared);

/// What one scrape reports, taken under the state's lock and encoded after.
#[derive(Debug, Default)]
struct Snapshot {
    processes: u64,
    protected: u64,
    unprotected: BTreeMap<String, u64>,
    counters: Totals,
    sessions: BTreeMap<&'static str, u64>,
    drops: crate::status::PeerDrops,
}

fn snapshot(s: &State) -> Snapshot {
    let mut snap = Snapshot {
        counters: s.retired.clone(),
        drops: super::status::peer_drops(s),
        ..Snapshot::default()
    };
    for c in s.clients.values().filter(|c| !c.watcher) {
        snap.processes += 1;
        let Some(st) = &c.status else { continue };
        snap.protected += st.protected_now;
        for (r, n) in &st.unprotected_now {
            *snap.unprotected.entry(r.clone()).or_default() += n;
        }
        snap.counters.add(st);
    }
    if let Some(p) = &s.probes {
        for (_, state) in p.sessions() {
            *snap.sessions.entry(session_name(state)).or_default() += 1;
        }
    }
    snap
}

fn session_name(s: SessionState) -> &'static str {
    match s {
        SessionState::AdminDown => "admin_down",
        SessionState::Down => "down",
        SessionState::Init => "init",
        SessionState::Up => "up",
    }
}

type Result = std::result::Result<(), std::fmt::Error>;

fn gauge(e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Result {
    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(m)
}

fn counter<N: prometheus_client::encoding::EncodeCounterValue>(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: N,
) -> Result {
    let m = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

/// A family with one series per label value of `set` (every value present, zero or
/// not, so that rates work from the first scrape).
fn family(
    e: &mut DescriptorEncoder<'_>,
    (name, help, kind, label): (&str, &str, MetricType, &str),
    set: &[&str],
    value: impl Fn(&str) -> u64,
) -> Result {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for v in set {
        let labels = [(label, *v)];
        let series = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(value(v)).encode(series)?,
            _ => ConstGauge::new(i64::try_from(value(v)).unwrap_or(i64::MAX)).encode(series)?,
        }
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Figures {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result {
        let snap = snapshot(&lock(&self.0));
        let c = &snap.counters;
        let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        gauge(&mut e, "processes", "Processes under apm attached to the agent.", snap.processes)?;
        gauge(
            &mut e,
            "connections_protected",
            "Connections (RC QPs) with an armed alternate agreed with the peer.",
            snap.protected,
        )?;
        family(
            &mut e,
            ("connections_unprotected", "Connections apm looks after with no armed alternate now, by reason.", MetricType::Gauge, "reason"),
            &UNPROTECTED_REASONS,
            |r| get(&snap.unprotected, r),
        )?;
        counter(&mut e, "qps_seen", "RC and other QPs the programs moved to RTS.", None, c.qps_seen)?;
        family(
            &mut e,
            ("qps_refused", "QPs apm did not protect, by reason.", MetricType::Counter, "reason"),
            &REFUSAL_CLASSES,
            |r| get(&c.refused, r),
        )?;
        family(
            &mut e,
            ("failovers", "Moves of a connection onto its alternate path, by cause.", MetricType::Counter, "cause"),
            &CAUSES,
            |r| get(&c.failovers, r),
        )?;
        let buckets: Vec<(f64, u64)> = MOVE_BUCKETS_S
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(c.moves.counts.iter().copied())
            .collect();
        let m = e.encode_descriptor(
            "move_duration",
            "Software moves of a QP (SQ drain to the send queue's restart).",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        let mut m = m;
        m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            c.moves.sum_s,
            c.moves.count(),
            &buckets,
            None,
        )?;
        counter(
            &mut e,
            "unprotected_connection",
            "Connection-seconds of connections apm looked after while they had no armed alternate.",
            Some(&Unit::Seconds),
            c.unprotected_s,
        )?;
        counter(&mut e, "connections_lost", "Connections lost under apm (QP in error).", None, c.lost)?;
        family(
            &mut e,
            ("probe_sessions", "The agent's liveness-probe sessions, by state.", MetricType::Gauge, "state"),
            &["down", "init", "up", "admin_down"],
            |st| snap.sessions.get(st).copied().unwrap_or(0),
        )?;
        let d = snap.drops;
        family(
            &mut e,
            ("peer_datagrams_dropped", "Peer datagrams the agent dropped, by reason.", MetricType::Counter, "reason"),
            &["unauthenticated", "forged", "other_key", "replayed", "stale", "malformed"],
            |r| match r {
                "unauthenticated" => d.unauthenticated,
                "forged" => d.forged,
                "other_key" => d.other_key,
                "replayed" => d.replayed,
                "stale" => d.stale,
                _ => d.malformed,
            },
        )
    }
}
