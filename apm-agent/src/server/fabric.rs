//! The InfiniBand side served to the processes (see [`crate::ib`]): PathRecords asked
//! once per (port, destination) for the whole host, trap 64/65 subscriptions per port
//! fanned out to every process that subscribed, and peer messages through the ports.

use super::{lock, ClientId, Shared};
use crate::ib::{IbPort, InfiniBand, PATHS_TTL};
use crate::wire::{FromAgent, PathsAnswer};
use apm_core::{Gid, Input, Lid, Path, PeerAddr, PeerMsg, PortKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Destinations whose paths are kept at most (then the oldest answer goes).
const PATHS_KEPT: usize = 65_536;
/// Questions waiting for one answer at most (the SA answers in milliseconds; more
/// waiting means the SA does not answer, and the asker is told so at once).
const WAITING_MAX: usize = 65_536;

/// What is asked of the SA: the paths from a port to a destination named by GID, or
/// by LID (a QP without a GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Dest {
    /// A port GID.
    Gid(Gid),
    /// A LID.
    Lid(u16),
}

/// The InfiniBand side's state in the agent.
#[derive(Debug)]
pub(super) struct IbState {
    side: Arc<dyn InfiniBand>,
    ports: Vec<IbPort>,
    answers: BTreeMap<(PortKey, Dest), (Instant, PathsAnswer)>,
    waiting: BTreeMap<(PortKey, Dest), Vec<(ClientId, u64)>>,
    /// Ports whose subscription runs now, with whether to run it once more.
    subscribing: BTreeMap<PortKey, bool>,
    subscribers: BTreeSet<ClientId>,
}

impl IbState {
    pub(super) fn new(side: Arc<dyn InfiniBand>) -> IbState {
        let ports = side.ports();
        IbState {
            side,
            ports,
            answers: BTreeMap::new(),
            waiting: BTreeMap::new(),
            subscribing: BTreeMap::new(),
            subscribers: BTreeSet::new(),
        }
    }

    /// The port of `device`/`port`, if it is one of the InfiniBand side's.
    pub(super) fn key(&self, device: &str, port: u8) -> Option<PortKey> {
        self.ports
            .iter()
            .find(|p| p.device == device && p.port == port)
            .map(|p| p.key)
    }

    /// Forget a client that left.
    pub(super) fn forget(&mut self, client: ClientId) {
        self.subscribers.remove(&client);
        for list in self.waiting.values_mut() {
            list.retain(|(c, _)| *c != client);
        }
    }
}

/// Start the side: its notices and peer messages come to the agent, and it subscribes
/// through every port.
pub(super) async fn start(state: &Shared) {
    let Some(side) = lock(state).ib.as_ref().map(|ib| ib.side.clone()) else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Input>();
    if let Err(e) = side.start(tx).await {
        warn!(error = %e, "the InfiniBand side did not start: no SA and no MAD channel");
        return;
    }
    let routed = state.clone();
    tokio::spawn(async move {
        while let Some(input) = rx.recv().await {
            match input {
                Input::PeerMessage { from, msg, .. } => super::peers::route(&routed, from, msg),
                Input::RemoteGid { gid, service } => notice(&routed, gid, service),
                _ => {}
            }
        }
    });
    let keys: Vec<PortKey> = side.ports().iter().map(|p| p.key).collect();
    for key in keys {
        subscribe(state, key);
    }
}

/// A notice from the SA: to every process that subscribed.
fn notice(state: &Shared, gid: Gid, service: apm_core::GidService) {
    let s = lock(state);
    let Some(ib) = s.ib.as_ref() else { return };
    debug!(%gid, ?service, subscribers = ib.subscribers.len(), "SA notice");
    let m = FromAgent::RemoteGid { gid, service };
    for c in &ib.subscribers {
        s.tell(*c, &m);
    }
}

/// Subscribe through `key`. One subscription of a port runs at a time: a request that
/// comes while one runs makes it run once more when it ends (after CLIENT_REREGISTER
/// every process asks at once: that is one or two subscriptions, and one asked after a
/// new SM came is never lost to one the old SM took).
pub(super) fn subscribe(state: &Shared, key: PortKey) {
    let side = {
        let mut s = lock(state);
        let Some(ib) = s.ib.as_mut() else { return };
        match ib.subscribing.get_mut(&key) {
            Some(again) => {
                *again = true;
                debug!(port = %key, "a subscription runs: once more after it");
                return;
            }
            None => {
                ib.subscribing.insert(key, false);
            }
        }
        ib.side.clone()
    };
    debug!(port = %key, "subscribing for traps 64/65");
    let state = state.clone();
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let result = side.subscribe(key).await;
            match &result {
                Ok(()) => info!(port = %key, "subscribed for traps 64/65"),
                Err(e) => warn!(port = %key, error = %e, "subscribing for traps 64/65 failed"),
            }
            let failed = result.is_err();
            failures = if failed { failures + 1 } else { 0 };
            {
                let mut s = lock(&state);
                let Some(ib) = s.ib.as_mut() else { return };
                let again = ib.subscribing.get(&key).copied().unwrap_or(false);
                if again {
                    ib.subscribing.insert(key, false);
                    continue;
                }
                if !failed || failures >= SUBSCRIBE_TRIES {
                    // After the last try the SA client's own refresh, every minute,
                    // goes on trying.
                    ib.subscribing.remove(&key);
                    return;
                }
            }
            // Until the SA takes it (a new SM may not answer yet).
            tokio::time::sleep(SUBSCRIBE_RETRY).await;
        }
    });
}

/// How long the agent waits before it asks the SA again to take a subscription.
const SUBSCRIBE_RETRY: std::time::Duration = std::time::Duration::from_secs(2);
/// How often it tries in a row at most.
const SUBSCRIBE_TRIES: u32 = 30;

/// A process subscribes: it gets every notice from now on, and the port is subscribed
/// (again).
pub(super) fn add_subscriber(state: &Shared, client: ClientId, key: PortKey) {
    if let Some(ib) = lock(state).ib.as_mut() {
        ib.subscribers.insert(client);
    }
    subscribe(state, key);
}

/// Answer `req` of `client` with the paths from `key` to `dest`: from what the agent
/// knows, by joining a question under way, or by asking the SA.
pub(super) fn paths(state: &Shared, client: ClientId, req: u64, key: PortKey, dest: Dest) {
    let side = {
        let mut s = lock(state);
        let Some(ib) = s.ib.as_mut() else { return };
        let now = Instant::now();
        let known = ib
            .answers
            .get(&(key, dest))
            .filter(|(at, _)| now.duration_since(*at) < PATHS_TTL)
            .map(|(_, a)| a.clone());
        if let Some(answer) = known {
            s.tell(
                client,
                &FromAgent::Paths {
                    req,
                    result: Ok(answer),
                },
            );
            return;
        }
        if let Some(list) = ib.waiting.get_mut(&(key, dest)) {
            list.push((client, req));
            return;
        }
        if ib.waiting.len() >= WAITING_MAX {
            let m = FromAgent::Paths {
                req,
                result: Err("the subnet administrator does not keep up".into()),
            };
            s.tell(client, &m);
            return;
        }
        ib.waiting.insert((key, dest), vec![(client, req)]);
        ib.side.clone()
    };
    let state = state.clone();
    tokio::spawn(async move {
        let result = ask(&*side, key, dest).await;
        let mut s = lock(&state);
        let Some(ib) = s.ib.as_mut() else { return };
        let askers = ib.waiting.remove(&(key, dest)).unwrap_or_default();
        if let Ok(answer) = &result {
            if ib.answers.len() >= PATHS_KEPT {
                let now = Instant::now();
                ib.answers
                    .retain(|_, (at, _)| now.duration_since(*at) < PATHS_TTL);
                if let Some(oldest) = ib.answers.iter().min_by_key(|(_, (at, _))| *at) {
                    let k = *oldest.0;
                    ib.answers.remove(&k);
                }
            }
            ib.answers
                .insert((key, dest), (Instant::now(), answer.clone()));
        }
        for (c, req) in askers {
            s.tell(
                c,
                &FromAgent::Paths {
                    req,
                    result: result.clone(),
                },
            );
        }
    });
}

/// The SA's answer: the destination's GID (looked up first when it is named by LID),
/// every path to it, the ports of its node (NodeRecords) and the paths to those too.
/// Only the destination's own paths are required; the node's other ports are what
/// the SA can tell.
async fn ask(side: &dyn InfiniBand, key: PortKey, dest: Dest) -> Result<PathsAnswer, String> {
    let (dgid, named_lid) = match dest {
        Dest::Gid(g) => (g, None),
        Dest::Lid(lid) => {
            let g = side
                .gid_of_lid(key, Lid::from_wire(lid))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("the subnet administrator knows no port at LID {lid}"))?;
            (g, Some(lid))
        }
    };
    let mut paths: Vec<Path> = side
        .resolve_paths(key, dgid)
        .await
        .map_err(|e| e.to_string())?;
    let lid = named_lid.or_else(|| paths.first().map(|p| p.dlid.get()));
    let mut peer_ports = Vec::new();
    if let Some(lid) = lid {
        match side.node_ports(key, Lid::from_wire(lid)).await {
            Ok(ports) => peer_ports = ports,
            Err(e) => debug!(lid, error = %e, "the peer node's ports are unknown"),
        }
    }
    for (g, _, _) in peer_ports.iter().filter(|(g, _, _)| *g != dgid) {
        match side.resolve_paths(key, *g).await {
            Ok(more) => paths.extend(more),
            Err(e) => debug!(gid = %g, error = %e, "no paths to the peer node's other port"),
        }
    }
    Ok(PathsAnswer {
        dgid,
        paths,
        peer_ports: peer_ports.iter().map(|(g, l, _)| (*g, l.get())).collect(),
    })
}

/// Send `msg` through InfiniBand port `key` to `to`.
pub(super) async fn send(state: &Shared, key: PortKey, to: PeerAddr, msg: PeerMsg) {
    let Some(side) = lock(state).ib.as_ref().map(|ib| ib.side.clone()) else {
        return;
    };
    if let Err(e) = side.send(key, to, msg).await {
        debug!(error = %e, "peer message not sent");
    }
}
