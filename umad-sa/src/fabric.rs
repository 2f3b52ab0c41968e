//! The engine's fabric facet ([`apm_core::FabricService`]) on an [`SaClient`]: notices
//! become [`apm_core::Input::RemoteGid`], path records become [`apm_core::Path`]s.
//!
//! Paths are cached per destination GID so that a rearm storm toward one destination
//! asks the SA once; a notice about that GID drops its entry; every (re)subscription
//! (client reregister, SM change) and any change of the local LID, LMC or SM LID drop
//! them all. One facet serves one local port, the SA client's; other ports of the same
//! node may be added ([`SaFabric::serve_port`]) where they cannot host an SA client of
//! their own (the ibsim bed: only port 1 of a node hosts a MAD client).

use crate::{SaClient, SaError, SaEvent};
use apm_core::{
    FabricService, Gid, Input, InputSink, Lid, Operation, Path, PortKey, ProviderError, Reason,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use tracing::debug;

/// Path cache: (local port, destination GID bytes) to the paths the SA returned,
/// valid for one (local LID, LMC, SM LID) of the client's port.
type Cache = Arc<Mutex<PathCache>>;

#[derive(Debug, Default)]
struct PathCache {
    epoch: Option<(u16, u8, u16)>,
    /// Keyed by (local port, destination GID).
    paths: BTreeMap<(PortKey, [u8; 16]), Vec<Path>>,
}

/// The SA as the engine's fabric facet, for one local port.
#[derive(Debug)]
pub struct SaFabric {
    client: SaClient,
    port: PortKey,
    /// Other local ports served through this client, with their GIDs.
    others: BTreeMap<PortKey, Gid>,
    events: Mutex<Option<mpsc::UnboundedReceiver<SaEvent>>>,
    cache: Cache,
    queries: Arc<std::sync::atomic::AtomicU64>,
}

impl SaFabric {
    /// The facet for `port` (the engine's name for the client's local port), delivering
    /// the notices of `events` (from [`SaClient::new`]).
    pub fn new(
        client: SaClient,
        port: PortKey,
        events: mpsc::UnboundedReceiver<SaEvent>,
    ) -> SaFabric {
        SaFabric {
            client,
            port,
            others: BTreeMap::new(),
            events: Mutex::new(Some(events)),
            cache: Arc::new(Mutex::new(PathCache::default())),
            queries: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// Also serve `port`, another port of the same node whose port GID is `gid`: its
    /// paths are asked with `gid` as the source (GID-only queries, so the LMC-aligned
    /// pairs only, see [`SaClient::path_records`]) and its subscription is this
    /// client's (which covers every GID). For ports that cannot host an SA client.
    pub fn serve_port(mut self, port: PortKey, gid: Gid) -> SaFabric {
        if port != self.port {
            self.others.insert(port, gid);
        }
        self
    }

    /// How many PathRecord queries went to the SA so far (cache misses and LID
    /// lookups).
    pub fn sa_queries(&self) -> u64 {
        self.queries.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every port of the node behind `lid`: `(port GID, base LID, port number)`, as
    /// the SA's NodeRecords say ([`SaClient::node_ports`]).
    pub async fn node_ports(&self, lid: Lid) -> Result<Vec<(Gid, Lid, u8)>, ProviderError> {
        self.queries
            .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        let ports = self
            .client
            .node_ports(lid.get())
            .await
            .map_err(|e| to_provider(Operation::ResolvePaths, e))?;
        Ok(ports
            .into_iter()
            .map(|(g, l, n)| (apm_core::Gid(g.0), Lid::from_wire(l), n))
            .collect())
    }

    /// The GID of the port answering to `lid`, as the SA says (a PathRecord from this
    /// client's port to that LID); `None` when it knows no path there.
    pub async fn gid_of_lid(&self, lid: Lid) -> Result<Option<Gid>, ProviderError> {
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let gid = self
            .client
            .gid_of_lid(lid.get())
            .await
            .map_err(|e| to_provider(Operation::ResolvePaths, e))?;
        Ok(gid.map(|g| Gid(g.0)))
    }

    fn unsupported(&self, operation: Operation, why: Reason) -> ProviderError {
        ProviderError::Unsupported {
            provider: NAME,
            operation,
            why: Some(why),
        }
    }
}

fn lock(c: &Cache) -> MutexGuard<'_, PathCache> {
    // The cache holds plain data: a poisoned lock still holds a consistent map.
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// The provider's name in errors.
const NAME: &str = "umad-sa";

/// An SA client's error as the engine sees it: no answer after every retry is a
/// timeout, a missing libibumad `Unavailable`, the rest a failure with its [`Reason`].
fn to_provider(operation: Operation, e: SaError) -> ProviderError {
    match e {
        SaError::Transport(umad::Error::Timeout { .. }) => ProviderError::Timeout { operation },
        SaError::Transport(umad::Error::LibraryMissing {
            library, package, ..
        }) => ProviderError::Unavailable { library, package },
        SaError::Unsupported(what) => ProviderError::Unsupported {
            provider: NAME,
            operation,
            why: Some(Reason::Because(what)),
        },
        SaError::Status(status) => ProviderError::io(operation, Reason::Status(status)),
        SaError::Transport(e) => ProviderError::io(operation, reason(&e)),
        _ => ProviderError::io(operation, Reason::BadAnswer),
    }
}

/// Why a umad call failed, as a [`Reason`] (shared with cm-lap's MAD channel).
pub fn reason(e: &umad::Error) -> Reason {
    match e {
        umad::Error::Call { func, rc } => Reason::Call {
            call: func,
            // libibumad returns a negative errno, or -1 with errno lost.
            errno: if *rc < -1 { -rc } else { EIO },
        },
        umad::Error::Closed => Reason::Closed,
        umad::Error::LibraryMissing { .. } => Reason::Because("libibumad cannot be loaded"),
        umad::Error::NoSuchPort(_) => Reason::Because("no such local umad port"),
        umad::Error::TestBedRefused(_) => {
            Reason::Because("the test-bed mode works on the ibsim bed only")
        }
        umad::Error::NoAgent(_) => Reason::Because("no agent registered for the class"),
        umad::Error::BadMad(_) => Reason::Because("a malformed MAD"),
        umad::Error::Timeout { .. } => Reason::Because("no answer after every attempt"),
        _ => Reason::Because("the umad transport failed"),
    }
}

/// `EIO`, for a failed call that left no errno.
const EIO: i32 = 5;

#[async_trait]
impl FabricService for SaFabric {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        let rx = self.events.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut rx) = rx else {
            return Err(self.unsupported(Operation::Start, Reason::Because("started twice")));
        };
        let cache = Arc::clone(&self.cache);
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let (gid, service) = match ev {
                    SaEvent::Gid { gid, service } => (gid, service),
                    SaEvent::Other { trap } => {
                        debug!(trap, "notice not for the engine");
                        continue;
                    }
                };
                // Paths toward this GID may have changed either way.
                lock(&cache).paths.retain(|(_, d), _| *d != gid.0);
                let input = Input::RemoteGid {
                    gid: Gid(gid.0),
                    service,
                };
                if sink.send(input).is_err() {
                    break;
                }
            }
        });
        Ok(())
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        let sgid = if port == self.port {
            ib_mad::types::Gid(self.client.port().info().gid)
        } else if let Some(g) = self.others.get(&port) {
            ib_mad::types::Gid(g.0)
        } else {
            return Err(self.unsupported(Operation::ResolvePaths, Reason::NotOurPort(port)));
        };
        // Paths depend on our LIDs and on the SM that computed them: a LID change or a
        // new SM (both seen in the port's attributes) makes every cached path stale.
        let me = self
            .client
            .port()
            .refresh_info()
            .map_err(|e| to_provider(Operation::ResolvePaths, e.into()))?;
        let epoch = (me.lid, me.lmc, me.sm_lid);
        {
            let mut c = lock(&self.cache);
            if c.epoch != Some(epoch) {
                c.paths.clear();
                c.epoch = Some(epoch);
            }
            if let Some(p) = c.paths.get(&(port, dgid.0)) {
                return Ok(p.clone());
            }
        }
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let records = self
            .client
            .path_records(sgid, ib_mad::types::Gid(dgid.0))
            .await
            .map_err(|e| to_provider(Operation::ResolvePaths, e))?;
        let paths: Vec<Path> = records
            .iter()
            .filter(|r| r.reversible)
            .map(|r| Path {
                port,
                slid: Lid::from_wire(r.slid.0),
                dlid: Lid::from_wire(r.dlid.0),
                sgid: Gid(r.sgid.0),
                dgid: Gid(r.dgid.0),
                // GID 0 is the port GUID GID, the one PathRecords are asked for.
                sgid_index: 0,
                sl: r.sl.get(),
                flow_label: r.flow_label.get(),
                traffic_class: r.traffic_class,
                hop_limit: r.hop_limit,
                rate: r.rate.get(),
                mtu: r.mtu.get(),
                // The default P_Key sits at index 0 on every port this serves.
                pkey_index: 0,
                // Local ACK timeout must cover a round trip: twice the packet life
                // time, i.e. one more in the exponent (capped at the 5-bit field).
                ack_timeout: (r.packet_life_time.get() + 1).min(31),
            })
            .collect();
        lock(&self.cache)
            .paths
            .insert((port, dgid.0), paths.clone());
        Ok(paths)
    }

    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError> {
        if self.others.contains_key(&port) {
            // The SA delivers notices about every GID to the subscription of the
            // client's own port; another port adds nothing.
            return Ok(());
        }
        if port != self.port {
            return Err(self.unsupported(Operation::Subscribe, Reason::NotOurPort(port)));
        }
        // A (re)subscription follows a client reregister or SM change: the SA may have
        // rerouted, so cached paths are stale.
        lock(&self.cache).paths.clear();
        self.client
            .subscribe_gid_traps()
            .await
            .map_err(|e| to_provider(Operation::Subscribe, e))
    }
}
