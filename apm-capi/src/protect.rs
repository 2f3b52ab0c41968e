//! Protecting and unprotecting connections: the C path and connection descriptions
//! turned into apm's, the application's `ibv_qp` adopted (never destroyed), stalls
//! reported.

use super::*;

pub(crate) fn path_of(p: &ApmPath) -> Result<Path, ApmStatus> {
    Ok(Path {
        port: PortKey::new(p.device, p.port),
        slid: Lid::from_wire(p.slid),
        dlid: Lid::from_wire(p.dlid),
        sgid: Gid(p.sgid),
        dgid: Gid(p.dgid),
        sgid_index: p.sgid_index,
        sl: p.sl,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        rate: p.rate,
        mtu: p.mtu,
        pkey_index: p.pkey_index,
        ack_timeout: p.ack_timeout,
    })
}

pub(crate) fn c_path(p: &Path) -> ApmPath {
    ApmPath {
        device: p.port.device,
        port: p.port.port,
        slid: p.slid.get(),
        dlid: p.dlid.get(),
        sgid: p.sgid.0,
        dgid: p.dgid.0,
        sgid_index: p.sgid_index,
        sl: p.sl,
        flow_label: p.flow_label,
        traffic_class: p.traffic_class,
        hop_limit: p.hop_limit,
        rate: p.rate,
        mtu: p.mtu,
        pkey_index: p.pkey_index,
        ack_timeout: p.ack_timeout,
    }
}

/// A connection description from C.
///
/// # Safety
/// `info.candidates` points to `info.n_candidates` paths (or is NULL with 0).
pub(crate) unsafe fn spec_of(info: &ApmConnInfo) -> Result<ConnSpec, ApmStatus> {
    let qpn = |v: u32, what: &str| {
        Qpn::new(v).ok_or_else(|| {
            fail(
                ApmStatus::InvalidArgument,
                format!("{what} {v:#x} is not a 24-bit QPN"),
            )
        })
    };
    let candidates = if info.n_candidates == 0 {
        Vec::new()
    } else if info.candidates.is_null() {
        return Err(fail(
            ApmStatus::InvalidArgument,
            "candidates is NULL but n_candidates is not 0",
        ));
    } else {
        // SAFETY: non-NULL, `n_candidates` initialised paths per the caller's contract.
        let s = unsafe { std::slice::from_raw_parts(info.candidates, info.n_candidates) };
        s.iter().map(path_of).collect::<Result<_, _>>()?
    };
    Ok(ConnSpec {
        id: ConnId(info.id),
        role: if info.active != 0 {
            Role::Active
        } else {
            Role::Passive
        },
        mode: if info.software != 0 {
            MigrationMode::Software
        } else {
            MigrationMode::Hardware
        },
        local_qpn: qpn(info.local_qpn, "local_qpn")?,
        remote_qpn: qpn(info.remote_qpn, "remote_qpn")?,
        local_comm_id: info.local_comm_id,
        remote_comm_id: info.remote_comm_id,
        primary: path_of(&info.primary)?,
        agreed_alternate: if info.has_agreed_alternate != 0 {
            Some(path_of(&info.agreed_alternate)?)
        } else {
            None
        },
        candidates,
    })
}

/// Put a connection under protection. `qp` is the application's `struct ibv_qp *`, an
/// RC QP in RTS on the device `info->primary.device` names (the index of its
/// `[[device]]` table); it stays the application's (apm never destroys it, and stops
/// touching it at `apm_unprotect`). Nothing is asked of its access flags: on RoCE apm
/// restarts its send queue after a move with the send doorbell alone, which posts no
/// work request and completes nothing. A simulated deployment has no QPs: pass NULL
/// there.
///
/// # Safety
/// `m` is a live manager; `info` points to a valid `ApmConnInfo` (and its candidates);
/// `qp` is NULL or a QP that stays valid until `apm_unprotect` or destroy.
#[no_mangle]
pub unsafe extern "C" fn apm_protect(
    m: *mut ApmManager,
    qp: *mut IbvQp,
    info: *const ApmConnInfo,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        // SAFETY: per this function's contract (NULL checked).
        let Some(info) = (unsafe { info.as_ref() }) else {
            return fail(ApmStatus::InvalidArgument, "info is NULL");
        };
        // SAFETY: per this function's contract.
        let spec = match unsafe { spec_of(info) } {
            Ok(s) => s,
            Err(s) => return s,
        };
        let Some(apm) = &m.apm else {
            return fail(ApmStatus::Stopped, "the manager has stopped");
        };
        let r = if qp.is_null() {
            if !apm.contexts().is_empty() {
                return fail(
                    ApmStatus::InvalidArgument,
                    "qp is NULL: a device deployment protects the application's ibv_qp",
                );
            }
            m.rt.block_on(apm.protect(spec)).map_err(manager_error)
        } else {
            if apm.contexts().is_empty() {
                return fail(
                    ApmStatus::Unsupported,
                    "this deployment has no QP facet to hand an ibv_qp to (simulated \
                     fabric): pass NULL",
                );
            }
            let device = spec.primary.port.device;
            let Some(ctx) = apm.contexts().get(usize::from(device)) else {
                return fail(
                    ApmStatus::InvalidArgument,
                    format!(
                        "primary.device {device} is not a configured device (0..{})",
                        apm.contexts().len()
                    ),
                );
            };
            // SAFETY: `qp` is a live ibv_qp of this process's libibverbs that stays
            // valid until unprotect or destroy, per this function's contract.
            let adopted = match unsafe { Qp::adopt(ctx, qp.cast()) } {
                Ok(q) => q,
                Err(e) => return fail(ApmStatus::InvalidArgument, e.to_string()),
            };
            m.rt.block_on(apm.protect_qp(spec, Arc::new(adopted)))
                .map_err(protect_error)
        };
        m.collect();
        r.map_or_else(|s| s, |()| ApmStatus::Ok)
    })
}

/// The application's sends on `conn_id` stopped completing (outstanding work, no
/// completion for longer than it tolerates): apm moves the connection to its agreed
/// alternate now, telling the peer. apm cannot see an application's completions, so
/// this is how a silent path failure (no port event) reaches it.
///
/// # Safety
/// `m` is a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_report_stall(m: *mut ApmManager, conn_id: u64) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        let Some(apm) = &m.apm else {
            return fail(ApmStatus::Stopped, "the manager has stopped");
        };
        m.rt.block_on(apm.report_stall(ConnId(conn_id)))
            .map_or_else(protect_error, |()| ApmStatus::Ok)
    })
}

/// Stop protecting connection `conn_id` (the QP is left as it is).
///
/// # Safety
/// `m` is a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_unprotect(m: *mut ApmManager, conn_id: u64) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        let Some(apm) = &m.apm else {
            return fail(ApmStatus::Stopped, "the manager has stopped");
        };
        let r = m.rt.block_on(apm.unprotect(ConnId(conn_id)));
        m.collect();
        r.map_or_else(manager_error, |()| ApmStatus::Ok)
    })
}
