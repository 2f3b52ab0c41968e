//! apm's work inside the program: deciding what to protect, the in-process engine per
//! device, and letting go (see the crate docs).
//!
//! One `Protector` per process, started at the first RC QP that reaches RTS: a tokio
//! runtime on two threads of apm's own, the connection to the host's agent, and per
//! device (on a context apm opens itself) what each port showed it can do
//! (`device::Opened`) and, per way of moving a QP, an apm-core `Manager` on
//! provider-rxe's QP facet with the agent as its peer channel and the paths it moves
//! between (`device::Device`): on an Ethernet port the connection's own GIDs, on an
//! InfiniBand port the SA's answers through the agent (`paths`). If it cannot start
//! (no agent on the host), every RC QP is reported unprotected with that reason and
//! the program runs on as without apm.
//!
//! Each QP the program hands over goes through a `Slot`: the adoption of the QP (the
//! only moment apm touches it outside a move) runs under the slot's lock, which the
//! program's `ibv_destroy_qp` takes too; afterwards the program's own control verbs
//! and apm's moves serialise on the adopted QP's lock (`AdoptedQp::hold`).

mod device;
mod follow;
mod paths;

use crate::fork::{self, Mine, PerProcess};
use crate::ledger::{Drainer, Element, Event, Object};
use crate::mode::{srq_refusal, Facet};
use crate::report;
use apm_agent::client::AgentClient;
use apm_agent::wire::Route;
use apm_core::{ConnId, ConnSpec, Gid, Path, PeerAddr, PeerMsg, Qpn, Role};
use device::{Device, EngineKey, Opened, Paths};
use paths::QpPaths;
use provider_rxe::adopt::DrainNote;
use provider_rxe::AdoptedQp;
use provider_verbs::ffi::{AsyncEventKind, Context, QpAttr, QpAttrMask};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info};

/// The kind of a QP, as far as protection goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpKind {
    /// Reliable connected: protectable.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// XRC send or receive.
    Xrc,
    /// Anything else (raw packet, driver-specific).
    Other,
}

/// A QP the program just moved to RTS.
#[derive(Clone, Debug)]
pub struct QpSeen {
    /// The `struct ibv_qp *`, as a key.
    pub key: usize,
    /// Its `struct ibv_context *` (the program's, where its async events arrive).
    pub context: usize,
    /// Its number.
    pub qpn: u32,
    /// Its type.
    pub kind: QpKind,
    /// It receives through a shared receive queue.
    pub srq: bool,
    /// Its device's name.
    pub device: String,
}

/// An adopted QP apm looks after.
struct Adopted {
    device: Arc<Device>,
    id: ConnId,
    qpn: u32,
    how: Moved,
    remote_qpn: u32,
}

/// Who moves an adopted QP's path.
enum Moved {
    /// apm, through the SQ drain (provider-rxe): the program's own verbs on the QP wait
    /// while it does ([`AdoptedQp::hold`]).
    Software(Arc<AdoptedQp>),
    /// The device (hardware APM: it migrates by itself; apm loads, arms and forces with
    /// RTS -> RTS modifies). The QP as the facet holds it: another clone of it is a verb
    /// of apm's in flight, which the program's destroy waits for (`destroyed`).
    Hardware(Arc<provider_verbs::ffi::Qp>),
}

/// QPs whose program loads alternate paths or sets their migration state itself: apm
/// leaves them to it.
static OWN_APM_QPS: Mutex<PerProcess<BTreeSet<usize>>> =
    Mutex::new(PerProcess::new(BTreeSet::new()));

fn own_apm() -> Mine<BTreeSet<usize>> {
    fork::lock(&OWN_APM_QPS, BTreeSet::new)
}

/// The program itself set `IBV_QP_ALT_PATH` or `IBV_QP_PATH_MIG_STATE` on QP `key`.
pub fn manages_apm(key: usize) {
    own_apm().insert(key);
}

/// Why a QP whose program does its own APM is not protected.
const OWN_APM: &str = "the program loads alternate paths itself (its own APM): apm leaves \
                       the QP's path migration to it";

/// One QP from RTS until released.
#[derive(Default)]
struct Slot {
    /// The program destroyed it or took it out of RTS: stop.
    released: bool,
    adopted: Option<Adopted>,
}

#[derive(Clone)]
struct Conn {
    qpn: u32,
    /// The peer's QP number and every address of the peer its paths lead to: with the
    /// QP number, what tells this connection's peer messages from those of another
    /// device's connection whose QP has the same number.
    remote_qpn: u32,
    peer_gids: Vec<Gid>,
    /// InfiniBand: the peer's LIDs (a MAD without a GRH names its sender by LID).
    peer_lids: Vec<u16>,
    primary: Path,
    protected_once: bool,
    /// Peer messages that came before the engine knew the connection (the agent routes
    /// them once the QP is registered, which must come first: it sends only messages of
    /// registered connections), handed to the engine right after; `None` from then on.
    early: Option<Vec<(PeerAddr, PeerMsg)>>,
}

/// Peer messages kept for one connection before its engine knows it (a peer sends a
/// LAP and at most its retries meanwhile); more are dropped, as a lost datagram is.
const EARLY_MAX: usize = 16;

impl Conn {
    /// Take a peer message for this connection: `Some` hands it to the engine now,
    /// `None` kept it (or dropped it past [`EARLY_MAX`]) for [`Conn::engaged`].
    fn take(&mut self, from: PeerAddr, msg: PeerMsg) -> Option<(PeerAddr, PeerMsg)> {
        match &mut self.early {
            None => Some((from, msg)),
            Some(kept) => {
                if kept.len() < EARLY_MAX {
                    kept.push((from, msg));
                }
                None
            }
        }
    }

    /// The engine knows the connection: what was kept for it, in order.
    fn engaged(&mut self) -> Vec<(PeerAddr, PeerMsg)> {
        self.early.take().unwrap_or_default()
    }

    /// Whether a peer message naming (`receiver`, `sender`) that came from `from` is
    /// this connection's (the agent's own test, `matches_route`, made again here
    /// among the process's devices).
    fn owns(&self, receiver: u32, sender: u32, from: &PeerAddr) -> bool {
        let lid = from.lid.get();
        self.qpn == receiver
            && self.remote_qpn == sender
            && (self.peer_gids.contains(&from.gid) || (lid != 0 && self.peer_lids.contains(&lid)))
    }
}

/// The process's apm (see the module docs).
struct Protector {
    rt: tokio::runtime::Runtime,
    client: Arc<AgentClient>,
    policy: apm_core::Policy,
    slots: Mutex<BTreeMap<usize, Arc<Mutex<Slot>>>>,
    /// apm's context per device (see `device`).
    opened: tokio::sync::Mutex<BTreeMap<String, Result<Arc<Opened>, String>>>,
    /// The engines, per device, way of moving and link layer.
    devices: tokio::sync::Mutex<BTreeMap<EngineKey, Result<Arc<Device>, String>>>,
    /// Snapshot of the devices started, for the agent's events (sync access).
    started: Mutex<Vec<Arc<Device>>>,
}

static PROTECTOR: OnceLock<Result<Protector, String>> = OnceLock::new();

/// Threads starting the process's apm now ([`protector`]): a fork waits for them, so
/// that no child inherits a start half done.
static STARTING: AtomicUsize = AtomicUsize::new(0);

/// This process was forked (without exec) from one whose apm had started: the apm it
/// inherited has no threads here, and is never touched ([`live`]).
static FORKED_FROM_APM: AtomicBool = AtomicBool::new(false);

/// Why a forked child's QPs are not protected (see [`FORKED_FROM_APM`]).
const FORKED: &str = "the process was forked from one where apm runs, without exec: apm's \
                      threads stayed in the parent (a program that execs after fork gets \
                      an apm of its own)";

/// This process's apm, if it started here (never the one a forked child inherited).
fn live() -> Option<&'static Protector> {
    if FORKED_FROM_APM.load(Ordering::Relaxed) {
        return None;
    }
    PROTECTOR.get()?.as_ref().ok()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Whole inserts and removes only: poisoned data is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn protector() -> Result<&'static Protector, &'static str> {
    if FORKED_FROM_APM.load(Ordering::Relaxed) {
        return Err(FORKED);
    }
    STARTING.fetch_add(1, Ordering::SeqCst);
    let p = PROTECTOR.get_or_init(Protector::start);
    STARTING.fetch_sub(1, Ordering::SeqCst);
    p.as_ref().map_err(String::as_str)
}

/// This module's locks a forked child may take, held across a fork.
pub(crate) struct ForkHold {
    _rtr_only: std::sync::MutexGuard<'static, PerProcess<BTreeMap<usize, QpSeen>>>,
    _own_apm: std::sync::MutexGuard<'static, PerProcess<BTreeSet<usize>>>,
}

/// Before a fork: wait (a few seconds at most) for a start of apm in progress, and hold
/// the locks of this module a forked child may take (see `crate::fork`).
pub(crate) fn before_fork() -> ForkHold {
    let since = std::time::Instant::now();
    while STARTING.load(Ordering::SeqCst) > 0 && since.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    ForkHold {
        _rtr_only: fork::hold(&RTR_ONLY_QPS),
        _own_apm: fork::hold(&OWN_APM_QPS),
    }
}

/// In a forked child (without exec): an apm that had started stays the parent's.
pub(crate) fn in_forked_child() {
    if PROTECTOR.get().is_some() {
        FORKED_FROM_APM.store(true, Ordering::Relaxed);
    }
}

impl Protector {
    fn start() -> Result<Protector, String> {
        if let Ok(filter) = std::env::var("APM_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
        let policy = match std::env::var("APM_RUN_POLICY") {
            Ok(j) => serde_json::from_str(&j)
                .map_err(|e| format!("APM_RUN_POLICY is not a policy: {e}"))?,
            Err(_) => apm_core::Policy::default(),
        };
        // The host's agent probes every path once for all of the host's processes and
        // hands its verdicts over (FromAgent::Path): no process probes on its own.
        let mut policy: apm_core::Policy = policy;
        policy.probe.enabled = false;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("apm")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start apm's threads: {e}"))?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let (tx, rx) = std::sync::mpsc::channel();
        let socket = crate::settings::agent_socket();
        rt.spawn(async move {
            let _ = tx.send(AgentClient::connect(&socket, events_tx).await);
        });
        let client = rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "the apm agent did not accept the connection in time".to_owned())?
            .map_err(|e| e.to_string())?;
        rt.spawn(follow::dispatch(events));
        let client = Arc::new(client);
        rt.spawn(report::push(client.clone()));
        crate::tee::set_hook(Box::new(|_, ev| tee_event(ev)));
        Ok(Protector {
            rt,
            client,
            policy,
            slots: Mutex::new(BTreeMap::new()),
            opened: tokio::sync::Mutex::new(BTreeMap::new()),
            devices: tokio::sync::Mutex::new(BTreeMap::new()),
            started: Mutex::new(Vec::new()),
        })
    }
}

/// RC QPs in RTR that have not reached RTS (yet): a QP the program leaves in RTR
/// (receive only, like perftest's bandwidth servers) cannot be moved (no RTR to RTR
/// transition carries a new address vector, SQD is entered from RTS only, and hardware
/// APM arms a QP only in RTS: REARM is an RTS state, so the device drops its peer's
/// packets on the other path), so it is reported unprotected when the program lets go
/// of it. Kept without starting apm's threads.
static RTR_ONLY_QPS: Mutex<PerProcess<BTreeMap<usize, QpSeen>>> =
    Mutex::new(PerProcess::new(BTreeMap::new()));

fn rtr_only() -> Mine<BTreeMap<usize, QpSeen>> {
    fork::lock(&RTR_ONLY_QPS, BTreeMap::new)
}

/// Why a QP left in RTR is not protected.
const RTR_ONLY: &str = "it never left RTR (receive only): a path moves, or is armed, only \
                        from RTS (the SQ drain, REARM); its peer's apm finds no partner";

/// An RC QP reached RTR.
pub fn on_rtr(seen: QpSeen) {
    if seen.kind == QpKind::Rc {
        rtr_only().insert(seen.key, seen);
    }
}

/// A QP in RTR that never reached RTS is gone (or the program ends): say why it was
/// not protected.
fn settle_rtr(key: usize) {
    if let Some(seen) = rtr_only().remove(&key) {
        report::seen();
        report::refused(seen.qpn, &seen.device, RTR_ONLY);
    }
}

/// An RC QP reached RTS: protect it if it can be, else say why.
pub fn on_rts(seen: QpSeen) {
    rtr_only().remove(&seen.key);
    let reason = match seen.kind {
        QpKind::Rc if own_apm().contains(&seen.key) => Some(OWN_APM),
        QpKind::Rc => None,
        QpKind::Ud => Some("a UD QP (apm protects RC connections)"),
        QpKind::Uc => Some("a UC QP (apm protects RC connections)"),
        QpKind::Xrc => Some("an XRC QP, not supported yet"),
        QpKind::Other => Some("not an RC QP"),
    };
    let p = match protector() {
        Ok(p) => Some(p),
        Err(_) if reason.is_some() => None,
        Err(e) => {
            report::seen();
            report::refused(seen.qpn, &seen.device, e);
            return;
        }
    };
    if let Some(r) = reason {
        if p.is_none_or(|p| !lock(&p.slots).contains_key(&seen.key)) {
            report::seen();
            report::refused(seen.qpn, &seen.device, r);
        }
        return;
    }
    let Some(p) = p else { return };
    let slot = {
        let mut slots = lock(&p.slots);
        if slots.contains_key(&seen.key) {
            return; // RTS -> RTS: already looked after.
        }
        let slot = Arc::new(Mutex::new(Slot::default()));
        slots.insert(seen.key, slot.clone());
        slot
    };
    report::seen();
    report::looking_after(seen.qpn, &seen.device);
    p.rt.spawn(async move {
        let (qpn, device) = (seen.qpn, seen.device.clone());
        if let Err(why) = protect(p, seen, slot).await {
            report::refused(qpn, &device, &why);
        }
    });
}

/// Run `f` (the program's own verb on QP `key`) while no move of it runs; `None` when
/// apm does not look after that QP in software, or when a move still runs after the
/// command deadline (a drain on a dead path lasts until the QP's retransmit timer
/// fires): the caller then runs the verb itself, so that apm never holds a program's
/// verb longer than that.
pub fn with_held<R>(key: usize, f: impl FnOnce() -> R) -> Option<R> {
    let p = live()?;
    let slot = lock(&p.slots).get(&key).cloned()?;
    let qp = match lock(&slot).adopted.as_ref().map(|a| &a.how) {
        Some(Moved::Software(qp)) => qp.clone(),
        _ => return None,
    };
    let limit = Duration::from_millis(p.policy.command_timeout_ms);
    let Some(_held) = qp.hold_within(limit) else {
        report::note(&format!(
            "a move of apm's outlasted the command deadline ({} ms): the program's verb on \
             its QP went ahead without waiting for it",
            p.policy.command_timeout_ms
        ));
        return None;
    };
    Some(f())
}

/// The program destroys QP `key`; under hardware APM once no verb of apm's runs on it
/// (`mode::wait_for_verbs`: after `release` none starts).
pub fn destroyed(key: usize) {
    own_apm().remove(&key);
    let in_use = live().and_then(|p| {
        let slot = lock(&p.slots).get(&key).cloned()?;
        let s = lock(&slot);
        match s.adopted.as_ref().map(|a| &a.how) {
            Some(Moved::Hardware(qp)) => Some(qp.clone()),
            _ => None,
        }
    });
    release(key, "destroyed");
    if let Some(qp) = in_use {
        crate::mode::wait_for_verbs(&qp);
    }
}

/// The program destroys QP `key` or took it out of RTS: stop looking after it (waits
/// for a move or an adoption in progress).
pub fn release(key: usize, why: &str) {
    settle_rtr(key);
    let Some(p) = live() else { return };
    let Some(slot) = lock(&p.slots).remove(&key) else {
        return;
    };
    let mut s = lock(&slot);
    s.released = true;
    let Some(a) = s.adopted.take() else { return };
    drop(s);
    if let Moved::Software(qp) = &a.how {
        qp.retire();
    }
    a.device.facet.unregister(a.id);
    let qpn = a.qpn;
    lock(&a.device.conns).remove(&a.id);
    let _ = p.client.unregister(qpn, a.remote_qpn);
    report::released(qpn, &a.device.name);
    debug!(qpn, why, "apm let go of the QP");
    let (handle, id) = (a.device.handle.clone(), a.id);
    // `a` (its QP among it) is dropped here, not kept by the task.
    p.rt.spawn(async move {
        let _ = handle.unprotect(id).await;
    });
}

/// apm's own failure (a panic in its part of a verb): said once; the program goes on.
pub fn internal_failure(what: &str) {
    report::note(&format!(
        "internal failure in apm ({what}): the program continues; its QPs may be unprotected"
    ));
}

/// At the program's exit (and a program apm could not see is told so).
pub fn at_exit() {
    let left: Vec<usize> = rtr_only().keys().copied().collect();
    for key in left {
        settle_rtr(key);
    }
    if let Some(why) = crate::loader::unseen_reason(crate::ffi::saw_verbs()) {
        report::not_seen(&why);
    }
    report::finish();
}

/// Adopt and protect one RC QP; `Err` says why it is not protected.
async fn protect(
    p: &'static Protector,
    seen: QpSeen,
    slot: Arc<Mutex<Slot>>,
) -> Result<(), String> {
    let opened = p.opened(&seen.device).await?;
    let Some((qp, attr)) = read_qp(&opened.ctx, &seen, &slot)? else {
        return Ok(());
    };
    let (mode, link) = opened.mechanism(paths::qp_port(&attr)).await?;
    // An SRQ matters only to software migration: decided once the port's mode is known.
    if let Some(why) = srq_refusal(mode).filter(|_| seen.srq) {
        return Err(why.into());
    }
    let dev = p.device(&opened, mode, link).await?;
    let found = paths::qp_paths(p, &opened, &dev, link, &attr).await?;
    let qpn = seen.qpn;
    let remote_qpn = attr.dest_qp_num;
    let id = ConnId(u64::from(qpn));
    if hand_over(&dev, &seen, &slot, id, qp, remote_qpn)? == Handover::Released {
        return Ok(());
    }
    learn(&dev, &found);
    lock(&dev.conns).insert(
        id,
        Conn {
            qpn,
            remote_qpn,
            peer_gids: found.peer_gids.clone(),
            peer_lids: found.peer_lids.clone(),
            primary: found.primary,
            protected_once: false,
            early: Some(Vec::new()),
        },
    );
    // Registered before the engine starts on it: its first LAP goes out through the
    // agent at once, and the agent sends only messages of registered connections.
    if let Err(why) = register(p, qpn, remote_qpn, &found) {
        release(seen.key, "the agent refused it");
        return Err(why);
    }
    // The side with the lower (GID, QPN) plays the CM's active part.
    let role = if (found.sgid, qpn) < (found.dgid, remote_qpn) {
        Role::Active
    } else {
        Role::Passive
    };
    let candidates = found.candidates.len();
    let spec = ConnSpec {
        id,
        role,
        mode,
        local_qpn: Qpn::new(qpn).ok_or("its QP number is out of range")?,
        remote_qpn: Qpn::new(remote_qpn).ok_or("the peer's QP number is out of range")?,
        local_comm_id: qpn,
        remote_comm_id: remote_qpn,
        primary: found.primary,
        agreed_alternate: None,
        candidates: found.candidates.clone(),
    };
    info!(
        qpn,
        remote_qpn,
        ?role,
        ?link,
        candidates,
        "protecting the program's QP"
    );
    if let Err(e) = dev.handle.protect(spec).await {
        release(seen.key, "the engine refused it");
        return Err(format!("apm's engine refused it: {e}"));
    }
    // What the peer sent meanwhile (the agent hands a held message over as soon as the
    // QP is registered) reaches the engine now that it knows the connection.
    // Under the lock that dispatch takes, so none of the peer's later messages
    // overtakes them.
    let mut conns = lock(&dev.conns);
    for (from, msg) in conns.get_mut(&id).map(Conn::engaged).unwrap_or_default() {
        dev.peer.deliver(from, msg);
    }
    Ok(())
}

/// The program's QP, adopted, and its attributes, read under the slot's lock (a
/// destroy waits for this); `None` once the program has released it.
fn read_qp(
    ctx: &Context,
    seen: &QpSeen,
    slot: &Mutex<Slot>,
) -> Result<Option<(provider_verbs::ffi::Qp, QpAttr)>, String> {
    let s = lock(slot);
    if s.released {
        return Ok(None);
    }
    let qp = crate::ffi::adopt(ctx, seen.key).map_err(|e| e.to_string())?;
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PORT
        | QpAttrMask::PKEY_INDEX
        | QpAttrMask::DEST_QPN
        | QpAttrMask::PATH_MTU
        | QpAttrMask::TIMEOUT;
    let attr = qp.query(mask).map_err(|e| e.to_string())?;
    Ok(Some((qp, attr)))
}

/// Whether the QP reached the device's facet.
#[derive(PartialEq, Eq)]
enum Handover {
    Done,
    /// The program released it meanwhile: nothing to protect.
    Released,
}

/// Hand the QP to the device's facet and note it in its slot, under the slot's lock.
fn hand_over(
    dev: &Arc<Device>,
    seen: &QpSeen,
    slot: &Mutex<Slot>,
    id: ConnId,
    qp: provider_verbs::ffi::Qp,
    remote_qpn: u32,
) -> Result<Handover, String> {
    let mut s = lock(slot);
    if s.released {
        return Ok(Handover::Released);
    }
    let how = match &dev.facet {
        Facet::Software(f) => {
            f.adopt(id, Arc::new(qp)).map_err(|e| e.to_string())?;
            let a = f.adopted(id).ok_or("the QP facet lost the adopted QP")?;
            // Its drains' SQ_DRAINED events are apm's, not the program's (see `tee`).
            let key = seen.key;
            a.on_drain(Box::new(move |note| match note {
                DrainNote::Requested => crate::tee::drain_asked(key, Drainer::Apm),
                DrainNote::Withdrawn => crate::tee::drain_withdrawn(key, Drainer::Apm),
            }));
            Moved::Software(a)
        }
        Facet::Hardware(f) => {
            if !crate::tee::attached(seen.context) {
                return Err(
                    "its context's async events are not shared with apm (no event \
                            tee on it), and hardware APM needs its PATH_MIG events"
                        .into(),
                );
            }
            let qp = Arc::new(qp);
            f.register(id, qp.clone()).map_err(|e| e.to_string())?;
            // The device migrates it onto apm's alternates: its PATH_MIG events are apm's.
            crate::tee::armed_by_apm(seen.key);
            Moved::Hardware(qp)
        }
    };
    s.adopted = Some(Adopted {
        device: dev.clone(),
        id,
        qpn: seen.qpn,
        how,
        remote_qpn,
    });
    Ok(Handover::Done)
}

/// An async event the tee passed on (see [`crate::tee`]): a protected QP's event goes
/// to the engine of its device when the device migrates it (hardware APM); apm's own
/// context reads the port events.
fn tee_event(ev: Event) {
    let Element::Object(Object::Qp, addr) = ev.about() else {
        return;
    };
    let Some(p) = live() else { return };
    let Some(slot) = lock(&p.slots).get(&addr).cloned() else {
        return;
    };
    let s = lock(&slot);
    let Some(a) = &s.adopted else { return };
    if let (Moved::Hardware(_), Facet::Hardware(f)) = (&a.how, &a.device.facet) {
        let kind = AsyncEventKind::from_raw(ev.event_type);
        debug!(qpn = a.qpn, ?kind, "the program's QP event");
        f.deliver_qp_event(a.id, kind);
    }
}

/// Make the connection's paths known to the device's facets: which local address
/// reaches which peer address (the peer facet), the paths themselves (RoCE: the static
/// path service, and the neighbour tables warmed).
fn learn(dev: &Device, found: &QpPaths) {
    let all = || std::iter::once(&found.primary).chain(&found.candidates);
    dev.peer.learn(all().map(|p| (p.sgid, p.dgid)));
    if let Paths::Ethernet(paths) = &dev.paths {
        paths.add(all().copied());
    }
    if let Facet::Software(f) = &dev.facet {
        f.keep_warm(all().copied());
    }
}

/// Ask the agent to route the connection's peer messages here (and, on RoCE, to
/// probe its rails).
fn register(p: &Protector, qpn: u32, remote_qpn: u32, found: &QpPaths) -> Result<(), String> {
    let all = || std::iter::once(&found.primary).chain(&found.candidates);
    let mut local_gids: Vec<Gid> = all().map(|p| p.sgid).collect();
    local_gids.sort();
    local_gids.dedup();
    p.client
        .register(Route {
            local_qpn: qpn,
            remote_qpn,
            peer_gids: found.peer_gids.clone(),
            local_gids,
            paths: found.probed.clone(),
            peer_lids: found.peer_lids.clone(),
        })
        .map_err(|e| e.to_string())
}
