//! One opened local port: agents per class, a blocking receive thread, request/response
//! matching on the low 32 bits of the TID, timeouts and retries.
//!
//! umad fds cannot be polled by tokio (under umad2sim they are not even real fds), so a
//! plain thread blocks in `umad_recv` with a short timeout (to notice shutdown) and hands
//! MADs to async code through tokio channels. This module never interprets a MAD beyond
//! the common header's class, method and TID.

pub use crate::dest::{Dest, QP1_QKEY};
use crate::ffi::{raw_close, Lib, PortInfo, RecvAddr, RecvOutcome};
use crate::testbed::{self, TestBedMode};
use crate::Error;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, trace, warn};

/// Which local port to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSelector {
    /// The first ACTIVE port of the first CA that has one (else port 1 of the first CA).
    First,
    /// A CA by name and a port number.
    CaPort {
        /// CA name (`mlx5_0`, `ibsim0`).
        ca: String,
        /// Port number (1-based).
        port: u8,
    },
    /// The local port whose GID 0 is this (network byte order).
    Gid([u8; 16]),
}

/// A management class to register an agent for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentSpec {
    /// Management class (0x03 SA, 0x07 CM, 0x30-0x4F vendor with OUI...).
    pub class: u8,
    /// Class version (2 for SA and CM).
    pub version: u8,
    /// OUI for vendor classes 0x30-0x4F (registered with `umad_register_oui`).
    pub oui: Option<[u8; 3]>,
    /// RMPP version to register with (0: none). With 1 the kernel reassembles
    /// multi-segment responses into one long MAD; without it a kernel delivers only the
    /// first segment of a response (it matches responses to the pending send, which the
    /// first segment completes). umad2sim ignores it.
    pub rmpp_version: u8,
}

impl AgentSpec {
    /// A plain class agent.
    pub const fn class(class: u8, version: u8) -> AgentSpec {
        AgentSpec {
            class,
            version,
            oui: None,
            rmpp_version: 0,
        }
    }

    /// The same agent with kernel RMPP (version 1), for classes with multi-MAD
    /// responses (SA GetTable).
    pub const fn with_rmpp(self) -> AgentSpec {
        AgentSpec {
            rmpp_version: 1,
            ..self
        }
    }
}

/// How to open a port.
#[derive(Debug, Clone)]
pub struct PortOptions {
    /// Agents to register, in order (one per class).
    pub agents: Vec<AgentSpec>,
    /// The ibsim-only IsSM shim; [`TestBedMode::Off`] everywhere but the bed.
    pub testbed: TestBedMode,
    /// How long one `umad_recv` blocks before the thread checks for shutdown.
    pub recv_poll: Duration,
}

impl Default for PortOptions {
    fn default() -> Self {
        PortOptions {
            agents: Vec::new(),
            testbed: TestBedMode::Off,
            recv_poll: Duration::from_millis(100),
        }
    }
}

/// Per-request timeout and retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestOptions {
    /// How long to wait for the response to one attempt. Default 200 ms.
    pub timeout: Duration,
    /// Resends after the first attempt. Default 3.
    pub retries: u32,
}

impl Default for RequestOptions {
    fn default() -> Self {
        RequestOptions {
            timeout: Duration::from_millis(200),
            retries: 3,
        }
    }
}

/// A MAD received on the port.
#[derive(Debug, Clone)]
pub struct Received {
    /// The MAD: 256 bytes, or longer when the kernel reassembled an RMPP transfer for
    /// an agent registered with RMPP.
    pub mad: Vec<u8>,
    /// Who sent it.
    pub src: RecvAddr,
}

impl Received {
    /// Management class (header byte 1).
    pub fn class(&self) -> u8 {
        self.mad.get(1).copied().unwrap_or(0)
    }
    /// Method (header byte 3).
    pub fn method(&self) -> u8 {
        self.mad.get(3).copied().unwrap_or(0)
    }
    /// The full 64-bit TID as received.
    pub fn tid(&self) -> u64 {
        tid_of(&self.mad)
    }
}

/// Unsolicited MADs (requests, Reports, CM sends) that no pending request claimed.
pub type Unsolicited = mpsc::UnboundedReceiver<Received>;

/// Split a port's unsolicited stream by management class, so that several clients
/// (umad-sa for class 0x03, cm-lap for 0x07 or its vendor class) share one port (under
/// umad2sim a process may hold only one agent per class and a node one IsSM client).
/// MADs of other classes are dropped (logged). Must be called inside a tokio runtime.
pub fn split_by_class(mut unsolicited: Unsolicited, classes: &[u8]) -> BTreeMap<u8, Unsolicited> {
    let mut txs = BTreeMap::new();
    let mut rxs = BTreeMap::new();
    for &c in classes {
        let (tx, rx) = mpsc::unbounded_channel();
        txs.insert(c, tx);
        rxs.insert(c, rx);
    }
    tokio::spawn(async move {
        while let Some(m) = unsolicited.recv().await {
            match txs.get(&m.class()) {
                Some(tx) => {
                    // A closed receiver only means that client stopped listening.
                    let _ = tx.send(m);
                }
                None => debug!(class = m.class(), "unsolicited MAD for no client dropped"),
            }
        }
    });
    rxs
}

/// The TID of a MAD (header bytes 8..16), 0 if too short.
fn tid_of(mad: &[u8]) -> u64 {
    mad.get(8..16)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// What a port has done so far (for operators and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests sent, retransmissions included.
    pub requests_sent: u64,
    /// Retransmissions of requests after a timeout.
    pub retransmits: u64,
    /// Requests given up after every attempt.
    pub timeouts: u64,
    /// Responses that matched no pending request (late, duplicate or foreign).
    pub unmatched_responses: u64,
}

#[derive(Debug, Default)]
struct AtomicCounters {
    requests_sent: AtomicU64,
    retransmits: AtomicU64,
    timeouts: AtomicU64,
    unmatched_responses: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A registered agent (its class and libibumad id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agent {
    /// What was registered.
    pub spec: AgentSpec,
    /// libibumad's agent id.
    pub id: i32,
}

/// State shared with the receive thread.
#[derive(Debug)]
struct Inner {
    lib: Lib,
    portid: i32,
    info: PortInfo,
    agents: BTreeMap<u8, Agent>,
    /// Pending requests by TID low 32 bits; a sender per request (RMPP responses come as
    /// several MADs with one TID).
    pending: Mutex<PendingTable>,
    unsolicited: mpsc::UnboundedSender<Received>,
    stop: AtomicBool,
    next_tid: AtomicU32,
    counters: AtomicCounters,
    testbed: TestBedMode,
}

impl Inner {
    fn pending(&self) -> MutexGuard<'_, PendingTable> {
        // A poisoned map is still a valid map: a panic elsewhere must not stop routing.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Requests awaiting responses, keyed by the low 32 bits of their TID (the high bits
/// are rewritten on the way: by the kernel's agent ID, by ibsim). Each entry has a
/// serial so that a stale handle never removes a newer entry with the same key.
#[derive(Debug, Default)]
struct PendingTable {
    map: BTreeMap<u32, (u64, mpsc::UnboundedSender<Received>)>,
    next_serial: u64,
}

impl PendingTable {
    /// Expect responses to `tid`: (key, serial, where they arrive).
    fn insert(&mut self, tid: u64) -> (u32, u64, mpsc::UnboundedReceiver<Received>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let key = tid as u32; // the low 32 bits: all that survives the trip
        let serial = self.next_serial;
        self.next_serial = self.next_serial.wrapping_add(1);
        self.map.insert(key, (serial, tx));
        (key, serial, rx)
    }

    /// Forget `key` if it is still the entry `serial` created.
    fn remove(&mut self, key: u32, serial: u64) {
        if self.map.get(&key).is_some_and(|(s, _)| *s == serial) {
            self.map.remove(&key);
        }
    }

    /// Hand a response to its request; gives it back when no request waits for it.
    fn route(&mut self, r: Received) -> Result<(), Received> {
        let key = r.tid() as u32;
        match self.map.get(&key) {
            Some((_, tx)) => match tx.send(r) {
                Ok(()) => Ok(()),
                Err(e) => {
                    // The requester is gone without removing its entry: drop it now.
                    self.map.remove(&key);
                    Err(e.0)
                }
            },
            None => Err(r),
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// One opened local port with its agents and receive thread. Dropping it stops the
/// thread, unregisters the agents and closes the port (and the IsSM fd in bed mode).
#[derive(Debug)]
pub struct Port {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    issm_fd: Option<i32>,
}

impl Port {
    /// Load libibumad, open the selected port, register `opts.agents` (plus the SMI
    /// agents in test-bed mode, then become IsSM) and start the receive thread.
    pub fn open(sel: &PortSelector, opts: PortOptions) -> Result<(Port, Unsolicited), Error> {
        if opts.testbed != TestBedMode::Off {
            testbed::check_allowed(opts.testbed)?;
        }
        let lib = Lib::load()?;
        let info = resolve(&lib, sel)?;
        let portid = lib.open_port(&info.ca, info.port)?;
        let mut specs = Vec::new();
        if opts.testbed == TestBedMode::IbsimOnly {
            // SMI agents first: OpenSM's SMInfo can arrive the moment we are IsSM.
            specs.push(AgentSpec::class(testbed::CLASS_SMI_LID, 1));
            specs.push(AgentSpec::class(testbed::CLASS_SMI_DR, 1));
        }
        specs.extend(opts.agents.iter().copied());
        let mut agents = BTreeMap::new();
        for spec in specs {
            if agents.contains_key(&spec.class) {
                continue; // one agent per class (umad2sim allows no more)
            }
            match lib.register(
                portid,
                spec.class,
                spec.version,
                spec.rmpp_version,
                spec.oui,
            ) {
                Ok(id) => {
                    debug!(class = spec.class, id, "agent registered");
                    agents.insert(spec.class, Agent { spec, id });
                }
                Err(e) => {
                    for a in agents.values() {
                        lib.unregister(portid, a.id);
                    }
                    lib.close_port(portid);
                    return Err(e);
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        // Random-ish high TID bits per process keep our TIDs apart from other agents'
        // on a real fabric; matching never relies on them.
        let tid_seed = std::process::id().wrapping_mul(0x9E37_79B9);
        let inner = Arc::new(Inner {
            lib,
            portid,
            info,
            agents,
            pending: Mutex::new(PendingTable::default()),
            unsolicited: tx,
            stop: AtomicBool::new(false),
            next_tid: AtomicU32::new(tid_seed | 1),
            counters: AtomicCounters::default(),
            testbed: opts.testbed,
        });
        let mut issm_fd = None;
        if opts.testbed == TestBedMode::IbsimOnly {
            // Only now, with every agent in place, become IsSM (umad2sim turns the open
            // of the issm device into the flag that makes ibsim deliver unsolicited MADs).
            let path = inner
                .lib
                .issm_path(&inner.info.ca, inner.info.port)
                .unwrap_or_else(|| "/dev/infiniband/issm0".to_owned());
            match crate::ffi::raw_open_rdwr(&path) {
                Ok(fd) => issm_fd = Some(fd),
                Err(e) => {
                    close_inner(&inner);
                    return Err(e);
                }
            }
        }
        let t_inner = Arc::clone(&inner);
        let poll_ms = i32::try_from(opts.recv_poll.as_millis())
            .unwrap_or(100)
            .max(1);
        let thread = std::thread::Builder::new()
            .name(format!("umad-recv-{}", inner.info.ca))
            .spawn(move || recv_loop(&t_inner, poll_ms))
            .map_err(|_| Error::Closed)?;
        Ok((
            Port {
                inner,
                thread: Some(thread),
                issm_fd,
            },
            rx,
        ))
    }

    /// Facts about the port (LID, LMC, SM LID, GID) as read when it was opened.
    pub fn info(&self) -> &PortInfo {
        &self.inner.info
    }

    /// Re-read the port's facts (LID, SM LID change after a sweep).
    pub fn refresh_info(&self) -> Result<PortInfo, Error> {
        self.inner
            .lib
            .port_info(&self.inner.info.ca, self.inner.info.port)
    }

    /// The agents registered on this port.
    pub fn agents(&self) -> impl Iterator<Item = &Agent> {
        self.inner.agents.values()
    }

    /// The port's counters.
    pub fn counters(&self) -> Counters {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            requests_sent: get(&c.requests_sent),
            retransmits: get(&c.retransmits),
            timeouts: get(&c.timeouts),
            unmatched_responses: get(&c.unmatched_responses),
        }
    }

    /// How many TIDs are awaiting responses (for leak checks).
    pub fn pending_requests(&self) -> usize {
        self.inner.pending().len()
    }

    /// A fresh TID: the low 32 bits are unique in this process (they are what responses
    /// are matched on); the high bits are left 0 (the kernel and ibsim rewrite them).
    pub fn next_tid(&self) -> u64 {
        u64::from(self.inner.next_tid.fetch_add(1, Ordering::Relaxed))
    }

    /// Send one MAD as is (responses, RMPP ACKs). `mad[1]` selects the agent.
    pub fn send(&self, mad: &[u8], dest: Dest) -> Result<(), Error> {
        send_raw(&self.inner, mad, dest, 0)
    }

    /// Register interest in responses with `tid`'s low 32 bits; they arrive on the
    /// returned [`Pending`] until it is dropped.
    pub fn expect(&self, tid: u64) -> Pending {
        let (key, serial, rx) = self.inner.pending().insert(tid);
        Pending {
            inner: Arc::clone(&self.inner),
            key,
            serial,
            sends: 0,
            rx,
        }
    }

    /// Send a request and wait for its first response, with a timeout per attempt and
    /// retries (same TID, so a late response to an earlier attempt also counts). The TID
    /// in `mad` is replaced by a fresh one.
    pub async fn request(
        &self,
        mad: &[u8],
        dest: Dest,
        opts: RequestOptions,
    ) -> Result<Received, Error> {
        let (mut pending, mad) = self.start_request(mad)?;
        loop {
            pending.send(&mad, dest, opts.timeout)?;
            if let Some(r) = pending.recv_timeout(opts.timeout).await? {
                return Ok(r);
            }
            let attempts = pending.sends;
            if attempts > opts.retries {
                return Err(pending.give_up());
            }
            debug!(tid = pending.key, attempts, "request timed out; resending");
        }
    }

    /// Give `mad` a fresh TID and expect responses to it. The caller sends it (with
    /// [`Pending::send`]) as often as it likes; for multi-MAD responses (RMPP).
    pub fn start_request(&self, mad: &[u8]) -> Result<(Pending, Vec<u8>), Error> {
        if mad.len() < 24 {
            return Err(Error::BadMad(format!("{} bytes", mad.len())));
        }
        let tid = self.next_tid();
        let mut m = mad.to_vec();
        m[8..16].copy_from_slice(&tid.to_be_bytes());
        Ok((self.expect(tid), m))
    }
}

fn timeout_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// Responses expected for one TID. Dropping it forgets the TID (so nothing leaks when a
/// request is abandoned or its future is cancelled).
#[derive(Debug)]
pub struct Pending {
    inner: Arc<Inner>,
    key: u32,
    serial: u64,
    sends: u32,
    rx: mpsc::UnboundedReceiver<Received>,
}

impl Pending {
    /// The low 32 bits of the TID this waits for.
    pub fn tid_low(&self) -> u32 {
        self.key
    }

    /// Send (or resend) the request `mad` (which carries this TID); `timeout` tells the
    /// kernel how long to keep routing responses to this agent.
    pub fn send(&mut self, mad: &[u8], dest: Dest, timeout: Duration) -> Result<(), Error> {
        let c = &self.inner.counters;
        bump(&c.requests_sent);
        if self.sends > 0 {
            bump(&c.retransmits);
        }
        self.sends += 1;
        send_raw(&self.inner, mad, dest, timeout_ms(timeout))
    }

    /// How many times the request was sent.
    pub fn sends(&self) -> u32 {
        self.sends
    }

    /// Give up: counts a timeout and returns the error to report.
    pub fn give_up(&self) -> Error {
        bump(&self.inner.counters.timeouts);
        Error::Timeout {
            tid: self.key,
            attempts: self.sends,
        }
    }

    /// The next response, or `None` after `timeout`.
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Received>, Error> {
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Some(r)) => Ok(Some(r)),
            Ok(None) => Err(Error::Closed),
            Err(_) => Ok(None),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.inner.pending().remove(self.key, self.serial);
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(fd) = self.issm_fd.take() {
            raw_close(fd);
        }
        close_inner(&self.inner);
    }
}

fn close_inner(inner: &Inner) {
    for a in inner.agents.values() {
        inner.lib.unregister(inner.portid, a.id);
    }
    inner.lib.close_port(inner.portid);
}

fn send_raw(inner: &Inner, mad: &[u8], dest: Dest, timeout_ms: u32) -> Result<(), Error> {
    let class = *mad.get(1).ok_or_else(|| Error::BadMad("empty".into()))?;
    let agent = inner.agents.get(&class).ok_or(Error::NoAgent(class))?;
    trace!(
        class,
        method = mad.get(3).copied().unwrap_or(0),
        tid = tid_of(mad),
        dlid = dest.lid,
        "send"
    );
    inner.lib.send(
        inner.portid,
        agent.id,
        mad,
        dest.lid,
        dest.qpn,
        dest.sl,
        dest.qkey,
        timeout_ms,
    )
}

/// Find the port a selector means.
fn resolve(lib: &Lib, sel: &PortSelector) -> Result<PortInfo, Error> {
    match sel {
        PortSelector::CaPort { ca, port } => lib.port_info(ca, *port),
        PortSelector::First | PortSelector::Gid(_) => {
            let mut first = None;
            for ca in lib.ca_names()? {
                // UMAD_CA_MAX_PORTS is 10 (0-9); port 0 is a switch's management port.
                for p in 1..10u8 {
                    let Ok(info) = lib.port_info(&ca, p) else {
                        break;
                    };
                    match sel {
                        PortSelector::Gid(g) if info.gid == *g => return Ok(info),
                        PortSelector::First if info.state == 4 => return Ok(info),
                        _ => {}
                    }
                    if first.is_none() {
                        first = Some(info);
                    }
                }
            }
            match (sel, first) {
                (PortSelector::First, Some(info)) => Ok(info),
                _ => Err(Error::NoSuchPort(format!("{sel:?}"))),
            }
        }
    }
}

/// The receive thread: route every MAD until the port is dropped.
fn recv_loop(inner: &Inner, poll_ms: i32) {
    let guid: [u8; 8] = inner.info.gid[8..].try_into().unwrap_or([0; 8]);
    // After a failure, wait before trying again, longer each time (up to 1 s), so that a
    // dead port (the simulator gone, the device removed) costs neither CPU nor a log
    // line every few milliseconds; a success resets it.
    let mut backoff = Duration::ZERO;
    while !inner.stop.load(Ordering::Relaxed) {
        let (status, addr, mad) = match inner.lib.recv(inner.portid, poll_ms) {
            Ok(RecvOutcome::Timeout) => {
                backoff = Duration::ZERO;
                continue;
            }
            Ok(RecvOutcome::Mad {
                status, addr, mad, ..
            }) => {
                backoff = Duration::ZERO;
                (status, addr, mad)
            }
            Err(e) => {
                if backoff.is_zero() {
                    warn!(error = %e, "umad_recv failed");
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                std::thread::sleep(backoff);
                continue;
            }
        };
        if status != 0 {
            // A send the kernel gave up on (its timeout); our own timer handles retries.
            debug!(status, tid = tid_of(&mad), "send completion with error");
            continue;
        }
        let class = mad.get(1).copied().unwrap_or(0);
        let method = mad.get(3).copied().unwrap_or(0);
        if inner.testbed == TestBedMode::IbsimOnly
            && (class == testbed::CLASS_SMI_LID || class == testbed::CLASS_SMI_DR)
        {
            if let Some((resp, dest)) = testbed::answer_smp(&mad, &addr, guid) {
                if let Err(e) = send_raw(inner, &resp, dest, 0) {
                    warn!(error = %e, "could not answer SMP");
                }
            }
            continue;
        }
        let rx = Received { mad, src: addr };
        if method & 0x80 != 0 {
            if let Err(rx) = inner.pending().route(rx) {
                bump(&inner.counters.unmatched_responses);
                trace!(tid = rx.tid(), class, method, "unmatched response dropped");
            }
        } else if inner.unsolicited.send(rx).is_err() {
            trace!(class, method, "unsolicited MAD dropped: nobody listens");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(tid: u64) -> Received {
        let mut mad = vec![0u8; 256];
        mad[1] = 0x03;
        mad[3] = 0x81;
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
        Received {
            mad,
            src: RecvAddr::default(),
        }
    }

    #[test]
    fn matches_on_low_32_bits_only() {
        let mut t = PendingTable::default();
        let (key, _, mut rx) = t.insert(0x0000_0000_1234_5678);
        assert_eq!(key, 0x1234_5678);
        // ibsim (or the kernel) rewrote the high bits.
        assert!(t.route(resp(0x0001_0002_1234_5678)).is_ok());
        assert_eq!(rx.try_recv().unwrap().tid(), 0x0001_0002_1234_5678);
        // Several responses to one TID (RMPP segments) all arrive.
        assert!(t.route(resp(0xFFFF_FFFF_1234_5678)).is_ok());
        assert!(rx.try_recv().is_ok());
        assert!(
            t.route(resp(0x1234_5679)).is_err(),
            "other TID must not match"
        );
    }

    #[test]
    fn entries_never_leak() {
        let mut t = PendingTable::default();
        let (k1, s1, rx1) = t.insert(7);
        t.remove(k1, s1);
        assert_eq!(t.len(), 0);
        assert!(
            t.route(resp(7)).is_err(),
            "a forgotten request gets nothing"
        );
        drop(rx1);
        // A receiver dropped without remove: the first response cleans the entry up.
        let (_, _, rx2) = t.insert(8);
        drop(rx2);
        assert!(t.route(resp(8)).is_err());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn stale_handle_keeps_newer_entry() {
        let mut t = PendingTable::default();
        let (k, old, _rx_old) = t.insert(9);
        let (_, new, mut rx_new) = t.insert(9); // the 32-bit counter wrapped
        assert_ne!(old, new);
        t.remove(k, old);
        assert_eq!(t.len(), 1);
        assert!(t.route(resp(9)).is_ok());
        assert!(rx_new.try_recv().is_ok());
        t.remove(k, new);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn tid_of_short_mad_is_zero() {
        assert_eq!(tid_of(&[0u8; 10]), 0);
        assert_eq!(resp(0xAB).tid(), 0xAB);
        let r = Received {
            mad: vec![],
            src: RecvAddr::default(),
        };
        assert_eq!((r.class(), r.method(), r.tid()), (0, 0, 0));
    }
}
