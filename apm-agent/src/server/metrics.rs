//! The agent's metrics (off unless an address is given): what its processes say of
//! themselves, summed, and what the agent itself sees, encoded by the Prometheus
//! project's Rust client (`prometheus-client`) and served by [`crate::metrics_http`].
//!
//! Every name starts with `apm_` (beside node_exporter's `node_infiniband_*`, never
//! clashing), counters end in `_total`, durations are in seconds. Counters sum the
//! live processes' last words and those of the processes that have left, so they
//! only grow while the agent runs (a restart of the agent starts them again, which
//! Prometheus's `rate` expects); gauges are the live processes' alone. Every label
//! value of a family is always present, zero or not, so that rates work from the first
//! scrape, and the label sets are closed ([`QpState`], [`FailoverCause`]).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `apm_processes` | gauge | |
//! | `apm_connections_protected` | gauge | |
//! | `apm_connections_unprotected` | gauge | `reason` ([`QpState`] but `protected`) |
//! | `apm_qps_seen_total` | counter | |
//! | `apm_qps_refused_total` | counter | |
//! | `apm_failovers_total` | counter | `cause` ([`FailoverCause`]) |
//! | `apm_move_duration_seconds` | histogram | |
//! | `apm_unprotected_connection_seconds_total` | counter | |
//! | `apm_connections_lost_total` | counter | |
//! | `apm_probe_sessions` | gauge | `state` (`down`, `init`, `up`, `admin_down`) |
//! | `apm_peer_datagrams_dropped_total` | counter | `reason` (`unauthenticated`, `forged`, `other_key`, `replayed`, `stale`, `malformed`) |

use super::{lock, Shared, StartError, State};
use crate::status::{FailoverCause, PeerDrops, QpState, Totals};
use apm_core::probe::SessionState;
use prometheus_client::encoding::NoLabelSet;
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

/// What one scrape reports, taken under the state's lock and encoded after it.
#[derive(Debug, Default)]
struct Snapshot {
    processes: u64,
    looked_after: BTreeMap<QpState, u64>,
    counters: Totals,
    sessions: BTreeMap<&'static str, u64>,
    drops: PeerDrops,
}

fn snapshot(s: &State) -> Snapshot {
    let mut snap = Snapshot {
        counters: s.retired.clone(),
        drops: super::status::peer_drops(s),
        ..Snapshot::default()
    };
    for st in s.clients.values().filter_map(|c| c.status.as_deref()) {
        snap.processes += 1;
        for (state, n) in &st.looked_after {
            *snap.looked_after.entry(*state).or_default() += n;
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

/// The probe sessions' states, as labels.
const SESSION_STATES: [&str; 4] = ["down", "init", "up", "admin_down"];

fn session_name(s: SessionState) -> &'static str {
    match s {
        SessionState::AdminDown => "admin_down",
        SessionState::Down => "down",
        SessionState::Init => "init",
        SessionState::Up => "up",
    }
}

type Encoded = std::result::Result<(), std::fmt::Error>;

/// One metric without labels.
fn single(e: &mut DescriptorEncoder<'_>, what: Descriptor<'_>, v: f64) -> Encoded {
    let m = e.encode_descriptor(what.name, what.help, what.unit.as_ref(), what.kind)?;
    match what.kind {
        MetricType::Counter => ConstCounter::new(v).encode(m),
        _ => ConstGauge::new(v).encode(m),
    }
}

/// A family with one series per label value (every value present).
fn family<'a>(
    e: &mut DescriptorEncoder<'_>,
    what: Descriptor<'_>,
    label: &str,
    series: impl IntoIterator<Item = (&'a str, u64)>,
) -> Encoded {
    let mut m = e.encode_descriptor(what.name, what.help, what.unit.as_ref(), what.kind)?;
    for (value, n) in series {
        let labels = [(label, value)];
        let s = m.encode_family(&labels)?;
        match what.kind {
            MetricType::Counter => ConstCounter::new(n).encode(s)?,
            _ => ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(s)?,
        }
    }
    Ok(())
}

/// A metric's name (after `apm_`, before its unit and `_total`), help, unit and type.
#[derive(Debug)]
struct Descriptor<'a> {
    name: &'a str,
    help: &'a str,
    unit: Option<Unit>,
    kind: MetricType,
}

fn gauge<'a>(name: &'a str, help: &'a str) -> Descriptor<'a> {
    Descriptor {
        name,
        help,
        unit: None,
        kind: MetricType::Gauge,
    }
}

fn counter<'a>(name: &'a str, help: &'a str) -> Descriptor<'a> {
    Descriptor {
        name,
        help,
        unit: None,
        kind: MetricType::Counter,
    }
}

impl prometheus_client::collector::Collector for Figures {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Encoded {
        let snap = snapshot(&lock(&self.0));
        now(&mut e, &snap)?;
        counters(&mut e, &snap.counters)?;
        agent(&mut e, &snap)
    }
}

/// The gauges of the live processes: how many, and their connections by state.
fn now(e: &mut DescriptorEncoder<'_>, snap: &Snapshot) -> Encoded {
    let count = |s: QpState| snap.looked_after.get(&s).copied().unwrap_or(0);
    single(
        e,
        gauge(
            "processes",
            "Processes under apm that reported to the agent.",
        ),
        snap.processes as f64,
    )?;
    single(
        e,
        gauge(
            "connections_protected",
            "Connections (RC QPs) apm looks after with an armed alternate agreed with the peer.",
        ),
        count(QpState::Protected) as f64,
    )?;
    family(
        e,
        gauge(
            "connections_unprotected",
            "Connections apm looks after with no agreed alternate now, by reason.",
        ),
        "reason",
        QpState::ALL
            .into_iter()
            .filter(|s| *s != QpState::Protected)
            .map(|s| (s.name(), count(s))),
    )?;
    Ok(())
}

/// The counters of every process, live or gone.
fn counters(e: &mut DescriptorEncoder<'_>, c: &Totals) -> Encoded {
    single(
        e,
        counter("qps_seen", "QPs the programs under apm moved to RTS."),
        c.qps_seen as f64,
    )?;
    single(
        e,
        counter(
            "qps_refused",
            "QPs apm did not protect (apm status lists why).",
        ),
        c.refused as f64,
    )?;
    family(
        e,
        counter(
            "failovers",
            "Moves of a connection onto its alternate path, by cause.",
        ),
        "cause",
        FailoverCause::ALL
            .into_iter()
            .map(|f| (f.name(), c.failovers.get(&f).copied().unwrap_or(0))),
    )?;
    let mut m = e.encode_descriptor(
        "move_duration",
        "Software moves of a QP, from the SQ drain to the send queue's restart.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    m.encode_histogram::<NoLabelSet>(c.moves.sum_s, c.moves.count(), &c.moves.buckets(), None)?;
    single(
        e,
        Descriptor {
            unit: Some(Unit::Seconds),
            ..counter(
                "unprotected_connection",
                "Connection-seconds of connections apm looked after with no agreed alternate.",
            )
        },
        c.unprotected_s,
    )?;
    single(
        e,
        counter(
            "connections_lost",
            "Connections lost under apm (QP in error).",
        ),
        c.lost as f64,
    )?;
    Ok(())
}

/// What the agent itself sees: its probe sessions and the datagrams it dropped.
fn agent(e: &mut DescriptorEncoder<'_>, snap: &Snapshot) -> Encoded {
    family(
        e,
        gauge(
            "probe_sessions",
            "The agent's liveness-probe sessions, by state.",
        ),
        "state",
        SESSION_STATES.map(|st| (st, snap.sessions.get(st).copied().unwrap_or(0))),
    )?;
    family(
        e,
        counter(
            "peer_datagrams_dropped",
            "Peer datagrams the agent dropped, by reason.",
        ),
        "reason",
        snap.drops.by_reason(),
    )
}
