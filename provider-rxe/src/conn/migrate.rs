//! Moving a connection's primary path: through the SQ drain while the QP is alive, or by
//! re-initialising a QP that failed into ERR (its flushed sends replayed with their PSNs,
//! its receives reposted), and back to the old path when the new one cannot be used.

use super::*;

impl RcConn {
    /// Move the primary path to `av` (see the crate docs for the two procedures).
    /// Returns true when the QP had to be re-initialised.
    pub async fn migrate(
        &self,
        av: AddressVector,
        drain_timeout: Duration,
    ) -> Result<bool, ConnError> {
        let t0 = Instant::now();
        let _one = self.migration.lock().await;
        let waited_for_lock = t0.elapsed();
        if waited_for_lock > Duration::from_millis(50) {
            info!(
                qpn = self.qp_num(),
                ?waited_for_lock,
                "waited for another migration"
            );
        }
        {
            let mut g = self.lock();
            if g.params.is_none() {
                return Err(ConnError::Invalid("the connection was never connected"));
            }
            g.mode = Mode::Migrating;
        }
        let t_query = Instant::now();
        let state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        debug!(qpn = self.qp_num(), ?state, query = ?t_query.elapsed(), "migration starts");
        let result = if matches!(state, QpState::Err | QpState::Sqe) || self.lock().failed {
            self.reinit(av).await.map(|()| true)
        } else {
            match self.drain_and_move(av, drain_timeout).await {
                Ok(()) => Ok(false),
                Err(e) => {
                    // The QP may have failed under the drain: re-initialising still works.
                    let now = self.qp.query(QpAttrMask::STATE).map(|a| a.qp_state);
                    if matches!(now, Ok(QpState::Sqd)) {
                        // The new path was refused (e.g. no route): resume on the old one
                        // rather than leave the QP drained, and report the failure.
                        warn!(qpn = self.qp_num(), error = %e, "the new path was refused: resuming on the old one");
                        let rts = QpAttr {
                            qp_state: QpState::Rts,
                            ..QpAttr::default()
                        };
                        if self.qp.modify(&rts, QpAttrMask::STATE).is_ok() {
                            let mut g = self.lock();
                            let _ = self.post_kick(&mut g);
                        }
                        Err(e)
                    } else if matches!(now, Ok(QpState::Err)) {
                        warn!(qpn = self.qp_num(), error = %e, "drain failed with the QP in ERR: re-initialising");
                        self.reinit(av).await.map(|()| true)
                    } else {
                        Err(e)
                    }
                }
            }
        };
        let mut g = self.lock();
        g.mode = Mode::Running;
        g.last_progress = Instant::now();
        g.reported_at = None;
        g.migrated_at = Some(Instant::now());
        if result.is_ok() {
            g.failed = false;
            // Sends held during the migration go out now, in order.
            while let Some(wr) = g.held.pop_front() {
                if let Err(e) = self.post_now(&mut g, wr) {
                    g.held.push_front(wr);
                    return Err(e);
                }
            }
        }
        result
    }

    /// RTS -> SQD (async notify), wait for SQ_DRAINED, SQD -> SQD with the AV alone,
    /// route cache flush, SQD -> RTS, one kick.
    async fn drain_and_move(&self, av: AddressVector, timeout: Duration) -> Result<(), ConnError> {
        let before = self.drained.load(Ordering::SeqCst);
        let t_sqd = Instant::now();
        let sqd = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: true,
            ..QpAttr::default()
        };
        self.qp
            .modify(&sqd, QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY)?;
        let started = Instant::now();
        let sqd_modify = started.saturating_duration_since(t_sqd);
        let waited = tokio::time::timeout(timeout, async {
            loop {
                let notified = self.drained_notify.notified();
                if self.drained.load(Ordering::SeqCst) > before {
                    return;
                }
                // A missed wake-up costs at most this poll interval.
                let _ = tokio::time::timeout(Duration::from_millis(20), notified).await;
            }
        })
        .await;
        if waited.is_err() {
            // No event: accept a QP that says it has drained.
            let a = self.qp.query(QpAttrMask::STATE)?;
            if a.qp_state != QpState::Sqd || a.sq_draining {
                return Err(ConnError::Timeout("waiting for SQ_DRAINED"));
            }
        }
        let drained_after = started.elapsed();
        debug!(qpn = self.qp_num(), after = ?drained_after, "send queue drained");
        self.qp.modify(
            &QpAttr {
                ah_attr: av,
                ..QpAttr::default()
            },
            QpAttrMask::AV,
        )?;
        crate::route::flush_route_cache();
        self.qp.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )?;
        let mut g = self.lock();
        g.stats.drain_migrations += 1;
        // Work rolled back by the drain goes out only at the next post.
        self.post_kick(&mut g)?;
        info!(
            qpn = self.qp_num(),
            ?sqd_modify,
            ?drained_after,
            rest = ?drained_after_end(started, drained_after),
            event = waited.is_ok(),
            "moved the primary path through SQ-drain"
        );
        Ok(())
    }

    /// The QP is in ERR: collect the flushes, RESET -> INIT (receives again) -> RTR (new
    /// AV, own receive PSN) -> RTS (send PSN of the oldest unacknowledged send), flush
    /// the route cache, replay the unacknowledged sends.
    async fn reinit(&self, av: AddressVector) -> Result<(), ConnError> {
        let forced = self.settle_in_err().await?;
        self.collect_flushes().await?;
        let q = self
            .qp
            .query(QpAttrMask::STATE | QpAttrMask::RQ_PSN | QpAttrMask::SQ_PSN | QpAttrMask::AV)?;
        let params = self
            .lock()
            .params
            .ok_or(ConnError::Invalid("the connection was never connected"))?;
        self.qp.modify(&reset(), QpAttrMask::STATE)?;
        self.to_init()?;
        let mut g = self.lock();
        let recvs: Vec<RecvWr> = g.recvs.iter().copied().collect();
        self.repost(&recvs)?;
        let replay: Vec<SendWr> = g.outstanding.drain(..).collect();
        let counted = replay.first().map_or(g.next_psn, |w| w.psn);
        let first_psn = replay_psn(forced, replay.len(), q.sq_psn, counted);
        if first_psn != counted {
            warn!(
                qpn = self.qp_num(),
                counted,
                rxe = first_psn,
                "PSN count differs from rxe's: using rxe's"
            );
        }
        drop(g);
        let moved = self
            .to_rtr(&params, av, q.rq_psn)
            .and_then(|()| self.to_rts(&params, first_psn));
        if let Err(e) = moved {
            // The new path is unusable (e.g. no route): put the QP back on the old one
            // rather than leave it half-initialised, then report the failure.
            warn!(qpn = self.qp_num(), error = %e, "re-initialisation on the new path failed: back to the old path");
            self.back_to_old_path(&params, &q, &recvs, &replay, first_psn)?;
            return Err(e);
        }
        crate::route::flush_route_cache();
        let mut g = self.lock();
        g.stats.reinit_migrations += 1;
        g.stats.flushed_recvs += recvs.len() as u64;
        g.stats.flushed_sends += replay.iter().filter(|w| !w.kick).count() as u64;
        g.next_psn = first_psn;
        g.failed = false;
        info!(
            qpn = self.qp_num(),
            err_sq_psn = q.sq_psn,
            forced_err = forced,
            rq_psn = q.rq_psn,
            first_psn,
            replayed = replay.len(),
            reposted_recvs = recvs.len(),
            "re-initialised the QP on the new path"
        );
        // Kicks too: each took a PSN, and every later send must keep its own.
        for wr in &replay {
            self.post_now(&mut g, *wr)?;
        }
        if g.outstanding.is_empty() {
            self.post_kick(&mut g)?;
        }
        Ok(())
    }

    /// Wait for the QP to reach ERR by itself, or put it there; true when apm had to.
    async fn settle_in_err(&self) -> Result<bool, ConnError> {
        // rxe moves a QP whose send failed to ERR shortly after the error completion; its
        // send PSN there is where the requester rolled back to, the oldest unacknowledged
        // send's. Give it that moment; a QP that stays up is put in ERR here.
        let until = Instant::now() + Duration::from_millis(200);
        let mut state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        while state != QpState::Err && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
            state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        }
        let forced = state != QpState::Err;
        if forced {
            let err = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            self.qp.modify(&err, QpAttrMask::STATE)?;
        }
        Ok(forced)
    }

    /// Take every completion out of the CQ before RESET wipes it, keeping the
    /// successful ones for the application.
    async fn collect_flushes(&self) -> Result<(), ConnError> {
        // Everything flushed must be out of the CQ before RESET wipes it: poll until it
        // has been quiet for a while (the application may poll too; the state is shared).
        let until = Instant::now() + Duration::from_millis(500);
        let mut quiet_since = Instant::now();
        while Instant::now() < until {
            let (got, raw) = self.poll_cq(64)?;
            if raw > 0 {
                quiet_since = Instant::now();
            }
            // Successful completions found here are lost to the application otherwise.
            if !got.is_empty() {
                self.lock_pending().extend(got);
            }
            if quiet_since.elapsed() > Duration::from_millis(10) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Post the remembered receives again (the caller holds the connection's lock).
    fn repost(&self, recvs: &[RecvWr]) -> Result<(), ConnError> {
        let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
        for r in recvs {
            self.qp.post_recv(r.wr_id, &mr, r.offset, r.len)?;
        }
        Ok(())
    }

    /// The new path failed: re-initialise on the old one (`q`, as queried in ERR) and
    /// replay there, or, if even that fails, keep the sends outstanding.
    fn back_to_old_path(
        &self,
        params: &ConnectParams,
        q: &QpAttr,
        recvs: &[RecvWr],
        replay: &[SendWr],
        first_psn: u32,
    ) -> Result<(), ConnError> {
        let back = self
            .qp
            .modify(&reset(), QpAttrMask::STATE)
            .map_err(ConnError::from)
            .and_then(|()| self.to_init())
            .and_then(|()| self.to_rtr(params, q.ah_attr, q.rq_psn))
            .and_then(|()| self.to_rts(params, first_psn));
        let mut g = self.lock();
        if back.is_ok() {
            self.repost(recvs)?;
            g.next_psn = first_psn;
            // Kicks too: each took a PSN, and every later send must keep its own.
            for wr in replay {
                self.post_now(&mut g, *wr)?;
            }
        } else {
            g.outstanding.extend(replay.iter().copied());
        }
        Ok(())
    }

    /// The QP failed on the path it was just moved to (e.g. a send the link-down had
    /// already doomed): re-initialise it on its current path, replaying what was flushed.
    pub async fn repair(&self, drain_timeout: Duration) -> Result<(), ConnError> {
        let av = self.qp.query(QpAttrMask::AV)?.ah_attr;
        self.lock().failed = true;
        self.migrate(av, drain_timeout).await.map(|_| ())
    }
}

/// The attributes that move a QP to RESET.
fn reset() -> QpAttr {
    QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    }
}

/// The PSN the oldest of `outstanding` unacknowledged sends is replayed with after a
/// re-initialisation. In an ERR the QP reached by itself, rxe's send PSN (`rxe_sq_psn`)
/// is that send's (rxe rolled back to retry it): it is trusted over our own count, which
/// cannot see how rxe numbered work around a send that failed in transmission. A QP apm
/// had to put in ERR (`forced`) was still sending: rxe's send PSN is then the next new
/// one, and every outstanding send (one PSN each) was numbered before it. With nothing
/// outstanding our count (`counted`, the next PSN) is exact.
fn replay_psn(forced: bool, outstanding: usize, rxe_sq_psn: u32, counted: u32) -> u32 {
    if outstanding == 0 {
        return counted & PSN_MASK;
    }
    if forced {
        let n = u32::try_from(outstanding).unwrap_or(u32::MAX);
        rxe_sq_psn.wrapping_sub(n) & PSN_MASK
    } else {
        rxe_sq_psn & PSN_MASK
    }
}

/// Time from the end of the drain to now (AV modify, route flush, SQD->RTS, kick).
fn drained_after_end(started: Instant, drained_after: Duration) -> Duration {
    started.elapsed().saturating_sub(drained_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_psn_follows_rxe_and_wraps_at_24_bits() {
        // Seen on rxe: an ERR reached by itself reports the oldest unacknowledged PSN.
        assert_eq!(replay_psn(false, 12, 5_142_147, 5_142_147), 5_142_147);
        // Seen on rxe: a QP failed by apm reports the next new PSN (14 sends out).
        assert_eq!(replay_psn(true, 14, 8_777_353, 8_777_338), 8_777_339);
        assert_eq!(replay_psn(true, 3, 1, 0), 0x00FF_FFFE);
        assert_eq!(replay_psn(false, 0, 77, 0x0100_0005), 5);
    }
}
