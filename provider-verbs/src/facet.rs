//! provider-verbs as apm-core's [`QpControl`] facet: local events in, hardware APM out.
//!
//! The application hands over the device contexts its QPs live on and registers each
//! protected QP under its [`ConnId`]. [`QpControl::start`] then reports every port as an
//! [`Input::PortInfo`] and turns each device's async events into engine inputs (port
//! events, QP events mapped to their connection, device fatal). Commands run the
//! [`crate::hw_apm`] operations, which refuse RoCE ports up front.
//!
//! Async events are delivered to the context that created the QP, and a context has one
//! event queue: the application must pass the contexts it created its QPs on, and must
//! not read their async events itself while this facet runs. A QP created on a context
//! this facet does not read (a program's own, whose events an interposition library
//! shares with apm) has its events handed in with [`VerbsQpControl::deliver_qp_event`].
#![forbid(unsafe_code)]

use crate::ffi::{self, AsyncEventKind, Context, EventElement, PortState, Qp, QpState, VerbsError};
use crate::hw_apm;
use apm_core::{
    ConnId, Gid, Input, InputSink, Lid, LinkLayer, MigState, Operation, Path, PortEvent, PortInfo,
    PortKey, ProviderError, QpControl, QpEvent, QpSnapshot, Reason,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// This facet's name in errors and logs.
const NAME: &str = "provider-verbs";

/// The QP-control and local-event facet over libibverbs.
pub struct VerbsQpControl {
    /// Index = `PortKey::device`.
    devices: Vec<Context>,
    conns: Conns,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    hook: Mutex<Option<EventHook>>,
    /// The engine's input, once started (for events read elsewhere).
    sink: Mutex<Option<InputSink>>,
}

/// Called with every async event (and its device index) before it becomes an engine
/// input: how a facet built on this one (provider-rxe) sees events such as
/// `SQ_DRAINED` that the engine has no use for. It runs on the event task: keep it short.
pub type EventHook = Arc<dyn Fn(u16, &ffi::AsyncEvent) + Send + Sync>;

impl std::fmt::Debug for VerbsQpControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.devices.iter().map(|c| c.name()).collect();
        f.debug_struct("VerbsQpControl")
            .field("devices", &names)
            .finish_non_exhaustive()
    }
}

impl Drop for VerbsQpControl {
    fn drop(&mut self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            t.abort();
        }
    }
}

impl VerbsQpControl {
    /// A facet over these contexts; device index `i` in [`PortKey`]s is `contexts[i]`.
    pub fn new(contexts: Vec<Context>) -> Self {
        VerbsQpControl {
            devices: contexts,
            conns: Arc::new(Mutex::new(BTreeMap::new())),
            tasks: Mutex::new(Vec::new()),
            hook: Mutex::new(None),
            sink: Mutex::new(None),
        }
    }

    /// An async event of connection `conn`'s QP that someone else read (the QP lives on
    /// a context this facet does not read): it reaches the engine as the facet's own
    /// events do. Ignored before [`QpControl::start`] and for kinds the engine has no use
    /// for; returns whether it became an input.
    pub fn deliver_qp_event(&self, conn: ConnId, kind: AsyncEventKind) -> bool {
        let Some(event) = qp_event(kind) else {
            return false;
        };
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        sink.as_ref()
            .is_some_and(|s| s.send(Input::QpEvent { conn, event }).is_ok())
    }

    /// Also hand every async event to `hook` (replacing an earlier one). Set it before
    /// [`QpControl::start`]: the event tasks take the hook they find then.
    pub fn set_event_hook(&self, hook: EventHook) {
        *self.hook.lock().unwrap_or_else(PoisonError::into_inner) = Some(hook);
    }

    /// The device contexts, by device index.
    pub fn contexts(&self) -> &[Context] {
        &self.devices
    }

    /// The device index of a context name, as used in [`PortKey`]s.
    pub fn device_index(&self, name: &str) -> Option<u16> {
        self.devices
            .iter()
            .position(|c| c.name() == name)
            .and_then(|i| u16::try_from(i).ok())
    }

    /// Put `qp` under this facet as connection `conn` (replacing an earlier one).
    pub fn register(&self, conn: ConnId, qp: Arc<Qp>) -> Result<(), VerbsError> {
        if self.device_index(qp.context().name()).is_none() {
            return Err(VerbsError::InvalidArgument(
                "the QP is on a device this facet was not given",
            ));
        }
        self.lock_conns().insert(conn, qp);
        Ok(())
    }

    /// Forget connection `conn`.
    pub fn unregister(&self, conn: ConnId) {
        self.lock_conns().remove(&conn);
    }

    fn lock_conns(&self) -> std::sync::MutexGuard<'_, BTreeMap<ConnId, Arc<Qp>>> {
        // A panic elsewhere while holding the map leaves it consistent (single inserts
        // and removes): keep using it.
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn qp(&self, conn: ConnId) -> Result<Arc<Qp>, ProviderError> {
        self.lock_conns()
            .get(&conn)
            .cloned()
            .ok_or(ProviderError::UnknownConnection(conn))
    }

    /// The engine's view of one local port.
    pub fn port_info(&self, key: PortKey) -> Result<PortInfo, VerbsError> {
        let ctx = self
            .devices
            .get(usize::from(key.device))
            .ok_or(VerbsError::InvalidArgument("no such device index"))?;
        port_info(ctx, key)
    }
}

fn port_info(ctx: &Context, key: PortKey) -> Result<PortInfo, VerbsError> {
    let p = ctx.query_port(key.port)?;
    let link_layer = match p.link_layer {
        ffi::LinkLayer::Ethernet => LinkLayer::Ethernet,
        _ => LinkLayer::InfiniBand,
    };
    let gids = ctx
        .gid_table(key.port)?
        .into_iter()
        .map(|g| Gid(g.gid))
        .collect();
    Ok(PortInfo {
        key,
        gids,
        lid: Lid::from_wire(p.lid),
        lmc: p.lmc,
        active: p.state == PortState::Active,
        link_layer,
    })
}

/// A binding error as the engine sees it: what it says the device cannot do is
/// `Unsupported`, a missing library `Unavailable`, anything else a refusal with its
/// [`reason`].
pub fn to_provider(operation: Operation, e: VerbsError) -> ProviderError {
    let unsupported = |why: &'static str| ProviderError::Unsupported {
        provider: NAME,
        operation,
        why: Some(Reason::Because(why)),
    };
    match e {
        VerbsError::HardwareApmOnRoce { .. } => unsupported(
            "hardware APM on a RoCE port: the kernel refuses alternate paths there (the \
             stock RDMA core bans them on RoCE, and stock rxe never migrates); use \
             provider-rxe, which migrates paths in software",
        ),
        VerbsError::NoApmCapability { .. } => {
            unsupported("the device does not advertise IBV_DEVICE_AUTO_PATH_MIG")
        }
        VerbsError::Unsupported(what) => unsupported(what),
        VerbsError::LibraryMissing { .. } => ProviderError::Unavailable {
            library: "libibverbs.so.1",
            package: "libibverbs1",
        },
        other => ProviderError::refused(operation, reason(&other)),
    }
}

/// Why a verb failed, as a [`Reason`]: the call and its errno, or what was wrong with
/// the argument.
pub fn reason(e: &VerbsError) -> Reason {
    match e {
        VerbsError::Call { call, source } => Reason::Call {
            call,
            errno: source.raw_os_error().unwrap_or(EIO),
        },
        VerbsError::InvalidArgument(what) | VerbsError::Unsupported(what) => Reason::Because(what),
        VerbsError::NoSuchDevice(_) => Reason::Because("no RDMA device of that name"),
        VerbsError::HardwareApmOnRoce { .. } => {
            Reason::Because("the kernel refuses alternate paths on RoCE ports")
        }
        VerbsError::NoApmCapability { .. } => {
            Reason::Because("the device does not advertise IBV_DEVICE_AUTO_PATH_MIG")
        }
        VerbsError::LibraryMissing { .. } => Reason::Because("libibverbs cannot be loaded"),
    }
}

/// `EIO`, for a failed call that left no errno.
const EIO: i32 = 5;

/// After a refused modify, a QP found in ERR means the connection is gone.
fn refine(qp: &Qp, err: ProviderError) -> ProviderError {
    match hw_apm::query(qp) {
        Ok((QpState::Err, _)) => ProviderError::QpInError,
        _ => err,
    }
}

/// The attributes [`snapshot`] reads.
pub const SNAPSHOT_MASK: ffi::QpAttrMask = ffi::QpAttrMask(
    ffi::QpAttrMask::STATE.0 | ffi::QpAttrMask::PATH_MIG_STATE.0 | ffi::QpAttrMask::AV.0,
);

/// What the engine needs to know of a QP of device index `device`, from its attributes
/// (queried with [`SNAPSHOT_MASK`]).
pub fn snapshot(device: u16, a: &ffi::QpAttr) -> Result<QpSnapshot, ProviderError> {
    Ok(QpSnapshot {
        operational: !matches!(a.qp_state, QpState::Err | QpState::Reset),
        mig_state: mig_state(Operation::QueryQp, a.path_mig_state)?,
        primary_port: PortKey::new(device, a.ah_attr.port_num.max(a.port_num).max(1)),
        primary_dlid: Lid::from_wire(a.ah_attr.dlid),
        primary_dgid: Gid(a.ah_attr.dgid),
    })
}

fn mig_state(operation: Operation, m: ffi::MigState) -> Result<MigState, ProviderError> {
    match m {
        ffi::MigState::Migrated => Ok(MigState::Migrated),
        ffi::MigState::Rearm => Ok(MigState::Rearm),
        ffi::MigState::Armed => Ok(MigState::Armed),
        _ => Err(ProviderError::io(
            operation,
            Reason::Because("the device reported an unknown path migration state"),
        )),
    }
}

/// The source path bits that make a port with base LID `base` and LMC `lmc` send from
/// `slid`: its offset in the port's LID range (with LMC > 0 each of a port's LIDs is
/// routed separately, so an alternate through another LID of the same port must send
/// from that LID). A source LID of 0 (RoCE, or a path that does not say) is the base LID.
pub fn src_path_bits(slid: u16, base: u16, lmc: u8) -> Result<u8, NotPortLid> {
    if slid == 0 {
        return Ok(0);
    }
    let not_ours = NotPortLid { slid, base, lmc };
    let span = 1u32 << lmc.min(7);
    let offset = u32::from(slid).wrapping_sub(u32::from(base));
    if slid < base || offset >= span {
        return Err(not_ours);
    }
    // At most 127 (LMC 7).
    u8::try_from(offset).map_err(|_| not_ours)
}

/// A source LID outside the port's LID range ([`src_path_bits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("source LID {slid} is not one of the port's LIDs (base {base}, LMC {lmc})")]
pub struct NotPortLid {
    /// The path's source LID.
    pub slid: u16,
    /// The port's base LID.
    pub base: u16,
    /// The port's LMC.
    pub lmc: u8,
}

/// The engine's path as an address vector on the QP's device; `src_path_bits` from
/// [`src_path_bits`].
fn alt_path(path: &Path, src_path_bits: u8) -> hw_apm::AltPath {
    hw_apm::AltPath {
        av: ffi::AddressVector {
            dlid: path.dlid.get(),
            sl: path.sl,
            src_path_bits,
            static_rate: path.rate,
            port_num: path.port.port,
            is_global: path.hop_limit > 1 || path.dgid != Gid::default(),
            dgid: path.dgid.0,
            sgid_index: path.sgid_index,
            flow_label: path.flow_label,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
        },
        pkey_index: path.pkey_index,
        timeout: path.ack_timeout,
    }
}

/// A RoCE path's address vector: the source GID's index looked up now (RoCE GID indexes
/// move as addresses come and go), always global, a hop limit IP will carry.
fn roce_av(
    ctx: &Context,
    path: &Path,
    av: ffi::AddressVector,
) -> Result<ffi::AddressVector, ProviderError> {
    let sgid_index = ctx
        .roce_gid_index(path.port.port, &path.sgid.0)
        .map_err(|e| to_provider(Operation::FindGid, e))?
        .ok_or(ProviderError::refused(
            Operation::LoadAlternate,
            Reason::GidNotInTable {
                gid: path.sgid,
                port: path.port.port,
            },
        ))?;
    Ok(ffi::AddressVector {
        is_global: true,
        sgid_index,
        hop_limit: if av.hop_limit <= 1 { 64 } else { av.hop_limit },
        ..av
    })
}

#[async_trait]
impl QpControl for VerbsQpControl {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        *self.sink.lock().unwrap_or_else(PoisonError::into_inner) = Some(sink.clone());
        // The devices are open, so libibverbs' provider is loaded: map in the code a
        // failover runs before one needs it (page faults on the way cost a first move
        // as much as the move's own work in an emulated guest).
        let _ = tokio::task::spawn_blocking(code_resident).await;
        for (i, ctx) in self.devices.iter().enumerate() {
            let device = u16::try_from(i).map_err(|_| {
                ProviderError::io(Operation::Start, Reason::Because("more than 65535 devices"))
            })?;
            let dev = ctx
                .query_device()
                .map_err(|e| to_provider(Operation::QueryDevice, e))?;
            for port in 1..=dev.phys_port_cnt {
                let info = port_info(ctx, PortKey::new(device, port))
                    .map_err(|e| to_provider(Operation::QueryPort, e))?;
                // RoCE: the rails' links, which no port event reports.
                if info.link_layer == LinkLayer::Ethernet {
                    let task =
                        tokio::spawn(crate::rails::watch(ctx.clone(), info.key, sink.clone()));
                    self.tasks
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(task);
                }
                let _ = sink.send(Input::PortInfo(info));
            }
            let events = ctx
                .async_events()
                .map_err(|e| to_provider(Operation::ReadEvents, e))?;
            let hook = self
                .hook
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let task = tokio::spawn(pump(
                ctx.clone(),
                device,
                events,
                sink.clone(),
                self.conns.clone(),
                hook,
            ));
            self.tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(task);
        }
        Ok(())
    }

    async fn load_alternate(&self, conn: ConnId, path: Path) -> Result<(), ProviderError> {
        let qp = self.qp(conn)?;
        blocking(Operation::LoadAlternate, move || load(&qp, &path)).await
    }

    async fn set_rearm(&self, conn: ConnId) -> Result<MigState, ProviderError> {
        let qp = self.qp(conn)?;
        blocking(Operation::SetRearm, move || {
            hw_apm::set_rearm(&qp).map_err(|e| refine(&qp, to_provider(Operation::SetRearm, e)))?;
            let (_, m) = hw_apm::query(&qp).map_err(|e| to_provider(Operation::QueryQp, e))?;
            mig_state(Operation::SetRearm, m)
        })
        .await
    }

    async fn force_migrate(&self, conn: ConnId) -> Result<(), ProviderError> {
        let qp = self.qp(conn)?;
        blocking(Operation::ForceMigrate, move || {
            hw_apm::force_migrated(&qp)
                .map_err(|e| refine(&qp, to_provider(Operation::ForceMigrate, e)))
        })
        .await
    }

    async fn software_migrate(
        &self,
        _conn: ConnId,
        _path: Path,
        _peer: apm_core::PeerMove,
    ) -> Result<(), ProviderError> {
        Err(ProviderError::Unsupported {
            provider: NAME,
            operation: Operation::SoftwareMigrate,
            why: Some(Reason::Because("provider-rxe does it on RoCE")),
        })
    }

    async fn peer_there(&self, _conn: ConnId, _path: Path) -> Result<(), ProviderError> {
        // Nothing is ever held here: the HCA's own APM moves the QP.
        Ok(())
    }

    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError> {
        let qp = self.qp(conn)?;
        let device = self
            .device_index(qp.context().name())
            .ok_or(ProviderError::UnknownConnection(conn))?;
        blocking(Operation::QueryQp, move || {
            let a = qp
                .query(SNAPSHOT_MASK)
                .map_err(|e| to_provider(Operation::QueryQp, e))?;
            snapshot(device, &a)
        })
        .await
    }
}

/// Make apm's failover path resident ([`crate::ffi::resident`]) and say what came of it.
fn code_resident() {
    let started = tokio::time::Instant::now();
    match crate::ffi::resident::make_code_resident() {
        Ok(r) if r.refused == 0 => tracing::debug!(
            mappings = r.mappings,
            kib = r.bytes / 1024,
            over_budget = r.over_budget,
            took = ?started.elapsed(),
            "apm's failover path is resident"
        ),
        Ok(r) => tracing::info!(
            refused = r.refused,
            resident = r.mappings,
            error = %std::io::Error::from_raw_os_error(r.first_refusal.unwrap_or(0)),
            "the kernel did not map in all of apm's failover path ahead of time \
             (EINVAL: MADV_POPULATE_READ needs Linux 5.14): a first failover pays its page faults"
        ),
        Err(e) => {
            tracing::info!(error = %e, "cannot list this process's mappings: apm's failover path is not made resident")
        }
    }
}

/// Run a QP verb off the async workers: `ibv_modify_qp` can wait in the kernel (loading
/// a RoCE alternate resolves its neighbour, seconds on a dead rail), and the event
/// pumps and the peer channel must keep going meanwhile (a LAP left waiting behind it
/// arrives late and stale).
async fn blocking<T: Send + 'static>(
    operation: Operation,
    f: impl FnOnce() -> Result<T, ProviderError> + Send + 'static,
) -> Result<T, ProviderError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ProviderError::io(operation, Reason::WorkerFailed))?
}

/// Load `path` as the alternate of `qp` (blocking: see [`blocking`]).
fn load(qp: &Qp, path: &Path) -> Result<(), ProviderError> {
    let port = qp
        .context()
        .query_port(path.port.port)
        .map_err(|e| to_provider(Operation::QueryPort, e))?;
    let bits = src_path_bits(path.slid.get(), port.lid, port.lmc)
        .map_err(|_| ProviderError::refused(Operation::LoadAlternate, Reason::NotLocalPath))?;
    let mut alt = alt_path(path, bits);
    if port.link_layer == ffi::LinkLayer::Ethernet {
        alt.av = roce_av(qp.context(), path, alt.av)?;
    }
    hw_apm::load_alternate(qp, &alt)
        .map_err(|e| refine(qp, to_provider(Operation::LoadAlternate, e)))
}

/// The registered QPs, shared between the facet and its event pumps.
type Conns = Arc<Mutex<BTreeMap<ConnId, Arc<Qp>>>>;

/// The connection whose QP is `qpn` on device `dev`.
fn find_conn(conns: &Conns, dev: &str, qpn: u32) -> Option<ConnId> {
    conns
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(_, qp)| qp.qp_num() == qpn && qp.context().name() == dev)
        .map(|(c, _)| *c)
}

/// The engine's view of a QP-affiliated event kind (`None`: no use for it).
fn qp_event(kind: AsyncEventKind) -> Option<QpEvent> {
    match kind {
        AsyncEventKind::PathMig => Some(QpEvent::PathMigrated),
        AsyncEventKind::PathMigErr => Some(QpEvent::PathMigrationError),
        AsyncEventKind::CommEst => Some(QpEvent::CommEstablished),
        AsyncEventKind::QpFatal | AsyncEventKind::QpReqErr | AsyncEventKind::QpAccessErr => {
            Some(QpEvent::Fatal)
        }
        AsyncEventKind::SqDrained => Some(QpEvent::SqDrained),
        _ => None,
    }
}

/// Read one device's events until the task is aborted, as engine inputs.
async fn pump(
    ctx: Context,
    device: u16,
    mut events: ffi::AsyncEvents,
    sink: InputSink,
    conns: Conns,
    hook: Option<EventHook>,
) {
    loop {
        let ev = match events.next().await {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(device = ctx.name(), error = %e, "reading async events failed");
                return;
            }
        };
        tracing::debug!(device = ctx.name(), ?ev, "async event");
        if let Some(h) = &hook {
            h(device, &ev);
        }
        let inputs = match ev.element {
            EventElement::Port(port) => {
                let key = PortKey::new(device, port);
                let event = match ev.kind {
                    AsyncEventKind::PortActive => Some(PortEvent::Active),
                    AsyncEventKind::PortErr => Some(PortEvent::Down),
                    AsyncEventKind::LidChange => Some(PortEvent::LidChange),
                    AsyncEventKind::SmChange => Some(PortEvent::SmChange),
                    AsyncEventKind::ClientReregister => Some(PortEvent::ClientReregister),
                    AsyncEventKind::PkeyChange => Some(PortEvent::PkeyChange),
                    AsyncEventKind::GidChange => Some(PortEvent::GidChange),
                    _ => None,
                };
                let mut v: Vec<Input> = event
                    .map(|event| Input::PortEvent { port: key, event })
                    .into_iter()
                    .collect();
                // Attributes that changed come with the event: LID, GIDs, state.
                if matches!(
                    ev.kind,
                    AsyncEventKind::LidChange
                        | AsyncEventKind::GidChange
                        | AsyncEventKind::PortActive
                ) {
                    if let Ok(info) = port_info(&ctx, key) {
                        v.push(Input::PortInfo(info));
                    }
                }
                v
            }
            EventElement::Qp(qpn) => {
                match (qp_event(ev.kind), find_conn(&conns, ctx.name(), qpn)) {
                    (Some(event), Some(conn)) => vec![Input::QpEvent { conn, event }],
                    _ => Vec::new(),
                }
            }
            EventElement::Device if ev.kind == AsyncEventKind::DeviceFatal => {
                vec![Input::DeviceFatal { device }]
            }
            _ => Vec::new(),
        };
        for i in inputs {
            if sink.send(i).is_err() {
                // The driver is gone: nobody to tell.
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_path_bits_select_the_lid_of_the_path() {
        // LMC 2: LIDs 8..=11 are the port's; each is its offset.
        assert_eq!(src_path_bits(8, 8, 2), Ok(0));
        assert_eq!(src_path_bits(9, 8, 2), Ok(1));
        assert_eq!(src_path_bits(11, 8, 2), Ok(3));
        // LMC 0: the base LID only.
        assert_eq!(src_path_bits(8, 8, 0), Ok(0));
        // RoCE (no LIDs): the base.
        assert_eq!(src_path_bits(0, 0, 0), Ok(0));
        // A LID outside the range (another port's, or a stale one after a LID change)
        // is refused with the numbers, not loaded as the base LID.
        for bad in [7, 12, 9] {
            let lmc = if bad == 9 { 0 } else { 2 };
            let e = src_path_bits(bad, 8, lmc)
                .expect_err("outside the range")
                .to_string();
            assert!(
                e.contains(&format!("source LID {bad}")) && e.contains("base 8"),
                "{e}"
            );
        }
    }
}
