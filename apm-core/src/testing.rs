//! Deterministic stand-ins for the tests of crates built on apm-core; compiled with the
//! `testing` feature (a dev-dependency feature: `apm-core = { ..., features =
//! ["testing"] }`) and in apm-core's own tests. Unlike the `mock` feature's mockall
//! facets, which check the calls a test expects, these behave like the thing they stand
//! for, so a whole engine can run against them.
//!
//! - [`FakeQp`]: a [`QpControl`] facet without hardware. It keeps each QP as an HCA
//!   would (migration state, primary, alternate), reports the ports it was given when
//!   started, lets the test inject port events (a simulated HCA's PORT_ERR and
//!   PORT_ACTIVE) and tells an observer of every operation ([`QpOp`]).
//! - [`paired_conn_spec`]: the spec of a test connection as either end sees it, so
//!   that two test nodes protect the two ends of one connection.
//! - [`notification_line`] and [`remote_gid_line`]: one-line descriptions of what the
//!   engine tells its application, with the fields tests check (a path's local port
//!   and DLID). With [`QpOp`]'s `Display` they are the vocabulary node processes of the
//!   ibsim bed tests report in.
//!
//! Nothing here reads a clock or spawns a task: a fake's state after a sequence of
//! calls depends on that sequence alone.

use crate::io::*;
use crate::manager::FabricEventKind;
use crate::provider::{InputSink, QpControl};
use crate::types::*;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// One QP of a [`FakeQp`], as an HCA keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FakeQpState {
    /// Migration state: `Migrated` until a rearm with an alternate loaded.
    pub mig: MigState,
    /// The primary path.
    pub primary: Path,
    /// The loaded alternate, if any (a forced migration makes it the primary).
    pub alternate: Option<Path>,
}

/// An operation a [`FakeQp`] carried out, as its observer sees it.
///
/// `Display` writes the line the ibsim bed tests report and look for:
/// `LOAD_ALT port=<p> dlid=<lid>`, `REARM -> <state>` and
/// `FORCED primary port=<p> dlid=<lid>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpOp {
    /// `path` was loaded as the alternate of `conn`.
    LoadAlternate {
        /// The connection.
        conn: ConnId,
        /// The new alternate.
        path: Path,
    },
    /// `conn` was set to REARM and read back as `state`.
    Rearm {
        /// The connection.
        conn: ConnId,
        /// The state read back.
        state: MigState,
    },
    /// `conn` was forced to MIGRATED; `primary` is its primary afterwards.
    ForceMigrate {
        /// The connection.
        conn: ConnId,
        /// The primary after the migration.
        primary: Path,
    },
}

impl QpOp {
    /// The connection the operation was for.
    pub fn conn(&self) -> ConnId {
        match *self {
            QpOp::LoadAlternate { conn, .. }
            | QpOp::Rearm { conn, .. }
            | QpOp::ForceMigrate { conn, .. } => conn,
        }
    }
}

impl fmt::Display for QpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpOp::LoadAlternate { path, .. } => {
                write!(f, "LOAD_ALT port={} dlid={}", path.port.port, path.dlid)
            }
            QpOp::Rearm { state, .. } => write!(f, "REARM -> {state:?}"),
            QpOp::ForceMigrate { primary, .. } => write!(
                f,
                "FORCED primary port={} dlid={}",
                primary.port.port, primary.dlid
            ),
        }
    }
}

type Observer = Box<dyn Fn(&QpOp) + Send + Sync>;

/// A [`QpControl`] facet that simulates an HCA's QPs, for tests.
///
/// - `start` sends an [`Input::PortInfo`] for each port given to [`FakeQp::new`] and
///   keeps the sink for [`FakeQp::port_event`].
/// - `load_alternate` stores the alternate; `set_rearm` reads back `Armed` at once when
///   an alternate is loaded (as if the peer's packets already carried MigReq=0) and
///   `Migrated` otherwise; `force_migrate` makes the alternate, if any, the primary, and
///   leaves the QP `Migrated` with no alternate; `query_qp` reads the QP back,
///   always operational.
/// - `software_migrate` is unsupported (the fake is a hardware-migration HCA).
/// - A connection without a QP ([`FakeQp::add_qp`]) gets
///   [`ProviderError::UnknownConnection`].
///
/// Share it as an `Arc<FakeQp>` (also a [`QpControl`]) to keep a handle for injecting
/// events and reading QPs back while a stack owns the other.
pub struct FakeQp {
    ports: Vec<PortInfo>,
    qps: Mutex<BTreeMap<ConnId, FakeQpState>>,
    sink: Mutex<Option<InputSink>>,
    observer: Option<Observer>,
}

impl fmt::Debug for FakeQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeQp")
            .field("ports", &self.ports)
            .field("qps", &*lock(&self.qps))
            .field("started", &lock(&self.sink).is_some())
            .field("observed", &self.observer.is_some())
            .finish()
    }
}

/// Plain data behind every lock: a poisoned one still holds consistent state.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeQp {
    /// An HCA with `ports` (reported when started) and no QPs yet.
    pub fn new(ports: Vec<PortInfo>) -> Self {
        FakeQp {
            ports,
            qps: Mutex::new(BTreeMap::new()),
            sink: Mutex::new(None),
            observer: None,
        }
    }

    /// Call `f` after each operation that changes a QP (load alternate, rearm, forced
    /// migration), outside the fake's locks.
    pub fn on_operation(mut self, f: impl Fn(&QpOp) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(f));
        self
    }

    /// Give `conn` a QP on `primary`: `Migrated`, no alternate loaded (replacing any QP
    /// it had).
    pub fn add_qp(&self, conn: ConnId, primary: Path) {
        lock(&self.qps).insert(
            conn,
            FakeQpState {
                mig: MigState::Migrated,
                primary,
                alternate: None,
            },
        );
    }

    /// `conn`'s QP as it is now.
    pub fn qp(&self, conn: ConnId) -> Option<FakeQpState> {
        lock(&self.qps).get(&conn).copied()
    }

    /// Deliver `event` on `port` as the HCA would (an unaffiliated async event);
    /// whether a started facet had a sink that took it.
    pub fn port_event(&self, port: PortKey, event: PortEvent) -> bool {
        let sink = lock(&self.sink).clone();
        sink.is_some_and(|s| s.send(Input::PortEvent { port, event }).is_ok())
    }

    fn with_qp<T>(
        &self,
        conn: ConnId,
        f: impl FnOnce(&mut FakeQpState) -> T,
    ) -> Result<T, ProviderError> {
        lock(&self.qps)
            .get_mut(&conn)
            .map(f)
            .ok_or(ProviderError::UnknownConnection(conn))
    }

    fn observe(&self, op: QpOp) {
        if let Some(f) = &self.observer {
            f(&op);
        }
    }
}

#[async_trait]
impl QpControl for FakeQp {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        for p in &self.ports {
            let _ = sink.send(Input::PortInfo(p.clone()));
        }
        *lock(&self.sink) = Some(sink);
        Ok(())
    }

    async fn load_alternate(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        self.with_qp(conn, |q| q.alternate = Some(path))?;
        self.observe(QpOp::LoadAlternate { conn, path });
        Ok(())
    }

    async fn set_rearm(&self, conn: ConnId) -> Result<MigState, ProviderError> {
        let state = self.with_qp(conn, |q| {
            q.mig = if q.alternate.is_some() {
                MigState::Armed
            } else {
                MigState::Migrated
            };
            q.mig
        })?;
        self.observe(QpOp::Rearm { conn, state });
        Ok(state)
    }

    async fn force_migrate(&self, conn: ConnId) -> Result<(), ProviderError> {
        let primary = self.with_qp(conn, |q| {
            if let Some(alt) = q.alternate.take() {
                q.primary = alt;
            }
            q.mig = MigState::Migrated;
            q.primary
        })?;
        self.observe(QpOp::ForceMigrate { conn, primary });
        Ok(())
    }

    async fn software_migrate(
        &self,
        _conn: ConnId,
        _path: Path,
        _peer: PeerMove,
    ) -> Result<(), ProviderError> {
        Err(ProviderError::unsupported(
            "fake QP",
            Operation::SoftwareMigrate,
        ))
    }

    async fn peer_there(&self, _conn: ConnId, _path: Path) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError> {
        self.with_qp(conn, |q| QpSnapshot {
            operational: true,
            mig_state: q.mig,
            primary_port: q.primary.port,
            primary_dlid: q.primary.dlid,
            primary_dgid: q.primary.dgid,
        })
    }
}

/// The spec of test connection `k` as its `role` end sees it, numbered so that two test
/// nodes given the same `k` describe the two ends of one connection: the active end's
/// comm ID is `0x1000 + k` and its QPN `0x100 + k`, the passive end's `0x2000 + k` and
/// `0x200 + k`. Hardware migration, no agreed alternate. `None` when `k` is too large
/// for a QPN.
pub fn paired_conn_spec(
    k: u32,
    role: Role,
    primary: Path,
    candidates: Vec<Path>,
) -> Option<ConnSpec> {
    let (mine, theirs) = match role {
        Role::Active => (0x1000, 0x2000),
        Role::Passive => (0x2000, 0x1000),
    };
    let qpn = |base: u32| Qpn::new((base / 0x10).checked_add(k)?);
    // A QPN has 24 bits: when both fit, so do the comm IDs.
    let (local_qpn, remote_qpn) = (qpn(mine)?, qpn(theirs)?);
    Some(ConnSpec {
        id: ConnId(u64::from(k)),
        role,
        mode: MigrationMode::Hardware,
        local_qpn,
        remote_qpn,
        local_comm_id: mine + k,
        remote_comm_id: theirs + k,
        primary,
        agreed_alternate: None,
        candidates,
    })
}

/// A notification in one line: `Protected alt port=<p> dlid=<lid>`, `Rearmed alt ...`,
/// `Migrated forced=<bool> primary port=<p> dlid=<lid>`, the other kinds as `Debug`.
pub fn notification_line(kind: &NotificationKind) -> String {
    match kind {
        NotificationKind::Protected { alternate, .. } => format!(
            "Protected alt port={} dlid={}",
            alternate.port.port, alternate.dlid
        ),
        NotificationKind::Rearmed { alternate, .. } => format!(
            "Rearmed alt port={} dlid={}",
            alternate.port.port, alternate.dlid
        ),
        NotificationKind::Migrated {
            primary, forced, ..
        } => format!(
            "Migrated forced={forced} primary port={} dlid={}",
            primary.port.port, primary.dlid
        ),
        other => format!("{other:?}"),
    }
}

/// An SA notice about a remote port in one line, `remote <port GUID in hex> in|out`;
/// `None` for the other fabric events.
pub fn remote_gid_line(kind: &FabricEventKind) -> Option<String> {
    match kind {
        FabricEventKind::RemoteGid { gid, service } => Some(format!(
            "remote {:x} {}",
            gid.guid(),
            match service {
                GidService::InService => "in",
                GidService::OutOfService => "out",
            }
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn path(port: u8, dlid: u16) -> Path {
        Path {
            rate: 3,
            ..Path::ib(
                PortKey::new(0, port),
                (
                    Lid::from_wire(u16::from(port)),
                    Gid::from_guid(u64::from(port)),
                ),
                (Lid::from_wire(dlid), Gid::from_guid(u64::from(dlid))),
                Path::MTU_2048,
                Path::ACK_TIMEOUT_67MS,
            )
        }
    }

    fn port_info(port: u8) -> PortInfo {
        PortInfo {
            key: PortKey::new(0, port),
            gids: vec![Gid::from_guid(u64::from(port))],
            lid: Lid::from_wire(u16::from(port)),
            lmc: 0,
            active: true,
            link_layer: LinkLayer::InfiniBand,
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn rearm_arms_only_with_an_alternate_and_a_forced_migration_swaps() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let qp = FakeQp::new(Vec::new()).on_operation(move |op| lock(&log).push(op.to_string()));
        let c = ConnId(7);
        qp.add_qp(c, path(2, 20));
        block_on(async {
            assert_eq!(qp.set_rearm(c).await, Ok(MigState::Migrated));
            qp.load_alternate(c, path(1, 10)).await.unwrap();
            assert_eq!(qp.set_rearm(c).await, Ok(MigState::Armed));
            let s = qp.query_qp(c).await.unwrap();
            assert_eq!(
                (s.mig_state, s.primary_port, s.primary_dlid),
                (MigState::Armed, PortKey::new(0, 2), Lid::from_wire(20))
            );
            qp.force_migrate(c).await.unwrap();
            assert_eq!(
                qp.qp(c),
                Some(FakeQpState {
                    mig: MigState::Migrated,
                    primary: path(1, 10),
                    alternate: None,
                })
            );
            // Nothing loaded: the primary stays.
            qp.force_migrate(c).await.unwrap();
            assert_eq!(qp.qp(c).map(|q| q.primary), Some(path(1, 10)));
        });
        assert_eq!(
            *lock(&seen),
            [
                "REARM -> Migrated",
                "LOAD_ALT port=1 dlid=10",
                "REARM -> Armed",
                "FORCED primary port=1 dlid=10",
                "FORCED primary port=1 dlid=10",
            ]
        );
    }

    #[test]
    fn unknown_connections_and_software_migration_are_refused() {
        let qp = FakeQp::new(Vec::new());
        block_on(async {
            assert_eq!(
                qp.set_rearm(ConnId(1)).await,
                Err(ProviderError::UnknownConnection(ConnId(1)))
            );
            qp.add_qp(ConnId(1), path(1, 1));
            assert!(matches!(
                qp.software_migrate(ConnId(1), path(2, 2), PeerMove::Done)
                    .await,
                Err(ProviderError::Unsupported { .. })
            ));
        });
    }

    #[test]
    fn ports_at_start_then_injected_events() {
        let qp = Arc::new(FakeQp::new(vec![port_info(1), port_info(2)]));
        assert!(!qp.port_event(PortKey::new(0, 2), PortEvent::Down));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        block_on(QpControl::start(&qp, tx)).unwrap();
        assert!(qp.port_event(PortKey::new(0, 2), PortEvent::Down));
        let got: Vec<Input> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(
            got,
            [
                Input::PortInfo(port_info(1)),
                Input::PortInfo(port_info(2)),
                Input::PortEvent {
                    port: PortKey::new(0, 2),
                    event: PortEvent::Down
                },
            ]
        );
    }

    #[test]
    fn paired_specs_are_two_ends_of_one_connection() {
        let a = paired_conn_spec(3, Role::Active, path(2, 2), Vec::new()).unwrap();
        let p = paired_conn_spec(3, Role::Passive, path(2, 1), vec![path(1, 1)]).unwrap();
        assert_eq!((a.local_comm_id, a.remote_comm_id), (0x1003, 0x2003));
        assert_eq!(
            (a.local_comm_id, a.remote_comm_id),
            (p.remote_comm_id, p.local_comm_id)
        );
        assert_eq!((a.local_qpn, a.remote_qpn), (p.remote_qpn, p.local_qpn));
        assert_eq!(a.local_qpn, Qpn::new(0x103).unwrap());
        assert_eq!((a.id, p.id), (ConnId(3), ConnId(3)));
        assert!(paired_conn_spec(0xff_ffff, Role::Active, path(1, 1), Vec::new()).is_none());
    }

    #[test]
    fn lines() {
        let n = NotificationKind::Migrated {
            primary: path(1, 5),
            forced: true,
            cause: None,
        };
        assert_eq!(
            notification_line(&n),
            "Migrated forced=true primary port=1 dlid=5"
        );
        let e = FabricEventKind::RemoteGid {
            gid: Gid::from_guid(0xab),
            service: GidService::OutOfService,
        };
        assert_eq!(remote_gid_line(&e).as_deref(), Some("remote ab out"));
    }
}
