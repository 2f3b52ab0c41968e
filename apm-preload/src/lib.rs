//! `libapm_preload.so`: apm inside an unmodified verbs program (`apm run`, or
//! `LD_PRELOAD` directly, e.g. under mpirun).
//!
//! **What it interposes**: exported libibverbs control functions only (module `ffi`) —
//! `ibv_modify_qp`, `ibv_query_qp` and `ibv_destroy_qp` (protection), `ibv_open_device`,
//! `ibv_close_device`, `ibv_get_async_event`, `ibv_destroy_cq` and `ibv_destroy_srq`
//! (the async event tee). The real ones are found with `dlvsym(RTLD_NEXT, name,
//! "IBVERBS_1.1")`, or through `dlopen("libibverbs.so.1", RTLD_NOLOAD)` when the
//! program loaded libibverbs itself with `dlopen` (then it is not on `RTLD_NEXT`'s
//! path). The data path (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`: static inline
//! calls through the context's ops) is never touched. rdma_cm programs reach the same
//! verbs.
//!
//! **How programs reach it**: a program that links libibverbs calls these exports (the
//! preload comes first in the global scope). One that `dlopen`s libibverbs and binds
//! each verb with `dlsym`/`dlvsym` on that handle (NCCL) would not: the library also
//! exports `dlsym` and `dlvsym` and answers such a lookup of one of these verbs with
//! apm's (module `loader`, which says why this way, where the real lookup functions
//! come from without recursion, and what it cannot cover). A process that held an RDMA
//! device at exit though none of its verbs reached apm (a statically linked libibverbs,
//! a provider's direct verbs, ...) is reported "not seen", with the reason.
//!
//! **What it protects**: every RC QP on a soft-RoCE (rxe) device that the program moves
//! to RTS ([`protect`]): peer and primary path from the QP's own attributes, alternates
//! from the host's agent (hello with the peer's agent, rails paired by subnet), comm ids
//! = the QP numbers of both ends, the side with the lower (GID, QPN) active. Where the
//! kernel accepts alternate paths on the device (the APM-capable soft-RoCE) the device
//! migrates the QP by itself (hardware APM) and apm arms it; elsewhere apm moves it
//! through the SQ drain (software migration); `APM_RUN_MIGRATION` can insist on one.
//! The program is never made to fail by apm: the real verb always runs and its result
//! is returned unchanged; apm's own work runs after it, inside `catch_unwind`, on apm's
//! threads (started at the first RTS: a program without verbs gets no thread). What
//! cannot be protected (UD/UC/XRC QPs, an SRQ under software migration, no apm at the
//! peer, no second path, another kind of device, a QP whose program loads alternate paths
//! itself) is said once on stderr and in the report, and runs as without apm.
//!
//! **What it serialises**: the program's own `ibv_modify_qp`/`ibv_query_qp`/
//! `ibv_destroy_qp` on a QP apm moves in software wait while apm moves it
//! (milliseconds), so the program never sees it in SQD and never destroys it under apm;
//! a QP the program takes out of RTS or destroys is retired from apm first: a move in
//! progress stops at its next check. A move that lasts longer than the command deadline
//! (a drain on a dead path ends only at the QP's retransmit timer) still ends in RTS,
//! and the program's other verbs stop waiting for it at that deadline.
//!
//! **fork** (module `fork`): a child forked without exec gets no lock an apm thread
//! held and writes a report of its own; an apm started in the parent stays the
//! parent's (the child's QPs are refused with that reason); a child that execs gets an
//! apm of its own.
//!
//! **Async events** (module `tee`): a context has one async event queue, and whoever reads
//! an event takes it. Hardware APM needs the QP-affiliated events of the program's QPs
//! (`PATH_MIG`), which only the program's context receives; port events reach every
//! context of a device, so apm reads those on its own. A program that reads its events
//! reads them as without apm and apm gets a copy; for one that does not, apm takes what
//! it left for 10 ms and keeps it for the program's first read, and acks on its behalf
//! what it never read of an object it destroys (libibverbs' destroy waits until every
//! event read from the kernel is acked). Events apm caused (the `SQ_DRAINED` of its
//! software moves, the `PATH_MIG` of a QP it arms) are kept from the program on every
//! context, whatever `--migration` says.
//!
//! **Settings** come from the environment `apm run` sets: `APM_RUN_PORT` (the agent's
//! UDP port), `APM_RUN_AGENT_SOCKET` (the agent's socket) and `APM_RUN_AGENT_UID` (an
//! agent user to trust besides root and this user; `settings`), `APM_RUN_POLICY` (the
//! engine policy as JSON), `APM_RUN_REPORT_DIR` (where each process writes its report,
//! [`report`]), `APM_LOG` (a tracing filter for apm's own logs, off by default).
#![deny(unsafe_code)]
// A driver inside the program: it times real moves and unprotected intervals.
#![allow(clippy::disallowed_methods)]

mod ffi;
mod fork;
pub mod infiniband;
mod ledger;
mod loader;
pub mod mode;
pub mod protect;
pub mod report;
mod settings;
mod tee;
