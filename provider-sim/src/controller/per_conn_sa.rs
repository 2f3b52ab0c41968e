//! `per-conn-sa`: the naive way to keep connections armed through the SA, for
//! comparing what apm costs the SM and SA. Each connection looks after itself, as an
//! application resolving its own routes does (a PathRecord query per connection, the
//! pattern behind the "10^6 PathRecord queries of a 1000-process job"): whenever one
//! of its paths may have changed (its local port went down or came back, a trap 65 or
//! 64 named its peer's port, the HCA migrated it or refused a migration), it asks the
//! SA for paths to its peer through every local port that is up, one query per port,
//! with no cache shared with the other connections and no pacing, and arms the best
//! answer: the peer on the other rail, else a variant on the same ports whose two
//! LIDs both differ (which both sides pick alike). Every port subscribes to traps
//! 64/65 (the only subscription OpenSM offers for them: every trap to every
//! subscriber). No peer protocol: both sides apply the rule on their own.

use super::{ById, Outstanding};
use apm_core::{
    Command, CommandId, CommandOp, CommandOutcome, ConnId, ConnSpec, Gid, GidService, Input,
    LinkLayer, Output, Path, PortEvent, PortKey, QpEvent, Time,
};
use std::collections::{BTreeMap, VecDeque};

/// One connection's side.
#[derive(Debug)]
struct Conn {
    primary: Path,
    alternate: Option<Path>,
    /// The peer's GID on each local port (its rail).
    peers: Box<[(PortKey, Gid)]>,
    /// PathRecord queries out, and the paths they brought so far.
    asking: u32,
    found: Vec<Path>,
}

/// What a command was for.
#[derive(Clone, Copy, Debug)]
enum Job {
    Subscribe,
    Query(ConnId),
    /// A load; set REARM when it succeeds.
    Load(ConnId),
    Rearm,
}

/// The `per-conn-sa` controller of one host.
#[derive(Debug, Default)]
pub struct PerConnSa {
    /// Local InfiniBand ports and whether each is up.
    ports: BTreeMap<PortKey, bool>,
    conns: ById<Conn>,
    out: VecDeque<Output>,
    pending: Outstanding<Job>,
}

impl PerConnSa {
    fn issue(&mut self, op: CommandOp, job: Job) {
        let id = self.pending.issue(job);
        self.out.push_back(Output::Command(Command { id, op }));
    }

    fn load(&mut self, conn: ConnId, path: Path) {
        self.issue(CommandOp::LoadAlternate { conn, path }, Job::Load(conn));
    }

    /// Ask the SA for the paths of `id`, through every local port that is up.
    fn requery(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.asking > 0 {
            return;
        }
        let asks: Vec<(PortKey, Gid)> = c
            .peers
            .iter()
            .filter(|(port, _)| self.ports.get(port) == Some(&true))
            .copied()
            .collect();
        if let Some(c) = self.conns.get_mut(&id) {
            c.asking = asks.len() as u32;
            c.found.clear();
        }
        for (port, dgid) in asks {
            self.issue(CommandOp::ResolvePaths { port, dgid }, Job::Query(id));
        }
    }

    /// Requery every connection `hit` picks.
    fn requery_where(&mut self, hit: impl Fn(&Conn) -> bool) {
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| hit(c))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.requery(id);
        }
    }

    /// Every answer for `id` is in: arm the best path found.
    fn choose(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let primary = c.primary;
        let other_rail = c.found.iter().find(|p| p.port != primary.port);
        let variant = c
            .found
            .iter()
            .find(|p| p.port == primary.port && p.slid != primary.slid && p.dlid != primary.dlid);
        let Some(best) = other_rail.or(variant).copied() else {
            c.alternate = None;
            return;
        };
        if c.alternate.is_some_and(|a| a.same_route(&best)) {
            return;
        }
        c.alternate = Some(best);
        self.load(id, best);
    }

    fn command_done(
        &mut self,
        id: CommandId,
        result: Result<CommandOutcome, apm_core::ProviderError>,
    ) {
        let Some(job) = self.pending.complete(id) else {
            return;
        };
        match job {
            Job::Subscribe | Job::Rearm => {}
            Job::Load(conn) => {
                if result.is_ok() {
                    self.issue(CommandOp::SetRearm { conn }, Job::Rearm);
                }
            }
            Job::Query(conn) => {
                let Some(c) = self.conns.get_mut(&conn) else {
                    return;
                };
                if let Ok(CommandOutcome::Paths(paths)) = result {
                    c.found.extend(paths);
                }
                c.asking = c.asking.saturating_sub(1);
                if c.asking == 0 {
                    self.choose(conn);
                }
            }
        }
    }

    /// A port that was down is up: connections without an alternate on another port
    /// ask again.
    fn port_back(&mut self, port: PortKey) {
        if self.ports.insert(port, true) == Some(false) {
            self.requery_where(|c| c.alternate.is_none_or(|a| a.port == c.primary.port));
        }
    }

    fn port_event(&mut self, port: PortKey, event: PortEvent) {
        match event {
            PortEvent::Down => {
                self.ports.insert(port, false);
                self.requery_where(|c| {
                    c.primary.port == port || c.alternate.is_some_and(|a| a.port == port)
                });
            }
            PortEvent::Active => self.port_back(port),
            PortEvent::ClientReregister => {
                self.issue(CommandOp::Subscribe { port }, Job::Subscribe);
            }
            _ => {}
        }
    }
}

impl super::Controller for PerConnSa {
    fn protect(&mut self, _now: Time, spec: ConnSpec) {
        let mut peers: Vec<(PortKey, Gid)> = Vec::new();
        for p in &spec.candidates {
            if !peers.iter().any(|(port, _)| *port == p.port) {
                peers.push((p.port, p.dgid));
            }
        }
        self.conns.insert(
            spec.id,
            Conn {
                primary: spec.primary,
                alternate: spec.agreed_alternate,
                peers: peers.into_boxed_slice(),
                asking: 0,
                found: Vec::new(),
            },
        );
        if let Some(alt) = spec.agreed_alternate {
            self.load(spec.id, alt);
        }
    }

    fn handle_input(&mut self, _now: Time, input: Input) {
        match input {
            Input::PortInfo(info) if info.link_layer == LinkLayer::InfiniBand => {
                let new = self.ports.insert(info.key, info.active).is_none();
                if new {
                    let port = info.key;
                    self.issue(CommandOp::Subscribe { port }, Job::Subscribe);
                }
            }
            Input::PortEvent { port, event } => self.port_event(port, event),
            Input::RemoteGid { gid, service } => match service {
                GidService::OutOfService => self.requery_where(|c| {
                    c.primary.dgid == gid || c.alternate.is_some_and(|a| a.dgid == gid)
                }),
                GidService::InService => self.requery_where(|c| {
                    c.alternate.is_none() && c.peers.iter().any(|(_, g)| *g == gid)
                }),
            },
            Input::QpEvent {
                conn,
                event: QpEvent::PathMigrated,
            } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    if let Some(alt) = c.alternate.take() {
                        c.primary = alt;
                    }
                }
                self.requery(conn);
            }
            Input::QpEvent {
                conn,
                event: QpEvent::PathMigrationError,
            } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.alternate = None;
                }
                self.requery(conn);
            }
            Input::CommandDone { id, result } => self.command_done(id, result),
            _ => {}
        }
    }

    fn handle_timeout(&mut self, _now: Time) {}

    fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}
