//! What runs on each simulated host to look after its connections: the apm engine, or
//! one of the two baselines it is compared with.
//!
//! All three speak the engine's sans-IO contract (`Input` in, `Output` out), so the
//! simulator drives them identically. The baselines model what applications do today
//! and must stay as simple as they are in the wild: they are not straw men, but they
//! are not to be improved either.

use apm_core::{
    Command, CommandId, CommandOp, ConnId, ConnSpec, Engine, Input, MigState, Output, Path, Policy,
    QpEvent, Time,
};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Which controller a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// The apm engine with its default policy.
    Apm,
    /// Alternate loaded and armed once at connect time; nothing else.
    HwOnly,
    /// Re-arm locally on `PATH_MIG` (old MPI libraries): no LAP, no SA notices.
    ReloadLocal,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Apm, PolicyKind::HwOnly, PolicyKind::ReloadLocal];

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Apm => "apm",
            PolicyKind::HwOnly => "hw-only",
            PolicyKind::ReloadLocal => "reload-local",
        }
    }

    /// Parse a report name.
    pub fn from_name(s: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// A per-host connection manager in the engine's sans-IO shape.
pub trait Controller: std::fmt::Debug + Send {
    /// Feed one input.
    fn handle_input(&mut self, now: Time, input: Input);
    /// Protect a connection (the API call).
    fn protect(&mut self, now: Time, spec: ConnSpec);
    /// Let deadlines up to `now` pass.
    fn handle_timeout(&mut self, now: Time);
    /// The next output.
    fn poll_output(&mut self) -> Option<Output>;
    /// The next deadline.
    fn poll_timeout(&self) -> Option<Time>;
    /// The engine, when this is one (for getters in tests).
    fn engine(&self) -> Option<&Engine> {
        None
    }
}

/// The apm engine as a controller.
#[derive(Debug)]
pub struct ApmController {
    engine: Engine,
}

impl ApmController {
    /// An engine with `policy`.
    pub fn new(policy: Policy) -> Result<ApmController, apm_core::PolicyError> {
        Ok(ApmController {
            engine: Engine::new(policy)?,
        })
    }
}

impl Controller for ApmController {
    fn handle_input(&mut self, now: Time, input: Input) {
        self.engine.handle_input(now, input);
    }
    fn protect(&mut self, now: Time, spec: ConnSpec) {
        if let Err(e) = self.engine.protect(now, spec) {
            // The simulator protects each connection once; an error here is a
            // simulator bug worth seeing in the logs, not a crash.
            tracing::warn!(error = %e, "engine refused a simulator connection");
        }
    }
    fn handle_timeout(&mut self, now: Time) {
        self.engine.handle_timeout(now);
    }
    fn poll_output(&mut self) -> Option<Output> {
        self.engine.poll_output()
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.engine.poll_timeout()
    }
    fn engine(&self) -> Option<&Engine> {
        Some(&self.engine)
    }
}

#[derive(Debug)]
struct BaseConn {
    primary: Path,
    alternate: Option<Path>,
    candidates: Vec<Path>,
    /// Outstanding command chain: LoadAlternate then SetRearm.
    pending: Option<CommandId>,
}

/// The two baselines: `hw-only` and `reload-local`.
#[derive(Debug)]
pub struct Baseline {
    reload: bool,
    conns: BTreeMap<ConnId, BaseConn>,
    out: VecDeque<Output>,
    next_cmd: u64,
    /// Command id -> (connection, set REARM next).
    pending: BTreeMap<CommandId, (ConnId, bool)>,
}

impl Baseline {
    /// `hw-only` (`reload = false`) or `reload-local` (`reload = true`).
    pub fn new(reload: bool) -> Baseline {
        Baseline {
            reload,
            conns: BTreeMap::new(),
            out: VecDeque::new(),
            next_cmd: 1,
            pending: BTreeMap::new(),
        }
    }

    fn issue(&mut self, op: CommandOp, conn: ConnId, rearm_next: bool) {
        let id = CommandId(self.next_cmd);
        self.next_cmd += 1;
        self.pending.insert(id, (conn, rearm_next));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.pending = Some(id);
        }
        self.out.push_back(Output::Command(Command { id, op }));
    }

    fn load(&mut self, conn: ConnId, path: Path) {
        self.issue(CommandOp::LoadAlternate { conn, path }, conn, true);
    }

    fn protect(&mut self, spec: ConnSpec) {
        let alt = spec.agreed_alternate;
        self.conns.insert(
            spec.id,
            BaseConn {
                primary: spec.primary,
                alternate: alt,
                candidates: spec.candidates.clone(),
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
        if !self.reload || c.pending.is_some() {
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
            c.alternate = Some(next);
            self.load(id, next);
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
                let Some((conn, rearm_next)) = self.pending.remove(&id) else {
                    return;
                };
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.pending = None;
                }
                if rearm_next && result.is_ok() {
                    self.issue(CommandOp::SetRearm { conn }, conn, false);
                }
                let _ = MigState::Armed;
            }
            // Port events, notices and peer messages: the baselines do not listen.
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

/// A controller of `kind`; `policy` is used by `apm` only.
pub fn make(
    kind: PolicyKind,
    policy: &Policy,
) -> Result<Box<dyn Controller>, apm_core::PolicyError> {
    Ok(match kind {
        PolicyKind::Apm => Box::new(ApmController::new(policy.clone())?),
        PolicyKind::HwOnly => Box::new(Baseline::new(false)),
        PolicyKind::ReloadLocal => Box::new(Baseline::new(true)),
    })
}
