//! Does the kernel take alternate paths on a RoCE port? Asked of the device itself.
//!
//! The capability bit cannot tell: soft-RoCE advertises `IBV_DEVICE_AUTO_PATH_MIG` and a
//! stock kernel refuses `IBV_QP_ALT_PATH` on every RoCE port (EINVAL), while a RoCE
//! driver that implements APM and tells the core so (the patched soft-RoCE of
//! `kernel/rxe-apm`) has alternates accepted and migrates by itself. So the answer is
//! what the kernel does: two throwaway RC QPs on the port are moved INIT -> RTR towards
//! themselves, one without an alternate path (which must succeed: the probe itself is
//! sound) and one with the same path as its alternate. EINVAL for the second alone means
//! "refused"; success means "accepted". The answer is cached per context and port.
//!
//! What it must never do: decide from the link layer or the capability bit, or report
//! "accepted" for an answer it did not get (any other failure is an error, not a no).
#![forbid(unsafe_code)]

use crate::ffi::{AddressVector, Context, GidType, Mtu, QpAttr, QpAttrMask, QpCaps, QpState};
use crate::ffi::{Result, VerbsError};

/// Whether the kernel accepts alternate paths on RoCE `port` of `ctx` (probed once per
/// context and port).
pub fn accepts_alternates(ctx: &Context, port: u8) -> Result<bool> {
    if let Some(known) = ctx.roce_apm_cached(port) {
        return Ok(known);
    }
    let accepted = probe(ctx, port)?;
    tracing::debug!(
        device = ctx.name(),
        port,
        accepted,
        "alternate paths on RoCE"
    );
    ctx.roce_apm_cache(port, accepted);
    Ok(accepted)
}

fn probe(ctx: &Context, port: u8) -> Result<bool> {
    let gid = ctx
        .first_gid(port, |g| g.gid_type == GidType::RoceV2)?
        .ok_or(VerbsError::InvalidArgument(
            "the RoCE port has no RoCE v2 GID yet: cannot ask the kernel about alternate \
             paths",
        ))?;
    let sgid_index =
        u8::try_from(gid.index).map_err(|_| VerbsError::InvalidArgument("GID index above 255"))?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(2)?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
    };
    let plain = pd.create_rc_qp(&cq, &cq, caps)?;
    let with_alt = pd.create_rc_qp(&cq, &cq, caps)?;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: port,
        ..QpAttr::default()
    };
    let init_mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    plain.modify(&init, init_mask)?;
    with_alt.modify(&init, init_mask)?;
    // A path from the port to itself: no peer needed, nothing is ever sent.
    let av = AddressVector {
        port_num: port,
        is_global: true,
        dgid: gid.gid,
        sgid_index,
        hop_limit: 64,
        ..AddressVector::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::Mtu256,
        dest_qp_num: plain.qp_num(),
        ah_attr: av,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    let rtr_mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    plain.modify(&rtr, rtr_mask)?;
    let alt = QpAttr {
        alt_ah_attr: av,
        alt_port_num: port,
        alt_timeout: 14,
        ..rtr
    };
    match with_alt.modify(&alt, rtr_mask | QpAttrMask::ALT_PATH) {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}
