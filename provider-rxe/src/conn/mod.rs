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
//! - every posted receive is remembered, and reposted after a re-initialisation, which
//!   collects the old QP's completions until each send and each receive has its own
//!   (rxe flushes both queues on ERR);
//! - flush completions of that work are swallowed and counted ([`ConnStats`]): the
//!   application sees each message's completion once, or not at all if it never
//!   completed, and learns what was flushed and replayed from the stats;
//! - while a migration runs, new sends are held and posted right after it;
//! - a re-initialisation that moves before the peer does (`Replay::WhenPeerThere`,
//!   `Replay::HeldUntilPeerThere`) holds its replay, and new sends behind it, until the
//!   peer is there: see [`RcConn::peer_there`].
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

mod hold;
mod migrate;
mod stall;

use stall::{stall_verdict, StallView};

/// Application work request ids must stay below this (the top two bits tag apm's own).
pub const MAX_WR_ID: u64 = (1 << 62) - 1;
const SEND_TAG: u64 = 1 << 62;
const KICK_TAG: u64 = 1 << 63;
/// `IBV_WC_WR_FLUSH_ERR`.
const WC_WR_FLUSH_ERR: u32 = 5;
/// PSNs are 24 bits.
const PSN_MASK: u32 = 0x00FF_FFFF;
/// Send-queue entries beyond the application's depth, for kicks (a migration's, and its
/// nudges': see `RcConn::nudge`, which posts none while `KICK_ROOM - 2` are outstanding).
const KICK_ROOM: u32 = 12;

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

impl ConnError {
    /// Why, as the engine's [`apm_core::Reason`].
    pub fn reason(&self) -> apm_core::Reason {
        match self {
            ConnError::Verbs(e) => provider_verbs::facet::reason(e),
            ConnError::Invalid(why) => apm_core::Reason::Because(why),
            ConnError::Timeout(what) => apm_core::Reason::TimedOut(what),
        }
    }
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
    /// Its completion was an error (a flush): it stays outstanding, to be replayed.
    flushed: bool,
}

#[derive(Debug, Clone, Copy)]
struct RecvWr {
    wr_id: u64,
    offset: usize,
    len: usize,
    /// Its completion was a flush: it stays in `recvs`, to be posted again.
    flushed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Running,
    /// A migration runs, to the peer's GID `to`: sends are held. `peer_there`: the
    /// engine said the peer already runs on that path (its word came while we moved), so
    /// the replay goes at once when the move is done instead of waiting for the peer.
    Migrating {
        to: [u8; 16],
        peer_there: bool,
    },
    /// Re-initialised on a path the peer has not moved to yet: the replay waits at the
    /// front of `held`, new sends behind it, until the peer is there.
    AwaitingPeer {
        /// The peer's GID on the path the replay waits for it on.
        on: [u8; 16],
        since: Instant,
        /// The receive PSN the QP was given at RTR: once it moves, a packet of the
        /// peer's arrived in sequence over the new path.
        rq_psn: u32,
    },
}

impl Mode {
    /// Whether the engine said, while this move to the peer's GID `dgid` ran, that the
    /// peer is there already (its word came during the move): then nothing is held.
    fn peer_there_during_move_to(&self, dgid: &[u8; 16]) -> bool {
        matches!(self, Mode::Migrating { to, peer_there: true } if to == dgid)
    }
}

/// When a re-initialisation's replay goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// At once: the peer runs on the new path already.
    Now,
    /// Once the peer runs there too (see [`RcConn::peer_there`]), if rxe's retransmit
    /// timer has fired since the last acknowledgement. Sent before, the replay would be
    /// dropped by the peer's QP, and rxe would send it again only at its next timer: a
    /// PSN-sequence NAK does not make it retransmit after such a timer, not even across
    /// a RESET. Otherwise as `Now`: the nudges draw the peer's NAK once it follows.
    WhenPeerThere,
    /// Once the peer runs there too, whatever the timer did: the peer moves at the same
    /// time and may finish after us, and rxe's retransmit timer armed before the move
    /// (a RESET leaves it running) would fire on a replay sent into the peer's drop,
    /// start a retry and make rxe ignore the peer's NAK until the next timer. Held, the
    /// timer fires on an empty send queue and does nothing.
    HeldUntilPeerThere,
}

/// Why sends held for the peer were released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// The engine heard from the peer that it runs on our path.
    PeerSaid,
    /// A message from the peer arrived over the new path (rxe takes RC packets only
    /// from the QP's primary address, so the peer has moved).
    PeerSent,
    /// The QP's receive PSN moved: the peer's packet arrived over the new path, one
    /// that completes no receive (an RDMA write, a kick).
    PeerPacket,
    /// No word within the follow wait.
    Deadline,
    /// Another migration starts: it replays them itself.
    Migration,
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
    /// Sends (kicks included) completed successfully, ever: a nudge after a move stops
    /// once this moves.
    acked: u64,
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
    /// Woken when sends held for the peer are released.
    released_notify: tokio::sync::Notify,
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
                // Room for the kicks a migration and its nudges post.
                max_send_wr: depth.saturating_add(KICK_ROOM),
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
                acked: 0,
                stats: ConnStats::default(),
            }),
            pending: Mutex::new(Vec::new()),
            drained: AtomicU64::new(0),
            drained_notify: tokio::sync::Notify::new(),
            released_notify: tokio::sync::Notify::new(),
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
        g.recvs.push_back(RecvWr {
            wr_id,
            offset,
            len,
            flushed: false,
        });
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
            flushed: false,
        };
        if g.mode != Mode::Running || g.failed {
            g.stats.held_sends += 1;
            g.held.push_back(wr);
            return Ok(());
        }
        self.post_now(&mut g, wr)
    }

    /// Post one send now, with the next PSN.
    fn post_now(&self, g: &mut Inner, mut wr: SendWr) -> Result<(), ConnError> {
        wr.psn = g.next_psn;
        wr.flushed = false;
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
            flushed: false,
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
                // RC completes sends in order: it is the oldest (search to stay safe).
                let pos = g
                    .outstanding
                    .iter()
                    .position(|w| w.kick == kick && w.wr_id == id);
                if !ok {
                    if let Some(w) = pos.and_then(|p| g.outstanding.get_mut(p)) {
                        w.flushed = true;
                    }
                    note_send_error(&mut g, &wc.status);
                    continue;
                }
                if let Some(p) = pos {
                    g.outstanding.remove(p);
                }
                g.last_progress = Instant::now();
                g.reported_at = None;
                g.repairs = 0;
                g.acked += 1;
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
                self.release_held(&mut g, Released::PeerSent);
                out.push(Completion {
                    wr_id: wc.wr_id,
                    recv: true,
                    byte_len: wc.byte_len,
                    imm: wc.imm,
                });
            } else if let Some(r) = g.recvs.iter_mut().find(|r| r.wr_id == wc.wr_id) {
                // A flushed receive stays in `recvs`: it is posted again after re-init.
                r.flushed = true;
            }
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
            // Held for the peer counts as moving: bounded by the follow wait.
            migrating: g.mode != Mode::Running,
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

    fn lock_pending(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
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
