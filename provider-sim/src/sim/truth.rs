//! Ground truth: what state each connection is really in, the protection clock, the
//! invariants checked against it, and the run's report.

use super::*;
use apm_core::AlternateKind;

impl Sim {
    // ------------------------------------------------------------------ ground truth

    /// The state of connection `i` and its bucket on the protection clock.
    pub(super) fn classify(&self, i: usize) -> (ConnState, Bucket) {
        let c = &self.conns[i];
        let (a, b) = (&c.qp[0], &c.qp[1]);
        if a.err || b.err {
            return (ConnState::Lost, Bucket::Lost);
        }
        if !(mirrors(&a.primary, &b.primary)
            && self.conn_path_ok(i, 0, &a.primary)
            && self.conn_path_ok(i, 1, &b.primary))
        {
            return (ConnState::Migrating, Bucket::Migrating);
        }
        let alts = match c.mode {
            Mode::Hardware => {
                (a.mig == MigState::Armed && b.mig == MigState::Armed).then_some((a.alt, b.alt))
            }
            // A RoCE QP holds no alternate: what protects it is the alternate both
            // engines agreed on, so ask them.
            Mode::Software => {
                let alt = |s: usize| {
                    self.hosts[c.qp[s].host]
                        .ctl
                        .engine()
                        .and_then(|e| e.connection(ConnId(i as u64)))
                        .filter(|st| st.protection == apm_core::Protection::Armed)
                        .and_then(|st| st.alternate)
                };
                Some((alt(0), alt(1)))
            }
        };
        match alts {
            Some((Some(x), Some(y)))
                if mirrors(&x, &y)
                    && self.conn_path_ok(i, 2, &x)
                    && self.conn_path_ok(i, 3, &y) =>
            {
                let bucket = if AlternateKind::of(&a.primary, &x) == AlternateKind::PortDisjoint {
                    Bucket::ArmedDisjoint
                } else {
                    Bucket::ArmedShared
                };
                (ConnState::Armed, bucket)
            }
            _ => (ConnState::Unprotected, Bucket::Unprotected),
        }
    }

    pub(super) fn reeval(&mut self, i: usize) {
        if self.cfg.trace_conn == Some(i) {
            self.trace(i);
        }
        let (new, bucket) = self.classify(i);
        self.wake_if_changed(i, new);
        let now = self.now;
        // A guarded failover whose alternates died as well is a double fault: excused.
        if let Some(&(x, y)) = self.conns[i].guard.as_deref() {
            if !(self.path_ok(&x) && self.path_ok(&y)) {
                self.conns[i].guard = None;
            }
        }
        // A moment without any path between its hosts while it fails over (a
        // diagnostic: a loss after one is not excused by it).
        let outage_now = new == ConnState::Migrating
            && !self.conns[i].outage_since_working
            && !self.hosts_connected(self.conns[i].qp[0].host, self.conns[i].qp[1].host);
        let c = &mut self.conns[i];
        c.outage_since_working |= outage_now;
        let (old, old_bucket) = (c.state, c.bucket);
        if bucket != old_bucket {
            self.c.bucket_ns[old_bucket.idx()] += u128::from(now.0 - c.since.0);
            c.since = now;
            c.bucket = bucket;
            self.counts[old_bucket.idx()] -= 1;
            self.counts[bucket.idx()] += 1;
        }
        if new == ConnState::Armed {
            c.moved_unarmed = None;
        }
        if new == old {
            return;
        }
        if new == ConnState::Armed {
            self.windows.armed(now);
        }
        let c = &mut self.conns[i];
        c.state = new;
        if old.working() && new == ConnState::Migrating {
            // Not armed again since its last move: what follows is a loss in the
            // re-arm window (however long the window has lasted).
            c.in_rearm_window = c.moved_unarmed.is_some();
            c.interrupted_at = Some(now);
            c.guard = match (old, c.qp[0].alt, c.qp[1].alt) {
                (ConnState::Armed, Some(x), Some(y)) => Some(Box::new((x, y))),
                _ => None,
            };
            c.guard_disjoint = old_bucket == Bucket::ArmedDisjoint;
        } else if old == ConnState::Migrating && new.working() {
            c.in_rearm_window = false;
            c.outage_since_working = false;
            if let Some(t) = c.interrupted_at.take() {
                self.c.restore_ns.push(now.0 - t.0);
                self.c.restore_conns.push(i as u32);
                if c.guard_disjoint {
                    self.c.restore_disjoint_ns.push(now.0 - t.0);
                }
            }
            c.guard = None;
        }
        if new == ConnState::Lost {
            let (ha, hb) = (c.qp[0].host, c.qp[1].host);
            // Lost while nothing could carry its packets: no path between its two
            // hosts worked at that instant.
            let outage = !self.hosts_connected(ha, hb);
            let c = &mut self.conns[i];
            c.lost_in_total_outage = outage;
            c.lost_after_total_outage = outage || c.outage_since_working;
            self.c.lost += 1;
            let guard = c.guard.take();
            let excused = c.excused;
            c.interrupted_at = None;
            if guard.is_some() && !excused && self.cfg.policy.is_apm_engine() {
                self.violation(format!(
                    "conn{i} lost at {now} although armed with a healthy alternate when its primary failed"
                ));
            }
        }
    }

    /// Some path between hosts `a` and `b` works both ways now (any rail, any LID
    /// variant).
    fn hosts_connected(&self, a: usize, b: usize) -> bool {
        (1..=self.fab.ports_per_host()).any(|num| {
            let (Some(x), Some(y)) = (self.fab.port_of(a, num), self.fab.port_of(b, num)) else {
                return false;
            };
            self.fab
                .all_paths(x, y, self.p.ack_timeout)
                .iter()
                .any(|p| self.path_ok(p) && self.fab.route(p.dlid.get(), p.slid.get()).is_some())
        })
    }

    /// Log connection `i`'s QPs when they changed since the last time.
    pub(super) fn trace(&mut self, i: usize) {
        let c = &self.conns[i];
        let side = |q: &Qp| {
            let alt = q
                .alt
                .map_or("-".to_string(), |a| format!("{}->{}", a.slid, a.dlid));
            let ok = if self.path_ok(&q.primary) {
                ""
            } else {
                " (dead)"
            };
            format!(
                "h{} {}->{}{ok} alt {alt} {:?}{}{}",
                q.host,
                q.primary.slid,
                q.primary.dlid,
                q.mig,
                if q.err { " ERR" } else { "" },
                if q.stalled {
                    format!(" stalled {}", q.retries)
                } else {
                    String::new()
                }
            )
        };
        let now = format!("{} | {}", side(&c.qp[0]), side(&c.qp[1]));
        if now != self.traced {
            let at = self.now;
            tracing::info!(target: "provider_sim::trace", conn = i, "{at} {now}");
            self.traced = now;
        }
    }

    pub(super) fn reeval_all(&mut self) {
        for i in 0..self.conns.len() {
            if self.conns[i].state != ConnState::Lost {
                self.reeval(i);
            }
        }
    }

    pub(super) fn violation(&mut self, what: String) {
        if self.cfg.check && self.violations.len() < 100 {
            self.violations.push(what);
        }
    }

    // ------------------------------------------------------------------ invariants

    pub(super) fn check_step(&mut self) {
        // Every Report a host received was answered (the umad-sa contract): the totals
        // first, each host only when they differ (a check of every host after every
        // event would cost 4,096 comparisons an event).
        if self.c.reports_received != self.c.report_resps_sent {
            for (h, host) in self.hosts.iter().enumerate() {
                if host.reports_received != host.report_resps_sent {
                    let what = format!("h{h} left a Report unanswered");
                    if self.violations.len() < 100 {
                        self.violations.push(what);
                    }
                    return;
                }
            }
        }
    }

    /// The engine must never issue a command that moves a connection onto a path it
    /// was told is dead (ARCHITECTURE's move invariant; the engine's side of it is
    /// `Engine::path_up`): checked when the command is issued, which is when the engine
    /// decided (it takes effect later, when the device gets to it). "Told" is this
    /// host's own record (`Sim::feed`), not the engine's belief, which apm-core's
    /// property test (`engine/tests/properties.rs`) checks moves against. Probe verdicts
    /// are not in the record: they stay inside the host's controller.
    pub(super) fn check_move_target(&mut self, host: usize, op: &CommandOp) {
        let target = match *op {
            CommandOp::ForceMigrate { conn } => self
                .side_of(host, conn)
                .ok()
                .and_then(|(i, s)| self.conns[i].qp[s].alt),
            CommandOp::SoftwareMigrate { path, .. } => Some(path),
            _ => None,
        };
        let Some(path) = target else {
            return;
        };
        let h = &self.hosts[host];
        if h.known_down_ports.contains(&path.port.port) || h.known_dead_gids.contains(&path.dgid) {
            let what = op.name();
            self.violation(format!(
                "h{host}: {what} onto {path}, a path it was told is dead"
            ));
        }
    }

    /// Connections that are not armed although a healthy alternate exists for them, as
    /// of now (for the "re-armed within a bound after the faults stop" invariant). A
    /// connection armed (in its QPs, or by the engines' agreement on RoCE) on a dead
    /// alternate that ranks at least as high as every healthy one is not counted: the
    /// engine keeps such an alternate on purpose (`apm_core`'s `select` module: armed,
    /// it gives a second retry budget, and it is the one that survives what the primary
    /// does not). The ranking is the engine's own (`AlternateKind::of`, which
    /// `select::rank` orders candidates by); the candidates are the fabric's: every
    /// routed path between the two hosts' ports of the same number, what the SA would
    /// answer. A change to `select`'s ranking changes this check too.
    pub fn unarmed_with_healthy_alternate(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, c) in self.conns.iter().enumerate() {
            if c.state != ConnState::Unprotected {
                continue;
            }
            let (a, b) = (&c.qp[0], &c.qp[1]);
            let (Some(pa), Some(pb)) = (
                self.fab.port_by_gid(&a.primary.sgid),
                self.fab.port_by_gid(&b.primary.sgid),
            ) else {
                continue;
            };
            let (ha, hb) = (self.fab.ports[pa].host, self.fab.ports[pb].host);
            let mut best_healthy: Option<AlternateKind> = None;
            for num in 1..=self.fab.ports_per_host() {
                let (Some(x), Some(y)) = (self.fab.port_of(ha, num), self.fab.port_of(hb, num))
                else {
                    continue;
                };
                for p in self.fab.all_paths(x, y, self.p.ack_timeout) {
                    if !p.same_route(&a.primary)
                        && self.path_ok(&p)
                        && self.fab.route(p.dlid.get(), p.slid.get()).is_some()
                    {
                        best_healthy = best_healthy.max(Some(AlternateKind::of(&a.primary, &p)));
                    }
                }
            }
            let Some(best) = best_healthy else {
                continue;
            };
            let kept = self
                .agreed_alternate(i)
                .map(|alt| AlternateKind::of(&a.primary, &alt));
            if kept.is_none_or(|k| k < best) {
                out.push(i);
            }
        }
        out
    }

    /// The alternate both sides of connection `i` hold (hardware: both QPs ARMED on
    /// mirrored alternates; RoCE: both engines agreed on mirrored alternates), seen
    /// from the active side, whether it works or not.
    fn agreed_alternate(&self, i: usize) -> Option<Path> {
        let c = &self.conns[i];
        let (x, y) = match c.mode {
            Mode::Hardware => {
                let armed = c.qp.iter().all(|q| q.mig == MigState::Armed);
                (c.qp[0].alt.filter(|_| armed)?, c.qp[1].alt?)
            }
            Mode::Software => {
                let alt = |s: usize| {
                    self.hosts[c.qp[s].host]
                        .ctl
                        .engine()
                        .and_then(|e| e.connection(ConnId(i as u64)))
                        .and_then(|st| st.alternate)
                };
                (alt(0)?, alt(1)?)
            }
        };
        mirrors(&x, &y).then_some(x)
    }

    // ------------------------------------------------------------------ the report

    /// Finish: close the protection clock and build the report.
    pub fn finish(mut self) -> RunReport {
        self.catch_up_all();
        let now = self.now.max(self.end);
        for c in &self.conns {
            self.c.bucket_ns[c.bucket.idx()] += u128::from(now.0.saturating_sub(c.since.0));
        }
        if self.cfg.check {
            // Invariant: once the faults stop, every connection that has a healthy
            // alternate is armed again within the bound.
            let bound = self.settle_bound();
            if now >= after(self.last_fault, bound) {
                let unarmed = self.unarmed_with_healthy_alternate();
                for i in unarmed.iter().take(5) {
                    self.violations.push(format!(
                        "conn{i} still unprotected {} after the last fault although a healthy alternate exists",
                        Time(now.0 - self.last_fault.0)
                    ));
                }
            }
        }
        let offered: u64 = self
            .conns
            .iter()
            .flat_map(|c| &c.qp)
            .map(|q| q.posted)
            .sum();
        let delivered: u64 = self
            .conns
            .iter()
            .flat_map(|c| &c.qp)
            .map(|q| q.delivered)
            .sum();
        let lost_ids = self.lost_where(|_| true);
        let lost_in_rearm_window = self.lost_where(|c| c.in_rearm_window);
        let lost_in_total_outage = self.lost_where(|c| c.lost_in_total_outage);
        let lost_after_total_outage = self.lost_where(|c| c.lost_after_total_outage);
        let ms_of = |b: Bucket| self.c.bucket_ns[b.idx()] as f64 / 1e6;
        let load = self.load_now();
        RunReport {
            policy: self.cfg.policy.name().to_string(),
            connections: self.conns.len() as u64,
            lost: self.c.lost,
            lost_ids,
            lost_in_rearm_window,
            lost_in_total_outage,
            lost_after_total_outage,
            messages_lost: offered - delivered,
            messages_duplicated: self.c.messages_duplicated,
            failovers: self.c.failovers,
            false_failovers: self.c.false_failovers,
            restore_ms: Percentiles::of(self.c.restore_ns.clone()),
            restore_samples_ns: std::mem::take(&mut self.c.restore_ns),
            restore_sample_conns: std::mem::take(&mut self.c.restore_conns),
            restore_disjoint_ms: Percentiles::of(std::mem::take(&mut self.c.restore_disjoint_ns)),
            unprotected_ms_total: ms_of(Bucket::Unprotected)
                + ms_of(Bucket::Migrating)
                + ms_of(Bucket::Lost),
            armed_disjoint_ms_total: ms_of(Bucket::ArmedDisjoint),
            armed_shared_ms_total: ms_of(Bucket::ArmedShared),
            failing_over_ms_total: ms_of(Bucket::Migrating),
            lost_ms_total: ms_of(Bucket::Lost),
            sa_queries: self.c.sa_queries,
            mads_sent: self.c.mads_sent,
            smps_sent: self.c.smps_sent,
            messages_posted: offered,
            messages_delivered: self.c.messages_delivered,
            messages_retransmitted: self.c.messages_retransmitted,
            reports_sent: self.c.reports_sent,
            reports_abandoned: self.c.reports_abandoned,
            probes_sent: self.c.probes_sent,
            probes_per_host_per_s: self.c.probes_sent as f64
                / self.hosts.len().max(1) as f64
                / (now.0.max(1) as f64 / 1e9),
            notifications: self.c.notifications,
            events: self.c.events,
            digest: self.digest,
            violations: std::mem::take(&mut self.violations),
            samples: std::mem::take(&mut self.samples),
            timeline: self
                .timeline
                .iter()
                .map(|(t, s)| (t.0 as f64 / 1e6, s.clone()))
                .collect(),
            end_state: [
                (self.counts[Bucket::ArmedDisjoint.idx()] + self.counts[Bucket::ArmedShared.idx()])
                    as u64,
                self.counts[Bucket::Unprotected.idx()] as u64,
                self.counts[Bucket::Migrating.idx()] as u64,
                self.counts[Bucket::Lost.idx()] as u64,
            ],
            end_armed_disjoint: self.counts[Bucket::ArmedDisjoint.idx()] as u64,
            failure_events: std::mem::take(&mut self.windows).report(load, self.hosts.len()),
        }
    }

    /// The lost connections for which `what` holds, by index.
    fn lost_where(&self, what: impl Fn(&Conn) -> bool) -> Vec<u64> {
        (0..self.conns.len())
            .filter(|&i| self.conns[i].state == ConnState::Lost && what(&self.conns[i]))
            .map(|i| i as u64)
            .collect()
    }

    /// How long after the last fault every connection with a healthy alternate must be
    /// armed again: the longest hold-down, the longest re-arm backoff, a whole LAP
    /// exchange with its retries, an SA query with its retries, a light-sweep period,
    /// a trap resend and the Report retries, the longest interval between SA rechecks
    /// of an out-of-service GID (for a host that missed the SM's last notice) with its
    /// query, plus a second of slack.
    pub fn settle_bound(&self) -> Time {
        let p = &self.cfg.engine_policy;
        let lap_total: u64 = (0..p.lap_max_tries)
            .map(|k| p.lap_timeout_ms << k.min(20))
            .sum();
        let sa = self.p.sa_timeout_ms * u64::from(self.p.sa_tries);
        let reports = self.p.report_timeout_ms * u64::from(self.p.report_retries + 1);
        let trap = self.p.trap_resend_ns() / 1_000_000;
        ms(p.hold_down_max_ms
            + p.rearm_retry_max_ms
            + lap_total
            + sa
            + self.p.sweep_interval_ms
            + trap
            + reports
            + p.subscribe_retry_ms
            + if p.remote_recheck_ms > 0 {
                p.remote_recheck_max_ms + sa
            } else {
                0
            }
            + 1000)
    }
}
