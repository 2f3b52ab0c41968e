//! `libapm_preload.so`: apm inside an unmodified verbs program (`apm run`, or
//! `LD_PRELOAD` directly, e.g. under mpirun).
//!
//! **What it interposes**: three exported libibverbs control functions, nothing else —
//! `ibv_modify_qp`, `ibv_query_qp` and `ibv_destroy_qp` (module `ffi`). The real ones are
//! found with `dlvsym(RTLD_NEXT, name, "IBVERBS_1.1")`, or through
//! `dlopen("libibverbs.so.1", RTLD_NOLOAD)` when the program loaded libibverbs itself
//! with `dlopen` (then it is not on `RTLD_NEXT`'s path). The data path (`ibv_post_send`,
//! `ibv_post_recv`, `ibv_poll_cq`: static inline calls through the context's ops) and
//! the program's async events are never touched: on rxe apm reads port events from a
//! context of its own (every context of a device gets them) and needs no QP event
//! (the drain's end is polled). rdma_cm programs reach the same `ibv_modify_qp`.
//!
//! **What it protects**: every RC QP on a soft-RoCE (rxe) device that the program moves
//! to RTS ([`protect`]): peer and primary path from the QP's own attributes, alternates
//! from the host's agent (hello with the peer's agent, rails paired by subnet), comm ids
//! = the QP numbers of both ends, the side with the lower (GID, QPN) active. The program
//! is never made to fail by apm: the real verb always runs and its result is returned
//! unchanged; apm's own work runs after it, inside `catch_unwind`, on apm's threads
//! (started at the first RTS: a program without verbs gets no thread). What cannot be
//! protected (UD/UC/XRC QPs, an SRQ, no apm at the peer, no second path, another kind of
//! device) is said once on stderr and in the report, and runs as without apm.
//!
//! **What it serialises**: the program's own `ibv_modify_qp`/`ibv_query_qp`/
//! `ibv_destroy_qp` on a protected QP wait while apm moves it (milliseconds), so the
//! program never sees it in SQD and never destroys it under apm; a QP the program
//! takes out of RTS or destroys is retired from apm first.
//!
//! **Async events, and where hardware APM would need more.** A context has one async
//! event queue, read by whoever calls `ibv_get_async_event` on it. On rxe apm needs
//! none of the program's events: port events (`PORT_ERR`, `PORT_ACTIVE`, GID changes)
//! reach every context of a device, so apm reads them on its own context, and the end
//! of a drain is polled; so the program keeps its queue to itself and receives exactly
//! what it would without apm. QP-affiliated events (`PATH_MIG`, `QP_FATAL`) go only to
//! the program's context; hardware APM on InfiniBand would need them. The design for
//! that (not built: nothing on rxe raises them for apm) is a tee: at `ibv_open_device`
//! apm keeps the kernel's async fd for itself and puts a pipe in `ctx->async_fd`; apm's
//! thread reads each event from the kernel fd, takes what it needs, and queues a copy
//! for the program, writing one byte to the pipe per event; the interposed
//! `ibv_get_async_event` pops the queue after reading its byte (so `poll`/`epoll` on
//! `ctx->async_fd` and its `O_NONBLOCK` keep working), `ibv_ack_async_event` is the real
//! one (the event's element pointers are unchanged), and `ibv_close_device` puts the
//! kernel fd back before the real close.
//!
//! **Settings** come from the environment `apm run` sets: `APM_RUN_PORT` (the agent's
//! UDP port), `APM_RUN_POLICY` (the engine policy as JSON), `APM_RUN_REPORT_DIR` (where
//! each process writes its report, [`report`]), `APM_LOG` (a tracing filter for apm's
//! own logs, off by default).
#![deny(unsafe_code)]
// A driver inside the program: it times real moves and unprotected intervals.
#![allow(clippy::disallowed_methods)]

mod ffi;
pub mod ledger;
pub mod protect;
pub mod report;
mod tee;
