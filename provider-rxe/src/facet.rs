//! [`RxeQpControl`]: apm-core's QP-control facet for RoCE, with software path migration
//! and the progress monitor.
//!
//! Port events, GID changes and QP events come from provider-verbs' facet, which this one
//! wraps (one async-event reader per device); `IBV_EVENT_SQ_DRAINED` is also routed to the
//! connection that is draining. `SoftwareMigrate` moves the connection's primary address
//! vector ([`RcConn::migrate`]); load-alternate, set-rearm and force-migrate are refused:
//! RoCE has no hardware APM.
//!
//! **Progress monitor.** rxe with `retry_cnt` 7 retransmits forever, so a dead path never
//! errors. Every `stall_timeout / 4` the monitor asks each connection whether its sends
//! make progress ([`RcConn::check_stall`]): outstanding sends with no completion for
//! longer than `stall_timeout` (default 300 ms: ~4 retransmissions at ACK timeout 14),
//! or a send that failed (a link down puts an rxe QP in ERR within milliseconds), raise
//! [`QpEvent::PrimaryStalled`] for that connection; the engine then migrates to the
//! agreed alternate. A stall is reported once, and again every `4 * stall_timeout` while
//! it lasts. A send that fails within `3 * stall_timeout` after a migration (work the
//! old path had already doomed) is repaired in place: the QP is re-initialised on its
//! new path, at most twice in a row, without asking the engine to move again. A
//! connection with nothing outstanding is never reported: an idle QP cannot
//! tell a dead path from a quiet one (the peer, which is sending, notices instead).
//!
//! **Application-owned QPs** ([`RxeQpControl::adopt`]) migrate through
//! [`AdoptedQp`]: the same SQ drain, without the monitor (apm does not see their
//! completions). The application reports what it sees through the manager
//! (`apm_core::ManagerHandle::report_stall`), which raises the same `PrimaryStalled`.

use crate::adopt::AdoptedQp;
use crate::conn::{RcConn, Replay};
use crate::warm::{Warm, WARM_EVERY};
use apm_core::{
    ConnId, Gid, Input, InputSink, MigState, Operation, Path, PeerMove, ProviderError, QpControl,
    QpEvent, QpSnapshot, Reason,
};
use async_trait::async_trait;
use provider_verbs::facet::reason as verbs_reason;
use provider_verbs::ffi::{AddressVector, AsyncEventKind, Context, EventElement, Qp};
use provider_verbs::VerbsQpControl;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// This facet's name in errors and logs.
const NAME: &str = "provider-rxe";

/// Tunables of [`RxeQpControl`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxeConfig {
    /// Outstanding sends with no completion for this long mean the path is dead.
    /// Default 300 ms.
    pub stall_timeout: Duration,
    /// How long an application's QP ([`AdoptedQp`]) may take to drain (`SQ_DRAINED`)
    /// before its state is checked. Default 2 s.
    pub drain_timeout: Duration,
    /// How long apm's own connection ([`RcConn`]) drains before apm gives up on the old
    /// path and re-initialises the QP instead; also how long its sends may go without
    /// an acknowledgement before a move skips the drain. On a live path everything in
    /// flight is acknowledged within a round trip; on a dead one only rxe's retransmit
    /// timer (67 ms at ACK timeout 14) would end the drain. Default 10 ms.
    pub drain_grace: Duration,
}

impl Default for RxeConfig {
    fn default() -> Self {
        RxeConfig {
            stall_timeout: Duration::from_millis(300),
            drain_timeout: Duration::from_secs(2),
            drain_grace: Duration::from_millis(10),
        }
    }
}

type Conns = Arc<Mutex<BTreeMap<ConnId, Managed>>>;

/// A connection under this facet.
#[derive(Clone, Debug)]
enum Managed {
    /// apm posts and polls its work ([`RcConn`]).
    Own(Arc<RcConn>),
    /// The application does ([`AdoptedQp`]).
    Adopted(Arc<AdoptedQp>),
}

impl Managed {
    fn context(&self) -> &Context {
        match self {
            Managed::Own(rc) => rc.context(),
            Managed::Adopted(a) => a.qp().context(),
        }
    }
}

/// The RoCE QP-control facet (see the module docs).
pub struct RxeQpControl {
    verbs: VerbsQpControl,
    conns: Conns,
    config: RxeConfig,
    monitor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The paths kept ready for a move onto them ([`crate::warm`]).
    warm: Arc<Mutex<Warm>>,
}

impl std::fmt::Debug for RxeQpControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxeQpControl")
            .field("verbs", &self.verbs)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for RxeQpControl {
    fn drop(&mut self) {
        if let Some(t) = self
            .monitor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            t.abort();
        }
    }
}

fn lock(conns: &Conns) -> std::sync::MutexGuard<'_, BTreeMap<ConnId, Managed>> {
    // Single inserts and removes: a poisoned map is still consistent.
    conns.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RxeQpControl {
    /// A facet over these device contexts (device index `i` is `contexts[i]`).
    pub fn new(contexts: Vec<Context>, config: RxeConfig) -> RxeQpControl {
        let names: Vec<String> = contexts.iter().map(|c| c.name().to_owned()).collect();
        let verbs = VerbsQpControl::new(contexts);
        let conns: Conns = Arc::new(Mutex::new(BTreeMap::new()));
        let hook_conns = conns.clone();
        verbs.set_event_hook(Arc::new(move |device, ev| {
            let (AsyncEventKind::SqDrained, EventElement::Qp(qpn)) = (ev.kind, ev.element) else {
                return;
            };
            let Some(dev) = names.get(usize::from(device)) else {
                return;
            };
            for c in lock(&hook_conns).values() {
                if let Managed::Own(c) = c {
                    if c.qp_num() == qpn && c.context().name() == dev {
                        c.sq_drained();
                    }
                }
            }
        }));
        RxeQpControl {
            verbs,
            conns,
            config,
            monitor: Mutex::new(None),
            warm: Arc::default(),
        }
    }

    /// Keep `paths` ready for a move onto them, now and every [`WARM_EVERY`] while the
    /// facet runs: the peer's neighbour (ARP/ND) entry resolved, the source GID's index
    /// known ([`crate::warm`]). Looks up what is new now, on the caller's thread (one
    /// GID table scan per new source GID).
    pub fn keep_warm(&self, paths: impl IntoIterator<Item = Path>) {
        let fresh = self
            .warm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(paths);
        fresh.make_ready(self.verbs.contexts());
    }

    /// Put `rc` under this facet as connection `conn`.
    pub fn register(&self, conn: ConnId, rc: Arc<RcConn>) -> Result<(), ProviderError> {
        self.insert(conn, rc.qp().clone(), Managed::Own(rc))
    }

    /// Put an application's QP (from [`Qp::adopt`]) under this facet as connection
    /// `conn`, for software migration through [`AdoptedQp`]. Refused when the QP is not
    /// connected (see [`AdoptedQp::new`]).
    pub fn adopt(&self, conn: ConnId, qp: Arc<Qp>) -> Result<(), ProviderError> {
        let adopted = AdoptedQp::new(qp.clone())
            .map_err(|e| ProviderError::refused(Operation::Adopt, e.reason()))?;
        self.insert(conn, qp, Managed::Adopted(Arc::new(adopted)))
    }

    fn insert(&self, conn: ConnId, qp: Arc<Qp>, managed: Managed) -> Result<(), ProviderError> {
        let mut conns = lock(&self.conns);
        if conns.contains_key(&conn) {
            return Err(ProviderError::refused(
                Operation::Register,
                Reason::AlreadyRegistered(conn),
            ));
        }
        self.verbs
            .register(conn, qp)
            .map_err(|e| ProviderError::refused(Operation::Register, verbs_reason(&e)))?;
        conns.insert(conn, managed);
        Ok(())
    }

    /// The application-owned QP registered as `conn`, if it is one: for a caller that
    /// must serialise its own use of the QP with apm's moves ([`AdoptedQp::hold`]).
    pub fn adopted(&self, conn: ConnId) -> Option<Arc<AdoptedQp>> {
        match lock(&self.conns).get(&conn) {
            Some(Managed::Adopted(a)) => Some(a.clone()),
            _ => None,
        }
    }

    /// Forget connection `conn`.
    pub fn unregister(&self, conn: ConnId) {
        self.verbs.unregister(conn);
        lock(&self.conns).remove(&conn);
    }

    /// The device index of a context, as used in [`apm_core::PortKey`]s.
    pub fn device_index(&self, name: &str) -> Option<u16> {
        self.verbs.device_index(name)
    }

    fn conn(&self, conn: ConnId) -> Result<Managed, ProviderError> {
        lock(&self.conns)
            .get(&conn)
            .cloned()
            .ok_or(ProviderError::UnknownConnection(conn))
    }
}

/// What the engine needs to know of an application's QP, read while no move runs and
/// only while the application has not let go of it.
async fn adopted_snapshot(
    verbs: &VerbsQpControl,
    conn: ConnId,
    a: &AdoptedQp,
) -> Result<QpSnapshot, ProviderError> {
    let device = verbs
        .device_index(a.qp().context().name())
        .ok_or(ProviderError::UnknownConnection(conn))?;
    let attr = a
        .query(provider_verbs::facet::SNAPSHOT_MASK)
        .await
        .map_err(|e| ProviderError::refused(Operation::QueryQp, e.reason()))?;
    provider_verbs::facet::snapshot(device, &attr)
}

/// The error for every hardware-APM operation.
fn no_hw_apm(operation: Operation) -> ProviderError {
    ProviderError::Unsupported {
        provider: NAME,
        operation,
        why: Some(Reason::Because(
            "RoCE has no hardware APM (the kernel refuses alternate paths on RoCE ports); \
             protect RoCE connections with MigrationMode::Software",
        )),
    }
}

/// The address vector of `path` on `ctx`, with the source GID's index looked up now
/// (RoCE GID indexes move when addresses come and go).
pub fn address_vector(ctx: &Context, path: &Path) -> Result<AddressVector, ProviderError> {
    let port = path.port.port;
    let sgid_index = gid_index(ctx, port, &path.sgid)?;
    Ok(AddressVector {
        dlid: path.dlid.get(),
        sl: path.sl,
        src_path_bits: 0,
        static_rate: 0,
        port_num: port,
        is_global: true,
        dgid: path.dgid.0,
        sgid_index,
        flow_label: path.flow_label,
        hop_limit: if path.hop_limit <= 1 {
            64
        } else {
            path.hop_limit
        },
        traffic_class: path.traffic_class,
    })
}

/// The index of `gid` in `ctx` port `port`'s GID table, a RoCE v2 entry first
/// ([`Context::roce_gid_index`]).
pub fn gid_index(ctx: &Context, port: u8, gid: &Gid) -> Result<u8, ProviderError> {
    ctx.roce_gid_index(port, &gid.0)
        .map_err(|e| ProviderError::refused(Operation::FindGid, verbs_reason(&e)))?
        .ok_or(ProviderError::refused(
            Operation::FindGid,
            Reason::GidNotInTable { gid: *gid, port },
        ))
}

#[async_trait]
impl QpControl for RxeQpControl {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        self.verbs.start(sink.clone()).await?;
        let conns = self.conns.clone();
        let stall = self.config.stall_timeout;
        let grace = self.config.drain_grace;
        let tick = (stall / 4).max(Duration::from_millis(5));
        let warm = self.warm.clone();
        let contexts = self.verbs.contexts().to_vec();
        let task = tokio::spawn(async move {
            let mut warmed_at = Instant::now();
            loop {
                tokio::time::sleep(tick).await;
                let now = Instant::now();
                if now.saturating_duration_since(warmed_at) >= WARM_EVERY {
                    // Off the workers: a GID the table no longer holds is a scan of it.
                    let all = warm.lock().unwrap_or_else(PoisonError::into_inner).all();
                    let contexts = contexts.clone();
                    drop(tokio::task::spawn_blocking(move || {
                        all.make_ready(&contexts)
                    }));
                    warmed_at = now;
                }
                // Only apm's own connections: it sees their completions.
                let all: Vec<(ConnId, Arc<RcConn>)> = lock(&conns)
                    .iter()
                    .filter_map(|(k, v)| match v {
                        Managed::Own(rc) => Some((*k, rc.clone())),
                        Managed::Adopted(_) => None,
                    })
                    .collect();
                for (conn, rc) in all {
                    match rc.check_stall(now, stall) {
                        crate::conn::Stall::Report => {
                            info!(%conn, qpn = rc.qp_num(), "no send progress: primary path stalled");
                            let event = QpEvent::PrimaryStalled;
                            if sink.send(Input::QpEvent { conn, event }).is_err() {
                                return;
                            }
                        }
                        crate::conn::Stall::Repair => {
                            info!(%conn, qpn = rc.qp_num(), "send failed on the new path: repairing in place");
                            tokio::spawn(async move {
                                if let Err(e) = rc.repair(grace).await {
                                    warn!(%conn, error = %e, "repair failed");
                                }
                            });
                        }
                        _ => {}
                    }
                }
            }
        });
        if let Some(old) = self
            .monitor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(task)
        {
            old.abort();
        }
        Ok(())
    }

    async fn load_alternate(&self, _conn: ConnId, _path: Path) -> Result<(), ProviderError> {
        Err(no_hw_apm(Operation::LoadAlternate))
    }

    async fn set_rearm(&self, _conn: ConnId) -> Result<MigState, ProviderError> {
        Err(no_hw_apm(Operation::SetRearm))
    }

    async fn force_migrate(&self, _conn: ConnId) -> Result<(), ProviderError> {
        Err(no_hw_apm(Operation::ForceMigrate))
    }

    async fn software_migrate(
        &self,
        conn: ConnId,
        path: Path,
        peer: PeerMove,
    ) -> Result<(), ProviderError> {
        let started = Instant::now();
        let managed = self.conn(conn)?;
        let av = address_vector(managed.context(), &path)?;
        debug!(%conn, to = %path, lookup = ?started.elapsed(), "software migration: address vector found");
        let rc = match managed {
            Managed::Own(rc) => rc,
            Managed::Adopted(a) => {
                // A task of its own: the Manager drops this call at the command's
                // deadline, and a move cut off there would leave the application's QP
                // in SQD. The task ends the move in RTS (see `AdoptedQp::migrate`).
                let drain_timeout = self.config.drain_timeout;
                let moving = tokio::spawn(async move { a.migrate(av, drain_timeout).await });
                let result = moving.await.unwrap_or(Err(crate::conn::ConnError::Invalid(
                    "the move of the application's QP stopped midway (apm's runtime ended)",
                )));
                return match result {
                    Ok(()) => {
                        info!(%conn, to = %path, took = ?started.elapsed(), "software migration of the application's QP done");
                        Ok(())
                    }
                    Err(e) => {
                        warn!(%conn, to = %path, error = %e, "software migration of the application's QP failed");
                        Err(ProviderError::refused(
                            Operation::SoftwareMigrate,
                            e.reason(),
                        ))
                    }
                };
            }
        };
        let replay = match peer {
            PeerMove::Done => Replay::Now,
            PeerMove::After => Replay::WhenPeerThere,
            PeerMove::Alongside => Replay::HeldUntilPeerThere,
        };
        match rc.migrate(av, self.config.drain_grace, replay).await {
            Ok(reinit) => {
                info!(%conn, to = %path, reinit, took = ?started.elapsed(), "software migration done");
                tokio::spawn(async move { rc.nudge().await });
                Ok(())
            }
            Err(e) => {
                warn!(%conn, to = %path, error = %e, "software migration failed");
                debug!(stats = ?rc.stats(), "connection stats");
                Err(ProviderError::refused(
                    Operation::SoftwareMigrate,
                    e.reason(),
                ))
            }
        }
    }

    async fn peer_there(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        // An adopted QP replays nothing, so holds nothing.
        if let Managed::Own(rc) = self.conn(conn)? {
            rc.peer_there(&path.dgid.0);
        }
        Ok(())
    }

    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError> {
        match self.conn(conn)? {
            // The application's QP is queried under its hold, as its own verbs are: a
            // query beside its destroy would make the destroy fail (EBUSY), and one
            // after it would read a freed QP.
            Managed::Adopted(a) => adopted_snapshot(&self.verbs, conn, &a).await,
            Managed::Own(_) => self.verbs.query_qp(conn).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apm_core::{Lid, PortKey};

    #[tokio::test]
    async fn hardware_apm_is_refused_with_a_reason() {
        let facet = RxeQpControl::new(Vec::new(), RxeConfig::default());
        let path = crate::roce_path(
            PortKey::new(0, 1),
            "10.0.10.1".parse().expect("ip"),
            "10.0.10.2".parse().expect("ip"),
            3,
            14,
        );
        let conn = ConnId(1);
        let errs = [
            facet.load_alternate(conn, path).await.err(),
            facet.set_rearm(conn).await.err(),
            facet.force_migrate(conn).await.err(),
        ];
        for e in errs {
            match e {
                Some(e @ ProviderError::Unsupported { provider, .. }) => {
                    assert_eq!(provider, "provider-rxe");
                    let text = e.to_string();
                    assert!(text.contains("RoCE has no hardware APM"), "{text}");
                    assert!(text.contains("MigrationMode::Software"), "{text}");
                }
                other => panic!("expected Unsupported, got {other:?}"),
            }
        }
        // Unknown connections are named, not guessed.
        assert_eq!(
            facet.software_migrate(conn, path, PeerMove::Done).await,
            Err(ProviderError::UnknownConnection(conn))
        );
        assert_eq!(path.dlid, Lid::from_wire(0));
    }
}
