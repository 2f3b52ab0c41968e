//! What a client may ask, and the agent's answer to each request.
//!
//! The rules, by request (a [`Caller`] that is an operator is root, the agent's own
//! user, or a member of the operator group):
//!
//! - `Register`: at most [`Limits::per_route`](super::Limits) paths and addresses, at
//!   most so many registrations per client and in all; every local address one of
//!   this host's; the QP one the kernel says the caller's own process created, connected
//!   to the registered remote QPN (an operator's registration is taken when the kernel
//!   cannot be asked, never a non-operator's); never a connection another client holds.
//!   Its paths are probed only toward addresses whose host's agent answered a hello
//!   (an operator's toward any).
//! - `Send`: only a message of a connection the client registered, from one of its
//!   local addresses to one of its peer addresses; never a probe (the agent's own). So
//!   the agent seals nothing but what a process may say about its own connections.
//! - `Candidates`: a bounded number in flight per client, from a local address.
//! - `Report`: a process's account of itself, kept while within its bounds.
//! - `Status`: every process for an operator, else the caller's user's own.
//! - `RailDown` and `Watch`: operators only (a rail-down moves everybody's
//!   connections; a watcher sees every path's verdict).
//!
//! A refused request is answered with [`FromAgent::Refused`] and logged.

use super::{fabric, lock, peers, Shared};
use crate::access::Caller;
use crate::hello::HelloSocket;
use crate::local::{self, ip_of};
use crate::outbox::WATCHER_BUDGET;
use crate::probes::AgentProbes;
use crate::wire::{FromAgent, Route, ToAgent};
use apm_core::{Gid, Lid, PeerAddr, PortKey};
use tracing::{debug, info, warn};

/// Handle one request of client `id`.
pub(super) async fn handle(
    id: super::ClientId,
    m: ToAgent,
    state: &Shared,
    hello: &HelloSocket,
    port: u16,
) {
    let Some(caller) = lock(state).clients.get(&id).map(|c| c.caller) else {
        return;
    };
    match m {
        ToAgent::Register { route } => register(id, caller, route, state, hello, port).await,
        ToAgent::Unregister {
            local_qpn,
            remote_qpn,
        } => {
            let mut s = lock(state);
            s.routes.remove(id, local_qpn, remote_qpn);
            s.refollow();
        }
        ToAgent::Paths {
            req,
            sgid,
            dgid,
            dlid,
        } => paths(id, caller, req, sgid, dgid, dlid, state).await,
        ToAgent::Subscribe { sgid } => match ib_port(state, sgid).await {
            Some(key) => fabric::add_subscriber(state, id, key),
            None => refuse(
                state,
                id,
                caller,
                "subscribing through a port the agent does not serve",
            ),
        },
        ToAgent::Send { from, to, msg, lid } => {
            send(id, caller, from, to, lid, msg, state, port).await
        }
        ToAgent::Candidates {
            req,
            sgid,
            dgid,
            local_gids,
        } => candidates_request(id, req, sgid, dgid, local_gids, state, hello),
        ToAgent::RailDown { gid } => {
            if !caller.operator {
                return refuse(state, id, caller, "reporting a rail down (operators only)");
            }
            info!(%gid, uid = caller.uid, "rail down: telling every process");
            lock(state).tell_all(&FromAgent::RailDown { gid });
        }
        ToAgent::Watch => {
            if !caller.operator {
                return refuse(
                    state,
                    id,
                    caller,
                    "watching every path's verdict (operators only)",
                );
            }
            let mut s = lock(state);
            // A watcher is no protected process: it leaves the idle count, and its
            // smaller budget holds verdicts only.
            if let Some(c) = s.clients.get_mut(&id) {
                c.watcher = true;
                c.outbox.set_budget(WATCHER_BUDGET);
            }
            s.routes.remove_client(id);
            s.refollow();
            let answer = FromAgent::Watching {
                probing: s.probes.is_some(),
                sessions: s
                    .probes
                    .as_ref()
                    .map(AgentProbes::sessions)
                    .unwrap_or_default(),
            };
            debug!(client = id, "a watcher attached");
            s.tell(id, &answer);
        }
        ToAgent::Sync { req } => lock(state).tell(id, &FromAgent::Synced { req }),
        ToAgent::Report { status } => {
            if let Err(why) = super::status::keep(state, id, status) {
                refuse(state, id, caller, &format!("a status out of bounds: {why}"));
            }
        }
        ToAgent::Status { req, pid } => super::status::answer(state, id, caller, req, pid),
    }
}

/// Send a peer message of one of the client's connections: through the InfiniBand port
/// of `from` to the peer's LID, or over UDP from `from`'s address.
#[allow(clippy::too_many_arguments)]
async fn send(
    id: super::ClientId,
    caller: Caller,
    from: Gid,
    to: Gid,
    lid: u16,
    msg: apm_core::PeerMsg,
    state: &Shared,
    port: u16,
) {
    if matches!(msg, apm_core::PeerMsg::Probe(_)) {
        return refuse(state, id, caller, "sending a probe (the agent's own)");
    }
    if lock(state)
        .routes
        .sender_route(id, &from, &to, &msg)
        .is_none()
    {
        return refuse(
            state,
            id,
            caller,
            "sending a message of a connection it has not registered",
        );
    }
    if let Some(key) = ib_port(state, from).await {
        let to = PeerAddr {
            gid: to,
            lid: Lid::from_wire(lid),
        };
        return fabric::send(state, key, to, msg).await;
    }
    match peers::channel(state, from, port).await {
        Ok(ch) => {
            let to = PeerAddr {
                gid: to,
                lid: Lid::from_wire(0),
            };
            if let Err(e) = apm_core::PeerChannel::send(&*ch, PortKey::new(0, 1), to, msg).await {
                debug!(error = %e, "peer message not sent");
            }
        }
        Err(e) => warn!(gid = %from, error = %e, "no channel to send from"),
    }
}

/// Answer a paths request from the SA through the agent's InfiniBand side.
async fn paths(
    id: super::ClientId,
    caller: Caller,
    req: u64,
    sgid: Gid,
    dgid: Option<Gid>,
    dlid: Option<u16>,
    state: &Shared,
) {
    let dest = match (dgid, dlid) {
        (Some(g), _) => fabric::Dest::Gid(g),
        (None, Some(l)) => fabric::Dest::Lid(l),
        (None, None) => return refuse(state, id, caller, "asking paths to nowhere"),
    };
    match ib_port(state, sgid).await {
        Some(key) => fabric::paths(state, id, req, key, dest),
        None => {
            let m = FromAgent::Paths {
                req,
                result: Err(format!("{sgid} is on no InfiniBand port the agent serves")),
            };
            lock(state).tell(id, &m);
        }
    }
}

/// The InfiniBand port of the agent's that holds local address `gid`, if any (sysfs
/// is read off the async workers).
async fn ib_port(state: &Shared, gid: Gid) -> Option<apm_core::PortKey> {
    let host = {
        let s = lock(state);
        s.ib.as_ref()?;
        s.config.host.clone()
    };
    let (device, port) = tokio::task::spawn_blocking(move || host.port_of(&gid))
        .await
        .ok()??;
    lock(state).ib.as_ref()?.key(&device, port)
}

/// Say no to client `id`, in its stream and the log.
fn refuse(state: &Shared, id: super::ClientId, caller: Caller, what: &str) {
    warn!(
        client = id,
        uid = caller.uid,
        pid = caller.pid,
        "refused: {what}"
    );
    lock(state).tell(
        id,
        &FromAgent::Refused {
            what: what.to_owned(),
        },
    );
}

async fn register(
    id: super::ClientId,
    caller: Caller,
    mut route: Route,
    state: &Shared,
    hello: &HelloSocket,
    port: u16,
) {
    if let Err(why) = admissible(id, caller, &route, state).await {
        return refuse(
            state,
            id,
            caller,
            &format!(
                "registering QP {} (peer QP {}): {why}",
                route.local_qpn, route.remote_qpn
            ),
        );
    }
    // Probe only a connection's own paths, and (but for operators) only toward hosts
    // whose agent answered a hello: a registration cannot aim probes anywhere else.
    let before = route.paths.len();
    route.paths.retain(|(l, r)| {
        route.local_gids.contains(l)
            && route.peer_gids.contains(r)
            && (caller.operator || hello.vouched(r))
    });
    if route.paths.len() < before {
        debug!(
            client = id,
            dropped = before - route.paths.len(),
            "paths not probed: not the connection's own, or toward no apm agent"
        );
    }
    // A UDP channel for each RoCE address (an InfiniBand port's GID is no IP address:
    // its messages are MADs through the port).
    for g in route.local_gids.iter().filter(|g| ip_of(g).is_some()) {
        if let Err(e) = peers::channel(state, *g, port).await {
            warn!(gid = %g, error = %e, "cannot listen for peer messages on this address");
        }
    }
    let mut s = lock(state);
    for (from, msg) in s.routes.insert(id, route) {
        // What arrived for this connection before it was registered.
        s.tell(id, &FromAgent::Peer { from, msg });
    }
    s.refollow();
}

/// Why `route` may not be registered by client `id`, if it may not.
async fn admissible(
    id: super::ClientId,
    caller: Caller,
    route: &Route,
    state: &Shared,
) -> Result<(), String> {
    let (host, limits) = {
        let s = lock(state);
        let limits = s.config.limits;
        if s.routes.of_client(id) >= limits.routes_per_client {
            return Err(format!(
                "the client's {} registrations are the most allowed",
                limits.routes_per_client
            ));
        }
        if s.routes.total() >= limits.routes {
            return Err(format!(
                "the agent holds {} registrations, the most allowed",
                limits.routes
            ));
        }
        if let Some(other) = s.routes.claimed_by_other(id, route) {
            return Err(format!("another client ({other}) holds that connection"));
        }
        (s.config.host.clone(), limits)
    };
    let n = limits.per_route;
    if route.paths.len() > n || route.local_gids.len() > n || route.peer_gids.len() > n {
        return Err(format!("more than {n} paths or addresses"));
    }
    let Some(first) = route.local_gids.first().copied() else {
        return Err("no local address".into());
    };
    let gids = route.local_gids.clone();
    let (local_qpn, remote_qpn) = (route.local_qpn, route.remote_qpn);
    let owner = tokio::task::spawn_blocking(move || {
        if let Some(g) = gids.iter().find(|g| !host.is_local(g)) {
            return Err(format!("{g} is not an address of this host's RDMA devices"));
        }
        Ok(host.qp(&first, local_qpn))
    })
    .await
    .map_err(|_| "the check failed".to_owned())??;
    match owner {
        Ok(Some(qp)) => {
            if qp.pid.is_none() || qp.pid != caller.pid {
                return Err(format!(
                    "the QP belongs to {}, not to the caller's process",
                    qp.pid
                        .map_or("the kernel".to_owned(), |p| format!("process {p}"))
                ));
            }
            if qp.remote_qpn.is_some_and(|r| r != remote_qpn) {
                return Err("the QP is connected to another remote QP".into());
            }
            Ok(())
        }
        Ok(None) => Err(format!("the device of {first} has no QP {local_qpn}")),
        Err(e) if caller.operator => {
            debug!(error = %e, "the QP's owner cannot be asked: an operator's registration taken");
            Ok(())
        }
        Err(e) => Err(format!("the QP's owner cannot be checked ({e})")),
    }
}

/// Answer a candidates request on a task of its own (the agent asks the peer's agent).
fn candidates_request(
    id: super::ClientId,
    req: u64,
    sgid: Gid,
    dgid: Gid,
    mut local_gids: Vec<Gid>,
    state: &Shared,
    hello: &HelloSocket,
) {
    {
        let mut s = lock(state);
        let limit = s.config.limits.candidates_per_client;
        let Some(c) = s.clients.get_mut(&id) else {
            return;
        };
        if c.candidates >= limit {
            let answer = FromAgent::Candidates {
                req,
                result: Err(format!("more than {limit} candidate requests at once")),
            };
            s.tell(id, &answer);
            return;
        }
        c.candidates += 1;
    }
    local_gids.truncate(lock(state).config.limits.per_route);
    let (hello, state) = (hello.clone(), state.clone());
    tokio::spawn(async move {
        let host = lock(&state).config.host.clone();
        let result = candidates(&hello, host, sgid, dgid, &local_gids).await;
        let mut s = lock(&state);
        if let Some(c) = s.clients.get_mut(&id) {
            c.candidates -= 1;
        }
        s.tell(id, &FromAgent::Candidates { req, result });
    });
}

/// The alternates from the device of `sgid` to the host of `dgid` (see [`local::pair`]).
async fn candidates(
    hello: &HelloSocket,
    host: std::sync::Arc<dyn crate::host::Host>,
    sgid: Gid,
    dgid: Gid,
    local_gids: &[Gid],
) -> Result<Vec<(Gid, Gid)>, String> {
    // sysfs reads: off the async workers.
    let mine = tokio::task::spawn_blocking(move || host.device_addresses(&sgid))
        .await
        .ok()
        .flatten()
        .ok_or_else(|| format!("no local RDMA device holds {sgid}"))?;
    let mine: Vec<_> = mine
        .into_iter()
        .filter(|a| local_gids.is_empty() || local_gids.contains(&a.gid))
        .collect();
    let theirs = hello
        .ask(dgid)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("the peer's agent knows no device holding {dgid}"))?;
    let pairs = local::pair(&mine, &theirs, &sgid, &dgid);
    if pairs.is_empty() {
        return Err(format!(
            "no second path: no address of this device ({}) shares a subnet with one of the \
             peer's ({}) other than the primary's",
            list(mine.iter().map(|a| a.gid)),
            list(theirs.iter().map(|a| a.gid))
        ));
    }
    Ok(pairs)
}

fn list(gids: impl Iterator<Item = Gid>) -> String {
    gids.filter_map(|g| ip_of(&g).map(|ip| ip.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}
