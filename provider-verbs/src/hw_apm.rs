//! Hardware APM on one RC QP: the QP-control operations the engine's commands map to.
//!
//! Every operation first checks that hardware APM can work on the QP's ports
//! ([`available`]): the device must advertise `IBV_DEVICE_AUTO_PATH_MIG`, and on a RoCE
//! port the kernel must accept alternate paths, which is asked of the kernel itself
//! ([`crate::roce_apm`]): a stock kernel refuses `IBV_QP_ALT_PATH` on RoCE with EINVAL,
//! and stock rxe, which advertises the capability, never migrates, while the patched
//! soft-RoCE of `kernel/rxe-apm` does both. A refusal comes before the operation, with
//! an error that points RoCE users to provider-rxe. This module never reports success
//! for an operation the device did not confirm.
#![forbid(unsafe_code)]

use crate::ffi::{
    AddressVector, Context, LinkLayer, MigState, Qp, QpAttr, QpAttrMask, QpState, Result,
    VerbsError,
};
use crate::roce_apm;

/// An alternate path to load into a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AltPath {
    /// The path (its `port_num` is the alternate local port).
    pub av: AddressVector,
    /// P_Key index on the alternate port.
    pub pkey_index: u16,
    /// Local ACK timeout on the alternate path.
    pub timeout: u8,
}

/// Fail unless hardware APM can work through local `port` of `ctx`: the capability bit,
/// and on RoCE the kernel's own answer ([`crate::roce_apm::accepts_alternates`]).
pub fn available(ctx: &Context, port: u8) -> Result<()> {
    let attr = ctx.query_port(port)?;
    if attr.link_layer == LinkLayer::Ethernet && !roce_apm::accepts_alternates(ctx, port)? {
        return Err(VerbsError::HardwareApmOnRoce {
            device: ctx.name().to_owned(),
            port,
        });
    }
    if !ctx.query_device()?.auto_path_mig() {
        return Err(VerbsError::NoApmCapability {
            device: ctx.name().to_owned(),
        });
    }
    Ok(())
}

/// Fail unless hardware APM can work on `qp` through local `port`.
pub fn check_port(qp: &Qp, port: u8) -> Result<()> {
    available(qp.context(), port)
}

/// Check the QP's current primary port (and `alt_port` if given).
fn check_qp(qp: &Qp, alt_port: Option<u8>) -> Result<QpAttr> {
    let cur = qp.query(QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::AV)?;
    // Some drivers leave port_num 0 in a query; the AV's port is the same port.
    let port = if cur.port_num != 0 {
        cur.port_num
    } else {
        cur.ah_attr.port_num.max(1)
    };
    check_port(qp, port)?;
    if let Some(p) = alt_port.filter(|p| *p != port) {
        check_port(qp, p)?;
    }
    Ok(cur)
}

/// Load `alt` as the QP's alternate path (RTS->RTS with `IBV_QP_ALT_PATH`), keeping the
/// migration state as it is. The peer must have accepted the path first (LAP/APR):
/// hardware does not detect a stale alternate.
pub fn load_alternate(qp: &Qp, alt: &AltPath) -> Result<()> {
    let cur = check_qp(qp, Some(alt.av.port_num))?;
    if cur.qp_state != QpState::Rts {
        return Err(VerbsError::InvalidArgument(
            "an alternate path is loaded in RTS (RTS->RTS)",
        ));
    }
    let attr = QpAttr {
        qp_state: QpState::Rts,
        alt_ah_attr: alt.av,
        alt_port_num: alt.av.port_num,
        alt_pkey_index: alt.pkey_index,
        alt_timeout: alt.timeout,
        ..QpAttr::default()
    };
    qp.modify(&attr, QpAttrMask::ALT_PATH)
}

/// Ask the hardware to arm the loaded alternate path (`IBV_QP_PATH_MIG_STATE` = REARM);
/// it becomes ARMED by itself once the peer's packets carry MigReq=0. A QP that is ARMED
/// already is left alone: the IBA defines REARM from MIGRATED only (rdmavt refuses it
/// from ARMED), and a new alternate loaded while armed is armed at once.
pub fn set_rearm(qp: &Qp) -> Result<()> {
    check_qp(qp, None)?;
    if query(qp)?.1 == MigState::Armed {
        return Ok(());
    }
    set_mig_state(qp, MigState::Rearm)
}

/// Force a migration to the alternate path (`IBV_QP_PATH_MIG_STATE` = MIGRATED; valid
/// only from ARMED, in RTS).
pub fn force_migrated(qp: &Qp) -> Result<()> {
    check_qp(qp, None)?;
    set_mig_state(qp, MigState::Migrated)
}

fn set_mig_state(qp: &Qp, state: MigState) -> Result<()> {
    let attr = QpAttr {
        path_mig_state: state,
        ..QpAttr::default()
    };
    qp.modify(&attr, QpAttrMask::PATH_MIG_STATE)
}

/// The QP's state and migration state, as the device reports them.
pub fn query(qp: &Qp) -> Result<(QpState, MigState)> {
    let a = qp.query(QpAttrMask::STATE | QpAttrMask::PATH_MIG_STATE)?;
    Ok((a.qp_state, a.path_mig_state))
}
