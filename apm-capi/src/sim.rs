//! The simulated fabric's own calls: advancing virtual time and listing the scenario's
//! connections, so a C test needs no device. `APM_STATUS_UNSUPPORTED` elsewhere.

use super::*;

/// Simulated deployments: advance the fabric by `ms` milliseconds of virtual time (the
/// manager works, notifications arrive). `APM_STATUS_UNSUPPORTED` on real deployments.
///
/// # Safety
/// `m` is a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_sim_run_for(m: *mut ApmManager, ms: u64) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        let Some(fabric) = m.apm.as_ref().and_then(|a| a.sim()).cloned() else {
            return fail(ApmStatus::Unsupported, "not a simulated deployment");
        };
        m.rt.block_on(fabric.run_for(std::time::Duration::from_millis(ms)));
        m.collect();
        ApmStatus::Ok
    })
}

/// Simulated deployments: the number of connections the scenario opened on the
/// configured host (`*count`), for `apm_sim_connection`.
///
/// # Safety
/// `m` is a live manager; `count` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn apm_sim_connection_count(
    m: *mut ApmManager,
    count: *mut usize,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        if count.is_null() {
            return fail(ApmStatus::InvalidArgument, "count is NULL");
        }
        match m.sim_specs() {
            // SAFETY: non-NULL and writable per the contract.
            Ok(v) => unsafe { count.write(v.len()) },
            Err(s) => return s,
        }
        ApmStatus::Ok
    })
}

/// Simulated deployments: connection `index` of the configured host as an
/// `ApmConnInfo`, as an application would fill it in (candidates: none).
///
/// # Safety
/// `m` is a live manager; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn apm_sim_connection(
    m: *mut ApmManager,
    index: usize,
    out: *mut ApmConnInfo,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        let specs = match m.sim_specs() {
            Ok(v) => v,
            Err(s) => return s,
        };
        let Some(s) = specs.get(index) else {
            return fail(
                ApmStatus::InvalidArgument,
                format!("no connection {index} ({} in all)", specs.len()),
            );
        };
        let info = ApmConnInfo {
            id: s.id.0,
            active: c_int::from(s.role == Role::Active),
            software: c_int::from(s.mode == MigrationMode::Software),
            local_qpn: s.local_qpn.get(),
            remote_qpn: s.remote_qpn.get(),
            local_comm_id: s.local_comm_id,
            remote_comm_id: s.remote_comm_id,
            primary: c_path(&s.primary),
            has_agreed_alternate: c_int::from(s.agreed_alternate.is_some()),
            agreed_alternate: s.agreed_alternate.as_ref().map(c_path).unwrap_or_default(),
            candidates: std::ptr::null(),
            n_candidates: 0,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(info) };
        ApmStatus::Ok
    })
}
