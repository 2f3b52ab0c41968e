//! RC QPs and their traffic: transmission, ACKs, the retry budget, migration and loss.

use super::*;

impl Sim {
    // ------------------------------------------------------------------ QPs and traffic

    pub(super) fn path_ok(&self, p: &Path) -> bool {
        self.fab.route(p.slid.get(), p.dlid.get()).is_some()
    }

    /// The HCA (or a forced migration) moves side `s` to its alternate.
    pub(super) fn hw_migrate(&mut self, i: usize, s: usize) {
        let q = &mut self.conns[i].qp[s];
        let Some(alt) = q.alt.take() else {
            return;
        };
        q.primary = alt;
        q.mig = MigState::Migrated;
        q.retries = 0;
        q.mig_err_budget_used = false;
        let host = q.host;
        if s == 0 {
            self.c.failovers += 1;
        }
        let lat = self.ev_latency();
        self.raise(
            host,
            lat,
            Input::QpEvent {
                conn: ConnId(i as u64),
                event: QpEvent::PathMigrated,
            },
        );
        self.unstall_try(i, s);
        self.reeval(i);
    }

    /// A stalled requester retries at once after its path changed.
    pub(super) fn unstall_try(&mut self, i: usize, s: usize) {
        if self.conns[i].qp[s].stalled && self.transmit(i, s) {
            self.unstall(i, s);
        }
    }

    pub(super) fn unstall(&mut self, i: usize, s: usize) {
        let q = &mut self.conns[i].qp[s];
        q.stalled = false;
        q.retries = 0;
        q.retry_gen = q.retry_gen.wrapping_add(1);
    }

    /// Send everything outstanding from side `x`. True when it got through and was
    /// acknowledged.
    pub(super) fn transmit(&mut self, i: usize, x: usize) -> bool {
        let y = 1 - x;
        if self.conns[i].qp[x].err || self.conns[i].qp[y].err {
            return false;
        }
        let p = self.conns[i].qp[x].primary;
        if !self.path_ok(&p) {
            return false;
        }
        let migreq = self.conns[i].qp[x].mig == MigState::Migrated;
        let mut changed = false;
        {
            let yq = &self.conns[i].qp[y];
            if !mirrors(&p, &yq.primary) {
                let takes_alt = self.conns[i].mode == Mode::Hardware
                    && migreq
                    && yq.mig == MigState::Armed
                    && yq.alt.is_some_and(|a| mirrors(&p, &a));
                if !takes_alt {
                    return false;
                }
                // The responder migrates on the first MigReq=1 packet on its alternate.
                self.hw_migrate(i, y);
                changed = true;
            }
        }
        // Delivered to the peer's application.
        let c = &mut self.conns[i];
        if c.qp[x].stalled {
            // Everything not acknowledged goes out again after the timeout.
            self.c.messages_retransmitted += c.qp[x].posted - c.qp[x].acked;
        }
        let newly = c.qp[x].posted - c.qp[x].delivered;
        c.qp[x].delivered = c.qp[x].posted;
        self.c.messages_delivered += newly;
        // The peer's MigReq=0 arms a REARM requester and vice versa.
        if !migreq && c.qp[y].mig == MigState::Rearm {
            c.qp[y].mig = MigState::Armed;
            changed = true;
        }
        // The ACK travels on the responder's primary.
        let back = c.qp[y].primary;
        let acked = mirrors(&back, &c.qp[x].primary) && self.path_ok(&back);
        let c = &mut self.conns[i];
        if acked {
            c.qp[x].acked = c.qp[x].posted;
            if c.qp[y].mig != MigState::Migrated && c.qp[x].mig == MigState::Rearm {
                c.qp[x].mig = MigState::Armed;
                changed = true;
            }
        }
        if changed {
            self.reeval(i);
        }
        acked
    }

    pub(super) fn tick(&mut self, g: u64) {
        let groups = self.scenario.workload.message_interval_ms as usize;
        let mut i = g as usize;
        while i < self.conns.len() {
            for s in 0..2 {
                if self.conns[i].qp[s].err {
                    continue;
                }
                self.conns[i].qp[s].posted += 1;
                self.c.messages_posted += 1;
                if !self.conns[i].qp[s].stalled && !self.transmit(i, s) {
                    let q = &mut self.conns[i].qp[s];
                    q.stalled = true;
                    q.retries = 0;
                    q.retry_gen = q.retry_gen.wrapping_add(1);
                    let gen = q.retry_gen;
                    let at = after(self.now, Time(self.p.ack_timeout_ns()));
                    self.push(
                        at,
                        Ev::Retry {
                            conn: i,
                            side: s,
                            gen,
                        },
                    );
                }
            }
            i += groups;
        }
        let at = after(self.now, ms(self.scenario.workload.message_interval_ms));
        self.push(at, Ev::Tick(g));
    }

    pub(super) fn retry(&mut self, i: usize, s: usize, gen: u32) {
        let q = &self.conns[i].qp[s];
        if q.retry_gen != gen || !q.stalled || q.err {
            return;
        }
        if self.transmit(i, s) {
            self.unstall(i, s);
            return;
        }
        let q = &mut self.conns[i].qp[s];
        q.retries += 1;
        let retries = q.retries;
        let host = q.host;
        if self.conns[i].mode == Mode::Software && retries == self.p.stall_timeouts {
            let lat = self.ev_latency();
            self.raise(
                host,
                lat,
                Input::QpEvent {
                    conn: ConnId(i as u64),
                    event: QpEvent::PrimaryStalled,
                },
            );
        }
        if retries > self.p.retry_cnt {
            self.exhausted(i, s);
            if self.conns[i].qp[s].err || !self.conns[i].qp[s].stalled {
                return;
            }
        }
        let gen = self.conns[i].qp[s].retry_gen;
        let at = after(self.now, Time(self.p.ack_timeout_ns()));
        self.push(
            at,
            Ev::Retry {
                conn: i,
                side: s,
                gen,
            },
        );
    }

    /// The retry budget of side `s` ran out.
    pub(super) fn exhausted(&mut self, i: usize, s: usize) {
        let c = &self.conns[i];
        let q = &c.qp[s];
        tracing::debug!(
            conn = i,
            side = s,
            primary = %q.primary,
            alt = ?q.alt.map(|a| (a.slid, a.dlid)),
            mig = ?q.mig,
            peer_primary = %c.qp[1 - s].primary,
            peer_alt = ?c.qp[1 - s].alt.map(|a| (a.slid, a.dlid)),
            peer_mig = ?c.qp[1 - s].mig,
            "retry budget exhausted"
        );
        let host = q.host;
        let armed_alt = q
            .alt
            .filter(|_| c.mode == Mode::Hardware && q.mig == MigState::Armed);
        if let Some(alt) = armed_alt {
            if self.path_ok(&alt) {
                self.hw_migrate(i, s);
                return;
            }
            // The alternate is dead too: the migration fails.
            let q = &mut self.conns[i].qp[s];
            q.mig = MigState::Migrated;
            q.retries = 0;
            q.mig_err_budget_used = true;
            let lat = self.ev_latency();
            self.raise(
                host,
                lat,
                Input::QpEvent {
                    conn: ConnId(i as u64),
                    event: QpEvent::PathMigrationError,
                },
            );
            self.reeval(i);
            return;
        }
        self.lose(i, false);
    }

    /// Both QPs of connection `i` go to ERR.
    pub(super) fn lose(&mut self, i: usize, device_fatal: bool) {
        if self.conns[i].qp[0].err && self.conns[i].qp[1].err {
            return;
        }
        let lat = self.ev_latency();
        for s in 0..2 {
            let q = &mut self.conns[i].qp[s];
            if !q.err {
                q.err = true;
                self.c.messages_lost += q.posted - q.delivered;
                self.c.messages_duplicated += q.delivered - q.acked;
                let host = q.host;
                if !device_fatal {
                    self.raise(
                        host,
                        lat,
                        Input::QpEvent {
                            conn: ConnId(i as u64),
                            event: QpEvent::Fatal,
                        },
                    );
                }
            }
        }
        if device_fatal {
            self.conns[i].excused = true;
        }
        self.reeval(i);
    }

}
