//! SA client over libibumad: InformInfo subscriptions, Reports, PathRecords.
//!
//! An [`SaClient`] runs on a [`umad::Port`] with an SA agent (class 0x03 v2). It
//! subscribes for traps (InformInfo, attribute 0x0003, Set; the GetResp is checked), turns
//! each Report into an [`SaEvent`] after answering it with ReportResp (same TID, at once,
//! before anything else, or OpenSM resends and logs ERR 1A06) and dropping duplicates
//! (OpenSM resends a Report whose ReportResp it missed), and queries PathRecords with
//! GetTable. On a kernel the SA agent is registered with RMPP and the kernel hands over
//! the reassembled table; segments that arrive one by one are reassembled here
//! (`ib_mad::rmpp`); under umad2sim, which has no RMPP and truncates every MAD to 256
//! bytes, queries are split so that each answer fits one MAD.
//!
//! Subscriptions are sent again every [`SaOptions::refresh_interval`] (default 60 s)
//! while wanted: an SA that forgot them without the port hearing of it (no
//! CLIENT_REREGISTER) delivers notices again within one interval; OpenSM takes an
//! identical Set as an update, never a second subscription.
//!
//! All MAD layouts come from `ib-mad`; this crate only sequences them. It never invents a
//! result: what it cannot do returns [`SaError::Unsupported`].
#![forbid(unsafe_code)]

use ib_mad::sa::{path_record::mask, InformInfo, PathRecord, SaMad};
use ib_mad::sa::{NoticeDetails, SaPayload};
use ib_mad::types::{Gid, U7};
use ib_mad::{AttributeId, Method, MgmtClass};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use umad::{Dest, Port, Received, RequestOptions};

mod fabric;
mod table;
pub use fabric::{reason as umad_reason, SaFabric};

/// The SA's management class and version, for [`umad::AgentSpec`].
/// Registered with RMPP so that a kernel reassembles GetTable responses.
pub const SA_AGENT: umad::AgentSpec = umad::AgentSpec::class(0x03, 2).with_rmpp();
/// Trap 64: GID in service.
pub const TRAP_GID_IN_SERVICE: u16 = 64;
/// Trap 65: GID out of service.
pub const TRAP_GID_OUT_OF_SERVICE: u16 = 65;
/// SA status "no records" (MAD status bits 8-15 = 3): an empty table, not an error.
const STATUS_NO_RECORDS: u16 = 0x0300;

/// Errors of the SA client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SaError {
    /// The umad transport failed (no response after retries, port closed...).
    #[error(transparent)]
    Transport(#[from] umad::Error),
    /// The SA answered with a non-zero MAD status.
    #[error("SA status {0:#06x}")]
    Status(u16),
    /// The SA's answer did not match the request.
    #[error("bad SA response: {0}")]
    BadResponse(String),
    /// The SA's answer did not decode.
    #[error("bad SA response: {0}")]
    Decode(#[from] ib_mad::DecodeError),
    /// An RMPP transfer failed.
    #[error("RMPP: {source} (segment header {head})")]
    Rmpp {
        /// Why.
        source: ib_mad::rmpp::RmppError,
        /// The segment's common and RMPP headers, in hex.
        head: String,
    },
    /// The operation is not implemented by this client.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

/// A notice from the SA, after it was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaEvent {
    /// Trap 64 or 65: the port with this GID is in service, or out of service.
    Gid {
        /// The port's GID.
        gid: Gid,
        /// What the trap says.
        service: apm_core::GidService,
    },
    /// Any other notice (trap number as reported).
    Other {
        /// The trap number (or vendor device ID).
        trap: u16,
    },
}

/// Settings of the SA client.
#[derive(Debug, Clone)]
pub struct SaOptions {
    /// Timeout and retries of every SA request. Default 200 ms, 3 retries.
    pub request: RequestOptions,
    /// How many recent Reports are remembered to drop duplicates. Default 256.
    pub dedup_window: usize,
    /// While subscribed, send the trap 64/65 subscriptions again this often (`None`:
    /// never). Default 60 s.
    ///
    /// An SA can forget a subscription without the port ever seeing a
    /// CLIENT_REREGISTER: an SM restarted without a persistent SA database that does not
    /// set the bit, a standby taking over whose handover the port misses, an event lost
    /// in the driver. Nothing then tells us, and the first notice missed is the one that
    /// mattered. OpenSM keys a subscription by its contents and the subscriber's address
    /// and answers a Set identical to an existing one with success without adding a
    /// second one, so a refresh is idempotent: it costs two MADs per interval per port
    /// and bounds how long a forgotten subscription stays forgotten to one interval.
    pub refresh_interval: Option<Duration>,
}

impl Default for SaOptions {
    fn default() -> Self {
        SaOptions {
            request: RequestOptions::default(),
            dedup_window: 256,
            refresh_interval: Some(Duration::from_secs(60)),
        }
    }
}

/// The SA client of one port.
#[derive(Debug, Clone)]
pub struct SaClient {
    port: Arc<Port>,
    opts: SaOptions,
    subs: Arc<Subscriptions>,
}

/// Whether the owner wants trap 64/65 subscriptions, and how often they were refreshed.
/// The lock is held across every Set so that a refresh never races an unsubscribe.
#[derive(Debug, Default)]
struct Subscriptions {
    wanted: tokio::sync::Mutex<bool>,
    refreshes: std::sync::atomic::AtomicU64,
}

impl SaClient {
    /// A client on `port` (which must have an SA agent, [`SA_AGENT`]). `unsolicited` is the
    /// port's stream of unsolicited SA MADs; the returned receiver yields the notices.
    /// Must be called inside a tokio runtime (it spawns the Report handler).
    pub fn new(
        port: Arc<Port>,
        unsolicited: umad::Unsolicited,
        opts: SaOptions,
    ) -> (SaClient, mpsc::UnboundedReceiver<SaEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let p = Arc::clone(&port);
        let window = opts.dedup_window.max(1);
        tokio::spawn(report_loop(p, unsolicited, tx, window));
        let subs = Arc::new(Subscriptions::default());
        if let Some(every) = opts.refresh_interval {
            tokio::spawn(refresh_loop(
                Arc::downgrade(&port),
                opts.clone(),
                Arc::clone(&subs),
                every,
            ));
        }
        (SaClient { port, opts, subs }, rx)
    }

    /// How many periodic refreshes of the subscriptions succeeded so far
    /// ([`SaOptions::refresh_interval`]).
    pub fn subscription_refreshes(&self) -> u64 {
        self.subs
            .refreshes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The port this client uses.
    pub fn port(&self) -> &Arc<Port> {
        &self.port
    }

    /// Where the SA is, read fresh (the SM LID changes after a handover).
    fn sa_dest(&self) -> Result<Dest, SaError> {
        let info = self.port.refresh_info()?;
        if info.sm_lid == 0 {
            return Err(SaError::BadResponse("the port knows no SM LID".into()));
        }
        Ok(Dest::gsi(info.sm_lid, info.sm_sl))
    }

    /// Subscribe (or unsubscribe) for a generic trap from every LID; the SA's GetResp is
    /// checked (status 0, InformInfo echoed for the same trap).
    pub async fn set_subscription(&self, trap: u16, subscribe: bool) -> Result<(), SaError> {
        let req = SaMad::set_inform_info(0, InformInfo::subscribe_trap(trap, subscribe));
        let dest = self.sa_dest()?;
        let resp = self
            .port
            .request(&req.encode(), dest, self.opts.request)
            .await?;
        let r = SaMad::decode(&resp.mad)?;
        if r.header.status != 0 {
            return Err(SaError::Status(r.header.status));
        }
        match r.payload {
            SaPayload::InformInfo(i) if r.header.method == Method::GET_RESP => {
                if i.trap_number != trap || i.subscribe != subscribe {
                    return Err(SaError::BadResponse(format!(
                        "InformInfo echoed trap {} subscribe {}",
                        i.trap_number, i.subscribe
                    )));
                }
                info!(trap, subscribe, "SA subscription accepted");
                Ok(())
            }
            other => Err(SaError::BadResponse(format!(
                "method {:#04x}, payload {other:?}",
                r.header.method.0
            ))),
        }
    }

    /// Subscribe for traps 64 and 65 (again, after a client reregister or SM change).
    /// From then on the subscriptions are refreshed every
    /// [`SaOptions::refresh_interval`] until [`SaClient::unsubscribe_gid_traps`].
    pub async fn subscribe_gid_traps(&self) -> Result<(), SaError> {
        let mut wanted = self.subs.wanted.lock().await;
        // Wanted even if this attempt fails: the refresh keeps trying.
        *wanted = true;
        self.set_gid_traps(true).await
    }

    /// Unsubscribe from traps 64 and 65 (on shutdown); stops the refresh.
    pub async fn unsubscribe_gid_traps(&self) -> Result<(), SaError> {
        let mut wanted = self.subs.wanted.lock().await;
        *wanted = false;
        self.set_gid_traps(false).await
    }

    async fn set_gid_traps(&self, subscribe: bool) -> Result<(), SaError> {
        self.set_subscription(TRAP_GID_IN_SERVICE, subscribe)
            .await?;
        self.set_subscription(TRAP_GID_OUT_OF_SERVICE, subscribe)
            .await
    }

    /// Every reversible path record from `sgid` to `dgid`: every SLID x DLID
    /// combination (all LMC variants), deduplicated, ordered by (SLID, DLID).
    ///
    /// Asked once per local LID (2^LMC GetTable queries) with the SLID fixed: OpenSM
    /// answers a GID-only query with the LMC-aligned pairs alone, but a query with a
    /// fixed SLID with every DLID. When a response is one unsegmented, full MAD (OpenSM
    /// under umad2sim, which has no kernel to segment and truncates every MAD to 256
    /// bytes), the query is split further per DLID seen.
    ///
    /// When `sgid` is not this port's GID (another port of the node, whose LIDs this
    /// port does not know), one GID-only query is asked: the LMC-aligned pairs only.
    pub async fn path_records(&self, sgid: Gid, dgid: Gid) -> Result<Vec<PathRecord>, SaError> {
        let template = PathRecord {
            sgid,
            dgid,
            reversible: true,
            // Ask for every path (NumbPath is 7 bits).
            numb_path: U7::MAX,
            ..PathRecord::default()
        };
        let base = mask::SGID | mask::DGID | mask::REVERSIBLE | mask::NUMB_PATH;
        let info = self.port.refresh_info()?;
        if info.lid == 0 || info.gid != sgid.0 {
            // No LID yet (the SM has not swept us), or another port's paths: the
            // GID-only query is all we can ask.
            return Ok(self
                .get_table::<PathRecord>(&SaMad::path_record_query(0, template, base).encode())
                .await?
                .records);
        }
        let variants = 1u16.checked_shl(u32::from(info.lmc)).unwrap_or(1);
        let mut all: BTreeMap<(u16, u16), PathRecord> = BTreeMap::new();
        for slid in (0..variants).map(|i| info.lid.wrapping_add(i)) {
            let t = PathRecord {
                slid: ib_mad::types::Lid(slid),
                ..template
            };
            let part = self
                .get_table::<PathRecord>(
                    &SaMad::path_record_query(0, t, base | mask::SLID).encode(),
                )
                .await?;
            let split = part.maybe_truncated;
            let dlids: BTreeSet<u16> = part.records.iter().map(|r| r.dlid.0).collect();
            for r in part.records {
                all.insert((r.slid.0, r.dlid.0), r);
            }
            if split {
                debug!(slid, "unsegmented full PathRecord table: asking per DLID");
                for dlid in dlids {
                    let t = PathRecord {
                        dlid: ib_mad::types::Lid(dlid),
                        ..t
                    };
                    let q = SaMad::path_record_query(0, t, base | mask::SLID | mask::DLID).encode();
                    let one = self.get_table::<PathRecord>(&q).await?;
                    for r in one.records {
                        all.insert((r.slid.0, r.dlid.0), r);
                    }
                }
            }
        }
        Ok(all.into_values().collect())
    }

    /// The GID of the port that answers to `lid` (any LID of its LMC range): the DGID
    /// of a path from this port to that LID. `None` when the SA knows no such path.
    pub async fn gid_of_lid(&self, lid: u16) -> Result<Option<Gid>, SaError> {
        let info = self.port.refresh_info()?;
        let template = PathRecord {
            sgid: Gid(info.gid),
            slid: ib_mad::types::Lid(info.lid),
            dlid: ib_mad::types::Lid(lid),
            numb_path: U7::from_masked(1),
            ..PathRecord::default()
        };
        let m = mask::SGID | mask::SLID | mask::DLID | mask::NUMB_PATH;
        let t = self
            .get_table::<PathRecord>(&SaMad::path_record_query(0, template, m).encode())
            .await?;
        Ok(t.records.first().map(|r| r.dgid))
    }
}

/// Identity of a Report: the sender's LID, the TID's low 32 bits and the issuer GID.
type ReportKey = (u16, u32, [u8; 16]);

/// The last `window` Reports seen, to drop the resends of one already handled.
#[derive(Debug)]
struct RecentReports {
    seen: BTreeSet<ReportKey>,
    order: VecDeque<ReportKey>,
    window: usize,
}

impl RecentReports {
    fn new(window: usize) -> RecentReports {
        RecentReports {
            seen: BTreeSet::new(),
            order: VecDeque::new(),
            window: window.max(1),
        }
    }

    /// True the first time `key` is seen within the window.
    fn first_time(&mut self, key: ReportKey) -> bool {
        if !self.seen.insert(key) {
            return false;
        }
        self.order.push_back(key);
        if self.order.len() > self.window {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

/// Answer every Report with ReportResp first, then drop duplicates, then publish.
async fn report_loop(
    port: Arc<Port>,
    mut unsolicited: umad::Unsolicited,
    tx: mpsc::UnboundedSender<SaEvent>,
    window: usize,
) {
    let mut recent = RecentReports::new(window);
    while let Some(m) = unsolicited.recv().await {
        if let Some(ev) = handle_report(&port, &m, &mut recent) {
            if tx.send(ev).is_err() {
                // Nobody listens any more; keep acknowledging so OpenSM stays quiet.
                continue;
            }
        }
    }
}

/// One unsolicited MAD: a Report is acknowledged and, unless a duplicate, turned into an
/// event. Anything else is ignored (logged).
fn handle_report(port: &Port, m: &Received, recent: &mut RecentReports) -> Option<SaEvent> {
    if m.class() != MgmtClass::SUBN_ADM.0 || m.method() != Method::REPORT.0 {
        debug!(
            class = m.class(),
            method = m.method(),
            "ignoring unsolicited MAD"
        );
        return None;
    }
    let report = match SaMad::decode(&m.mad) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "undecodable Report");
            return None;
        }
    };
    if let Err(e) = port.send(&report.report_response().encode(), Dest::reply_to(&m.src)) {
        warn!(error = %e, "could not send ReportResp");
    }
    let SaPayload::Notice(notice) = &report.payload else {
        return None;
    };
    if report.header.attribute_id != AttributeId::NOTICE {
        return None;
    }
    // A resent Report has the same TID (low bits) from the same SA and the same notice.
    let key = (m.src.lid, m.tid() as u32, notice.issuer_gid.0);
    if !recent.first_time(key) {
        debug!(tid = key.1, "duplicate Report dropped");
        return None;
    }
    Some(match notice.details {
        NoticeDetails::GidInService(gid) => SaEvent::Gid {
            gid,
            service: apm_core::GidService::InService,
        },
        NoticeDetails::GidOutOfService(gid) => SaEvent::Gid {
            gid,
            service: apm_core::GidService::OutOfService,
        },
        ref d => SaEvent::Other {
            trap: d.trap_number(),
        },
    })
}

/// Send the wanted subscriptions again every `every` while the port lives.
async fn refresh_loop(
    port: std::sync::Weak<Port>,
    opts: SaOptions,
    subs: Arc<Subscriptions>,
    every: Duration,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Only a weak hold: the refresh must not keep a closed port open.
        let Some(port) = port.upgrade() else { return };
        let wanted = subs.wanted.lock().await;
        if !*wanted {
            continue;
        }
        let client = SaClient {
            port,
            opts: opts.clone(),
            subs: Arc::clone(&subs),
        };
        match client.set_gid_traps(true).await {
            Ok(()) => {
                subs.refreshes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                debug!("SA subscriptions refreshed");
            }
            Err(e) => {
                warn!(error = %e, "refreshing the SA subscriptions failed; next try in one interval")
            }
        }
        drop(wanted);
    }
}

/// How long a caller should wait for one SA round trip with retries.
pub fn worst_case_request_time(opts: &RequestOptions) -> Duration {
    opts.timeout * (opts.retries + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resent_reports_are_dropped_within_the_window() {
        let mut r = RecentReports::new(2);
        let a = (1, 10, [0; 16]);
        let b = (1, 11, [0; 16]);
        let c = (2, 10, [0; 16]);
        assert!(r.first_time(a));
        assert!(!r.first_time(a), "OpenSM's resend of the same Report");
        assert!(r.first_time(b));
        assert!(
            r.first_time(c),
            "same TID from another SA is another Report"
        );
        // `a` left the window of 2: a new Report reusing its TID counts again.
        assert!(r.first_time(a));
        assert_eq!(r.seen.len(), r.order.len());
    }

    #[test]
    fn worst_case_time_counts_every_attempt() {
        let o = RequestOptions {
            timeout: Duration::from_millis(200),
            retries: 3,
        };
        assert_eq!(worst_case_request_time(&o), Duration::from_millis(800));
    }
}
