//! The interposed libibverbs functions and the lookup of the real ones.
//!
//! Every exported function calls the real verb and returns its result unchanged; apm's
//! part runs around it inside `catch_unwind` and can neither fail the call nor unwind
//! into C. Nothing here allocates or locks before the real verb on a QP apm does not
//! protect beyond one map lookup.
// The FFI boundary: exported C functions, dlvsym, raw QP pointers. Every block carries a
// SAFETY comment; the rest of the crate is safe code.
#![allow(unsafe_code)]

use crate::ledger::Drainer;
use crate::protect::{self, QpSeen};
use crate::tee;
use provider_verbs::ffi::sys;
use std::ffi::{c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

type ModifyFn = unsafe extern "C" fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int) -> c_int;
type QueryFn = unsafe extern "C" fn(
    *mut sys::ibv_qp,
    *mut sys::ibv_qp_attr,
    c_int,
    *mut sys::ibv_qp_init_attr,
) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut sys::ibv_qp) -> c_int;
type DestroyCqFn = unsafe extern "C" fn(*mut sys::ibv_cq) -> c_int;
type DestroySrqFn = unsafe extern "C" fn(*mut sys::ibv_srq) -> c_int;
type OpenFn = unsafe extern "C" fn(*mut sys::ibv_device) -> *mut sys::ibv_context;
type CloseFn = unsafe extern "C" fn(*mut sys::ibv_context) -> c_int;
type GetEventFn = unsafe extern "C" fn(*mut sys::ibv_context, *mut sys::ibv_async_event) -> c_int;
type AckFn = unsafe extern "C" fn(*mut sys::ibv_async_event);

static MODIFY: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static QUERY: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DESTROY: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DESTROY_CQ: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DESTROY_SRQ: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static OPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static CLOSE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static GET_EVENT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static ACK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The program called one of apm's verbs (for [`saw_verbs`]).
static SAW: AtomicBool = AtomicBool::new(false);

/// Whether any of the program's verbs reached apm.
pub(crate) fn saw_verbs() -> bool {
    SAW.load(Ordering::Relaxed)
}

/// The real `name` of libibverbs (symbol version `IBVERBS_1.1`, the one programs link).
fn real(name: &CStr) -> Option<*mut c_void> {
    const VERSION: &CStr = c"IBVERBS_1.1";
    // SAFETY: dlvsym with valid C strings; RTLD_NEXT searches the objects loaded after
    // this one (libibverbs when the program links it).
    let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), VERSION.as_ptr()) };
    if !p.is_null() {
        return Some(p);
    }
    // A program that dlopen'ed libibverbs (RTLD_LOCAL) is not on RTLD_NEXT's path:
    // ask for the already loaded library by name, without loading it.
    // SAFETY: RTLD_NOLOAD never runs constructors; the handle is only used for dlvsym
    // and kept (the library stays loaded while the program uses it anyway).
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    if h.is_null() {
        return None;
    }
    // SAFETY: as above, on a live handle.
    let p = unsafe { libc::dlvsym(h, name.as_ptr(), VERSION.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// libibverbs' `name` behind `cell`, looked up until found: a lookup before the program
/// has loaded libibverbs finds nothing, and that is not remembered.
fn real_ptr(cell: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let p = cell.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let p = real(name).unwrap_or(std::ptr::null_mut());
    cell.store(p, Ordering::Release);
    p
}

/// The real function behind `$cell`: libibverbs' `$name`, as a `$ty`.
macro_rules! resolve {
    ($cell:ident, $name:literal, $ty:ty) => {{
        SAW.store(true, Ordering::Relaxed);
        let p = real_ptr(&$cell, $name);
        // SAFETY: the symbol is libibverbs' own function of that name, whose C
        // signature `$ty` is (rdma-core's verbs.h, as bindgen took it).
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
    }};
}

/// apm's own function for libibverbs' `name` when `found` is libibverbs' (the very one
/// apm calls as the real one), for a program that binds its verbs with `dlsym` or
/// `dlvsym` ([`crate::loader`]).
pub(crate) fn interposed(name: &CStr, found: *mut c_void) -> Option<*mut c_void> {
    let (cell, ours): (&AtomicPtr<c_void>, usize) = match name.to_bytes() {
        b"ibv_modify_qp" => (&MODIFY, ibv_modify_qp as *const () as usize),
        b"ibv_query_qp" => (&QUERY, ibv_query_qp as *const () as usize),
        b"ibv_destroy_qp" => (&DESTROY, ibv_destroy_qp as *const () as usize),
        b"ibv_destroy_cq" => (&DESTROY_CQ, ibv_destroy_cq as *const () as usize),
        b"ibv_destroy_srq" => (&DESTROY_SRQ, ibv_destroy_srq as *const () as usize),
        b"ibv_open_device" => (&OPEN, ibv_open_device as *const () as usize),
        b"ibv_close_device" => (&CLOSE, ibv_close_device as *const () as usize),
        b"ibv_get_async_event" => (&GET_EVENT, ibv_get_async_event as *const () as usize),
        _ => return None,
    };
    (real_ptr(cell, name) == found).then_some(ours as *mut c_void)
}

/// Run apm's part; a panic in it is apm's failure alone and is reported, not unwound.
fn guarded<R>(what: &str, f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(_) => {
            protect::internal_failure(what);
            None
        }
    }
}

const NO_SYMBOL: c_int = libc::EOPNOTSUPP;

/// libibverbs' own `ibv_ack_async_event` (the tee acks on the program's behalf with it).
pub(crate) fn real_ack() -> Option<AckFn> {
    resolve!(ACK, c"ibv_ack_async_event", AckFn)
}

/// `ibv_modify_qp`: the real one; then, when it moved an RC QP to RTS, apm starts
/// protecting it, and when it took a protected QP out of RTS, apm lets go of it.
///
/// # Safety
/// The caller's contract of `ibv_modify_qp` (a live QP, a valid attribute struct).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let Some(real) = resolve!(MODIFY, c"ibv_modify_qp", ModifyFn) else {
        return NO_SYMBOL;
    };
    let key = qp as usize;
    // SAFETY: the caller's own arguments, passed on unchanged.
    let call = || unsafe { real(qp, attr, mask) };
    let rc = once("ibv_modify_qp", call, |run| {
        protect::with_held(key, || {
            // A QP apm moves in software: its drains and the program's are told apart
            // by the order they were asked for (see `tee`), so the program's is noted
            // before the device can raise its event.
            // SAFETY: the caller's contract: a live QP and attribute struct.
            let drains = unsafe { asks_drain(qp, attr, mask) };
            if drains {
                tee::drain_asked(key, Drainer::Program);
            }
            let rc = run();
            if drains && rc != 0 {
                tee::drain_withdrawn(key, Drainer::Program);
            }
        });
    });
    if rc != 0 || attr.is_null() {
        return rc;
    }
    let own_apm = (sys::IBV_QP_ALT_PATH | sys::IBV_QP_PATH_MIG_STATE) as c_int;
    if mask & own_apm != 0 {
        guarded("note the program's own APM", || protect::manages_apm(key));
    }
    if mask & sys::IBV_QP_STATE as c_int == 0 {
        return rc;
    }
    // SAFETY: a valid attribute struct per the contract.
    let state = unsafe { (*attr).qp_state };
    if state == sys::IBV_QPS_RTS {
        // SAFETY: a live QP per the contract.
        if let Some(seen) = unsafe { seen(qp) } {
            guarded("protect on RTS", || protect::on_rts(seen));
        }
    } else if state == sys::IBV_QPS_RTR {
        // SAFETY: a live QP per the contract.
        if let Some(seen) = unsafe { seen(qp) } {
            guarded("note RTR", || protect::on_rtr(seen));
        }
    } else if state != sys::IBV_QPS_SQD {
        guarded("release on a state change", || {
            protect::release(key, "left RTS");
            if state == sys::IBV_QPS_RESET {
                tee::starts_over(key);
            }
        });
    }
    rc
}

/// Whether this modify takes `qp` from RTS to SQD (a drain, whose end the device
/// announces with `SQ_DRAINED`).
///
/// # Safety
/// `qp` and `attr` are live per the caller's contract of `ibv_modify_qp`.
unsafe fn asks_drain(qp: *mut sys::ibv_qp, attr: *mut sys::ibv_qp_attr, mask: c_int) -> bool {
    if qp.is_null() || attr.is_null() || mask & sys::IBV_QP_STATE as c_int == 0 {
        return false;
    }
    // SAFETY: per the contract; `state` is what libibverbs set at the last modify.
    unsafe { (*attr).qp_state == sys::IBV_QPS_SQD && (*qp).state == sys::IBV_QPS_RTS }
}

/// `ibv_query_qp`: the real one, after any move of a protected QP has finished.
///
/// # Safety
/// The caller's contract of `ibv_query_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    mask: c_int,
    init: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let Some(real) = resolve!(QUERY, c"ibv_query_qp", QueryFn) else {
        return NO_SYMBOL;
    };
    // SAFETY: the caller's own arguments, passed on unchanged.
    let call = || unsafe { real(qp, attr, mask, init) };
    once("ibv_query_qp", call, |run| {
        protect::with_held(qp as usize, || {
            run();
        });
    })
}

/// `ibv_destroy_qp`: apm lets go of the QP first (waiting for a move in progress).
///
/// # Safety
/// The caller's contract of `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    let Some(real) = resolve!(DESTROY, c"ibv_destroy_qp", DestroyFn) else {
        return NO_SYMBOL;
    };
    guarded("release on destroy", || protect::destroyed(qp as usize));
    // SAFETY: the caller's own argument.
    let call = || unsafe { real(qp) };
    destroy_through_tee(qp as usize, call)
}

/// The program's verb `call`, run by apm's part `apm` (under a lock of apm's, say) or,
/// when apm's part does not run it (a QP apm does not look after) or fails before it
/// ran, by itself: exactly once either way, its result unchanged.
fn once(what: &str, call: impl Fn() -> c_int, apm: impl FnOnce(&dyn Fn() -> c_int)) -> c_int {
    let done = std::cell::Cell::new(None);
    let run = || {
        let rc = call();
        done.set(Some(rc));
        rc
    };
    let _ = guarded(what, || apm(&run));
    done.get().unwrap_or_else(call)
}

/// A destroy, with the tee's accounting of the object's events ([`tee::destroy`]).
fn destroy_through_tee(addr: usize, call: impl Fn() -> c_int) -> c_int {
    once("destroy through the event tee", call, |run| {
        tee::destroy(addr, run);
    })
}

/// `ibv_destroy_cq`: the real one, with the tee's accounting of the CQ's async events.
///
/// # Safety
/// The caller's contract of `ibv_destroy_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    let Some(real) = resolve!(DESTROY_CQ, c"ibv_destroy_cq", DestroyCqFn) else {
        return NO_SYMBOL;
    };
    // SAFETY: the caller's own argument.
    let call = || unsafe { real(cq) };
    destroy_through_tee(cq as usize, call)
}

/// `ibv_destroy_srq`: the real one, with the tee's accounting of the SRQ's async events.
///
/// # Safety
/// The caller's contract of `ibv_destroy_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
    let Some(real) = resolve!(DESTROY_SRQ, c"ibv_destroy_srq", DestroySrqFn) else {
        return NO_SYMBOL;
    };
    // SAFETY: the caller's own argument.
    let call = || unsafe { real(srq) };
    destroy_through_tee(srq as usize, call)
}

/// `ibv_open_device`: the real one; then, on a soft-RoCE device where apm may use
/// hardware APM, the async event tee ([`tee`]) so that apm sees the events of the
/// program's QPs. A tee that cannot start leaves the context as it was (said once).
///
/// # Safety
/// The caller's contract of `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut sys::ibv_device) -> *mut sys::ibv_context {
    let Some(real) = resolve!(OPEN, c"ibv_open_device", OpenFn) else {
        // SAFETY: setting errno, as libibverbs does on failure.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's own argument.
    let ctx = unsafe { real(device) };
    if ctx.is_null() {
        return ctx;
    }
    // SAFETY: a context libibverbs just returned; its device is live.
    let name = unsafe { device_name(ctx) };
    if crate::mode::wants_tee(&name) {
        // SAFETY: the context was just opened and is not the program's yet.
        if let Some(Err(why)) = guarded("the event tee", || unsafe { tee::attach(ctx) }) {
            crate::report::note(&format!(
                "apm cannot share {name}'s async events ({why}): its QPs are protected \
                 in software, if at all"
            ));
        }
    }
    ctx
}

/// `ibv_close_device`: the tee comes off first, then the real close.
///
/// # Safety
/// The caller's contract of `ibv_close_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut sys::ibv_context) -> c_int {
    let Some(real) = resolve!(CLOSE, c"ibv_close_device", CloseFn) else {
        return NO_SYMBOL;
    };
    guarded("take the event tee off", || tee::detach(ctx as usize));
    // SAFETY: the caller's own argument.
    unsafe { real(ctx) }
}

/// `ibv_get_async_event`: the real one; on a context with a tee, the events apm kept
/// for the program come first, and apm gets a copy of each; events apm caused are
/// passed over ([`tee::get_event`]).
///
/// # Safety
/// The caller's contract of `ibv_get_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut sys::ibv_context,
    event: *mut sys::ibv_async_event,
) -> c_int {
    let Some(real) = resolve!(GET_EVENT, c"ibv_get_async_event", GetEventFn) else {
        return -1;
    };
    // SAFETY: the caller's arguments; `real` is libibverbs' function.
    unsafe { tee::get_event(ctx, event, real) }
}

/// The name of the device of a live context.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn device_name(ctx: *mut sys::ibv_context) -> String {
    // SAFETY: a live context and its live device (libibverbs' public structs).
    unsafe {
        if ctx.is_null() || (*ctx).device.is_null() {
            return String::new();
        }
        CStr::from_ptr((*(*ctx).device).name.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// What apm needs to know of a QP that just reached RTS, read from the struct.
///
/// # Safety
/// `qp` is a live QP.
unsafe fn seen(qp: *mut sys::ibv_qp) -> Option<QpSeen> {
    if qp.is_null() {
        return None;
    }
    // SAFETY: a live QP and its live context and device (libibverbs' public structs).
    unsafe {
        let ctx = (*qp).context;
        let device = device_name(ctx);
        Some(QpSeen {
            key: qp as usize,
            context: ctx as usize,
            qpn: (*qp).qp_num,
            kind: match (*qp).qp_type {
                sys::IBV_QPT_RC => protect::QpKind::Rc,
                sys::IBV_QPT_UC => protect::QpKind::Uc,
                sys::IBV_QPT_UD => protect::QpKind::Ud,
                sys::IBV_QPT_XRC_SEND | sys::IBV_QPT_XRC_RECV => protect::QpKind::Xrc,
                _ => protect::QpKind::Other,
            },
            srq: !(*qp).srq.is_null(),
            device,
        })
    }
}

/// Wrap the program's QP for apm.
///
/// The caller ([`protect`]) guarantees the QP is live until it is released: the
/// program's `ibv_destroy_qp` waits in [`protect::release`] for the adoption in progress
/// and retires the QP before the real destroy runs.
pub(crate) fn adopt(
    ctx: &provider_verbs::ffi::Context,
    key: usize,
) -> Result<provider_verbs::ffi::Qp, provider_verbs::VerbsError> {
    // SAFETY: `key` is a live `struct ibv_qp *` of this process (see above), created
    // through the libibverbs provider-verbs found already loaded.
    unsafe { provider_verbs::ffi::Qp::adopt(ctx, key as *mut c_void) }
}

/// Runs when the library is loaded: apm's part of every `fork()` ([`crate::fork`]).
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

extern "C" fn at_load() {
    // The real dlsym and dlvsym, before the program's first lookup (crate::loader).
    let _ = catch_unwind(crate::loader::find_real);
    // SAFETY: three handlers of the C signature, each catching its own panics.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
}

unsafe extern "C" fn fork_prepare() {
    let _ = catch_unwind(crate::fork::prepare);
}

unsafe extern "C" fn fork_parent() {
    let _ = catch_unwind(crate::fork::parent);
}

unsafe extern "C" fn fork_child() {
    let _ = catch_unwind(crate::fork::child);
}

/// Runs at the program's exit: the last report and summary line.
#[used]
#[link_section = ".fini_array"]
static AT_EXIT: extern "C" fn() = at_exit;

extern "C" fn at_exit() {
    let _ = catch_unwind(protect::at_exit);
}
