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
//! - **The waits are bounded**: the application's destroy ([`AdoptedQp::retire`]) stops a
//!   move in progress at its next check (milliseconds), and its other verbs may give up
//!   waiting ([`AdoptedQp::hold_within`]) when a move lasts longer than they should wait.
//! - **A move finishes in RTS**: a QP apm took from RTS to SQD goes back to RTS however
//!   long its drain lasts (rxe refuses SQD->RTS until the drain has ended, which on a
//!   dead path is the QP's own retransmit timer), unless it fails meanwhile or the
//!   application retires it. A QP the application had put in SQD itself is left there,
//!   on its new path. The caller should run a move to its end even when nobody waits for
//!   its result any more (provider-rxe's facet runs it as a task of its own), so that the
//!   QP is never left in SQD.
//! - **Its drains are announced** ([`AdoptedQp::on_drain`]): rxe raises
//!   `IBV_EVENT_SQ_DRAINED` on the application's context after every RTS->SQD, whatever
//!   `en_sqd_async_notify` says, so whoever passes the application its events must be
//!   able to tell apm's drains from the application's own.
//! - **A QP in ERR is lost**: re-initialising it would flush the application's posted
//!   receives and sends, which only the application can post again. The migration fails
//!   with [`ConnError::Invalid`] naming that, and the engine reports the connection lost.
//! - **No progress monitor**: apm cannot see the completions. Port events and fabric
//!   notices still drive failover, and the application reports a stall it sees
//!   (`apm_core::ManagerHandle::report_stall`).

use crate::conn::ConnError;
use provider_verbs::ffi::{AddressVector, Qp, QpAttr, QpAttrMask, QpState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The work request id apm's kick on an adopted QP once carried. The kick is now the
/// send-queue doorbell alone (no work request, so no completion can carry this id);
/// kept so that programs which skip it keep building.
pub const KICK_WR_ID: u64 = 0xA9A9_0000_0000_4B1C;

/// How often the drain is checked while it runs.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// How often SQD -> RTS is tried again once a drain has outlasted the move's own limit.
const LATE_RTS_POLL: Duration = Duration::from_millis(50);

/// What [`AdoptedQp::on_drain`]'s hook is told about a drain of apm's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainNote {
    /// apm is about to take the QP from RTS to SQD: the device will raise one
    /// `SQ_DRAINED` for it when the drain ends.
    Requested,
    /// The drain announced last will raise nothing after all: the modify was refused,
    /// or the QP failed before its drain was seen to end.
    Withdrawn,
}

/// Told of every drain of apm's on the QP, before the device can raise its event.
pub type DrainHook = Box<dyn Fn(DrainNote) + Send + Sync>;

/// An application's RC QP under apm's software migration (see the module docs).
pub struct AdoptedQp {
    qp: Arc<Qp>,
    /// One migration at a time; also held by the application's own verbs on the QP
    /// ([`AdoptedQp::hold`]). The flag is true once retired.
    migration: tokio::sync::Mutex<bool>,
    /// The application is about to destroy the QP or take it out of RTS: a move in
    /// progress stops at its next check.
    retiring: AtomicBool,
    migrations: AtomicU64,
    /// How long the last move took, drain to kick, in microseconds (0: none yet).
    last_move_us: AtomicU64,
    drain_hook: OnceLock<DrainHook>,
}

impl std::fmt::Debug for AdoptedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdoptedQp")
            .field("qp", &self.qp)
            .field("migrations", &self.migrations)
            .finish_non_exhaustive()
    }
}

/// Why a move stops for an application that is done with the QP.
const RETIRED: ConnError =
    ConnError::Invalid("the application is done with the QP (destroyed or taken out of RTS)");

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
            retiring: AtomicBool::new(false),
            migrations: AtomicU64::new(0),
            last_move_us: AtomicU64::new(0),
            drain_hook: OnceLock::new(),
        })
    }

    /// Tell `hook` of every drain apm starts on the QP (once per QP; a second hook is
    /// ignored). It runs on apm's thread, before the RTS -> SQD modify and after a
    /// drain that will raise nothing.
    pub fn on_drain(&self, hook: DrainHook) {
        let _ = self.drain_hook.set(hook);
    }

    fn note_drain(&self, note: DrainNote) {
        if let Some(hook) = self.drain_hook.get() {
            hook(note);
        }
    }

    /// Wait until no migration runs and keep the next one from starting while the guard
    /// lives: for a caller about to use the QP's control verbs itself (modify, query,
    /// destroy). Waits by polling, so it may be called from any thread, inside an async
    /// runtime or not; a move takes milliseconds (at most the drain timeout).
    pub fn hold(&self) -> tokio::sync::MutexGuard<'_, bool> {
        loop {
            if let Some(g) = self.hold_within(Duration::from_secs(3600)) {
                return g;
            }
        }
    }

    /// [`AdoptedQp::hold`], waiting at most `limit`: `None` when a move still runs then
    /// (a drain on a dead path lasts until the QP's own retransmit timer fires).
    pub fn hold_within(&self, limit: Duration) -> Option<tokio::sync::MutexGuard<'_, bool>> {
        let since = Instant::now();
        loop {
            if let Ok(g) = self.migration.try_lock() {
                return Some(g);
            }
            if since.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Stop migrating this QP for good (the application is about to destroy it, or took
    /// it out of RTS): a move in progress stops at its next check (it never touches the
    /// QP again), and every later one is refused. Returns once no move runs.
    pub fn retire(&self) {
        self.retiring.store(true, Ordering::SeqCst);
        *self.hold() = true;
    }

    /// `Err` once the application is done with the QP.
    fn still_ours(&self) -> Result<(), ConnError> {
        if self.retiring.load(Ordering::SeqCst) {
            return Err(RETIRED);
        }
        Ok(())
    }

    /// Query the QP while no move runs (waits for one in progress); refused once the
    /// application is done with it, whose destroy may have freed it.
    pub async fn query(&self, mask: QpAttrMask) -> Result<QpAttr, ConnError> {
        let retired = self.migration.lock().await;
        if *retired {
            return Err(RETIRED);
        }
        Ok(self.qp.query(mask)?)
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
    /// RTS on its old path where that is possible. A QP the application had put in SQD
    /// itself gets its new path and stays in SQD.
    pub async fn migrate(
        &self,
        av: AddressVector,
        drain_timeout: Duration,
    ) -> Result<(), ConnError> {
        let retired = self.migration.lock().await;
        if *retired {
            return Err(RETIRED);
        }
        self.still_ours()?;
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
        let ours = state == QpState::Rts;
        if ours {
            self.enter_sqd()?;
        }
        let drained = match self.wait_drained(wait).await {
            Ok(d) => d,
            Err(e) => {
                if ours {
                    // Failed while draining: the device raises nothing for it.
                    self.note_drain(DrainNote::Withdrawn);
                }
                return Err(e);
            }
        };
        let after_drain = started.elapsed();
        self.still_ours()?;
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
        if !ours {
            moved?;
            info!(
                qpn,
                "moved the application's QP, which it keeps in SQD itself"
            );
            return self.moved(started);
        }
        let rts = self.back_to_rts(wait, drained).await;
        // Work rolled back by the drain (or posted meanwhile) goes out only at the next
        // post, on whichever path the QP now has: ring the doorbell (no work request).
        let kick = rts.as_ref().ok().map(|()| self.qp.ring_send_doorbell());
        if let Some(Err(e)) = &kick {
            // The application's own next post restarts the queue.
            warn!(qpn, error = %e, "could not ring the send doorbell after the migration");
        }
        moved?;
        rts?;
        info!(qpn, ?after_drain, drained, took = ?started.elapsed(), "moved the application's QP through SQ-drain");
        self.moved(started)
    }

    /// RTS -> SQD, the drain announced first (the device may raise its event before the
    /// modify returns).
    fn enter_sqd(&self) -> Result<(), ConnError> {
        self.note_drain(DrainNote::Requested);
        let sqd = QpAttr {
            qp_state: QpState::Sqd,
            ..QpAttr::default()
        };
        self.qp.modify(&sqd, QpAttrMask::STATE).map_err(|e| {
            self.note_drain(DrainNote::Withdrawn);
            ConnError::from(e)
        })
    }

    /// Count a move that went through, started at `started`.
    fn moved(&self, started: Instant) -> Result<(), ConnError> {
        self.migrations.fetch_add(1, Ordering::Relaxed);
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_move_us.store(took.max(1), Ordering::Relaxed);
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
    /// when the retransmit timer fires): retried every few milliseconds until `limit`,
    /// then more slowly for as long as the QP stays in SQD, so that a move never leaves
    /// it there, however long its drain lasts. Ends early when the QP fails (ERR: the
    /// drain then raises nothing, which is said unless `drained`) or the application
    /// retires it.
    async fn back_to_rts(&self, limit: Duration, drained: bool) -> Result<(), ConnError> {
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        let qpn = self.qp.qp_num();
        let until = Instant::now() + limit;
        let mut said = false;
        loop {
            self.still_ours()?;
            let e = match self.qp.modify(&rts, QpAttrMask::STATE) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() < until {
                debug!(qpn, error = %e, "SQD -> RTS refused: still draining");
                tokio::time::sleep(DRAIN_POLL * 5).await;
                continue;
            }
            let a = self.qp.query(QpAttrMask::STATE)?;
            if a.qp_state != QpState::Sqd {
                if !drained {
                    self.note_drain(DrainNote::Withdrawn);
                }
                return Err(e.into());
            }
            if !said {
                warn!(qpn, ?limit, error = %e, "the drain outlasts the move's limit: SQD -> RTS is tried until it is taken");
                said = true;
            }
            tokio::time::sleep(LATE_RTS_POLL).await;
        }
    }

    /// Wait until the QP is in SQD and no longer draining. After `timeout` the move goes
    /// ahead anyway (rxe accepts an address-vector change while draining, and a drain on a
    /// dead path may not end); returns whether the drain was seen to end.
    async fn wait_drained(&self, timeout: Duration) -> Result<bool, ConnError> {
        let until = Instant::now() + timeout;
        loop {
            self.still_ours()?;
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
