//! What the SMs and SAs handle, per failure event: the MADs they receive and send
//! (SA requests and answers, Reports and ReportResps), the requests dropped unanswered,
//! the deepest SA queue, the sweeps' SMPs, the SA requests each host sent, and how long
//! after the event the last connection was armed again.
//!
//! Counters run from the start of the run; each fault of the schedule closes the
//! window of the one before (the first window, "start", is everything before the first
//! fault: the subscriptions, the first sweeps), so a window holds what its fault set
//! off until the next fault came.

use super::*;
use crate::report::EventLoad;

/// Windows kept; the faults after that many add to the last one.
const MAX_WINDOWS: usize = 10_000;

/// What every SM and SA handled since the start of the run.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SmLoad {
    /// SA requests that reached an SA (every attempt).
    pub(super) requests_in: u64,
    /// Answers the SAs sent.
    pub(super) answers_out: u64,
    /// Requests an SA dropped unanswered: they would have waited longer than
    /// `sa_fifo_timeout_ms` behind the others (the SA queue overflowed).
    pub(super) dropped: u64,
    /// Reports the SMs sent, resends included.
    pub(super) reports_out: u64,
    /// ReportResps that reached an SM.
    pub(super) report_resps_in: u64,
    /// SA request attempts the hosts sent, and of those the ones that timed out.
    pub(super) requests_sent: u64,
    pub(super) request_timeouts: u64,
    /// Sweep SMPs and traps 128.
    pub(super) smps: u64,
}

/// One window: a fault and what followed it.
#[derive(Debug)]
struct Window {
    at: Time,
    event: String,
    /// The counters when it opened.
    start: SmLoad,
    peak_queue: u64,
    last_armed: Option<Time>,
    requests_per_host_max: u32,
}

/// The windows and the per-host request counts of the open one.
#[derive(Debug, Default)]
pub(super) struct Windows {
    done: Vec<(Window, SmLoad)>,
    open: Option<Window>,
    /// SA request attempts per host in the open window, and the hosts that sent any.
    per_host: Vec<u32>,
    touched: Vec<usize>,
}

impl Windows {
    /// A new window opens at `at` for `event`, closing the one before (`now`: the
    /// counters at that moment).
    pub(super) fn open(&mut self, at: Time, event: String, now: SmLoad) {
        if self.done.len() + 1 >= MAX_WINDOWS && self.open.is_some() {
            return;
        }
        self.close(now);
        self.open = Some(Window {
            at,
            event,
            start: now,
            peak_queue: 0,
            last_armed: None,
            requests_per_host_max: 0,
        });
    }

    fn close(&mut self, now: SmLoad) {
        if let Some(w) = self.open.take() {
            self.done.push((w, now));
        }
        for h in self.touched.drain(..) {
            self.per_host[h] = 0;
        }
    }

    /// Host `host` sent an SA request attempt (`hosts`: how many there are).
    pub(super) fn request_from(&mut self, host: usize, hosts: usize) {
        if self.per_host.len() < hosts {
            self.per_host.resize(hosts, 0);
        }
        if self.per_host[host] == 0 {
            self.touched.push(host);
        }
        self.per_host[host] += 1;
        if let Some(w) = &mut self.open {
            w.requests_per_host_max = w.requests_per_host_max.max(self.per_host[host]);
        }
    }

    /// An SA queue is `depth` MADs deep.
    pub(super) fn queue(&mut self, depth: u64) {
        if let Some(w) = &mut self.open {
            w.peak_queue = w.peak_queue.max(depth);
        }
    }

    /// A connection was armed again.
    pub(super) fn armed(&mut self, now: Time) {
        if let Some(w) = &mut self.open {
            w.last_armed = Some(now);
        }
    }

    /// Every window, the open one closed with the counters `now`, over `hosts` hosts.
    pub(super) fn report(mut self, now: SmLoad, hosts: usize) -> Vec<EventLoad> {
        self.close(now);
        self.done
            .into_iter()
            .map(|(w, end)| {
                let d = |f: fn(&SmLoad) -> u64| f(&end) - f(&w.start);
                let requests = d(|l| l.requests_sent);
                EventLoad {
                    at_ms: w.at.0 as f64 / 1e6,
                    event: w.event,
                    sa_mads_in: d(|l| l.requests_in) + d(|l| l.report_resps_in),
                    sa_mads_out: d(|l| l.answers_out) + d(|l| l.reports_out),
                    reports: d(|l| l.reports_out),
                    sa_dropped: d(|l| l.dropped),
                    peak_sa_queue: w.peak_queue,
                    sweep_smps: d(|l| l.smps),
                    sa_requests: requests,
                    sa_requests_per_host: requests as f64 / hosts.max(1) as f64,
                    sa_requests_per_host_max: u64::from(w.requests_per_host_max),
                    sa_request_timeouts: d(|l| l.request_timeouts),
                    last_rearm_ms: w.last_armed.map(|t| (t.0 - w.at.0) as f64 / 1e6),
                }
            })
            .collect()
    }
}

impl Sim {
    /// The counters now (the SMPs are the run's own count).
    pub(super) fn load_now(&self) -> SmLoad {
        SmLoad {
            smps: self.c.smps_sent,
            ..self.load
        }
    }

    /// The SA/SM MAD server of subnet `s`: one MAD at a time at `sa_rate_per_s`.
    pub(super) fn sa_service(&self) -> Time {
        Time(1_000_000_000 / self.p.sa_rate_per_s.max(1))
    }

    /// MADs in subnet `s`'s SA queue now, the one being served included: every MAD
    /// takes the same service time, so the backlog says how many.
    pub(super) fn sa_depth(&self, s: usize) -> u64 {
        let backlog = self.sms[s].sa_busy.0.saturating_sub(self.now.0);
        backlog.div_ceil(self.sa_service().0.max(1))
    }

    /// Put one MAD in subnet `s`'s SA queue: when it will have been served.
    pub(super) fn sa_enqueue(&mut self, s: usize) -> Time {
        let service = self.sa_service();
        let sm = &mut self.sms[s];
        let done = after(sm.sa_busy.max(self.now), service);
        sm.sa_busy = done;
        let depth = self.sa_depth(s);
        self.windows.queue(depth);
        done
    }
}
