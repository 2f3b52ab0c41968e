//! Protection domains, completion queues, memory regions and RC queue pairs: what apm
//! needs to control a QP's paths and what the hardware suite needs to move traffic.

use super::{sys, Context, Result, VerbsError};
use std::sync::{Arc, Mutex};

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
    /// A value this binding does not know.
    Other(u32),
}

impl Mtu {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_MTU_256 => Mtu::Mtu256,
            sys::IBV_MTU_512 => Mtu::Mtu512,
            sys::IBV_MTU_1024 => Mtu::Mtu1024,
            sys::IBV_MTU_2048 => Mtu::Mtu2048,
            sys::IBV_MTU_4096 => Mtu::Mtu4096,
            o => Mtu::Other(o),
        }
    }
    /// The IBA path-MTU code (1 = 256 ... 5 = 4096, `enum ibv_mtu`'s values), as an
    /// engine `Path` carries it; 0 for a value no code fits.
    pub fn code(self) -> u8 {
        u8::try_from(self.raw()).unwrap_or(0)
    }

    /// The MTU of an IBA path-MTU code (see [`Mtu::code`]).
    pub fn from_code(code: u8) -> Self {
        Self::from_raw(u32::from(code))
    }

    fn raw(self) -> u32 {
        match self {
            Mtu::Mtu256 => sys::IBV_MTU_256,
            Mtu::Mtu512 => sys::IBV_MTU_512,
            Mtu::Mtu1024 => sys::IBV_MTU_1024,
            Mtu::Mtu2048 => sys::IBV_MTU_2048,
            Mtu::Mtu4096 => sys::IBV_MTU_4096,
            Mtu::Other(o) => o,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpState {
    /// RESET.
    Reset,
    /// INIT.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain(ed).
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error.
    Err,
    /// A value this binding does not know.
    Other(u32),
}

impl QpState {
    fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::Rtr,
            sys::IBV_QPS_RTS => QpState::Rts,
            sys::IBV_QPS_SQD => QpState::Sqd,
            sys::IBV_QPS_SQE => QpState::Sqe,
            sys::IBV_QPS_ERR => QpState::Err,
            o => QpState::Other(o),
        }
    }
    fn raw(self) -> u32 {
        match self {
            QpState::Reset => sys::IBV_QPS_RESET,
            QpState::Init => sys::IBV_QPS_INIT,
            QpState::Rtr => sys::IBV_QPS_RTR,
            QpState::Rts => sys::IBV_QPS_RTS,
            QpState::Sqd => sys::IBV_QPS_SQD,
            QpState::Sqe => sys::IBV_QPS_SQE,
            QpState::Err => sys::IBV_QPS_ERR,
            QpState::Other(o) => o,
        }
    }
}

/// Path migration state (`enum ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigState {
    /// Nothing armed (start state, and after a migration).
    Migrated,
    /// Software asked to arm the loaded alternate path.
    Rearm,
    /// Armed: the hardware may migrate.
    Armed,
    /// A value this binding does not know.
    Other(u32),
}

impl MigState {
    fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_MIG_MIGRATED => MigState::Migrated,
            sys::IBV_MIG_REARM => MigState::Rearm,
            sys::IBV_MIG_ARMED => MigState::Armed,
            o => MigState::Other(o),
        }
    }
    fn raw(self) -> u32 {
        match self {
            MigState::Migrated => sys::IBV_MIG_MIGRATED,
            MigState::Rearm => sys::IBV_MIG_REARM,
            MigState::Armed => sys::IBV_MIG_ARMED,
            MigState::Other(o) => o,
        }
    }
}

/// `enum ibv_qp_attr_mask` bits: which attributes a modify sets or a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttrMask(pub u32);

impl QpAttrMask {
    /// IBV_QP_STATE.
    pub const STATE: Self = Self(sys::IBV_QP_STATE);
    /// IBV_QP_CUR_STATE.
    pub const CUR_STATE: Self = Self(sys::IBV_QP_CUR_STATE);
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(sys::IBV_QP_EN_SQD_ASYNC_NOTIFY);
    /// IBV_QP_ACCESS_FLAGS.
    pub const ACCESS_FLAGS: Self = Self(sys::IBV_QP_ACCESS_FLAGS);
    /// IBV_QP_PKEY_INDEX.
    pub const PKEY_INDEX: Self = Self(sys::IBV_QP_PKEY_INDEX);
    /// IBV_QP_PORT.
    pub const PORT: Self = Self(sys::IBV_QP_PORT);
    /// IBV_QP_AV: the primary address vector.
    pub const AV: Self = Self(sys::IBV_QP_AV);
    /// IBV_QP_PATH_MTU.
    pub const PATH_MTU: Self = Self(sys::IBV_QP_PATH_MTU);
    /// IBV_QP_TIMEOUT.
    pub const TIMEOUT: Self = Self(sys::IBV_QP_TIMEOUT);
    /// IBV_QP_RETRY_CNT.
    pub const RETRY_CNT: Self = Self(sys::IBV_QP_RETRY_CNT);
    /// IBV_QP_RNR_RETRY.
    pub const RNR_RETRY: Self = Self(sys::IBV_QP_RNR_RETRY);
    /// IBV_QP_RQ_PSN.
    pub const RQ_PSN: Self = Self(sys::IBV_QP_RQ_PSN);
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub const MAX_QP_RD_ATOMIC: Self = Self(sys::IBV_QP_MAX_QP_RD_ATOMIC);
    /// IBV_QP_ALT_PATH: the alternate path (address vector, port, pkey, timeout).
    pub const ALT_PATH: Self = Self(sys::IBV_QP_ALT_PATH);
    /// IBV_QP_MIN_RNR_TIMER.
    pub const MIN_RNR_TIMER: Self = Self(sys::IBV_QP_MIN_RNR_TIMER);
    /// IBV_QP_SQ_PSN.
    pub const SQ_PSN: Self = Self(sys::IBV_QP_SQ_PSN);
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(sys::IBV_QP_MAX_DEST_RD_ATOMIC);
    /// IBV_QP_PATH_MIG_STATE.
    pub const PATH_MIG_STATE: Self = Self(sys::IBV_QP_PATH_MIG_STATE);
    /// IBV_QP_CAP.
    pub const CAP: Self = Self(sys::IBV_QP_CAP);
    /// IBV_QP_DEST_QPN.
    pub const DEST_QPN: Self = Self(sys::IBV_QP_DEST_QPN);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for QpAttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// An address vector (`struct ibv_ah_attr`): one path to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits (LMC offset of the local LID).
    pub src_path_bits: u8,
    /// Static rate (0 = port rate).
    pub static_rate: u8,
    /// Local port number.
    pub port_num: u8,
    /// Global routing header present (always on RoCE).
    pub is_global: bool,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID table index.
    pub sgid_index: u8,
    /// IPv6 flow label / GRH flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

impl AddressVector {
    fn to_raw(self) -> sys::ibv_ah_attr {
        sys::ibv_ah_attr {
            grh: sys::ibv_global_route {
                dgid: sys::ibv_gid { raw: self.dgid },
                flow_label: self.flow_label,
                sgid_index: self.sgid_index,
                hop_limit: self.hop_limit,
                traffic_class: self.traffic_class,
            },
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: u8::from(self.is_global),
            port_num: self.port_num,
        }
    }
    fn from_raw(a: &sys::ibv_ah_attr) -> Self {
        AddressVector {
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            port_num: a.port_num,
            is_global: a.is_global != 0,
            // SAFETY: every bit pattern is a valid [u8; 16].
            dgid: unsafe { a.grh.dgid.raw },
            sgid_index: a.grh.sgid_index,
            flow_label: a.grh.flow_label,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        }
    }
}

/// QP attributes for modify and query: what the mask names is read (modify) or was
/// filled in (query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state (modify) or current state (query).
    pub qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Path migration state.
    pub path_mig_state: MigState,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Peer QP number.
    pub dest_qp_num: u32,
    /// `ibv_access_flags` for remote access.
    pub qp_access_flags: u32,
    /// Primary path.
    pub ah_attr: AddressVector,
    /// Alternate path.
    pub alt_ah_attr: AddressVector,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate path P_Key index.
    pub alt_pkey_index: u16,
    /// Ask for IBV_EVENT_SQ_DRAINED when moving to SQD.
    pub en_sqd_async_notify: bool,
    /// (query) the send queue is still draining.
    pub sq_draining: bool,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Primary port.
    pub port_num: u8,
    /// Local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retry count (7 on rxe means: retry forever).
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// Alternate path port.
    pub alt_port_num: u8,
    /// Alternate path ACK timeout.
    pub alt_timeout: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: 0,
            ah_attr: AddressVector::default(),
            alt_ah_attr: AddressVector::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
        }
    }
}

impl QpAttr {
    fn to_raw(self) -> sys::ibv_qp_attr {
        // SAFETY: ibv_qp_attr is plain data (integers, arrays, a union of byte arrays);
        // all-zero is a valid value, and the fields are set below.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = self.qp_state.raw();
        a.path_mtu = self.path_mtu.raw();
        a.path_mig_state = self.path_mig_state.raw();
        a.rq_psn = self.rq_psn;
        a.sq_psn = self.sq_psn;
        a.dest_qp_num = self.dest_qp_num;
        a.qp_access_flags = self.qp_access_flags;
        a.ah_attr = self.ah_attr.to_raw();
        a.alt_ah_attr = self.alt_ah_attr.to_raw();
        a.pkey_index = self.pkey_index;
        a.alt_pkey_index = self.alt_pkey_index;
        a.en_sqd_async_notify = u8::from(self.en_sqd_async_notify);
        a.max_rd_atomic = self.max_rd_atomic;
        a.max_dest_rd_atomic = self.max_dest_rd_atomic;
        a.min_rnr_timer = self.min_rnr_timer;
        a.port_num = self.port_num;
        a.timeout = self.timeout;
        a.retry_cnt = self.retry_cnt;
        a.rnr_retry = self.rnr_retry;
        a.alt_port_num = self.alt_port_num;
        a.alt_timeout = self.alt_timeout;
        a
    }
    fn from_raw(a: &sys::ibv_qp_attr) -> Self {
        QpAttr {
            qp_state: QpState::from_raw(a.qp_state),
            path_mtu: Mtu::from_raw(a.path_mtu),
            path_mig_state: MigState::from_raw(a.path_mig_state),
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags,
            ah_attr: AddressVector::from_raw(&a.ah_attr),
            alt_ah_attr: AddressVector::from_raw(&a.alt_ah_attr),
            pkey_index: a.pkey_index,
            alt_pkey_index: a.alt_pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            sq_draining: a.sq_draining != 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: a.alt_port_num,
            alt_timeout: a.alt_timeout,
        }
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct Pd {
    inner: Arc<PdInner>,
}

struct PdInner {
    ctx: Context,
    pd: *mut sys::ibv_pd,
}

// SAFETY: verbs objects may be used from any thread (libibverbs locks internally); the
// pointer is freed only in Drop.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by us; MRs and QPs hold an Arc to this, so none remains.
        unsafe { (self.ctx.inner.verbs.lib.ibv_dealloc_pd)(self.pd) };
    }
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.inner.ctx.name())
            .finish_non_exhaustive()
    }
}

impl Context {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        // SAFETY: live context.
        let pd = unsafe { (self.inner.verbs.lib.ibv_alloc_pd)(self.raw()) };
        if pd.is_null() {
            return Err(VerbsError::last("ibv_alloc_pd"));
        }
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: self.clone(),
                pd,
            }),
        })
    }

    /// `ibv_create_cq` with `cqe` entries, no completion channel (polled).
    pub fn create_cq(&self, cqe: i32) -> Result<Cq> {
        if cqe <= 0 {
            return Err(VerbsError::InvalidArgument("a CQ needs at least one entry"));
        }
        // SAFETY: live context; no channel, no user context, vector 0.
        let cq = unsafe {
            (self.inner.verbs.lib.ibv_create_cq)(
                self.raw(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(VerbsError::last("ibv_create_cq"));
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                ctx: self.clone(),
                cq,
                poll: Mutex::new(()),
            }),
        })
    }
}

/// A completion queue, polled.
#[derive(Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

struct CqInner {
    ctx: Context,
    cq: *mut sys::ibv_cq,
    /// Providers' poll_cq is thread-safe, but polling one CQ from two threads would hand
    /// out completions in a racy order; one poller at a time keeps them ordered.
    poll: Mutex<()>,
}

// SAFETY: as for PdInner.
unsafe impl Send for CqInner {}
// SAFETY: as for PdInner.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by us; QPs using it hold an Arc, so none remains.
        let rc = unsafe { (self.ctx.inner.verbs.lib.ibv_destroy_cq)(self.cq) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq").finish_non_exhaustive()
    }
}

/// Completion status (`enum ibv_wc_status`), kept raw with its libibverbs string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WcStatus {
    /// The raw status (0 = success).
    pub code: u32,
    /// `ibv_wc_status_str`.
    pub text: String,
}

impl WcStatus {
    /// IBV_WC_SUCCESS.
    pub fn is_success(&self) -> bool {
        self.code == sys::IBV_WC_SUCCESS
    }
}

/// Completion opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A send completed.
    Send,
    /// An RDMA write completed.
    RdmaWrite,
    /// A receive completed.
    Recv,
    /// A receive of an RDMA write with immediate completed.
    RecvRdmaWithImm,
    /// Something else (or undefined: error completions carry no valid opcode).
    Other(u32),
}

/// One work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request id given when posting.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid only on success).
    pub opcode: WcOpcode,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// The local QP.
    pub qp_num: u32,
    /// Immediate data, host order, when the completion carries one.
    pub imm: Option<u32>,
}

impl Cq {
    /// Poll up to `max` completions (`ibv_poll_cq`, through `context->ops.poll_cq` as the
    /// inline in verbs.h does).
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>> {
        let max = max.clamp(1, 256);
        // SAFETY: ibv_wc is plain data; zero is valid and the provider overwrites the
        // entries it reports.
        let mut wcs: Vec<sys::ibv_wc> = vec![unsafe { std::mem::zeroed() }; max];
        let lib = &self.inner.ctx.inner.verbs.lib;
        // SAFETY: reading the ops table of a live context.
        let poll = unsafe { (*self.inner.ctx.raw()).ops.poll_cq };
        let Some(poll) = poll else {
            return Err(VerbsError::Unsupported("the provider has no poll_cq"));
        };
        let n = {
            let _one_poller = self.inner.poll.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: live CQ; `wcs` has room for `max` entries (max <= 256 fits i32).
            unsafe { poll(self.inner.cq, max as i32, wcs.as_mut_ptr()) }
        };
        if n < 0 {
            return Err(VerbsError::from_ret("ibv_poll_cq", n));
        }
        let mut out = Vec::with_capacity(n as usize);
        for wc in wcs.iter().take(n as usize) {
            let opcode = match wc.opcode {
                sys::IBV_WC_SEND => WcOpcode::Send,
                sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                sys::IBV_WC_RECV => WcOpcode::Recv,
                sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
                o => WcOpcode::Other(o),
            };
            let imm = (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0)
                // SAFETY: IBV_WC_WITH_IMM says the union holds imm_data (network order).
                .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
            // SAFETY: ibv_wc_status_str returns a static string for any value.
            let text = super::c_string(unsafe { (lib.ibv_wc_status_str)(wc.status) });
            out.push(WorkCompletion {
                wr_id: wc.wr_id,
                status: WcStatus {
                    code: wc.status,
                    text,
                },
                opcode,
                byte_len: wc.byte_len,
                qp_num: wc.qp_num,
                imm,
            });
        }
        Ok(out)
    }
}

/// A registered memory region over a buffer it owns.
pub struct Mr {
    pd: Pd,
    mr: *mut sys::ibv_mr,
    /// Registered memory: never moved or resized while registered (boxed slice).
    buf: Box<[u8]>,
}

// SAFETY: the MR handle is usable from any thread; the buffer is owned.
unsafe impl Send for Mr {}
// SAFETY: shared access only reads keys; writing the buffer needs `&mut`.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by us; deregistering before the buffer is freed (fields drop
        // after this) means the device can no longer touch it.
        let rc = unsafe { (self.pd.inner.ctx.inner.verbs.lib.ibv_dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dereg_mr failed");
        }
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("len", &self.buf.len())
            .finish_non_exhaustive()
    }
}

impl Pd {
    /// Register a zeroed buffer of `len` bytes for local write and remote read/write.
    pub fn reg_mr(&self, len: usize) -> Result<Mr> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument(
                "cannot register an empty buffer",
            ));
        }
        let mut buf = vec![0u8; len].into_boxed_slice();
        let access = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ;
        // SAFETY: live PD; `buf` is a live allocation of `len` bytes that outlives the
        // registration (Mr drops the registration before the buffer).
        let mr = unsafe {
            (self.inner.ctx.inner.verbs.lib.ibv_reg_mr)(
                self.inner.pd,
                buf.as_mut_ptr().cast(),
                len,
                access as i32,
            )
        };
        if mr.is_null() {
            return Err(VerbsError::last("ibv_reg_mr"));
        }
        Ok(Mr {
            pd: self.clone(),
            mr,
            buf,
        })
    }

    /// Create an RC QP on `send_cq`/`recv_cq`.
    pub fn create_rc_qp(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        let init = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.inner.cq,
            recv_cq: recv_cq.inner.cq,
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        let mut init = init;
        // SAFETY: live PD and CQs of the same context; `init` is a valid init struct.
        let qp =
            unsafe { (self.inner.ctx.inner.verbs.lib.ibv_create_qp)(self.inner.pd, &mut init) };
        if qp.is_null() {
            return Err(VerbsError::last("ibv_create_qp"));
        }
        // SAFETY: the QP was just created.
        let qp_num = unsafe { (*qp).qp_num };
        Ok(Qp {
            ctx: self.inner.ctx.clone(),
            owned: Some(QpOwner {
                _pd: self.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
            }),
            qp,
            qp_num,
        })
    }
}

impl Mr {
    /// The buffer.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }
    /// The buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: reading a field of a live MR.
        unsafe { (*self.mr).lkey }
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: reading a field of a live MR.
        unsafe { (*self.mr).rkey }
    }
    /// Address of the buffer (for RDMA from the peer).
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    fn sge(&self, offset: usize, len: usize) -> Result<sys::ibv_sge> {
        let end = offset
            .checked_add(len)
            .ok_or(VerbsError::InvalidArgument("buffer range overflows"))?;
        if end > self.buf.len() {
            return Err(VerbsError::InvalidArgument(
                "range outside the memory region",
            ));
        }
        Ok(sys::ibv_sge {
            addr: self.addr() + offset as u64,
            length: u32::try_from(len)
                .map_err(|_| VerbsError::InvalidArgument("a work request is at most 4 GiB"))?,
            lkey: self.lkey(),
        })
    }
}

/// Queue sizes of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
}

/// An RC queue pair: one apm created ([`Pd::create_rc_qp`]) or one an application
/// created and handed over ([`Qp::adopt`]).
pub struct Qp {
    /// apm's own context on the QP's device: the library's entry points and the
    /// device's name. An adopted QP belongs to the application's context; its verbs go
    /// through that one (`qp->context`), never through this.
    ctx: Context,
    /// Set when apm created the QP: what must outlive it, and the duty to destroy it.
    owned: Option<QpOwner>,
    qp: *mut sys::ibv_qp,
    qp_num: u32,
}

/// What an apm-created QP keeps alive (dropped after the QP is destroyed).
struct QpOwner {
    _pd: Pd,
    _send_cq: Cq,
    _recv_cq: Cq,
}

// SAFETY: QP verbs are thread-safe in libibverbs; the pointer is freed only in Drop.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        if self.owned.is_none() {
            // Adopted: the application destroys its QP, not apm.
            return;
        }
        // SAFETY: created by us; its CQs and PD are kept alive by `owned`, which drops
        // after this.
        let rc = unsafe { (self.ctx.inner.verbs.lib.ibv_destroy_qp)(self.qp) };
        if rc != 0 {
            tracing::warn!(qpn = self.qp_num, rc, "ibv_destroy_qp failed");
        }
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qp_num)
            .field("adopted", &self.owned.is_none())
            .finish_non_exhaustive()
    }
}

impl Qp {
    /// Take an application's RC QP under apm's control without owning it: apm modifies,
    /// queries and posts to it, and never destroys it. `ctx` is apm's own context on the
    /// same device (checked by name).
    ///
    /// # Safety
    /// `raw` is a live `struct ibv_qp *` created through the same libibverbs this
    /// process loaded (`Verbs::load` finds the one already mapped), and it stays valid
    /// until this `Qp` and every clone of its `Arc` are dropped.
    pub unsafe fn adopt(ctx: &Context, raw: *mut std::ffi::c_void) -> Result<Qp> {
        let qp = raw.cast::<sys::ibv_qp>();
        if qp.is_null() {
            return Err(VerbsError::InvalidArgument("the QP pointer is NULL"));
        }
        // SAFETY: a live QP per the contract; its context and device are live with it.
        let (qp_type, qp_num, device) = unsafe {
            let qctx = (*qp).context;
            if qctx.is_null() || (*qctx).device.is_null() {
                return Err(VerbsError::InvalidArgument("the QP has no device context"));
            }
            ((*qp).qp_type, (*qp).qp_num, (*qctx).device)
        };
        if qp_type != sys::IBV_QPT_RC {
            return Err(VerbsError::InvalidArgument(
                "only RC QPs can be protected (this one is another type)",
            ));
        }
        // SAFETY: a live device; the name is a NUL-terminated string owned by it.
        let name = unsafe {
            let p = (ctx.inner.verbs.lib.ibv_get_device_name)(device);
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        if name != ctx.name() {
            return Err(VerbsError::InvalidArgument(
                "the QP is on another device than the context given for it",
            ));
        }
        Ok(Qp {
            ctx: ctx.clone(),
            owned: None,
            qp,
            qp_num,
        })
    }

    /// Whether the application owns this QP ([`Qp::adopt`]).
    pub fn is_adopted(&self) -> bool {
        self.owned.is_none()
    }

    /// The `struct ibv_qp *` (for [`Qp::adopt`] elsewhere, or a C library). Valid while
    /// this `Qp` lives; using it is the caller's unsafe business.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.qp.cast()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The device this QP is on (apm's context on it).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The operations table of the QP's own context (the application's, when adopted).
    fn ops(&self) -> &sys::ibv_context_ops {
        // SAFETY: a live QP's context lives at least as long as the QP, which outlives
        // `self` per the constructors' contracts; the ops table is never written after
        // the device is opened.
        unsafe { &(*(*self.qp).context).ops }
    }

    /// `ibv_modify_qp` with the attributes `mask` names.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let mut raw = attr.to_raw();
        // SAFETY: live QP; `raw` is a complete attribute struct (unnamed fields zero).
        let rc = unsafe { (self.lib().ibv_modify_qp)(self.qp, &mut raw, mask.0 as i32) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// `ibv_query_qp` for the attributes `mask` names (drivers may fill more).
    pub fn query(&self, mask: QpAttrMask) -> Result<QpAttr> {
        // SAFETY: plain data, zero is valid.
        let mut raw: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live QP, writable out structs.
        let rc = unsafe { (self.lib().ibv_query_qp)(self.qp, &mut raw, mask.0 as i32, &mut init) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_query_qp", rc));
        }
        Ok(QpAttr::from_raw(&raw))
    }

    /// Post one receive of `len` bytes at `offset` of `mr`.
    pub fn post_recv(&self, wr_id: u64, mr: &Mr, offset: usize, len: usize) -> Result<()> {
        let mut sge = mr.sge(offset, len)?;
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        let Some(post) = self.ops().post_recv else {
            return Err(VerbsError::Unsupported("the provider has no post_recv"));
        };
        // SAFETY: live QP; `wr` and `sge` live through the call (the provider copies
        // them); the buffer range is inside `mr`, which the caller keeps registered while
        // the receive is outstanding (if it does not, the device reports a protection
        // error, it never writes freed memory: deregistration precedes the free).
        let rc = unsafe { post(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// Post one signalled SEND of `len` bytes at `offset` of `mr`, with immediate data if
    /// given.
    pub fn post_send(
        &self,
        wr_id: u64,
        mr: &Mr,
        offset: usize,
        len: usize,
        imm: Option<u32>,
    ) -> Result<()> {
        let sge = mr.sge(offset, len)?;
        let opcode = if imm.is_some() {
            sys::IBV_WR_SEND_WITH_IMM
        } else {
            sys::IBV_WR_SEND
        };
        self.post_send_raw(wr_id, Some(sge), opcode, imm, None, true)
    }

    /// Post a signalled 0-byte RDMA WRITE: the "kick" that makes a QP send what it holds
    /// (rxe sends work posted in SQD, or rolled back by a drain, only at the next post).
    /// The peer's QP must allow remote writes (a 0-byte write carries no key, but the
    /// opcode is checked).
    pub fn post_kick(&self, wr_id: u64) -> Result<()> {
        self.post_send_raw(
            wr_id,
            None,
            sys::IBV_WR_RDMA_WRITE,
            None,
            Some((0, 0)),
            true,
        )
    }

    /// [`Qp::post_kick`], unsignalled: on an application's QP created with
    /// `sq_sig_all = 0` it leaves nothing in the application's CQ (with `sq_sig_all = 1`
    /// its completion carries `wr_id`).
    pub fn post_kick_unsignaled(&self, wr_id: u64) -> Result<()> {
        self.post_send_raw(
            wr_id,
            None,
            sys::IBV_WR_RDMA_WRITE,
            None,
            Some((0, 0)),
            false,
        )
    }

    /// Ring the send queue's doorbell without posting anything: the kernel runs the QP's
    /// requester, which sends whatever the queue holds (work rolled back by an SQ drain,
    /// or posted while the QP was in SQD). This is the `POST_SEND` command with zero work
    /// requests that rdma-core's rxe provider itself writes to the context's command fd
    /// after every post; rxe's kernel driver answers it for user QPs by scheduling the
    /// requester. Unlike [`Qp::post_kick`] it puts no work request in the queue, so no
    /// completion can reach the application's CQ (even with `sq_sig_all`) and the peer
    /// needs no access right. Other drivers may refuse it (an error, nothing sent).
    pub fn ring_send_doorbell(&self) -> Result<()> {
        /// `struct ib_uverbs_cmd_hdr` followed by `struct ib_uverbs_post_send` with no
        /// work requests (kernel uapi `rdma/ib_user_verbs.h`).
        #[repr(C)]
        struct PostSendCmd {
            command: u32,
            in_words: u16,
            out_words: u16,
            response: u64,
            qp_handle: u32,
            wr_count: u32,
            sge_count: u32,
            wqe_size: u32,
        }
        /// `IB_USER_VERBS_CMD_POST_SEND` in the uapi's command enumeration.
        const CMD_POST_SEND: u32 = 28;
        // `struct ib_uverbs_post_send_resp { __u32 bad_wr; }`, written by the kernel.
        let mut resp: u32 = 0;
        // SAFETY: a live QP (constructor contracts); its context lives at least as long.
        let (fd, handle) = unsafe { ((*(*self.qp).context).cmd_fd, (*self.qp).handle) };
        let size = std::mem::size_of::<PostSendCmd>();
        let cmd = PostSendCmd {
            command: CMD_POST_SEND,
            in_words: (size / 4) as u16,
            out_words: (std::mem::size_of::<u32>() / 4) as u16,
            response: std::ptr::addr_of_mut!(resp) as u64,
            qp_handle: handle,
            wr_count: 0,
            sge_count: 0,
            // At least the kernel's `ib_uverbs_send_wr`, as rdma-core passes it.
            wqe_size: std::mem::size_of::<sys::ibv_send_wr>() as u32,
        };
        // SAFETY: writing a complete, initialised command of `size` bytes to the
        // context's command fd; the kernel writes at most 4 bytes to `resp`, which lives
        // through the call.
        let n = unsafe { libc::write(fd, std::ptr::addr_of!(cmd).cast(), size) };
        if usize::try_from(n).ok() != Some(size) {
            return Err(VerbsError::last("write(cmd_fd, POST_SEND doorbell)"));
        }
        Ok(())
    }

    fn post_send_raw(
        &self,
        wr_id: u64,
        sge: Option<sys::ibv_sge>,
        opcode: u32,
        imm: Option<u32>,
        rdma: Option<(u64, u32)>,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = sge;
        // SAFETY: ibv_send_wr is plain data (integers, pointers, unions of them); all-zero
        // is valid (null pointers, no flags) and the used fields are set below.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.next = std::ptr::null_mut();
        if let Some(s) = sge.as_mut() {
            wr.sg_list = s;
            wr.num_sge = 1;
        }
        wr.opcode = opcode;
        wr.send_flags = if signaled { sys::IBV_SEND_SIGNALED } else { 0 };
        if let Some(i) = imm {
            wr.__bindgen_anon_1.imm_data = i.to_be();
        }
        if let Some((remote_addr, rkey)) = rdma {
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        }
        let mut bad = std::ptr::null_mut();
        let Some(post) = self.ops().post_send else {
            return Err(VerbsError::Unsupported("the provider has no post_send"));
        };
        // SAFETY: live QP; `wr` and `sge` live through the call (the provider copies
        // them); the buffer range was checked to be inside a live MR.
        let rc = unsafe { post(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_send", rc));
        }
        Ok(())
    }

    fn lib(&self) -> &sys::IbvLib {
        &self.ctx.inner.verbs.lib
    }
}
