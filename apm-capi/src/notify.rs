//! Notifications out: the fd, taking them one by one, the callback, and their C form.

use super::*;

/// A file descriptor that is readable (poll/select/epoll) while notifications are
/// pending; take them with `apm_next_notification`. Owned by the manager: do not close
/// it. -1 for a NULL manager.
///
/// # Safety
/// `m` is NULL or a live manager.
#[no_mangle]
pub unsafe extern "C" fn apm_notification_fd(m: *mut ApmManager) -> c_int {
    // SAFETY: per this function's contract.
    catch_unwind(|| unsafe { m.as_ref() }.map_or(-1, |m| m.out.efd)).unwrap_or(-1)
}

/// Take the oldest pending notification into `*out`: `APM_STATUS_OK`, or `APM_STATUS_AGAIN`
/// when none is pending (the fd is then no longer readable).
///
/// # Safety
/// `m` is a live manager; `out` points to writable storage for one notification.
#[no_mangle]
pub unsafe extern "C" fn apm_next_notification(
    m: *mut ApmManager,
    out: *mut ApmNotification,
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
        m.collect();
        let mut q = m.out.queue.lock().unwrap_or_else(|p| p.into_inner());
        match q.pop_front() {
            Some(n) => {
                // SAFETY: `out` is non-NULL and writable per the contract.
                unsafe { out.write(n) };
                if q.is_empty() {
                    m.out.drain_fd();
                }
                ApmStatus::Ok
            }
            None => {
                m.out.drain_fd();
                ApmStatus::Again
            }
        }
    })
}

/// Deliver notifications to `cb(note, user)` instead of the queue (NULL `cb`: back to
/// the queue and fd). `note` is valid only during the call.
///
/// # Safety
/// `m` is a live manager; `cb` is safe to call with `user` from the thread that calls
/// apm functions on this manager (simulated deployments) or from any thread (device
/// deployments), until it is replaced or the manager destroyed.
#[no_mangle]
pub unsafe extern "C" fn apm_set_callback(
    m: *mut ApmManager,
    cb: ApmCallback,
    user: *mut c_void,
) -> ApmStatus {
    guard(|| {
        // SAFETY: per this function's contract.
        let m = match unsafe { manager(m) } {
            Ok(m) => m,
            Err(s) => return s,
        };
        // The pointer is kept as an integer: the manager stays Send-agnostic and the
        // value goes back to C unchanged.
        *m.out.callback.lock().unwrap_or_else(|p| p.into_inner()) = cb.map(|f| (f, user as usize));
        ApmStatus::Ok
    })
}

pub(crate) fn tracing_lag(k: u64) {
    set_error(&format!(
        "{k} notifications were dropped: the application fell behind"
    ));
}

/// `s` as a NUL-terminated C string of at most `N - 1` bytes.
pub(crate) fn reason_text<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *o = b as c_char;
    }
    out
}

pub(crate) fn unprotected_reason(r: UnprotectedReason) -> &'static str {
    match r {
        UnprotectedReason::NoCandidate => "no_candidate",
        UnprotectedReason::AlternateDown => "alternate_down",
        UnprotectedReason::AlternateFailed => "alternate_failed",
        UnprotectedReason::PeerUnresponsive => "peer_unresponsive",
        UnprotectedReason::PeerRejected(_) => "peer_rejected",
        UnprotectedReason::ModifyFailed => "modify_failed",
        UnprotectedReason::PrimaryDownUnarmed => "primary_down_unarmed",
        _ => "other",
    }
}

pub(crate) fn c_note(n: &Notification) -> ApmNotification {
    let cause = match &n.kind {
        NotificationKind::Migrated { cause, .. } | NotificationKind::Unprotected { cause, .. } => {
            cause.map_or("", Cause::name)
        }
        _ => "",
    };
    let (kind, reason, path) = match &n.kind {
        NotificationKind::Protected {
            alternate,
            survives,
        } => (
            ApmNotificationKind::Protected,
            survives.name(),
            c_path(alternate),
        ),
        NotificationKind::Rearmed {
            alternate,
            survives,
        } => (
            ApmNotificationKind::Rearmed,
            survives.name(),
            c_path(alternate),
        ),
        NotificationKind::Migrated {
            primary, forced, ..
        } => (
            ApmNotificationKind::Migrated,
            if *forced { "forced" } else { "" },
            c_path(primary),
        ),
        NotificationKind::Unprotected { reason, .. } => (
            ApmNotificationKind::Unprotected,
            unprotected_reason(*reason),
            ApmPath::default(),
        ),
        NotificationKind::Lost { reason } => (
            ApmNotificationKind::Lost,
            match reason {
                LostReason::QpFatal => "qp_fatal",
                LostReason::DeviceFatal => "device_fatal",
                _ => "other",
            },
            ApmPath::default(),
        ),
        _ => (
            ApmNotificationKind::Unprotected,
            "other",
            ApmPath::default(),
        ),
    };
    ApmNotification {
        conn_id: n.conn.0,
        time_ns: n.time.as_nanos(),
        kind,
        reason: reason_text(reason),
        cause: reason_text(cause),
        path,
    }
}
