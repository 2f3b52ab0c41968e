//! Moving a connection's primary path: through the SQ drain while the old path still
//! acknowledges, or by re-initialising the QP (its unacknowledged sends replayed with
//! their PSNs, its receives reposted) when the QP failed into ERR or the old path has
//! stopped acknowledging, and back to the old path when the new one cannot be used.
//!
//! Why not always drain: rxe ends a drain only when every send it put on the wire is
//! acknowledged, or when its retransmit timer (4.096 us x 2^timeout: 67 ms at ACK
//! timeout 14) fires and rolls the unacknowledged ones back. On a dead path the timer is
//! the only way out, so a drain there costs up to a whole ACK timeout. apm's own
//! connection can be re-initialised instead: it knows every outstanding work request,
//! and the peer's responder drops what it already has by PSN. The drain stays the
//! procedure for a live path (nothing flushed, nothing replayed), and the only one for
//! an application's QP ([`crate::AdoptedQp`]), whose work apm cannot replay.

use super::*;

/// How a re-initialisation gets the QP into ERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToErr {
    /// The QP failed (or is failing) by itself: give rxe a moment to finish.
    Wait,
    /// The QP is alive on a path that stopped acknowledging: apm fails it now.
    Force,
}

/// How the collection of a re-initialisation's completions ended, and after how many
/// polls of the CQ (for the trace: a move slower than its steps shows why here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collected {
    /// Every outstanding send and posted receive had its completion.
    Everything { polls: u32 },
    /// Some never came; the CQ was quiet for a moment.
    Quiet { polls: u32 },
    /// The CQ was never quiet for long enough.
    TimedOut { polls: u32 },
}

/// What became of a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    /// Drained and moved.
    Moved,
    /// Not drained within the grace: the old path does not acknowledge (the QP is left
    /// in SQD, to be re-initialised).
    NotInTime,
}

/// A migration under way: dropped before [`Unfinished::finished`] (its future abandoned
/// midway), it ends the migration as failed, so that the connection's sends are no
/// longer held for a move nobody finishes.
struct Unfinished<'a>(Option<&'a RcConn>);

impl Unfinished<'_> {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            warn!(
                qpn = conn.qp_num(),
                "migration abandoned midway: sends are no longer held for it"
            );
            let _ = conn.end_migration(Err(ConnError::Invalid("the migration was abandoned")));
        }
    }
}

impl RcConn {
    /// Move the primary path to `av`. A live QP drains (SQD) for at most `grace`, or not
    /// at all when its sends have already made no progress for that long; otherwise, or
    /// when it is in ERR, it is re-initialised (see the module docs), its replay sent
    /// as `replay` says. Returns true when the QP was re-initialised.
    pub async fn migrate(
        &self,
        av: AddressVector,
        grace: Duration,
        replay: Replay,
    ) -> Result<bool, ConnError> {
        let t0 = Instant::now();
        let _one = self.migration.lock().await;
        {
            // Still holding for the peer of the last move: post it, and this move
            // flushes and replays it with everything else.
            let mut g = self.lock();
            self.release_held(&mut g, Released::Migration);
        }
        let waited_for_lock = t0.elapsed();
        if waited_for_lock > Duration::from_millis(50) {
            info!(
                qpn = self.qp_num(),
                ?waited_for_lock,
                "waited for another migration"
            );
        }
        let stuck_for = {
            let mut g = self.lock();
            if g.params.is_none() {
                return Err(ConnError::Invalid("the connection was never connected"));
            }
            g.mode = Mode::Migrating {
                to: av.dgid,
                peer_there: false,
            };
            (!g.outstanding.is_empty()).then(|| g.last_progress.elapsed())
        };
        // Every way out of the move ends it: a failed query, or the driver dropping this
        // future at its command timeout, would otherwise leave every later send held.
        let unfinished = Unfinished(Some(self));
        let result = self.move_by_state(av, grace, replay, stuck_for).await;
        unfinished.finished();
        self.end_migration(result)
    }

    /// The move itself, chosen by the QP's state and how long its sends have waited.
    async fn move_by_state(
        &self,
        av: AddressVector,
        grace: Duration,
        replay: Replay,
        stuck_for: Option<Duration>,
    ) -> Result<bool, ConnError> {
        let t_query = Instant::now();
        let state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        debug!(qpn = self.qp_num(), ?state, ?stuck_for, query = ?t_query.elapsed(), "migration starts");
        if matches!(state, QpState::Err | QpState::Sqe) || self.lock().failed {
            self.reinit(av, ToErr::Wait, replay).await.map(|()| true)
        } else if stuck_for.is_some_and(|d| d >= grace) {
            // The old path has acknowledged nothing for a grace already: a drain would
            // wait for the retransmit timer.
            info!(
                qpn = self.qp_num(),
                ?stuck_for,
                "no acknowledgement on the old path: re-initialising"
            );
            self.reinit(av, ToErr::Force, replay).await.map(|()| true)
        } else {
            self.drain_or_reinit(av, grace, replay).await
        }
    }

    /// Drain and move; re-initialise when the drain does not end within `grace`, or
    /// failed with the QP in ERR; resume on the old path when the new one was refused.
    async fn drain_or_reinit(
        &self,
        av: AddressVector,
        grace: Duration,
        replay: Replay,
    ) -> Result<bool, ConnError> {
        match self.drain_and_move(av, grace).await {
            Ok(Drain::Moved) => Ok(false),
            Ok(Drain::NotInTime) => {
                info!(qpn = self.qp_num(), ?grace, "not drained within the grace: the old path does not acknowledge; re-initialising");
                self.reinit(av, ToErr::Force, replay).await.map(|()| true)
            }
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
                    self.reinit(av, ToErr::Wait, replay).await.map(|()| true)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Back to running after a migration: sends held meanwhile go out now, in order,
    /// unless the replay is held for the peer (they wait behind it).
    fn end_migration(&self, result: Result<bool, ConnError>) -> Result<bool, ConnError> {
        let mut g = self.lock();
        let for_peer = result.is_ok() && matches!(g.mode, Mode::AwaitingPeer { .. });
        if !for_peer {
            g.mode = Mode::Running;
        }
        g.last_progress = Instant::now();
        g.reported_at = None;
        g.migrated_at = Some(Instant::now());
        if result.is_ok() {
            g.failed = false;
        }
        if result.is_ok() && !for_peer {
            while let Some(wr) = g.held.pop_front() {
                if let Err(e) = self.post_now(&mut g, wr) {
                    g.held.push_front(wr);
                    return Err(e);
                }
            }
        }
        result
    }

    /// RTS -> SQD (async notify), wait up to `grace` for SQ_DRAINED, SQD -> SQD with the
    /// AV alone, route cache flush, SQD -> RTS, one kick.
    async fn drain_and_move(&self, av: AddressVector, grace: Duration) -> Result<Drain, ConnError> {
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
        let waited = tokio::time::timeout(grace, async {
            loop {
                let notified = self.drained_notify.notified();
                if self.drained.load(Ordering::SeqCst) > before {
                    return;
                }
                // A missed wake-up costs at most this poll interval.
                let _ = tokio::time::timeout(Duration::from_millis(5), notified).await;
            }
        })
        .await;
        if waited.is_err() {
            // No event: accept a QP that says it has drained.
            let a = self.qp.query(QpAttrMask::STATE)?;
            if a.qp_state != QpState::Sqd || a.sq_draining {
                return Ok(Drain::NotInTime);
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
        Ok(Drain::Moved)
    }

    /// The QP is in ERR: collect the flushes, RESET, flush the route cache, INIT
    /// (receives again) -> RTR (new AV, own receive PSN) -> RTS (send PSN of the oldest
    /// unacknowledged send), flush the route cache again, replay the unacknowledged
    /// sends, or hold them for the peer (`Replay::WhenPeerThere`, see [`super::hold`]).
    async fn reinit(&self, av: AddressVector, how: ToErr, when: Replay) -> Result<(), ConnError> {
        let t0 = Instant::now();
        let waited = {
            let g = self.lock();
            (!g.outstanding.is_empty()).then(|| g.last_progress.elapsed())
        };
        let forced = self.settle_in_err(how).await?;
        let t_err = t0.elapsed();
        let collected = self.collect_flushes().await?;
        let t_flushed = t0.elapsed();
        let q = self
            .qp
            .query(QpAttrMask::STATE | QpAttrMask::RQ_PSN | QpAttrMask::SQ_PSN | QpAttrMask::AV)?;
        // The connection's lock from RESET until the receives are back: rxe refuses a
        // receive posted to a QP below INIT (EINVAL), and the application posts its
        // receives from its own thread while the move runs.
        let mut g = self.lock();
        let params = g
            .params
            .ok_or(ConnError::Invalid("the connection was never connected"))?;
        self.qp.modify(&reset(), QpAttrMask::STATE)?;
        // Flush before INIT, not only after RTS: a QP in RTR answers (ACK, NAK) and
        // rxe sends those by the route it cached on the QP's socket, the old path's
        // until the generation changes. A silent cut leaves that route valid, so the
        // one sequence NAK the responder sends for the peer's next packet went down
        // the dead rail, and the peer resent only at its retransmit timer (50-70 ms
        // more per move in the VM). Nothing is sent between RESET and RTR.
        crate::route::flush_route_cache();
        self.to_init()?;
        let reposted = self.repost(&mut g)?;
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
            self.back_to_old_path(&params, &q, &replay, first_psn)?;
            return Err(e);
        }
        crate::route::flush_route_cache();
        let mut g = self.lock();
        g.stats.reinit_migrations += 1;
        g.stats.flushed_recvs += reposted as u64;
        g.stats.flushed_sends += replay.iter().filter(|w| !w.kick).count() as u64;
        g.next_psn = first_psn;
        g.failed = false;
        let peer_there = g.mode.peer_there_during_move_to(&av.dgid);
        let hold =
            !replay.is_empty() && !peer_there && super::hold::holds_replay(when, &params, waited);
        info!(
            qpn = self.qp_num(),
            err_sq_psn = q.sq_psn,
            forced_err = forced,
            rq_psn = q.rq_psn,
            first_psn,
            replayed = replay.len(),
            held_for_peer = hold,
            peer_there,
            reposted_recvs = reposted,
            ?t_err,
            ?t_flushed,
            ?collected,
            took = ?t0.elapsed(),
            "re-initialised the QP on the new path"
        );
        if hold {
            // In PSN order ahead of the sends held during the move; nothing else is
            // posted until they go (`release_held`).
            for wr in replay.iter().rev() {
                g.held.push_front(*wr);
            }
            g.mode = Mode::AwaitingPeer {
                on: av.dgid,
                since: Instant::now(),
                rq_psn: q.rq_psn,
            };
            return Ok(());
        }
        // Kicks too: each took a PSN, and every later send must keep its own.
        for wr in &replay {
            self.post_now(&mut g, *wr)?;
        }
        if g.outstanding.is_empty() {
            self.post_kick(&mut g)?;
        }
        Ok(())
    }

    /// Get the QP into ERR: `ToErr::Wait` gives rxe a moment to get there by itself
    /// first, `ToErr::Force` puts it there now. True when apm put it there.
    async fn settle_in_err(&self, how: ToErr) -> Result<bool, ConnError> {
        let mut state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        if how == ToErr::Wait {
            // rxe moves a QP whose send failed to ERR shortly after the error
            // completion; its send PSN there is where the requester rolled back to, the
            // oldest unacknowledged send's. Give it that moment; a QP that stays up is
            // put in ERR here.
            let until = Instant::now() + Duration::from_millis(200);
            while state != QpState::Err && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
                state = self.qp.query(QpAttrMask::STATE)?.qp_state;
            }
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
    /// successful ones for the application. Done as soon as every outstanding send and
    /// every posted receive has its completion: a success, or the flush ERR gives
    /// each (rxe's completer flushes the send queue and its responder the receive
    /// queue when the QP enters ERR, `rxe_qp_error`), so nothing of this QP can reach
    /// the CQ after that. Waiting for the CQ to be quiet instead cost 8 to 22 ms a
    /// move in the VM, every poll being a sleep of a few ms there. Should a completion
    /// never come, it ends once the CQ has been quiet for a moment (2 ms when every
    /// send has its completion, 10 otherwise); at most 500 ms.
    async fn collect_flushes(&self) -> Result<Collected, ConnError> {
        let until = Instant::now() + Duration::from_millis(500);
        let mut quiet_since = Instant::now();
        let mut polls = 0;
        while Instant::now() < until {
            polls += 1;
            let (got, raw) = self.poll_cq(64)?;
            if raw > 0 {
                quiet_since = Instant::now();
            }
            // Successful completions found here are lost to the application otherwise.
            if !got.is_empty() {
                self.lock_pending().extend(got);
            }
            let (sends_settled, all_settled) = {
                let g = self.lock();
                let sends = g.outstanding.iter().all(|w| w.flushed);
                (sends, sends && g.recvs.iter().all(|r| r.flushed))
            };
            if all_settled {
                return Ok(Collected::Everything { polls });
            }
            let quiet_for = if sends_settled {
                Duration::from_millis(2)
            } else {
                Duration::from_millis(10)
            };
            if quiet_since.elapsed() > quiet_for {
                return Ok(Collected::Quiet { polls });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(Collected::TimedOut { polls })
    }

    /// Post every remembered receive again, right after a RESET and INIT (which leave
    /// the QP with none), and mark them posted (no longer flushed); returns how many.
    /// `g` is the connection's state, locked by the caller since the RESET. Every one,
    /// not a list taken earlier: a receive the application posted since (between the
    /// two RESETs of a move that goes back to the old path) is wiped by the RESET too.
    fn repost(&self, g: &mut Inner) -> Result<usize, ConnError> {
        let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
        for r in &mut g.recvs {
            self.qp.post_recv(r.wr_id, &mr, r.offset, r.len)?;
            r.flushed = false;
        }
        Ok(g.recvs.len())
    }

    /// The new path failed: re-initialise on the old one (`q`, as queried in ERR) and
    /// replay there, or, if even that fails, keep the sends outstanding.
    fn back_to_old_path(
        &self,
        params: &ConnectParams,
        q: &QpAttr,
        replay: &[SendWr],
        first_psn: u32,
    ) -> Result<(), ConnError> {
        // Locked from RESET on, as in `reinit`: no receive may reach the QP below INIT.
        let mut g = self.lock();
        let back = self
            .qp
            .modify(&reset(), QpAttrMask::STATE)
            .map_err(ConnError::from)
            .and_then(|()| self.to_init())
            .and_then(|()| self.to_rtr(params, q.ah_attr, q.rq_psn))
            .and_then(|()| self.to_rts(params, first_psn));
        if back.is_ok() {
            self.repost(&mut g)?;
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
    pub async fn repair(&self, grace: Duration) -> Result<(), ConnError> {
        let av = self.qp.query(QpAttrMask::AV)?.ah_attr;
        self.lock().failed = true;
        // The peer is on this path already.
        self.migrate(av, grace, Replay::Now).await.map(|_| ())
    }
}

/// When, after a move, [`RcConn::nudge`] looks whether the sends still wait (ms after the
/// move): often at first, then until about two retransmit timeouts (ACK timeout 14), for
/// a peer that follows tens of milliseconds after us (apm's side whose own rail went
/// down moves without waiting for its peer's answer).
const NUDGE_AT_MS: [u64; 8] = [4, 8, 16, 32, 48, 64, 96, 128];

impl RcConn {
    /// After a move, while nothing sent is acknowledged: post a kick now and then, so
    /// that the peer's move is noticed at once. The peer takes packets only from its
    /// QP's primary address (rxe checks both addresses of every RC packet), so what we
    /// send before it has followed is dropped, and would wait for our retransmit timer
    /// (67 ms at ACK timeout 14). A kick that reaches the peer once it has moved arrives
    /// ahead of the PSN it expects; its responder answers with a PSN-sequence NAK, and our
    /// requester retransmits from there at once. Kicks are zero-length RDMA writes; none
    /// is posted while `KICK_ROOM - 2` are outstanding.
    pub async fn nudge(&self) {
        // A replay held for the peer goes when it is there: nudges start after.
        self.await_release().await;
        let moved_at = Instant::now();
        let acked_then = self.lock().acked;
        for ms in NUDGE_AT_MS {
            tokio::time::sleep_until((moved_at + Duration::from_millis(ms)).into()).await;
            let mut g = self.lock();
            let waiting = g.mode == Mode::Running && !g.failed && !g.outstanding.is_empty();
            if !waiting || g.acked != acked_then {
                return;
            }
            let kicks_out = g.outstanding.iter().filter(|w| w.kick).count();
            if kicks_out >= KICK_ROOM as usize - 2 {
                return;
            }
            if let Err(e) = self.post_kick(&mut g) {
                debug!(qpn = self.qp_num(), error = %e, "nudge not posted");
                return;
            }
            debug!(
                qpn = self.qp_num(),
                after_ms = ms,
                "nudged: nothing acknowledged since the move"
            );
        }
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
/// had to put in ERR (`forced`) was alive: rxe's send PSN is the next one it would have
/// sent, anywhere from the oldest unacknowledged send's (its retransmit timer had just
/// rolled back, in SQD or in the middle of a retransmission) to the one after every
/// outstanding send (one PSN each). Our count (`counted`, the oldest outstanding send's
/// PSN as numbered at posting) is taken when rxe's value lies in that range; otherwise
/// the count has drifted and rxe's next PSN minus the outstanding sends is. With nothing
/// outstanding our count (then the next PSN) is exact.
fn replay_psn(forced: bool, outstanding: usize, rxe_sq_psn: u32, counted: u32) -> u32 {
    if outstanding == 0 {
        return counted & PSN_MASK;
    }
    if !forced {
        return rxe_sq_psn & PSN_MASK;
    }
    let n = u32::try_from(outstanding).unwrap_or(u32::MAX);
    let sent_since_counted = rxe_sq_psn.wrapping_sub(counted) & PSN_MASK;
    if sent_since_counted <= n {
        counted & PSN_MASK
    } else {
        rxe_sq_psn.wrapping_sub(n) & PSN_MASK
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
        assert_eq!(replay_psn(true, 3, 1, 0x00FF_FFFE), 0x00FF_FFFE);
        assert_eq!(replay_psn(false, 0, 77, 0x0100_0005), 5);
    }

    #[test]
    fn a_forced_err_takes_the_count_where_rxe_agrees_with_it() {
        // Every outstanding send on the wire, none acknowledged: rxe is n past the count.
        assert_eq!(replay_psn(true, 5, 105, 100), 100);
        // The retransmit timer had rolled back (a drain that ended just as apm gave up
        // on it): rxe's next PSN is the oldest unacknowledged one.
        assert_eq!(replay_psn(true, 5, 100, 100), 100);
        // Halfway through a retransmission.
        assert_eq!(replay_psn(true, 5, 102, 100), 100);
        // Across the 24-bit wrap.
        assert_eq!(replay_psn(true, 4, 2, 0x00FF_FFFE), 0x00FF_FFFE);
        // A count rxe contradicts (further off than the outstanding sends) gives way.
        assert_eq!(replay_psn(true, 5, 200, 100), 195);
        assert_eq!(replay_psn(true, 5, 99, 100), 94);
    }
}
