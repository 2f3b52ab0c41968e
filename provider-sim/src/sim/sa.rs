//! The SA as a bounded server, and its clients' requests with their retries.
//!
//! A client (a host's SA facet) sends a PathRecord GetTable or an InformInfo Set to the
//! master SM's port, waits `sa_timeout_ms` for the answer and tries `sa_tries` times;
//! an answer to any attempt settles the request. The SA serves its MADs one at a time
//! at `sa_rate_per_s` in arrival order (the queue is `load.rs`'s): requests, and the
//! Reports and ReportResps of traps 64/65 (`sm.rs`), so a trap's Reports delay the
//! answers queued behind them. It drops a request that would wait longer than
//! `sa_fifo_timeout_ms` behind others (OpenSM `max_msg_fifo_timeout`: dropped, not
//! answered BUSY: the queue overflowed), and ignores everything while its master's
//! first sweep runs (OpenSM: "Received SA MAD while SM in first sweep. MAD ignored").
//! Under load that is OpenSM's collapse: a request waiting longer than its client's
//! timeout is resent while the first copy still waits, and the SA answers both.

use super::*;

/// One client request in flight.
#[derive(Debug)]
pub(super) struct SaTxn {
    host: usize,
    reply: Reply,
    port: PortId,
    /// PathRecords to this GID; `None` for the trap 64/65 subscription.
    dgid: Option<Gid>,
    attempt: u32,
}

/// The operation an SA request carries out: PathRecords to a GID, or the subscription.
fn sa_operation(dgid: Option<Gid>) -> Operation {
    match dgid {
        Some(_) => Operation::ResolvePaths,
        None => Operation::Subscribe,
    }
}

impl Sim {
    /// Start an SA request of `host` through its port `port` (PathRecords to `dgid`, or
    /// the InformInfo subscription when `dgid` is `None`).
    pub(super) fn sa_request(
        &mut self,
        host: usize,
        reply: Reply,
        port: PortKey,
        dgid: Option<Gid>,
    ) {
        self.c.sa_queries += 1;
        let Some(pid) = self
            .fab
            .port_of(host, port.port)
            .filter(|_| port.device == 0)
        else {
            self.complete(
                host,
                reply,
                Err(ProviderError::io(
                    sa_operation(dgid),
                    Reason::NotOurPort(port),
                )),
            );
            return;
        };
        let txn = self.next_txn;
        self.next_txn += 1;
        self.sa_txns.insert(
            txn,
            SaTxn {
                host,
                reply,
                port: pid,
                dgid,
                attempt: 0,
            },
        );
        self.sa_send(txn);
    }

    /// Send the next attempt of `txn` and arm its timeout.
    fn sa_send(&mut self, txn: u64) {
        let Some(t) = self.sa_txns.get_mut(&txn) else {
            return;
        };
        t.attempt += 1;
        let (pid, attempt, host) = (t.port, t.attempt, t.host);
        self.load.requests_sent += 1;
        self.windows.request_from(host, self.hosts.len());
        let s = self.fab.ports[pid].subnet;
        if let Some(m) = self.sms[s].master_port() {
            let (a, b) = (self.fab.ports[pid].lid, self.fab.ports[m].lid);
            if let Some(d) = self.mad(a, b) {
                let epoch = self.sms[s].epoch;
                self.push(
                    after(self.now, d),
                    Ev::SaArrive {
                        subnet: s,
                        epoch,
                        txn,
                    },
                );
            }
        }
        let at = after(self.now, ms(self.p.sa_timeout_ms));
        self.push(at, Ev::SaTimeout { txn, attempt });
    }

    pub(super) fn sa_timeout(&mut self, txn: u64, attempt: u32) {
        let Some(t) = self.sa_txns.get(&txn) else {
            return;
        };
        if t.attempt != attempt {
            return;
        }
        self.load.request_timeouts += 1;
        if attempt < self.p.sa_tries {
            self.sa_send(txn);
            return;
        }
        if let Some(t) = self.sa_txns.remove(&txn) {
            self.complete(
                t.host,
                t.reply,
                Err(ProviderError::Timeout {
                    operation: sa_operation(t.dgid),
                }),
            );
        }
    }

    /// A request reaches the SA: queue it, or drop it.
    pub(super) fn sa_arrive(&mut self, s: usize, epoch: u32, txn: u64) {
        if self.sms[s].epoch != epoch || !self.sa_serving(s) {
            return;
        }
        self.load.requests_in += 1;
        let wait = self.sms[s].sa_busy.0.saturating_sub(self.now.0);
        if wait > ms(self.p.sa_fifo_timeout_ms).0 {
            self.load.dropped += 1;
            return;
        }
        let done = self.sa_enqueue(s);
        self.push(
            done,
            Ev::SaServed {
                subnet: s,
                epoch,
                txn,
            },
        );
    }

    /// The SA has worked out its answer: send it back.
    pub(super) fn sa_served(&mut self, s: usize, epoch: u32, txn: u64) {
        if self.sms[s].epoch != epoch || !self.sa_serving(s) {
            return;
        }
        // The client may have given up already; the SA did the work all the same.
        let Some((pid, dgid, host)) = self.sa_txns.get(&txn).map(|t| (t.port, t.dgid, t.host))
        else {
            return;
        };
        let result = match dgid {
            Some(dgid) => {
                let paths = self
                    .fab
                    .port_by_gid(&dgid)
                    .filter(|&d| self.sms[s].in_service[d] && self.fab.ports[d].subnet == s)
                    .map(|d| self.fab.all_paths(pid, d, self.p.ack_timeout))
                    .unwrap_or_default();
                Ok(CommandOutcome::Paths(paths))
            }
            None => {
                self.sms[s].subs.insert(pid);
                Ok(CommandOutcome::Done)
            }
        };
        let Some(m) = self.sms[s].master_port() else {
            return;
        };
        self.load.answers_out += 1;
        let (a, b) = (self.fab.ports[m].lid, self.fab.ports[pid].lid);
        if let Some(d) = self.mad(a, b) {
            let mad = Mad::SaAnswer { txn, result };
            let mad = self.mads.put(mad);
            self.push(after(self.now, d), Ev::MadArrive { host, mad });
        }
    }

    /// An answer the client's agent has processed: the first settles the request.
    pub(super) fn sa_answer_ready(
        &mut self,
        txn: u64,
        result: Result<CommandOutcome, ProviderError>,
    ) {
        if let Some(t) = self.sa_txns.remove(&txn) {
            self.complete(t.host, t.reply, result);
        }
    }
}
