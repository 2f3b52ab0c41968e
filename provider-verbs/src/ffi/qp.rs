//! RC queue pairs: one apm created or one an application handed over
//! ([`Qp::adopt`]), modified and queried with [`super::qp_attr`]'s values, and the
//! verbs the hardware suite moves traffic with.

use super::qp_attr::{QpAttr, QpAttrMask};
use super::resources::{Cq, Mr, Pd};
use super::{sys, Context, Result, VerbsError};

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
    pub(super) ctx: Context,
    /// Set when apm created the QP: what must outlive it, and the duty to destroy it.
    pub(super) owned: Option<QpOwner>,
    pub(super) qp: *mut sys::ibv_qp,
    pub(super) qp_num: u32,
}

/// What an apm-created QP keeps alive (dropped after the QP is destroyed).
pub(super) struct QpOwner {
    pub(super) _pd: Pd,
    pub(super) _send_cq: Cq,
    pub(super) _recv_cq: Cq,
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
