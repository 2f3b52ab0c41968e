//! [`RcConn`]: an RC queue pair whose sends and receives go through apm, so that its
//! primary path can be moved in software without losing or duplicating a message.
//!
//! On RoCE the path lives in the QP's primary address vector; moving it needs the send
//! queue quiet (SQ-drain) or, when the QP already failed into ERR, a full
//! re-initialisation. Both need to know what is outstanding, so the application posts and
//! polls through this type instead of the raw QP:
//!
//! - every send is numbered with the PSN rxe gives it (one PSN per packet, sends of up to
//!   one MTU: see [`RcConn::post_send`]), kept until its completion, and replayed after a
//!   re-initialisation with its original PSN, so the peer's responder delivers what it
//!   has not seen and acknowledges (without delivering again) what it has;
//! - every posted receive is remembered, and reposted after a re-initialisation;
//! - flush completions of that work are swallowed and counted ([`ConnStats`]): the
//!   application sees each message's completion once, or not at all if it never
//!   completed, and learns what was flushed and replayed from the stats;
//! - while a migration runs, new sends are held and posted right after it.
//!
//! It also feeds the progress monitor ([`crate::facet`]): when outstanding sends stop
//! completing for longer than the stall timeout, or a send fails, the path is reported
//! stalled. What it must never do: hand the application a flush error for work it is
//! going to replay, or post a send whose PSN it cannot account for.

use provider_verbs::ffi::{
    AddressVector, Context, Cq, Mr, Mtu, Pd, Qp, QpAttr, QpAttrMask, QpCaps, QpState, WcStatus,
};
use provider_verbs::VerbsError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Application work request ids must stay below this (the top two bits tag apm's own).
pub const MAX_WR_ID: u64 = (1 << 62) - 1;
const SEND_TAG: u64 = 1 << 62;
const KICK_TAG: u64 = 1 << 63;
/// `IBV_WC_WR_FLUSH_ERR`.
const WC_WR_FLUSH_ERR: u32 = 5;
/// PSNs are 24 bits.
const PSN_MASK: u32 = 0x00FF_FFFF;

/// Errors of [`RcConn`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The caller's request is unusable.
    #[error("{0}")]
    Invalid(&'static str),
    /// The QP did not reach the state a migration needs in time.
    #[error("{0} timed out")]
    Timeout(&'static str),
}

/// How the QP is connected (kept for a re-initialisation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// The peer's QPN.
    pub remote_qpn: u32,
    /// The PSN of the peer's first send (our receive PSN).
    pub remote_psn: u32,
    /// The PSN of our first send.
    pub local_psn: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout (4.096 us * 2^timeout). 14 is ~67 ms.
    pub timeout: u8,
    /// Transport retries; 7 on rxe retries forever, so a dead path never errors and the
    /// progress monitor has to notice it.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
}

/// What has happened to the connection's work because of migrations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Migrations through the SQ-drain state (nothing flushed).
    pub drain_migrations: u64,
    /// Migrations by re-initialisation (the QP was in ERR).
    pub reinit_migrations: u64,
    /// Sends flushed by ERR and replayed with their original PSNs.
    pub flushed_sends: u64,
    /// Receives flushed by ERR and posted again.
    pub flushed_recvs: u64,
    /// Sends held while a migration ran, posted after it.
    pub held_sends: u64,
    /// Send completions with an error other than a flush (the path failed under them).
    pub send_errors: u64,
}

/// One completion as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The application's work request id.
    pub wr_id: u64,
    /// True for a receive, false for a send.
    pub recv: bool,
    /// Bytes received.
    pub byte_len: u32,
    /// Immediate data.
    pub imm: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct SendWr {
    wr_id: u64,
    offset: usize,
    len: usize,
    imm: Option<u32>,
    psn: u32,
    kick: bool,
}

#[derive(Debug, Clone, Copy)]
struct RecvWr {
    wr_id: u64,
    offset: usize,
    len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Running,
    /// A migration runs: sends are held.
    Migrating,
}

#[derive(Debug)]
struct Inner {
    mode: Mode,
    params: Option<ConnectParams>,
    mtu_bytes: usize,
    next_psn: u32,
    outstanding: VecDeque<SendWr>,
    held: VecDeque<SendWr>,
    recvs: VecDeque<RecvWr>,
    kicks: u64,
    /// Last time a send completed, or the first send went out on an idle QP.
    last_progress: Instant,
    /// A send failed (the QP is in ERR, or about to be).
    failed: bool,
    /// When the current stall was last reported (cleared by progress).
    reported_at: Option<Instant>,
    /// When the last migration ended: the peer may still be moving, so a stall is not
    /// reported until `3 * stall` later.
    migrated_at: Option<Instant>,
    /// Repairs since the last send completed (bounded: a path that keeps failing is
    /// reported instead).
    repairs: u32,
    stats: ConnStats,
}

/// An RC connection driven through apm (see the module docs).
pub struct RcConn {
    ctx: Context,
    port: u8,
    qp: Arc<Qp>,
    cq: Cq,
    mr: Mutex<Mr>,
    _pd: Pd,
    inner: Mutex<Inner>,
    /// Successful completions a re-initialisation found while collecting flushes: handed
    /// to the application at its next poll.
    pending: Mutex<Vec<Completion>>,
    /// `IBV_EVENT_SQ_DRAINED` count, bumped by the facet's event hook.
    drained: AtomicU64,
    drained_notify: tokio::sync::Notify,
    /// One migration (or repair) at a time.
    migration: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for RcConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcConn")
            .field("device", &self.ctx.name())
            .field("qpn", &self.qp.qp_num())
            .finish_non_exhaustive()
    }
}

/// The stall verdict of [`RcConn::check_stall`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// Sends complete (or none is outstanding).
    Healthy,
    /// Report the primary path as stalled now.
    Report,
    /// Stalled and already reported recently.
    Reported,
    /// A send failed right after a migration, on the new path: re-initialise the QP on
    /// that same path ([`RcConn::repair`]) instead of moving again (the peer is there
    /// already).
    Repair,
}

impl RcConn {
    /// A QP on `ctx` port `port` with `depth` sends and `depth` receives, and a registered
    /// buffer of `buf_len` bytes that work requests address by offset.
    pub fn create(
        ctx: &Context,
        port: u8,
        depth: u32,
        buf_len: usize,
    ) -> Result<RcConn, ConnError> {
        let pd = ctx.alloc_pd()?;
        let cqe = i32::try_from(depth.saturating_mul(2).saturating_add(8))
            .map_err(|_| ConnError::Invalid("queue depth too large"))?;
        let cq = ctx.create_cq(cqe)?;
        let mr = pd.reg_mr(buf_len)?;
        let qp = pd.create_rc_qp(
            &cq,
            &cq,
            QpCaps {
                // Room for the kicks a migration posts.
                max_send_wr: depth.saturating_add(4),
                max_recv_wr: depth,
            },
        )?;
        Ok(RcConn {
            ctx: ctx.clone(),
            port,
            qp: Arc::new(qp),
            cq,
            mr: Mutex::new(mr),
            _pd: pd,
            inner: Mutex::new(Inner {
                mode: Mode::Running,
                params: None,
                mtu_bytes: 1024,
                next_psn: 0,
                outstanding: VecDeque::new(),
                held: VecDeque::new(),
                recvs: VecDeque::new(),
                kicks: 0,
                last_progress: Instant::now(),
                failed: false,
                reported_at: None,
                migrated_at: None,
                repairs: 0,
                stats: ConnStats::default(),
            }),
            pending: Mutex::new(Vec::new()),
            drained: AtomicU64::new(0),
            drained_notify: tokio::sync::Notify::new(),
            migration: tokio::sync::Mutex::new(()),
        })
    }

    /// The QP (for registration with provider-verbs and for queries).
    pub fn qp(&self) -> &Arc<Qp> {
        &self.qp
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The local port.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// Counters of flushed, replayed and held work.
    pub fn stats(&self) -> ConnStats {
        self.lock().stats
    }

    /// Copy `data` into the buffer at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), ConnError> {
        let mut mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
        let dst = offset
            .checked_add(data.len())
            .and_then(|end| mr.as_mut_slice().get_mut(offset..end))
            .ok_or(ConnError::Invalid("write outside the buffer"))?;
        dst.copy_from_slice(data);
        Ok(())
    }

    /// Read `len` bytes of the buffer at `offset`.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, ConnError> {
        let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
        offset
            .checked_add(len)
            .and_then(|end| mr.as_slice().get(offset..end))
            .map(<[u8]>::to_vec)
            .ok_or(ConnError::Invalid("read outside the buffer"))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the state consistent: keep using it after a panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// RESET -> INIT -> RTR -> RTS towards the peer along `av`.
    pub fn connect(&self, params: ConnectParams, av: AddressVector) -> Result<(), ConnError> {
        self.to_init()?;
        self.to_rtr(&params, av, params.remote_psn)?;
        self.to_rts(&params, params.local_psn)?;
        let mut g = self.lock();
        g.params = Some(params);
        g.mtu_bytes = mtu_bytes(params.mtu);
        g.next_psn = params.local_psn & PSN_MASK;
        g.last_progress = Instant::now();
        Ok(())
    }

    fn to_init(&self) -> Result<(), ConnError> {
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: provider_verbs::ffi::sys::IBV_ACCESS_REMOTE_WRITE,
            ..QpAttr::default()
        };
        self.qp.modify(
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        Ok(())
    }

    fn to_rtr(&self, p: &ConnectParams, av: AddressVector, rq_psn: u32) -> Result<(), ConnError> {
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: p.mtu,
            dest_qp_num: p.remote_qpn,
            rq_psn: rq_psn & PSN_MASK,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: av,
            ..QpAttr::default()
        };
        self.qp.modify(
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        Ok(())
    }

    fn to_rts(&self, p: &ConnectParams, sq_psn: u32) -> Result<(), ConnError> {
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: sq_psn & PSN_MASK,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        self.qp.modify(
            &rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )?;
        Ok(())
    }

    /// Post a receive of up to `len` bytes into the buffer at `offset`.
    pub fn post_recv(&self, wr_id: u64, offset: usize, len: usize) -> Result<(), ConnError> {
        if wr_id > MAX_WR_ID {
            return Err(ConnError::Invalid("work request ids must stay below 2^62"));
        }
        let mut g = self.lock();
        {
            let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
            self.qp.post_recv(wr_id, &mr, offset, len)?;
        }
        g.recvs.push_back(RecvWr { wr_id, offset, len });
        Ok(())
    }

    /// Post a signalled send of `len` bytes at `offset` (at most one path MTU, so that it
    /// takes exactly one PSN). During a migration it is held and posted right after.
    pub fn post_send(
        &self,
        wr_id: u64,
        offset: usize,
        len: usize,
        imm: Option<u32>,
    ) -> Result<(), ConnError> {
        if wr_id > MAX_WR_ID {
            return Err(ConnError::Invalid("work request ids must stay below 2^62"));
        }
        let mut g = self.lock();
        if len > g.mtu_bytes {
            return Err(ConnError::Invalid(
                "sends are limited to one path MTU (one PSN each)",
            ));
        }
        let wr = SendWr {
            wr_id,
            offset,
            len,
            imm,
            psn: 0,
            kick: false,
        };
        if g.mode == Mode::Migrating || g.failed {
            g.stats.held_sends += 1;
            g.held.push_back(wr);
            return Ok(());
        }
        self.post_now(&mut g, wr)
    }

    /// Post one send now, with the next PSN.
    fn post_now(&self, g: &mut Inner, mut wr: SendWr) -> Result<(), ConnError> {
        wr.psn = g.next_psn;
        if wr.kick {
            self.qp.post_kick(KICK_TAG | (wr.wr_id & MAX_WR_ID))?;
        } else {
            let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
            self.qp
                .post_send(SEND_TAG | wr.wr_id, &mr, wr.offset, wr.len, wr.imm)?;
        }
        if g.outstanding.is_empty() {
            g.last_progress = Instant::now();
        }
        g.next_psn = (g.next_psn + 1) & PSN_MASK;
        g.outstanding.push_back(wr);
        Ok(())
    }

    fn post_kick(&self, g: &mut Inner) -> Result<(), ConnError> {
        g.kicks += 1;
        let wr = SendWr {
            wr_id: g.kicks,
            offset: 0,
            len: 0,
            imm: None,
            psn: 0,
            kick: true,
        };
        self.post_now(g, wr)
    }

    /// Poll up to `max` completions. Flushes of work that will be replayed are swallowed;
    /// a send that fails marks the path failed (the monitor reports it at once).
    pub fn poll(&self, max: usize) -> Result<Vec<Completion>, ConnError> {
        let mut out = std::mem::take(&mut *self.lock_pending());
        out.extend(self.poll_cq(max)?.0);
        Ok(out)
    }

    /// Poll the CQ: the application's completions, and how many the CQ gave in all.
    fn poll_cq(&self, max: usize) -> Result<(Vec<Completion>, usize), ConnError> {
        let wcs = self.cq.poll(max)?;
        let raw = wcs.len();
        if wcs.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let mut g = self.lock();
        let mut out = Vec::with_capacity(wcs.len());
        for wc in wcs {
            let ok = wc.status.is_success();
            if wc.wr_id & (SEND_TAG | KICK_TAG) != 0 {
                let kick = wc.wr_id & KICK_TAG != 0;
                let id = wc.wr_id & MAX_WR_ID;
                if !ok {
                    note_send_error(&mut g, &wc.status);
                    continue;
                }
                // RC completes sends in order: it is the oldest (search to stay safe).
                let pos = g
                    .outstanding
                    .iter()
                    .position(|w| w.kick == kick && w.wr_id == id);
                if let Some(p) = pos {
                    g.outstanding.remove(p);
                }
                g.last_progress = Instant::now();
                g.reported_at = None;
                g.repairs = 0;
                if !kick {
                    out.push(Completion {
                        wr_id: id,
                        recv: false,
                        byte_len: wc.byte_len,
                        imm: wc.imm,
                    });
                }
            } else if ok {
                if let Some(p) = g.recvs.iter().position(|r| r.wr_id == wc.wr_id) {
                    g.recvs.remove(p);
                }
                out.push(Completion {
                    wr_id: wc.wr_id,
                    recv: true,
                    byte_len: wc.byte_len,
                    imm: wc.imm,
                });
            }
            // A flushed receive stays in `recvs`: it is posted again after re-init.
        }
        Ok((out, raw))
    }

    /// The progress monitor's check: a failed send reports at once; outstanding sends
    /// with no completion for `stall` report once, then again every `4 * stall`. For
    /// `3 * stall` after a migration only a failed send reports: the peer may still be
    /// moving its side, and until it has, nothing it receives from us is acknowledged.
    pub fn check_stall(&self, now: Instant, stall: Duration) -> Stall {
        let mut g = self.lock();
        let g = &mut *g;
        let view = StallView {
            migrating: g.mode == Mode::Migrating,
            failed: g.failed,
            outstanding: !g.outstanding.is_empty(),
            last_progress: g.last_progress,
            migrated_at: g.migrated_at,
        };
        stall_verdict(&view, now, stall, &mut g.reported_at, &mut g.repairs)
    }

    /// Record an `IBV_EVENT_SQ_DRAINED` for this QP (the facet's event hook calls it).
    pub fn sq_drained(&self) {
        self.drained.fetch_add(1, Ordering::SeqCst);
        self.drained_notify.notify_waiters();
    }

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
        let q = self
            .qp
            .query(QpAttrMask::STATE | QpAttrMask::RQ_PSN | QpAttrMask::SQ_PSN | QpAttrMask::AV)?;
        let params = self
            .lock()
            .params
            .ok_or(ConnError::Invalid("the connection was never connected"))?;
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        self.qp.modify(&reset, QpAttrMask::STATE)?;
        self.to_init()?;
        let mut g = self.lock();
        let recvs: Vec<RecvWr> = g.recvs.iter().copied().collect();
        {
            let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
            for r in &recvs {
                self.qp.post_recv(r.wr_id, &mr, r.offset, r.len)?;
            }
        }
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
            let back = self
                .qp
                .modify(&reset, QpAttrMask::STATE)
                .map_err(ConnError::from)
                .and_then(|()| self.to_init())
                .and_then(|()| self.to_rtr(&params, q.ah_attr, q.rq_psn))
                .and_then(|()| self.to_rts(&params, first_psn));
            let mut g = self.lock();
            if back.is_ok() {
                {
                    let mr = self.mr.lock().unwrap_or_else(PoisonError::into_inner);
                    for r in &recvs {
                        self.qp.post_recv(r.wr_id, &mr, r.offset, r.len)?;
                    }
                }
                g.next_psn = first_psn;
                // Kicks too: each took a PSN, and every later send must keep its own.
                for wr in &replay {
                    self.post_now(&mut g, *wr)?;
                }
            } else {
                g.outstanding.extend(replay.iter().copied());
            }
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

    /// The QP failed on the path it was just moved to (e.g. a send the link-down had
    /// already doomed): re-initialise it on its current path, replaying what was flushed.
    pub async fn repair(&self, drain_timeout: Duration) -> Result<(), ConnError> {
        let av = self.qp.query(QpAttrMask::AV)?.ah_attr;
        self.lock().failed = true;
        self.migrate(av, drain_timeout).await.map(|_| ())
    }

    fn lock_pending(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the stall verdict looks at.
#[derive(Debug, Clone, Copy)]
struct StallView {
    migrating: bool,
    failed: bool,
    outstanding: bool,
    last_progress: Instant,
    migrated_at: Option<Instant>,
}

/// The progress monitor's rule (see [`RcConn::check_stall`]); updates when the stall was
/// reported and how many repairs ran.
fn stall_verdict(
    v: &StallView,
    now: Instant,
    stall: Duration,
    reported_at: &mut Option<Instant>,
    repairs: &mut u32,
) -> Stall {
    if v.migrating {
        return Stall::Healthy;
    }
    let settling = v
        .migrated_at
        .is_some_and(|t| now.saturating_duration_since(t) < stall * 3);
    if settling {
        if v.failed && *repairs < 2 {
            *repairs += 1;
            return Stall::Repair;
        }
        if !v.failed {
            return Stall::Healthy;
        }
    }
    let stalled =
        v.failed || (v.outstanding && now.saturating_duration_since(v.last_progress) > stall);
    if !stalled {
        return Stall::Healthy;
    }
    match *reported_at {
        Some(at) if now.saturating_duration_since(at) < stall * 4 => Stall::Reported,
        _ => {
            *reported_at = Some(now);
            Stall::Report
        }
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

fn note_send_error(g: &mut Inner, status: &WcStatus) {
    if status.code != WC_WR_FLUSH_ERR {
        g.stats.send_errors += 1;
        warn!(status = %status.text, "send failed: the path is down");
    }
    g.failed = true;
}

fn mtu_bytes(m: Mtu) -> usize {
    match m {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
        _ => 256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_millis(300);

    fn view(t0: Instant) -> StallView {
        StallView {
            migrating: false,
            failed: false,
            outstanding: true,
            last_progress: t0,
            migrated_at: None,
        }
    }

    #[test]
    fn outstanding_sends_without_progress_report_once_then_every_four_timeouts() {
        let t0 = Instant::now();
        let v = view(t0);
        let (mut rep, mut repairs) = (None, 0);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            stall_verdict(&v, at(200), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
        assert_eq!(
            stall_verdict(&v, at(301), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        assert_eq!(
            stall_verdict(&v, at(900), STALL, &mut rep, &mut repairs),
            Stall::Reported
        );
        assert_eq!(
            stall_verdict(&v, at(1502), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        // Nothing outstanding: an idle QP is never reported.
        let idle = StallView {
            outstanding: false,
            ..v
        };
        let mut rep = None;
        assert_eq!(
            stall_verdict(&idle, at(5000), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
        // During a migration: never.
        let moving = StallView {
            migrating: true,
            failed: true,
            ..v
        };
        assert_eq!(
            stall_verdict(&moving, at(5000), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
    }

    #[test]
    fn a_failed_send_reports_at_once_but_is_repaired_right_after_a_migration() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let failed = StallView {
            failed: true,
            last_progress: at(0),
            ..view(t0)
        };
        let (mut rep, mut repairs) = (None, 0);
        assert_eq!(
            stall_verdict(&failed, at(1), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        // Just moved: settle (no report for a slow peer), repair a failure in place, twice
        // at most, then report.
        let moved = StallView {
            failed: false,
            migrated_at: Some(at(1000)),
            ..view(t0)
        };
        let (mut rep, mut repairs) = (None, 0);
        assert_eq!(
            stall_verdict(&moved, at(1800), STALL, &mut rep, &mut repairs),
            Stall::Healthy
        );
        let broke = StallView {
            failed: true,
            ..moved
        };
        assert_eq!(
            stall_verdict(&broke, at(1100), STALL, &mut rep, &mut repairs),
            Stall::Repair
        );
        assert_eq!(
            stall_verdict(&broke, at(1200), STALL, &mut rep, &mut repairs),
            Stall::Repair
        );
        assert_eq!(
            stall_verdict(&broke, at(1300), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
        // After the settling time a slow path is reported as usual.
        let mut rep = None;
        assert_eq!(
            stall_verdict(&moved, at(1901), STALL, &mut rep, &mut repairs),
            Stall::Report
        );
    }

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
