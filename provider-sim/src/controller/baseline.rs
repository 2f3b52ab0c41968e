//! The baselines apm is judged against: what applications do with APM today, each as
//! simple as it is in the wild. [`Rules`] says what one does:
//! - `hw-only`: an alternate loaded and armed at connect time, nothing else;
//! - `reload-local`: after a migration, load the agreed next alternate (the path just
//!   left) and arm it, as the old MPI libraries did, with no LAP and no SA notices;
//! - `reload-boost`: `reload-local` loading its alternates with apm's alternate ACK
//!   timeout (`alternate_timeout_boost` steps above the connection's own), so that a
//!   reader sees what comes from timeouts and what from coordination;
//! - `port-err-move`: `reload-local` that also forces the migration of every QP whose
//!   primary runs on a local port that goes down, when its alternate's local port is
//!   up: the obvious local remedy, with no SA, no LAP and no word to the peer (an ARMED
//!   peer follows the first packet with MigReq=1, as the IBA has it). Like
//!   `reload-local` it re-arms the path it left at once; after a forced migration that
//!   strands a peer that had no packet of its before the re-arm (a QP in REARM sends
//!   MigReq=0, which a peer still on the dead path drops on its alternate). That is the
//!   obvious remedy's flaw, kept: apm's engine holds a QP it moved in MIGRATED until
//!   its peer says it followed.

use super::{ById, Controller, Outstanding};
use apm_core::{
    Command, CommandId, CommandOp, ConnId, ConnSpec, Input, Output, Path, PortEvent, PortKey,
    QpEvent, Time,
};
use std::collections::{BTreeSet, VecDeque};

#[derive(Debug)]
struct BaseConn {
    primary: Path,
    alternate: Option<Path>,
    /// The paths it may move to (kept by the reloading baselines only, which look for
    /// an LMC variant among them; `hw-only` never looks).
    candidates: Box<[Path]>,
    /// The connection's own local ACK timeout (its primary's at connect).
    timeout: u8,
    /// Outstanding command chain: LoadAlternate then SetRearm, or a ForceMigrate.
    pending: Option<CommandId>,
}

/// What a baseline does after a migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterMigration {
    /// Nothing: the connection runs unprotected from then on (`hw-only`).
    Nothing,
    /// Load the agreed next alternate and arm it (`reload-local`, see
    /// `Baseline::migrated`).
    ReloadLocal,
}

/// What a baseline does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// After a migration.
    pub after: AfterMigration,
    /// Alternates are loaded with a local ACK timeout this many steps above the
    /// connection's own (0: the agreed path's own, the application's).
    pub alternate_timeout_boost: u8,
    /// On a local `PORT_ERR`, force the migration of the QPs whose primary runs on the
    /// port and whose alternate's local port is up.
    pub move_on_port_err: bool,
}

impl Rules {
    /// `hw-only`.
    pub const HW_ONLY: Rules = Rules {
        after: AfterMigration::Nothing,
        alternate_timeout_boost: 0,
        move_on_port_err: false,
    };
    /// `reload-local`.
    pub const RELOAD_LOCAL: Rules = Rules {
        after: AfterMigration::ReloadLocal,
        alternate_timeout_boost: 0,
        move_on_port_err: false,
    };
}

/// What follows a baseline's command once it succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// Nothing (it was the last of its chain).
    Done,
    /// Set REARM (the command loaded an alternate).
    SetRearm,
}

/// A baseline controller ([`Rules`] says which).
#[derive(Debug)]
pub struct Baseline {
    rules: Rules,
    conns: ById<BaseConn>,
    out: VecDeque<Output>,
    /// Command id -> (connection, what follows it).
    pending: Outstanding<(ConnId, Then)>,
    /// This host's ports that are down (`move_on_port_err` only).
    ports_down: BTreeSet<PortKey>,
}

impl Baseline {
    /// A baseline that follows `rules`.
    pub fn new(rules: Rules) -> Baseline {
        Baseline {
            rules,
            conns: ById::default(),
            out: VecDeque::new(),
            pending: Outstanding::default(),
            ports_down: BTreeSet::new(),
        }
    }

    fn issue(&mut self, op: CommandOp, conn: ConnId, then: Then) {
        let id = self.pending.issue((conn, then));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pending = Some(id);
        }
        self.out.push_back(Output::Command(Command { id, op }));
    }

    /// Load `path` as `conn`'s alternate (at the rules' timeout), then arm it.
    fn load(&mut self, conn: ConnId, path: Path) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let path = if self.rules.alternate_timeout_boost > 0 {
            let boosted = c
                .timeout
                .saturating_add(self.rules.alternate_timeout_boost)
                .min(31);
            Path {
                ack_timeout: path.ack_timeout.max(boosted),
                ..path
            }
        } else {
            path
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.alternate = Some(path);
        }
        self.issue(
            CommandOp::LoadAlternate { conn, path },
            conn,
            Then::SetRearm,
        );
    }

    fn protect(&mut self, spec: ConnSpec) {
        let alt = spec.agreed_alternate;
        self.conns.insert(
            spec.id,
            BaseConn {
                primary: spec.primary,
                alternate: alt,
                candidates: if self.rules.after == AfterMigration::ReloadLocal {
                    spec.candidates.into_boxed_slice()
                } else {
                    Box::new([])
                },
                timeout: spec.primary.ack_timeout,
                pending: None,
            },
        );
        if let Some(alt) = alt {
            self.load(spec.id, alt);
        }
    }

    /// reload-local's rule agreed in advance, as the old MPI libraries had it: the new
    /// alternate is the old primary (the other rail); with one port, the next LMC
    /// variant. No health check, no peer: both sides apply the same rule blindly.
    fn migrated(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(new_primary) = c.alternate.take() else {
            return;
        };
        let old = std::mem::replace(&mut c.primary, new_primary);
        if self.rules.after == AfterMigration::Nothing || c.pending.is_some() {
            return;
        }
        let next = if old.port != new_primary.port {
            Some(old)
        } else {
            c.candidates
                .iter()
                .find(|p| p.port == new_primary.port && !p.same_route(&new_primary))
                .copied()
        };
        if let Some(next) = next {
            self.load(id, next);
        }
    }

    /// `port` went down: force every idle connection whose primary runs on it onto its
    /// alternate, when that leaves through a port that is up (the HCA refuses unless the
    /// QP is ARMED).
    fn port_down(&mut self, port: PortKey) {
        self.ports_down.insert(port);
        if !self.rules.move_on_port_err {
            return;
        }
        let hit: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.pending.is_none()
                    && c.primary.port == port
                    && c.alternate
                        .is_some_and(|a| !self.ports_down.contains(&a.port))
            })
            .map(|(id, _)| *id)
            .collect();
        for conn in hit {
            self.issue(CommandOp::ForceMigrate { conn }, conn, Then::Done);
        }
    }
}

impl Controller for Baseline {
    fn protect(&mut self, _now: Time, spec: ConnSpec) {
        Baseline::protect(self, spec);
    }
    fn handle_input(&mut self, _now: Time, input: Input) {
        match input {
            Input::QpEvent {
                conn,
                event: QpEvent::PathMigrated,
            } => self.migrated(conn),
            Input::QpEvent {
                conn,
                event: QpEvent::PathMigrationError,
            } => {
                // "All ports were used": nothing left to try.
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.alternate = None;
                }
            }
            Input::CommandDone { id, result } => {
                let Some((conn, then)) = self.pending.complete(id) else {
                    return;
                };
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.pending = None;
                }
                if then == Then::SetRearm && result.is_ok() {
                    self.issue(CommandOp::SetRearm { conn }, conn, Then::Done);
                }
            }
            Input::PortInfo(info) if !info.active => {
                self.ports_down.insert(info.key);
            }
            Input::PortEvent {
                port,
                event: PortEvent::Down,
            } => self.port_down(port),
            Input::PortEvent {
                port,
                event: PortEvent::Active,
            } => {
                self.ports_down.remove(&port);
            }
            // Other port events, notices and peer messages: the baselines do not listen.
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
