//! The devices apm works on in this process: apm's own context on each ([`Opened`]),
//! what each of its ports can do, tried once at the port's first QP
//! (`provider_verbs::capability`), and an engine per way of moving QPs and link layer
//! ([`Device`]): hardware APM through provider-verbs' facet, the software move through
//! provider-rxe's; peer messages through the agent, and paths from the agent's SA on
//! InfiniBand or from the connections themselves on RoCE.

use super::{lock, Conn, Protector};
use crate::mode::{chosen, migration, Facet};
use crate::report;
use apm_agent::facets::{AgentFabric, AgentPeer, Ports};
use apm_core::{ConnId, Gid, Manager, ManagerHandle, MigrationMode, PortKey, Stack, StaticPaths};
use provider_rxe::{RxeConfig, RxeQpControl};
use provider_verbs::capability::{probe_port, PortProbe, Trial};
use provider_verbs::ffi::{Context, LinkLayer, PortState, Verbs};
use provider_verbs::VerbsQpControl;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::info;

/// A port's link layer, as far as apm's paths go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Link {
    /// RoCE: the peer is named by its IP address (a RoCE v2 GID), the paths are the
    /// rails the agents pair.
    Ethernet,
    /// InfiniBand: the peer is named by LID (and GID with a GRH), the paths are the SA's.
    InfiniBand,
}

/// A device apm opened in this process: its context, shared by the device's engines
/// (the program's QPs are adopted onto it), and what each port showed it can do.
pub(super) struct Opened {
    pub(super) name: String,
    pub(super) ctx: Context,
    /// Ports tried, by number: the evidence kept for the QPs that come after.
    probes: tokio::sync::Mutex<BTreeMap<u8, PortProbe>>,
}

impl Opened {
    pub(super) fn open(name: &str) -> Result<Opened, String> {
        let verbs = Verbs::load().map_err(|e| e.to_string())?;
        let ctx = verbs
            .open(name)
            .map_err(|e| format!("apm cannot open {name}: {e}"))?;
        Ok(Opened {
            name: name.to_owned(),
            ctx,
            probes: tokio::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// How the QPs of `port` move, and its link layer: the port is tried at its first
    /// QP (a QP pair of apm's own on it, seconds at most, on a thread of its own so
    /// that no other connection's messages wait), then what was asked for decides.
    pub(super) async fn mechanism(&self, port: u8) -> Result<(MigrationMode, Link), String> {
        let mut probes = self.probes.lock().await;
        let probe = match probes.get(&port) {
            Some(p) => p.clone(),
            None => {
                let ctx = self.ctx.clone();
                let probe = tokio::task::spawn_blocking(move || probe_port(&ctx, port))
                    .await
                    .map_err(|e| format!("trying what port {port} can do failed: {e}"))?;
                info!(probe = %probe.line(), "what the port can do");
                report::port(&probe);
                // A trial that could not run (the port was down, a resource short)
                // proves nothing: the port's next QP tries again.
                if settled(&probe) {
                    probes.insert(port, probe.clone());
                }
                probe
            }
        };
        let link = match probe.link_layer.as_str() {
            "infiniband" => Link::InfiniBand,
            _ => Link::Ethernet,
        };
        Ok((chosen(migration(), &probe)?, link))
    }

    /// The device's active InfiniBand ports, each with its engine key and port GID
    /// (index 0): where an InfiniBand connection's paths may leave from.
    pub(super) fn ib_ports(&self) -> Vec<(PortKey, Gid)> {
        let count = self.ctx.query_device().map_or(1, |d| d.phys_port_cnt);
        (1..=count)
            .filter(|&port| {
                self.ctx.query_port(port).is_ok_and(|a| {
                    a.link_layer == LinkLayer::InfiniBand && a.state == PortState::Active
                })
            })
            .filter_map(|port| {
                let gid = self.ctx.query_gid(port, 0).ok().flatten()?;
                Some((PortKey::new(0, port), Gid(gid.gid)))
            })
            .collect()
    }
}

/// Whether every trial of `probe` ran (its verdict holds for the port's next QPs).
fn settled(probe: &PortProbe) -> bool {
    let untried = |t: &Trial| matches!(t, Trial::Untried(_));
    probe.mechanism() != provider_verbs::capability::Mechanism::None
        || !(untried(&probe.alternate_path) && untried(&probe.sqd_repath))
}

/// Where a device's engine gets its paths.
pub(super) enum Paths {
    /// RoCE: the connections' own (their primaries and the rails the agents paired).
    Ethernet(StaticPaths),
    /// InfiniBand: the SA's, through the agent, which also fans out its notices; the
    /// device's ports' GIDs, shared with the peer facet.
    InfiniBand(AgentFabric, Ports),
}

/// What apm runs per device, way of moving and link layer.
pub(super) struct Device {
    pub(super) name: String,
    pub(super) ctx: Context,
    pub(super) facet: Facet,
    pub(super) peer: AgentPeer,
    pub(super) paths: Paths,
    pub(super) handle: ManagerHandle,
    /// Protected connections: their QP number, peer QP number and current primary.
    pub(super) conns: Mutex<BTreeMap<ConnId, Conn>>,
}

/// What an engine is started for: a device, how its QPs move, their link layer.
pub(super) type EngineKey = (String, MigrationMode, Link);

impl Protector {
    /// apm's context on device `name` (opened on first use; a failure is remembered).
    pub(super) async fn opened(&self, name: &str) -> Result<Arc<Opened>, String> {
        let mut opened = self.opened.lock().await;
        if let Some(o) = opened.get(name) {
            return o.clone();
        }
        let o = Opened::open(name).map(Arc::new);
        opened.insert(name.to_owned(), o.clone());
        o
    }

    /// apm's engine for the QPs of `dev` that move by `mode` on `link` (started on
    /// first use; a failure is remembered).
    pub(super) async fn device(
        &'static self,
        dev: &Opened,
        mode: MigrationMode,
        link: Link,
    ) -> Result<Arc<Device>, String> {
        let key: EngineKey = (dev.name.clone(), mode, link);
        let mut devices = self.devices.lock().await;
        if let Some(d) = devices.get(&key) {
            return d.clone();
        }
        let d = self.start_engine(dev, mode, link).await.map(Arc::new);
        if let Ok(started) = &d {
            lock(&self.started).push(started.clone());
            tokio::spawn(super::follow::watch(started.clone()));
        }
        devices.insert(key, d.clone());
        d
    }

    async fn start_engine(
        &self,
        dev: &Opened,
        mode: MigrationMode,
        link: Link,
    ) -> Result<Device, String> {
        let name = dev.name.as_str();
        let ctx = dev.ctx.clone();
        let peer = AgentPeer::new(self.client.clone(), PortKey::new(0, 1));
        let (peer, paths) = match link {
            Link::Ethernet => (peer, Paths::Ethernet(StaticPaths::default())),
            Link::InfiniBand => {
                // The ports' GIDs are known before the engine subscribes through them.
                let ports = Ports::default();
                for (key, gid) in dev.ib_ports() {
                    ports.set(key, gid);
                }
                let fabric = AgentFabric::new(self.client.clone(), ports.clone());
                (
                    peer.with_ports(ports.clone()),
                    Paths::InfiniBand(fabric, ports),
                )
            }
        };
        let (facet, handle) = match mode {
            MigrationMode::Hardware => {
                let f = Arc::new(VerbsQpControl::new(vec![ctx.clone()]));
                let h = self.engine_on(name, f.clone(), &peer, &paths).await?;
                (Facet::Hardware(f), h)
            }
            MigrationMode::Software => {
                let f = Arc::new(RxeQpControl::new(vec![ctx.clone()], RxeConfig::default()));
                let h = self.engine_on(name, f.clone(), &peer, &paths).await?;
                (Facet::Software(f), h)
            }
        };
        info!(device = name, ?mode, ?link, "apm's engine started");
        Ok(Device {
            name: name.to_owned(),
            ctx,
            facet,
            peer,
            paths,
            handle,
            conns: Mutex::new(BTreeMap::new()),
        })
    }

    /// Start an engine on `facet`, the agent's peer channel and the device's paths.
    async fn engine_on<Q: apm_core::QpControl + 'static>(
        &self,
        name: &str,
        facet: Arc<Q>,
        peer: &AgentPeer,
        paths: &Paths,
    ) -> Result<ManagerHandle, String> {
        match paths {
            Paths::Ethernet(p) => {
                let stack = Stack::new(facet, peer.clone(), p.clone());
                self.engine(name, stack).await
            }
            Paths::InfiniBand(f, _) => {
                let stack = Stack::new(facet, peer.clone(), f.clone());
                self.engine(name, stack).await
            }
        }
    }

    async fn engine<P: apm_core::Provider + 'static>(
        &self,
        name: &str,
        stack: P,
    ) -> Result<ManagerHandle, String> {
        let (manager, handle) = Manager::new(Arc::new(stack), self.policy.clone())
            .map_err(|e| format!("apm's engine refused to start: {e}"))?;
        let task = tokio::spawn(manager.run());
        if handle.stats().await.is_err() {
            let why = match task.await {
                Ok(Err(e)) => e.to_string(),
                _ => "stopped".into(),
            };
            return Err(format!("apm's engine on {name} did not start: {why}"));
        }
        Ok(handle)
    }
}
