//! Asynchronous events of a device, read from the context's async fd through tokio.
//!
//! The fd is made non-blocking and registered with tokio's `AsyncFd`; each event read
//! with `ibv_get_async_event` is copied and acked with `ibv_ack_async_event` at once, so a
//! QP or CQ destroy never waits on an event apm still holds.

use super::{sys, Context, Result, VerbsError};
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::unix::AsyncFd;

/// The kind of an async event (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// IBV_EVENT_CQ_ERR.
    CqErr,
    /// IBV_EVENT_QP_FATAL.
    QpFatal,
    /// IBV_EVENT_QP_REQ_ERR.
    QpReqErr,
    /// IBV_EVENT_QP_ACCESS_ERR.
    QpAccessErr,
    /// IBV_EVENT_COMM_EST.
    CommEst,
    /// IBV_EVENT_SQ_DRAINED.
    SqDrained,
    /// IBV_EVENT_PATH_MIG.
    PathMig,
    /// IBV_EVENT_PATH_MIG_ERR.
    PathMigErr,
    /// IBV_EVENT_DEVICE_FATAL.
    DeviceFatal,
    /// IBV_EVENT_PORT_ACTIVE.
    PortActive,
    /// IBV_EVENT_PORT_ERR.
    PortErr,
    /// IBV_EVENT_LID_CHANGE.
    LidChange,
    /// IBV_EVENT_PKEY_CHANGE.
    PkeyChange,
    /// IBV_EVENT_SM_CHANGE.
    SmChange,
    /// IBV_EVENT_SRQ_ERR.
    SrqErr,
    /// IBV_EVENT_SRQ_LIMIT_REACHED.
    SrqLimitReached,
    /// IBV_EVENT_QP_LAST_WQE_REACHED.
    QpLastWqeReached,
    /// IBV_EVENT_CLIENT_REREGISTER.
    ClientReregister,
    /// IBV_EVENT_GID_CHANGE.
    GidChange,
    /// IBV_EVENT_WQ_FATAL.
    WqFatal,
    /// A value this binding does not know.
    Other(u32),
}

impl AsyncEventKind {
    /// From the raw `ibv_event_type`.
    pub fn from_raw(v: u32) -> Self {
        use AsyncEventKind as K;
        match v {
            sys::IBV_EVENT_CQ_ERR => K::CqErr,
            sys::IBV_EVENT_QP_FATAL => K::QpFatal,
            sys::IBV_EVENT_QP_REQ_ERR => K::QpReqErr,
            sys::IBV_EVENT_QP_ACCESS_ERR => K::QpAccessErr,
            sys::IBV_EVENT_COMM_EST => K::CommEst,
            sys::IBV_EVENT_SQ_DRAINED => K::SqDrained,
            sys::IBV_EVENT_PATH_MIG => K::PathMig,
            sys::IBV_EVENT_PATH_MIG_ERR => K::PathMigErr,
            sys::IBV_EVENT_DEVICE_FATAL => K::DeviceFatal,
            sys::IBV_EVENT_PORT_ACTIVE => K::PortActive,
            sys::IBV_EVENT_PORT_ERR => K::PortErr,
            sys::IBV_EVENT_LID_CHANGE => K::LidChange,
            sys::IBV_EVENT_PKEY_CHANGE => K::PkeyChange,
            sys::IBV_EVENT_SM_CHANGE => K::SmChange,
            sys::IBV_EVENT_SRQ_ERR => K::SrqErr,
            sys::IBV_EVENT_SRQ_LIMIT_REACHED => K::SrqLimitReached,
            sys::IBV_EVENT_QP_LAST_WQE_REACHED => K::QpLastWqeReached,
            sys::IBV_EVENT_CLIENT_REREGISTER => K::ClientReregister,
            sys::IBV_EVENT_GID_CHANGE => K::GidChange,
            sys::IBV_EVENT_WQ_FATAL => K::WqFatal,
            o => K::Other(o),
        }
    }

    /// What the event is about, as `verbs.h` groups them.
    fn element_class(self) -> ElementClass {
        use AsyncEventKind as K;
        match self {
            K::CqErr => ElementClass::Cq,
            K::QpFatal
            | K::QpReqErr
            | K::QpAccessErr
            | K::CommEst
            | K::SqDrained
            | K::PathMig
            | K::PathMigErr
            | K::QpLastWqeReached => ElementClass::Qp,
            K::SrqErr | K::SrqLimitReached => ElementClass::Srq,
            K::PortActive
            | K::PortErr
            | K::LidChange
            | K::PkeyChange
            | K::SmChange
            | K::ClientReregister
            | K::GidChange => ElementClass::Port,
            K::DeviceFatal | K::WqFatal | K::Other(_) => ElementClass::Device,
        }
    }
}

enum ElementClass {
    Cq,
    Qp,
    Srq,
    Port,
    Device,
}

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventElement {
    /// A QP, by number.
    Qp(u32),
    /// A port, by number.
    Port(u8),
    /// A CQ (apm does not track CQs by identity).
    Cq,
    /// An SRQ.
    Srq,
    /// The whole device (or an element this binding does not interpret).
    Device,
}

/// One async event, already acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The event.
    pub kind: AsyncEventKind,
    /// What it is about.
    pub element: EventElement,
}

struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The async event stream of one context. Needs a tokio runtime with IO enabled.
pub struct AsyncEvents {
    /// Declared first so it is dropped (deregistered) before the context can close the fd.
    fd: AsyncFd<Fd>,
    ctx: Context,
}

impl std::fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("device", &self.ctx.name())
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Start reading this device's async events. Call from within a tokio runtime. At
    /// most one stream per context: libibverbs has one async fd per context.
    pub fn async_events(&self) -> Result<AsyncEvents> {
        // SAFETY: reading a field of a live context.
        let raw = unsafe { (*self.raw()).async_fd };
        // SAFETY: fcntl on an fd the context owns; only the O_NONBLOCK flag is changed,
        // which libibverbs documents as the way to poll it.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(VerbsError::last("fcntl(async_fd, O_NONBLOCK)"));
        }
        // Registering outside a runtime would panic in tokio: say so instead.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(VerbsError::InvalidArgument(
                "async events need a tokio runtime (call from within one)",
            ));
        }
        // SAFETY: the fd is the context's async fd, open until the context is closed;
        // `AsyncEvents` holds a clone of the context and drops the AsyncFd first (field
        // order), so the fd stays open and the same for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(raw), tokio::io::Interest::READABLE) }
            .map_err(|e| VerbsError::Call {
                call: "AsyncFd::register(async_fd)",
                source: std::io::Error::other(e.to_string()),
            })?;
        Ok(AsyncEvents {
            fd,
            ctx: self.clone(),
        })
    }
}

impl AsyncEvents {
    /// The next event (waits for one). Each is acked before it is returned.
    pub async fn next(&mut self) -> Result<AsyncEvent> {
        loop {
            if let Some(ev) = self.try_next()? {
                return Ok(ev);
            }
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|source| VerbsError::Call {
                    call: "poll(async_fd)",
                    source,
                })?;
            guard.clear_ready();
        }
    }

    /// An event if one is pending, without waiting.
    pub fn try_next(&mut self) -> Result<Option<AsyncEvent>> {
        let lib = &self.ctx.inner.verbs.lib;
        let mut ev = std::mem::MaybeUninit::<sys::ibv_async_event>::zeroed();
        // SAFETY: live context, writable event; the fd is non-blocking so this returns -1
        // with EAGAIN when nothing is pending.
        let rc = unsafe { (lib.ibv_get_async_event)(self.ctx.raw(), ev.as_mut_ptr()) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(VerbsError::Call {
                call: "ibv_get_async_event",
                source: err,
            });
        }
        // SAFETY: filled in by the successful call.
        let mut ev = unsafe { ev.assume_init() };
        let kind = AsyncEventKind::from_raw(ev.event_type);
        let element = match kind.element_class() {
            // SAFETY: for QP events libibverbs sets `element.qp` to a live QP, which stays
            // valid at least until the event is acked (destroy waits for the ack).
            ElementClass::Qp => unsafe {
                let qp = ev.element.qp;
                if qp.is_null() {
                    EventElement::Device
                } else {
                    EventElement::Qp((*qp).qp_num)
                }
            },
            // SAFETY: port events carry the port number in the union's int member.
            ElementClass::Port => unsafe {
                EventElement::Port(u8::try_from(ev.element.port_num).unwrap_or(0))
            },
            ElementClass::Cq => EventElement::Cq,
            ElementClass::Srq => EventElement::Srq,
            ElementClass::Device => EventElement::Device,
        };
        // SAFETY: acking the event just read, once, after the last use of its element.
        unsafe { (lib.ibv_ack_async_event)(&mut ev) };
        Ok(Some(AsyncEvent { kind, element }))
    }
}
