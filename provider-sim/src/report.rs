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
    /// Number of samples.
    #[serde(skip)]
    pub samples: u64,
}

/// Connection counts by ground-truth state at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Simulated time, ms.
    pub t_ms: u64,
    /// Armed with a healthy alternate.
    pub armed: u32,
    /// Working without an armed healthy alternate.
    pub unprotected: u32,
    /// Not carrying traffic (failing over).
    pub migrating: u32,
    /// Gone.
    pub lost: u32,
}

/// One policy's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunReport {
    /// Policy name.
    pub policy: String,
    /// Connections simulated.
    pub connections: u64,
    /// Connections whose QPs went to ERR.
    pub lost: u64,
    /// Messages posted and never delivered because their connection was lost.
    pub messages_lost: u64,
    /// Messages delivered but never acknowledged on a lost connection (the application
    /// sends them again on its new connection: the receiver gets them twice).
    pub messages_duplicated: u64,
    /// Path migrations (counted once per connection, on the active side).
    pub failovers: u64,
    /// Time from a connection's path failing to it carrying traffic again.
    pub restore_ms: Percentiles,
    /// Summed time connections spent without an armed healthy alternate.
    pub unprotected_ms_total: f64,
    /// SA requests (PathRecord, InformInfo).
    pub sa_queries: u64,
    /// MADs put on the wire by anyone (CM, SA requests and answers, Reports).
    pub mads_sent: u64,
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
}
