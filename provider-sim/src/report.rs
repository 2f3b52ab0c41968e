//! What a run reports: the figures `apm simulate` compares, state samples for plots, the
//! timeline, and the invariant violations found.

use serde::Serialize;

/// Percentiles of a distribution, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
    /// Number of samples (0: the percentiles mean nothing, show "n/a").
    #[serde(skip)]
    pub samples: u64,
}

impl Percentiles {
    /// The percentiles of durations in nanoseconds (nearest rank), in milliseconds.
    pub fn of(mut ns: Vec<u64>) -> Percentiles {
        ns.sort_unstable();
        Percentiles::of_sorted(&ns)
    }

    /// The same over durations already sorted.
    pub fn of_sorted(ns: &[u64]) -> Percentiles {
        let pct = |q: f64| -> f64 {
            if ns.is_empty() {
                return 0.0;
            }
            let idx = ((ns.len() as f64 - 1.0) * q).round() as usize;
            ns[idx.min(ns.len() - 1)] as f64 / 1e6
        };
        Percentiles {
            p50: pct(0.5),
            p99: pct(0.99),
            max: pct(1.0),
            samples: ns.len() as u64,
        }
    }

    /// True when there was nothing to measure.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }
}

/// Connection counts by ground-truth state at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Simulated time, ms.
    pub t_ms: u64,
    /// Armed with a healthy alternate.
    pub armed: u32,
    /// Of those, armed through another local port and another remote port.
    pub armed_disjoint: u32,
    /// Working without an armed healthy alternate.
    pub unprotected: u32,
    /// Not carrying traffic (failing over).
    pub migrating: u32,
    /// Gone.
    pub lost: u32,
}

/// What one failure event cost the SMs and SAs: everything from the fault to the next
/// one (the first, "start", is everything before the first fault). MADs are the SA's
/// (QP1): requests and answers, Reports and ReportResps; a sweep's SMPs are counted
/// apart, being the same whatever the hosts do.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventLoad {
    /// When it happened (ms).
    pub at_ms: f64,
    /// What happened.
    pub event: String,
    /// MADs the SMs/SAs received: SA requests (every attempt) and ReportResps.
    pub sa_mads_in: u64,
    /// MADs they sent: SA answers and Reports (resends included).
    pub sa_mads_out: u64,
    /// Of those, Reports.
    pub reports: u64,
    /// SA requests dropped unanswered for waiting too long (`sa_fifo_timeout_ms`).
    pub sa_dropped: u64,
    /// The deepest any SA queue got (MADs waiting or being served).
    pub peak_sa_queue: u64,
    /// SMPs of the sweeps and traps 128.
    pub sweep_smps: u64,
    /// SA request attempts the hosts sent.
    pub sa_requests: u64,
    /// Those per host (every host counted).
    pub sa_requests_per_host: f64,
    /// The most one host sent.
    pub sa_requests_per_host_max: u64,
    /// Request attempts that timed out at their host.
    pub sa_request_timeouts: u64,
    /// From the event to the last connection armed again before the next one (ms);
    /// `None` when none was armed in between.
    pub last_rearm_ms: Option<f64>,
}

/// One policy's run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunReport {
    /// Policy name.
    pub policy: String,
    /// Connections simulated.
    pub connections: u64,
    /// Connections whose QPs went to ERR.
    pub lost: u64,
    /// Which connections were lost, by index.
    pub lost_ids: Vec<u64>,
    /// Of those, the ones whose primary died in the re-arm window after a move: it had
    /// moved (by its controller, or by the HCA on retry exhaustion) and had not been
    /// armed again on a working alternate since (a QP arms only once its peer's packets
    /// arrive), however long ago the move was. A cause class, not an excuse: the
    /// judgement ([`crate::compare`]) counts every loss.
    pub lost_in_rearm_window: Vec<u64>,
    /// Of those, the ones lost in a total outage: at the instant their QPs went to ERR
    /// no path between their two hosts worked (every rail cut somewhere between them),
    /// so nothing could have carried their packets. A cause class, not an excuse.
    pub lost_in_total_outage: Vec<u64>,
    /// Of those, the ones that went through a total outage since they last worked
    /// (lost in one, or after one, however short). A diagnostic of what a loss
    /// followed, not a cause class: a loss after the outage ended counts as its class
    /// says.
    pub lost_after_total_outage: Vec<u64>,
    /// Messages the applications offered over the whole run and that never reached the
    /// other side: a dead connection keeps counting what its application would have
    /// sent, so dying early never looks better.
    pub messages_lost: u64,
    /// Messages delivered but never acknowledged on a lost connection (the application
    /// sends them again on its new connection: the receiver gets them twice).
    pub messages_duplicated: u64,
    /// Path migrations (counted once per connection, on the active side).
    pub failovers: u64,
    /// Of those, the ones off a primary that still worked both ways (a probe lost or
    /// late, a stale notice): moves for nothing, each with the re-arm window after it.
    pub false_failovers: u64,
    /// Time from a connection's path failing to it carrying traffic again.
    pub restore_ms: Percentiles,
    /// The same, for connections armed on a port-disjoint alternate when the fault hit.
    pub restore_disjoint_ms: Percentiles,
    /// Every restore time, in nanoseconds (for pooling runs; not serialised).
    #[serde(skip)]
    pub restore_samples_ns: Vec<u64>,
    /// The connection each of those samples belongs to (not serialised).
    #[serde(skip)]
    pub restore_sample_conns: Vec<u32>,
    /// Summed time connections spent without an armed healthy alternate: working
    /// unarmed, failing over, or lost (a lost connection counts until the end).
    pub unprotected_ms_total: f64,
    /// Summed time armed on an alternate through another local and another remote port.
    pub armed_disjoint_ms_total: f64,
    /// Summed time armed on an alternate sharing a port with the primary (an LMC
    /// variant: it survives a switch path failure, not a port or cable).
    pub armed_shared_ms_total: f64,
    /// Summed time not carrying traffic while alive (failing over).
    pub failing_over_ms_total: f64,
    /// Summed time lost, from each loss to the end.
    pub lost_ms_total: f64,
    /// SA requests (PathRecord, InformInfo).
    pub sa_queries: u64,
    /// MADs put on the wire by anyone (CM, SA requests and answers, Reports, apm's
    /// messages and probes; on RoCE apm's go as UDP datagrams, counted here too).
    pub mads_sent: u64,
    /// SMPs the SMs sent for sweeps, and traps 128 (resends included).
    pub smps_sent: u64,
    /// Messages the applications posted.
    pub messages_posted: u64,
    /// Messages delivered.
    pub messages_delivered: u64,
    /// Messages sent again by the transport after a timeout.
    pub messages_retransmitted: u64,
    /// Reports the SMs sent (first transmissions).
    pub reports_sent: u64,
    /// Reports the SMs gave up on.
    pub reports_abandoned: u64,
    /// Liveness probes the hosts' probers sent (apm with probes on): per host, its
    /// peers times its rails times the probe rate, whatever the number of connections.
    /// On InfiniBand each is a MAD (counted in `mads_sent` too).
    pub probes_sent: u64,
    /// The same per host and second of simulated time.
    pub probes_per_host_per_s: f64,
    /// Notifications the controllers raised.
    pub notifications: u64,
    /// Simulation events processed.
    pub events: u64,
    /// Digest of the event sequence (determinism checks).
    pub digest: u64,
    /// Invariant violations (runs with checks on).
    pub violations: Vec<String>,
    /// Connection states over time.
    pub samples: Vec<Sample>,
    /// What happened in the fabric, in order (ms, text).
    pub timeline: Vec<(f64, String)>,
    /// Connection counts at the end: armed, unprotected, migrating, lost.
    pub end_state: [u64; 4],
    /// Of the armed at the end, those on a port-disjoint alternate.
    pub end_armed_disjoint: u64,
    /// What each failure event cost the SMs and SAs, in time order.
    pub failure_events: Vec<EventLoad>,
}
