//! Protection domains, completion queues and memory regions: what the hardware suite
//! needs to move traffic and what an RC QP is created on ([`super::qp`]).

use super::qp::{QpCaps, QpOwner};
use super::{sys, Context, Qp, Result, VerbsError};
use std::sync::{Arc, Mutex};

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

    pub(super) fn sge(&self, offset: usize, len: usize) -> Result<sys::ibv_sge> {
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
