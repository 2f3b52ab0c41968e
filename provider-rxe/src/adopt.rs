//! [`AdoptedQp`]: software path migration of an RC QP the application owns.
//!
//! An application that creates, connects, posts to and polls its own QP (a C program
//! through apm's C API, say) hands it to apm, and apm moves its primary address vector
//! when the path fails, with the same SQ-drain procedure [`crate::RcConn`] uses: RTS->SQD,
//! wait until the QP reports the drain done, SQD->SQD with the address vector alone,
//! route-cache flush, SQD->RTS, and one 0-byte RDMA WRITE as the kick (rxe sends work
//! rolled back by the drain only at the next post). Nothing the application posted is
//! lost or duplicated: it may keep posting during the move (work posted in SQD waits and
//! goes out after the kick, in order).
//!
//! What differs from `RcConn`, because apm does not see the application's work:
//! - **Drain completion** is read with `ibv_query_qp` (`sq_draining`) rather than from
//!   `IBV_EVENT_SQ_DRAINED`: that event goes to the application's context, and apm must
//!   not ask for events the application does not expect.
//! - **The kick is unsignalled** ([`KICK_WR_ID`]): with `sq_sig_all = 0` it leaves
//!   nothing in the application's CQ; with `sq_sig_all = 1` its completion carries
//!   [`KICK_WR_ID`] and should be ignored. The peer's QP must allow
//!   `IBV_ACCESS_REMOTE_WRITE` (a 0-byte write carries no key, but rxe checks the
//!   opcode); [`AdoptedQp::new`] checks the local QP's flag, which the peer's apm checks
//!   on its side.
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

/// The work request id of apm's kick on an adopted QP (visible only to applications
/// whose QP signals every send).
pub const KICK_WR_ID: u64 = 0xA9A9_0000_0000_4B1C;

/// `IBV_ACCESS_REMOTE_WRITE`.
const ACCESS_REMOTE_WRITE: u32 = 1 << 1;

/// How often the drain is checked while it runs.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// An application's RC QP under apm's software migration (see the module docs).
#[derive(Debug)]
pub struct AdoptedQp {
    qp: Arc<Qp>,
    /// One migration at a time.
    migration: tokio::sync::Mutex<()>,
    migrations: AtomicU64,
}

impl AdoptedQp {
    /// Take `qp` (from [`Qp::adopt`]) under software migration. Refused when the QP is
    /// not connected (state RTS or SQD) or does not allow remote writes (the kick needs
    /// them at the peer, which runs the same check).
    pub fn new(qp: Arc<Qp>) -> Result<AdoptedQp, ConnError> {
        let a = qp.query(QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS)?;
        if !matches!(a.qp_state, QpState::Rts | QpState::Sqd) {
            return Err(ConnError::Invalid(
                "the QP is not connected (RTS): connect it before handing it to apm",
            ));
        }
        if a.qp_access_flags & ACCESS_REMOTE_WRITE == 0 {
            return Err(ConnError::Invalid(
                "the QP must allow IBV_ACCESS_REMOTE_WRITE: after a path migration apm sends \
                 a 0-byte RDMA WRITE to restart the send queue, and the peer's QP checks it",
            ));
        }
        Ok(AdoptedQp {
            qp,
            migration: tokio::sync::Mutex::new(()),
            migrations: AtomicU64::new(0),
        })
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
        let _one = self.migration.lock().await;
        let qpn = self.qp.qp_num();
        let state = self.qp.query(QpAttrMask::STATE)?.qp_state;
        if matches!(state, QpState::Err | QpState::Sqe | QpState::Reset) {
            return Err(ConnError::Invalid(
                "the QP is in an error state: its posted work was flushed, and only the \
                 application can post it again; reconnect the QP",
            ));
        }
        let started = Instant::now();
        if state == QpState::Rts {
            let sqd = QpAttr {
                qp_state: QpState::Sqd,
                ..QpAttr::default()
            };
            self.qp.modify(&sqd, QpAttrMask::STATE)?;
        }
        let drained = self.wait_drained(drain_timeout).await?;
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
        let rts = self.qp.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        );
        // Work rolled back by the drain (or posted meanwhile) goes out only at the next
        // post, on whichever path the QP now has.
        let kick = rts
            .as_ref()
            .ok()
            .map(|()| self.qp.post_kick_unsignaled(KICK_WR_ID));
        if let Some(Err(e)) = &kick {
            // A full send queue: the application's own next post restarts it.
            warn!(qpn, error = %e, "could not post the kick after the migration");
        }
        moved?;
        rts?;
        self.migrations.fetch_add(1, Ordering::Relaxed);
        info!(qpn, ?after_drain, drained, took = ?started.elapsed(), "moved the application's QP through SQ-drain");
        Ok(())
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
