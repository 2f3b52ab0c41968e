//! The per-failure-event figures of `apm simulate`: what each fault of the scenario
//! cost the SMs and SAs under each policy (the SA's MADs in and out, Reports, requests
//! dropped, the deepest SA queue, SA requests per host, how long until the last
//! connection was armed again), as a section of the table, in the JSON document and
//! as lines of the SVG.

use provider_sim::{EventLoad, RunReport};
use serde::Serialize;
use std::fmt::Write;

/// One event's figures for one policy in the JSON document.
#[derive(Debug, Serialize)]
pub struct JsonEvent {
    at_ms: f64,
    event: String,
    /// SA requests (every attempt) and ReportResps the SMs/SAs received.
    sa_mads_in: u64,
    /// SA answers and Reports (resends included) they sent.
    sa_mads_out: u64,
    reports: u64,
    /// SA requests dropped for waiting too long: the SA queue overflowed.
    sa_dropped: u64,
    peak_sa_queue: u64,
    sweep_smps: u64,
    sa_requests: u64,
    sa_requests_per_host: f64,
    sa_requests_per_host_max: u64,
    sa_request_timeouts: u64,
    /// From the event to the last connection armed again before the next event.
    last_rearm_ms: Option<f64>,
}

impl JsonEvent {
    /// The JSON form of `e`.
    pub fn of(e: &EventLoad) -> JsonEvent {
        let r3 = |v: f64| (v * 1000.0).round() / 1000.0;
        JsonEvent {
            at_ms: r3(e.at_ms),
            event: e.event.clone(),
            sa_mads_in: e.sa_mads_in,
            sa_mads_out: e.sa_mads_out,
            reports: e.reports,
            sa_dropped: e.sa_dropped,
            peak_sa_queue: e.peak_sa_queue,
            sweep_smps: e.sweep_smps,
            sa_requests: e.sa_requests,
            sa_requests_per_host: r3(e.sa_requests_per_host),
            sa_requests_per_host_max: e.sa_requests_per_host_max,
            sa_request_timeouts: e.sa_request_timeouts,
            last_rearm_ms: e.last_rearm_ms.map(r3),
        }
    }
}

/// The table section: per event, a line naming it, then one line per policy.
pub fn section(reports: &[RunReport]) -> String {
    let mut o = String::new();
    let Some(first) = reports.first() else {
        return o;
    };
    let _ = writeln!(
        o,
        "\nwhat each failure event cost the SMs and SAs, until the next event (SA MADs: \
         requests and ReportResps in,\nanswers and Reports out; dropped: requests the SA \
         let wait too long; last re-arm: after the event)"
    );
    let _ = writeln!(
        o,
        "{:<26}{:>9}{:>9}{:>9}{:>9}{:>11}{:>16}{:>14}",
        "", "MADs in", "out", "Reports", "dropped", "peak queue", "requests/host", "last re-arm"
    );
    for (k, e) in first.failure_events.iter().enumerate() {
        let _ = writeln!(
            o,
            "{:>9.1} ms  {} (sweep SMPs {})",
            e.at_ms, e.event, e.sweep_smps
        );
        for r in reports {
            let Some(e) = r.failure_events.get(k) else {
                continue;
            };
            let rearm = e
                .last_rearm_ms
                .map_or("-".to_string(), |t| format!("{t:.1} ms"));
            let _ = writeln!(
                o,
                "  {:<24}{:>9}{:>9}{:>9}{:>9}{:>11}{:>16}{:>14}",
                r.policy,
                e.sa_mads_in,
                e.sa_mads_out,
                e.reports,
                e.sa_dropped,
                e.peak_sa_queue,
                format!(
                    "{:.2} (max {})",
                    e.sa_requests_per_host, e.sa_requests_per_host_max
                ),
                rearm
            );
        }
    }
    o
}

/// The SVG lines of one policy's event figures, one per event.
pub fn svg_lines(r: &RunReport) -> Vec<String> {
    r.failure_events
        .iter()
        .map(|e| {
            format!(
                "{}: at {:.0} ms {}: SA MADs {} in / {} out ({} Reports), {} dropped, peak \
                 SA queue {}, {:.2} SA requests/host (max {}), last re-arm {}",
                r.policy,
                e.at_ms,
                e.event,
                e.sa_mads_in,
                e.sa_mads_out,
                e.reports,
                e.sa_dropped,
                e.peak_sa_queue,
                e.sa_requests_per_host,
                e.sa_requests_per_host_max,
                e.last_rearm_ms
                    .map_or("-".to_string(), |t| format!("+{t:.1} ms"))
            )
        })
        .collect()
}
