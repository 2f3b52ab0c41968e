//! The agent's routing table: which client registered which connection, the messages
//! that came before their connection was registered, and the paths worth probing.
//!
//! A connection is keyed by its two QP numbers (its comm ids) and told apart from
//! another with the same numbers by its addresses: a message is the connection's when
//! its comm ids match and its sender is one of the connection's peer addresses.

use super::ClientId;
use crate::wire::{self, Route};
use apm_core::probe::PathEnds;
use apm_core::{PeerAddr, PeerMsg};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// How long a message for a connection nobody registered yet is kept: the two ends of
/// a connection register at different moments (each after its own hello), and the
/// first words of the quicker end would otherwise be lost to the slower one.
pub(super) const HOLD_UNROUTED: Duration = Duration::from_secs(3);
/// Messages held for connections not registered yet, at most (a stranger's datagrams
/// cannot make the agent hoard).
const UNROUTED_MAX: usize = 1024;

/// Every registered connection, by (local QPN, remote QPN).
#[derive(Debug, Default)]
pub(super) struct Routes {
    by_qpns: BTreeMap<(u32, u32), Vec<(ClientId, Route)>>,
    per_client: BTreeMap<ClientId, usize>,
    total: usize,
    unrouted: Vec<(Instant, PeerAddr, PeerMsg)>,
}

impl Routes {
    /// Connections registered in all.
    pub(super) fn total(&self) -> usize {
        self.total
    }

    /// Connections `client` registered.
    pub(super) fn of_client(&self, client: ClientId) -> usize {
        self.per_client.get(&client).copied().unwrap_or(0)
    }

    /// Another client's registration of the same connection (same QP numbers, a local
    /// address in common), if any.
    pub(super) fn claimed_by_other(&self, client: ClientId, route: &Route) -> Option<ClientId> {
        self.by_qpns
            .get(&(route.local_qpn, route.remote_qpn))?
            .iter()
            .find(|(c, r)| {
                *c != client && r.local_gids.iter().any(|g| route.local_gids.contains(g))
            })
            .map(|(c, _)| *c)
    }

    /// Register `route` for `client` (replacing its own registration of the same
    /// connection), and hand back what arrived for it before.
    pub(super) fn insert(&mut self, client: ClientId, route: Route) -> Vec<(PeerAddr, PeerMsg)> {
        self.remove(client, route.local_qpn, route.remote_qpn);
        let now = Instant::now();
        let mut early = Vec::new();
        self.unrouted.retain(|(at, from, msg)| {
            if now.duration_since(*at) > HOLD_UNROUTED {
                return false;
            }
            if matches(&route, from, msg) {
                early.push((*from, *msg));
                return false;
            }
            true
        });
        self.by_qpns
            .entry((route.local_qpn, route.remote_qpn))
            .or_default()
            .push((client, route));
        *self.per_client.entry(client).or_default() += 1;
        self.total += 1;
        early
    }

    /// Forget `client`'s registration of the connection `(local_qpn, remote_qpn)`.
    pub(super) fn remove(&mut self, client: ClientId, local_qpn: u32, remote_qpn: u32) {
        let key = (local_qpn, remote_qpn);
        let Some(list) = self.by_qpns.get_mut(&key) else {
            return;
        };
        let before = list.len();
        list.retain(|(c, _)| *c != client);
        let gone = before - list.len();
        if list.is_empty() {
            self.by_qpns.remove(&key);
        }
        self.forget(client, gone);
    }

    /// Forget every registration of `client`.
    pub(super) fn remove_client(&mut self, client: ClientId) {
        let mut gone = 0;
        self.by_qpns.retain(|_, list| {
            let before = list.len();
            list.retain(|(c, _)| *c != client);
            gone += before - list.len();
            !list.is_empty()
        });
        self.forget(client, gone);
    }

    fn forget(&mut self, client: ClientId, gone: usize) {
        self.total -= gone;
        if let Some(n) = self.per_client.get_mut(&client) {
            *n -= gone;
            if *n == 0 {
                self.per_client.remove(&client);
            }
        }
    }

    /// The client whose connection `msg` from `from` belongs to.
    pub(super) fn owner(&self, from: &PeerAddr, msg: &PeerMsg) -> Option<ClientId> {
        let (receiver, sender) = wire::comm_ids(msg);
        self.by_qpns
            .get(&(receiver, sender))?
            .iter()
            .find(|(_, r)| from_peer(r, from))
            .map(|(c, _)| *c)
    }

    /// `client`'s registration that `msg`, sent from local address `from` to peer
    /// address `to`, speaks for: its comm ids are the connection's (the sender's is
    /// the local QPN) and both addresses are the connection's.
    pub(super) fn sender_route(
        &self,
        client: ClientId,
        from: &apm_core::Gid,
        to: &apm_core::Gid,
        msg: &PeerMsg,
    ) -> Option<&Route> {
        let (receiver, sender) = wire::comm_ids(msg);
        self.by_qpns
            .get(&(sender, receiver))?
            .iter()
            .find(|(c, r)| *c == client && r.local_gids.contains(from) && r.peer_gids.contains(to))
            .map(|(_, r)| r)
    }

    /// Keep `msg` a moment for a connection not registered yet.
    pub(super) fn hold(&mut self, from: PeerAddr, msg: PeerMsg) {
        let now = Instant::now();
        self.unrouted
            .retain(|(at, _, _)| now.duration_since(*at) <= HOLD_UNROUTED);
        if self.unrouted.len() < UNROUTED_MAX {
            self.unrouted.push((now, from, msg));
        }
    }

    /// Every path of every registration (what the agent probes).
    pub(super) fn paths(&self) -> BTreeSet<PathEnds> {
        self.all()
            .flat_map(|(_, r)| r.paths.iter())
            .map(|(local, remote)| PathEnds {
                local: *local,
                remote: *remote,
            })
            .collect()
    }

    /// Whether one of `client`'s registrations has the path `ends`.
    pub(super) fn client_has_path(&self, client: ClientId, ends: &PathEnds) -> bool {
        self.all()
            .any(|(c, r)| c == client && r.paths.contains(&(ends.local, ends.remote)))
    }

    /// Every path of the registrations of `clients`.
    pub(super) fn paths_of(&self, clients: &BTreeSet<ClientId>) -> BTreeSet<PathEnds> {
        self.all()
            .filter(|(c, _)| clients.contains(c))
            .flat_map(|(_, r)| r.paths.iter())
            .map(|(local, remote)| PathEnds {
                local: *local,
                remote: *remote,
            })
            .collect()
    }

    fn all(&self) -> impl Iterator<Item = (ClientId, &Route)> {
        self.by_qpns
            .values()
            .flat_map(|list| list.iter().map(|(c, r)| (*c, r)))
    }
}

/// Whether `from` is one of the connection's peer addresses: its GID, or on
/// InfiniBand its LID (a MAD without a GRH names its sender by LID only).
fn from_peer(r: &Route, from: &PeerAddr) -> bool {
    let lid = from.lid.get();
    r.peer_gids.contains(&from.gid) || (lid != 0 && r.peer_lids.contains(&lid))
}

/// Whether `msg` from `from` belongs to the connection `r`.
fn matches(r: &Route, from: &PeerAddr, msg: &PeerMsg) -> bool {
    let (receiver, sender) = wire::comm_ids(msg);
    r.local_qpn == receiver && r.remote_qpn == sender && from_peer(r, from)
}
