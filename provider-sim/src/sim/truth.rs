//! Ground truth: what state each connection is really in, the protection clock, and
//! the invariants checked against it.

use super::*;

impl Sim {
    // ------------------------------------------------------------------ ground truth

    pub(super) fn classify(&self, i: usize) -> ConnState {
        let c = &self.conns[i];
        let (a, b) = (&c.qp[0], &c.qp[1]);
        if a.err || b.err {
            return ConnState::Lost;
        }
        if !(mirrors(&a.primary, &b.primary)
            && self.path_ok(&a.primary)
            && self.path_ok(&b.primary))
        {
            return ConnState::Migrating;
        }
        let protected = match c.mode {
            Mode::Hardware => {
                a.mig == MigState::Armed
                    && b.mig == MigState::Armed
                    && match (a.alt, b.alt) {
                        (Some(x), Some(y)) => {
                            mirrors(&x, &y) && self.path_ok(&x) && self.path_ok(&y)
                        }
                        _ => false,
                    }
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
                match (alt(0), alt(1)) {
                    (Some(x), Some(y)) => mirrors(&x, &y) && self.path_ok(&x) && self.path_ok(&y),
                    _ => false,
                }
            }
        };
        if protected {
            ConnState::Armed
        } else {
            ConnState::Unprotected
        }
    }

    pub(super) fn reeval(&mut self, i: usize) {
        let new = self.classify(i);
        let now = self.now;
        let c = &self.conns[i];
        let old = c.state;
        // A guarded failover whose alternates died as well is a double fault: excused.
        if let Some((x, y)) = c.guard {
            if !(self.path_ok(&x) && self.path_ok(&y)) {
                self.conns[i].guard = None;
            }
        }
        if new == old {
            return;
        }
        let c = &mut self.conns[i];
        if matches!(old, ConnState::Unprotected | ConnState::Migrating) {
            self.c.unprotected_ns += u128::from(now.0 - c.since.0);
        }
        c.since = now;
        c.state = new;
        self.counts[old.idx()] -= 1;
        self.counts[new.idx()] += 1;
        if old.working() && new == ConnState::Migrating {
            c.interrupted_at = Some(now);
            c.guard = if old == ConnState::Armed {
                match (c.qp[0].alt, c.qp[1].alt) {
                    (Some(x), Some(y)) => Some((x, y)),
                    _ => None,
                }
            } else {
                None
            };
        } else if old == ConnState::Migrating && new.working() {
            if let Some(t) = c.interrupted_at.take() {
                self.c.restore_ns.push(now.0 - t.0);
            }
            c.guard = None;
        }
        if new == ConnState::Lost {
            self.c.lost += 1;
            let guard = c.guard.take();
            let excused = c.excused;
            c.interrupted_at = None;
            if guard.is_some() && !excused {
                self.violation(format!(
                    "conn{i} lost at {now} although armed with a healthy alternate when its primary failed"
                ));
            }
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
        // Every Report a host received was answered (the umad-sa contract).
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

    /// Connections that are not armed although a healthy alternate exists for them, as
    /// of now (for the "re-armed within a bound after the faults stop" invariant).
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
            let mut healthy = false;
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
                        healthy = true;
                    }
                }
            }
            if healthy {
                out.push(i);
            }
        }
        out
    }

}
