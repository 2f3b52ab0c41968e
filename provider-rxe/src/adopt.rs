//! [`AdoptedQp`]: software path migration of an RC QP the application owns.
//!
//! An application that creates, connects, posts to and polls its own QP (a C program
//! through apm's C API, say) hands it to apm, and apm moves its primary address vector
//! when the path fails, with the same SQ-drain procedure [`crate::RcConn`] uses: RTS->SQD,
//! wait until the QP reports the drain done, SQD->SQD with the address vector alone,
//! route-cache flush, SQD->RTS, and a kick of the send queue (rxe sends work rolled back
//! by the drain only at the next post). Nothing the application posted is lost or
//! duplicated: it may keep posting during the move (work posted in SQD waits and goes out
//! after the kick, in order).
//!
//! What differs from `RcConn`, because apm does not see the application's work:
//! - **Drain completion** is read with `ibv_query_qp` (`sq_draining`) rather than from
//!   `IBV_EVENT_SQ_DRAINED`: that event goes to the application's context, and apm must
//!   not ask for events the application does not expect.
//! - **The kick posts nothing**: it is the send-queue doorbell alone
//!   ([`Qp::ring_send_doorbell`], the zero-work-request `POST_SEND` command rxe's own
//!   user-space provider writes after each post), which makes rxe's requester send what
//!   the queue holds. No work request means no completion in the application's CQ, also
//!   on QPs created with `sq_sig_all`, and nothing asked of the peer's QP (an earlier
//!   kick was a 0-byte RDMA WRITE, which needed `IBV_ACCESS_REMOTE_WRITE` at the peer
//!   and completed into a `sq_sig_all` CQ). Nothing is required of the application's
//!   access flags.
//! - **The application's own verbs wait for a move**: [`AdoptedQp::hold`] gives a
//!   caller that is about to modify, query or destroy the QP (apm's interposition
//!   library, on the application's behalf) the same lock a migration holds, so the
//!   application never sees the QP in SQD and never destroys it under apm's hands;
//!   [`AdoptedQp::retire`] makes every later migration refuse.
//! - **A QP in ERR is lost**: re-initialising it would flush the application's posted
//!   receives and sends, which only the application can post again. The migration fails
//!   with [`ConnError::Invalid`] naming that, and the engine reports the connection lost.
//! - **No progress monitor**: apm cannot see the completions. Port events and fabric
//!   notices still drive failover, and the application reports a stall it sees
//!   (`apm_core::ManagerHandle::report_stall`).

use crate::conn::ConnError;
use provider_verbs::ffi::{AddressVector, Qp, QpAttr, QpAttrMask, QpState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The work request id apm's kick on an adopted QP once carried. The kick is now the
/// send-queue doorbell alone (no work request, so no completion can carry this id);
/// kept so that programs which skip it keep building.
pub const KICK_WR_ID: u64 = 0xA9A9_0000_0000_4B1C;

/// How often the drain is checked while it runs.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// An application's RC QP under apm's software migration (see the module docs).
#[derive(Debug)]
pub struct AdoptedQp {
    qp: Arc<Qp>,
    /// One migration at a time; also held by the application's own verbs on the QP
    /// ([`AdoptedQp::hold`]). The flag is true once retired.
    migration: tokio::sync::Mutex<bool>,
    migrations: AtomicU64,
    /// How long the last move took, drain to kick, in microseconds (0: none yet).
    last_move_us: AtomicU64,
}

impl AdoptedQp {
    /// Take `qp` (from [`Qp::adopt`]) under software migration. Refused when the QP is
    /// not connected (state RTS or SQD).
    pub fn new(qp: Arc<Qp>) -> Result<AdoptedQp, ConnError> {
        let a = qp.query(QpAttrMask::STATE)?;
        if !matches!(a.qp_state, QpState::Rts | QpState::Sqd) {
            return Err(ConnError::Invalid(
                "the QP is not connected (RTS): connect it before handing it to apm",
            ));
        }
        Ok(AdoptedQp {
            qp,
            migration: tokio::sync::Mutex::new(false),
            migrations: AtomicU64::new(0),
            last_move_us: AtomicU64::new(0),
        })
    }

    /// Wait until no migration runs and keep the next one from starting while the guard
    /// lives: for a caller about to use the QP's control verbs itself (modify, query,
    /// destroy). Waits by polling, so it may be called from any thread, inside an async
    /// runtime or not; a move takes milliseconds (at most the drain timeout).
    pub fn hold(&self) -> tokio::sync::MutexGuard<'_, bool> {
        loop {
            if let Ok(g) = self.migration.try_lock() {
                return g;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Stop migrating this QP for good (the application is about to destroy it, or took
    /// it out of RTS): waits for a move in progress, and every later one is refused.
    pub fn retire(&self) {
        *self.hold() = true;
    }

    /// How long the last move took, from the drain to the kick.
    pub fn last_move(&self) -> Option<Duration> {
        match self.last_move_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// The QP.
    pub fn qp(&self) -> &Arc<Qp> {
        &self.qp
    }

    /// Migrations done.
    pub fn migrations(&self) -> u64 {
        self.migrations.load(Ordering::Relaxed)
    }

    /// Move the primary path to `av` through the SQ drain. On failure the QP is back in
    /// RTS on its old path where that is possible.
    pub async fn migrate(
        &self,
        av: AddressVector,
        drain_timeout: Duration,
    ) -> Result<(), ConnError> {
        let retired = self.migration.lock().await;
        if *retired {
            return Err(ConnError::Invalid(
                "the application is done with the QP (destroyed or taken out of RTS)",
            ));
        }
        let qpn = self.qp.qp_num();
        let state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        if matches!(state, QpState::Err | QpState::Sqe | QpState::Reset) {
            return Err(ConnError::Invalid(
                "the QP is in an error state: its posted work was flushed, and only the \
                 application can post it again; reconnect the QP",
            ));
        }
        let started = Instant::now();
        // A drain with work lost on the dead path ends only once the QP's own retransmit
        // timer has fired (rxe then rolls the send queue back): wait for at least three
        // of its ACK timeouts (rdma_cm's default on RoCE is ~1 s).
        let wait = drain_timeout.max(3 * self.ack_timeout());
        if state == QpState::Rts {
            let sqd = QpAttr {
                qp_state: QpState::Sqd,
                ..QpAttr::default()
            };
            self.qp.modify(&sqd, QpAttrMask::STATE)?;
        }
        let drained = self.wait_drained(wait).await?;
        let after_drain = started.elapsed();
        let moved = self.qp.modify(
            &QpAttr {
                ah_attr: av,
                ..QpAttr::default()
            },
            QpAttrMask::AV,
        );
        if moved.is_ok() {
            crate::route::flush_route_cache();
        }
        let rts = self.back_to_rts(wait).await;
        // Work rolled back by the drain (or posted meanwhile) goes out only at the next
        // post, on whichever path the QP now has: ring the doorbell (no work request).
        let kick = rts.as_ref().ok().map(|()| self.qp.ring_send_doorbell());
        if let Some(Err(e)) = &kick {
            // The application's own next post restarts the queue.
            warn!(qpn, error = %e, "could not ring the send doorbell after the migration");
        }
        moved?;
        rts?;
        self.migrations.fetch_add(1, Ordering::Relaxed);
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_move_us.store(took.max(1), Ordering::Relaxed);
        info!(qpn, ?after_drain, drained, took = ?started.elapsed(), "moved the application's QP through SQ-drain");
        Ok(())
    }

    /// The QP's local ACK timeout (4.096 us * 2^timeout); 0 when it has none.
    fn ack_timeout(&self) -> Duration {
        let t = self
            .qp
            .query(QpAttrMask::TIMEOUT)
            .map_or(0, |a| a.timeout.min(31));
        if t == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(4096u64 << t)
    }

    /// SQD -> RTS. rxe refuses it while the send queue still drains (the drain ends
    /// when the retransmit timer fires): retry until it is accepted or `limit` passed,
    /// so a QP is never left in SQD.
    async fn back_to_rts(&self, limit: Duration) -> Result<(), provider_verbs::VerbsError> {
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        let until = Instant::now() + limit;
        loop {
            match self.qp.modify(&rts, QpAttrMask::STATE) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < until => {
                    debug!(qpn = self.qp.qp_num(), error = %e, "SQD -> RTS refused: still draining");
                    tokio::time::sleep(DRAIN_POLL * 5).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Wait until the QP is in SQD and no longer draining. After `timeout` the move goes
    /// ahead anyway (rxe accepts an address-vector change while draining, and a drain on a
    /// dead path may not end); returns whether the drain was seen to end.
    async fn wait_drained(&self, timeout: Duration) -> Result<bool, ConnError> {
        let until = Instant::now() + timeout;
        loop {
            let a = self.qp.query(QpAttrMask::STATE)?;
            match a.qp_state {
                QpState::Sqd if !a.sq_draining => return Ok(true),
                QpState::Sqd => {}
                QpState::Err | QpState::Sqe => {
                    return Err(ConnError::Invalid(
                        "the QP failed while its send queue drained: its posted work was \
                         flushed; reconnect the QP",
                    ))
                }
                other => debug!(qpn = self.qp.qp_num(), ?other, "waiting for SQD"),
            }
            if Instant::now() >= until {
                warn!(
                    qpn = self.qp.qp_num(),
                    ?timeout,
                    "the drain did not end: moving anyway"
                );
                return Ok(false);
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }
}
