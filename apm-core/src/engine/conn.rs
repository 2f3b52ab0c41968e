//! Per-connection state: the paths as the engine believes the QP holds them, and the
//! phase of whatever the engine is doing for the connection.

use crate::io::{
    Cause, Command, CommandId, CommandOp, Lap, MigrateIntent, PeerMove, PeerMsg, UnprotectedReason,
};
use crate::types::{
    ConnId, ConnSpec, Gid, MigState, MigrationMode, Path, PeerAddr, PortKey, Qpn, Role, Time,
};

/// The connection's alternate path as the engine believes the QP holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alternate {
    /// None loaded (or none the engine can count on).
    None,
    /// Loaded in the QP (hardware) or proposed, but not armed: REARM not set, or the
    /// peer has not agreed to it (a LAP given up on), or it names our old LID.
    Loaded(Path),
    /// Armed: REARM set on it (hardware) or the peer accepted it (software).
    Armed(Path),
}

impl Alternate {
    /// The alternate path, armed or not.
    pub(crate) fn path(&self) -> Option<Path> {
        match *self {
            Alternate::None => None,
            Alternate::Loaded(p) | Alternate::Armed(p) => Some(p),
        }
    }

    /// The alternate path when it is armed.
    pub(crate) fn armed(&self) -> Option<Path> {
        match *self {
            Alternate::Armed(p) => Some(p),
            _ => None,
        }
    }

    pub(crate) fn is_armed(&self) -> bool {
        matches!(self, Alternate::Armed(_))
    }

    /// The path, to rewrite in place (a LID change).
    pub(crate) fn path_mut(&mut self) -> Option<&mut Path> {
        match self {
            Alternate::None => None,
            Alternate::Loaded(p) | Alternate::Armed(p) => Some(p),
        }
    }

    /// No longer known to be armed (the path stays loaded). The one place that
    /// disarms.
    pub(crate) fn disarm(&mut self) {
        if let Alternate::Armed(p) = *self {
            *self = Alternate::Loaded(p);
        }
    }

    /// The QP migrated to it, or it failed: no alternate any more. Returns it.
    pub(crate) fn take(&mut self) -> Option<Path> {
        std::mem::replace(self, Alternate::None).path()
    }

    /// Another path took its place in the QP, which keeps its migration state (an
    /// ARMED QP stays ARMED when its alternate is reloaded).
    pub(crate) fn replace(&mut self, path: Path) {
        *self = match *self {
            Alternate::Armed(_) => Alternate::Armed(path),
            _ => Alternate::Loaded(path),
        };
    }
}

/// What arms the connection's QP from REARM after a move (hardware APM): nothing (the
/// device reported ARMED as soon as REARM was set), apm's own zero-length write, when
/// the provider may post on the QP, or only the application's next packets. Learnt
/// from the QP's answer to REARM and the provider's to the first arming write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arming {
    /// Not known yet: counted as the application's traffic.
    Unknown,
    /// The device arms without waiting for a packet: REARM came back ARMED.
    AtOnce,
    /// apm's arming write: the QP arms within a round trip of being set to REARM.
    ByApm,
    /// Only the application's traffic: the QP stays in REARM until it flows again.
    ByTraffic,
}

impl Arming {
    /// The QP arms within a round trip after a move, whatever the application does.
    pub(crate) fn prompt(self) -> bool {
        matches!(self, Arming::AtOnce | Arming::ByApm)
    }
}

/// Who a phase is answering, when the engine acts on a peer's request (LAP or Migrate).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Responder {
    pub(crate) to: PeerAddr,
    pub(crate) port: PortKey,
    /// Digest of the request, for duplicate detection.
    pub(crate) digest: u64,
}

/// Why a connection moves to another path, which says what to do once it has: tell
/// the peer, or not, or answer it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MoveReason {
    /// We decided, and the peer has not heard of it: tell it (`Migrate`).
    Ours,
    /// The peer has moved already: it acknowledged our `Migrate` by moving.
    PeerMoved,
    /// The peer moves and asked us to follow: answer it when we have.
    PeerAsked(Responder),
    /// The same, and the peer has said since that it moved (both asked each other at
    /// once, say): answer it, and nothing to wait for.
    PeerAskedAndMoved(Responder),
}

/// Whether the engine itself moved the QP (a forced migration, or a software move it
/// made first: `Migrated { forced: true }`) or not (the HCA moved it, or the engine
/// moved only because the peer asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moved {
    Forced,
    Unforced,
}

/// Whether a LAP may still wait for a `PATH_MIG` (receiver rule 5) or already has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LapWait {
    MayWait,
    Waited,
}

/// Where the peer is, for a software migration: on the path already, or following.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerOnPath {
    /// It moved first and said so: the provider may send there at once.
    There,
    /// It follows once it hears of our move, and drops what reaches it before: the
    /// provider may hold its replay until told (`CommandOp::PeerThere`).
    Follows,
    /// It moves there now as we do (one side's `Migrate` "moving",
    /// `Engine::tell_and_move`, or requests that crossed), and either may finish first:
    /// the provider holds its replay until the peer is there (its "moved", its answer
    /// to our "moving" or request, or its first packet on the path).
    Alongside,
    /// It said it had moved while our move was under way: the provider was told then,
    /// and is told again once ours is done.
    ArrivedMeanwhile,
}

impl PeerOnPath {
    /// What the provider is told of the peer ([`CommandOp::SoftwareMigrate`]).
    pub(crate) fn as_command(self) -> PeerMove {
        match self {
            PeerOnPath::There | PeerOnPath::ArrivedMeanwhile => PeerMove::Done,
            PeerOnPath::Follows => PeerMove::After,
            PeerOnPath::Alongside => PeerMove::Alongside,
        }
    }

    /// Still moving when the peer said it had arrived: it is `ArrivedMeanwhile` now.
    pub(crate) fn peer_arrived(&mut self) {
        if matches!(self, PeerOnPath::Follows | PeerOnPath::Alongside) {
            *self = PeerOnPath::ArrivedMeanwhile;
        }
    }
}

/// What the engine is doing for a connection. Only one thing at a time: a second reason
/// to act is remembered in `Conn::chores` / `Conn::deferred_lap` and handled when the
/// phase returns to `Idle`.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    /// Nothing in flight.
    Idle,
    /// Passive side waiting for the active side's LAP before initiating (deadline).
    WaitPassive,
    /// We moved because the peer asked; it moves when it hears our answer. Until it
    /// says it has (its `Migrate` or a LAP), our QP stays MIGRATED: its packets carry
    /// MigReq=1, which moves the peer's ARMED QP by itself should our answer be lost,
    /// where an early REARM (MigReq=0) would strand it. Then `old` is armed again.
    /// Each deadline until `give_up` asks the peer whether it runs on our primary
    /// (our `Migrate` "moved": its "ok" answer is the word, should its own have been
    /// lost); at `give_up`, arm it anyway (our MigReq=1 packets have moved the peer by
    /// then). Every moment spent here the connection cannot arm, and a second failure
    /// in it leaves the QP in REARM with nothing to migrate to.
    AwaitFollow { old: Path, give_up: Time },
    /// Waiting for a re-arm slot (`RearmLimiter`).
    Queued,
    /// Waiting for path records.
    Resolving,
    /// A message (LAP or Migrate) is out; waiting for the answer (deadline: retransmit).
    AwaitPeer {
        msg: PeerMsg,
        port: PortKey,
        to: PeerAddr,
        tries: u32,
    },
    /// `LoadAlternate` outstanding.
    Loading {
        cmd: CommandId,
        path: Path,
        responder: Option<Responder>,
    },
    /// `SetRearm` outstanding.
    Arming {
        cmd: CommandId,
        path: Path,
        responder: Option<Responder>,
    },
    /// `ForceMigrate` outstanding.
    Migrating { cmd: CommandId, why: MoveReason },
    /// The peer moved to a path that is not our alternate (the two sides' alternates
    /// differ): `LoadAlternate` of that path outstanding, then `ForceMigrate` onto it.
    LoadingToFollow {
        cmd: CommandId,
        path: Path,
        responder: Responder,
    },
    /// `SoftwareMigrate` outstanding.
    SwMigrating {
        cmd: CommandId,
        path: Path,
        responder: Option<Responder>,
        peer: PeerOnPath,
    },
    /// `QueryQp` outstanding.
    Querying { cmd: CommandId },
    /// Gave up for now; try again at the deadline.
    Backoff,
}

/// A QP command handed to the provider and not answered yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub(crate) id: CommandId,
    /// What it does to the QP's alternate.
    pub(crate) kind: InFlightKind,
}

/// What a command in flight does to the QP's alternate path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InFlightKind {
    /// Nothing (REARM, a migration, a query).
    Other,
    /// Loads a path as the alternate: a load abandoned by an override still takes
    /// effect when the provider carries it out.
    Load,
    /// Puts back the alternate an abandoned load replaced (`Engine::restore_alternate`).
    Restore,
}

impl InFlight {
    /// `op` (command `id`) handed to the provider.
    pub(crate) fn of(id: CommandId, op: &CommandOp) -> InFlight {
        let kind = match op {
            CommandOp::LoadAlternate { .. } => InFlightKind::Load,
            _ => InFlightKind::Other,
        };
        InFlight { id, kind }
    }
}

impl Phase {
    /// The command this phase waits for, if any.
    pub(crate) fn awaited(&self) -> Option<CommandId> {
        match self {
            Phase::Loading { cmd, .. }
            | Phase::Arming { cmd, .. }
            | Phase::Migrating { cmd, .. }
            | Phase::LoadingToFollow { cmd, .. }
            | Phase::SwMigrating { cmd, .. }
            | Phase::Querying { cmd } => Some(*cmd),
            _ => None,
        }
    }

    /// The QP command this phase waits for, as it goes to the provider.
    pub(crate) fn command(&self, conn: ConnId) -> Option<Command> {
        let (id, op) = match *self {
            Phase::Loading { cmd, path, .. } | Phase::LoadingToFollow { cmd, path, .. } => {
                (cmd, CommandOp::LoadAlternate { conn, path })
            }
            Phase::Arming { cmd, .. } => (cmd, CommandOp::SetRearm { conn }),
            Phase::Migrating { cmd, .. } => (cmd, CommandOp::ForceMigrate { conn }),
            Phase::SwMigrating {
                cmd, path, peer, ..
            } => (
                cmd,
                CommandOp::SoftwareMigrate {
                    conn,
                    path,
                    peer: peer.as_command(),
                    // Filled in by the engine, which knows the connection's comm ids
                    // (`Engine::dispatch_waiting`).
                    announce: None,
                },
            ),
            Phase::Querying { cmd } => (cmd, CommandOp::QueryQp { conn }),
            _ => return None,
        };
        Some(Command { id, op })
    }

    /// True while the connection is moving to another path.
    pub(crate) fn moving(&self) -> bool {
        matches!(
            self,
            Phase::Migrating { .. } | Phase::LoadingToFollow { .. } | Phase::SwMigrating { .. }
        )
    }

    /// True while a command or a peer exchange is in flight (new work must wait).
    pub(crate) fn busy(&self) -> bool {
        self.awaited().is_some()
            || matches!(self, Phase::AwaitPeer { .. } | Phase::AwaitFollow { .. })
    }

    /// Whether our own request that the peer move to `path` is out (we wait for its
    /// answer): a request of the peer's for the same path crosses ours.
    pub(crate) fn asks_peer_to(&self, path: &Path) -> bool {
        matches!(
            self,
            Phase::AwaitPeer { msg: PeerMsg::Migrate(ours), .. }
                if ours.intent == MigrateIntent::Probe && ours.path.same_route(path)
        )
    }
}

/// What the application has been told about a connection: its protection story, which
/// ends at `Lost`, a terminal state (the engine never acts on a lost connection again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Told {
    /// Nothing yet.
    Nothing,
    /// Unprotected, never protected so far (its first protection is `Protected`).
    NotYetProtected(UnprotectedReason),
    /// Protected.
    Protected,
    /// Unprotected, protected before (its next protection is `Rearmed`).
    Unprotected(UnprotectedReason),
    /// Lost: the last word.
    Lost,
}

impl Told {
    /// True once the application has heard `Protected`.
    pub(crate) fn ever_protected(self) -> bool {
        matches!(self, Told::Protected | Told::Unprotected(_))
    }

    /// What "unprotected because of `reason`" is after this.
    pub(crate) fn unprotected(self, reason: UnprotectedReason) -> Told {
        if self.ever_protected() {
            Told::Unprotected(reason)
        } else {
            Told::NotYetProtected(reason)
        }
    }
}

/// Work a busy connection was asked to do meanwhile, done when its phase ends
/// (`Engine::after_phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Chore {
    /// Tell the peer where we run now (`Migrate` "moved").
    Announce = 1,
    /// Look for a (better) alternate.
    Rearm = 2,
}

/// A set of [`Chore`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chores(u8);

impl Chores {
    pub(crate) fn add(&mut self, chore: Chore) {
        self.0 |= chore as u8;
    }

    /// Remove `chore`; true when it was there.
    pub(crate) fn take(&mut self, chore: Chore) -> bool {
        let had = self.0 & chore as u8 != 0;
        self.0 &= !(chore as u8);
        had
    }
}

/// One protected connection.
#[derive(Clone, Debug)]
pub(crate) struct Conn {
    pub(crate) role: Role,
    pub(crate) mode: MigrationMode,
    pub(crate) local_qpn: Qpn,
    pub(crate) remote_qpn: Qpn,
    pub(crate) local_comm_id: u32,
    pub(crate) remote_comm_id: u32,
    /// The path the QP runs on.
    pub(crate) primary: Path,
    /// The connection's own local ACK timeout (its primary's at protect time).
    pub(crate) base_timeout: u8,
    /// The alternate loaded in the QP (hardware) or agreed with the peer (software),
    /// and whether it is armed.
    pub(crate) alt: Alternate,
    /// Migration state as last known.
    pub(crate) mig: MigState,
    /// Every path to the peer the engine may use, including the original primary.
    pub(crate) candidates: Vec<Path>,
    /// Paths that failed as alternates, with the time they may be tried again.
    pub(crate) bad: Vec<(Path, Time)>,
    /// Boxed when not idle: most connections sit idle, and the busy phases are large.
    phase: Option<Box<Phase>>,
    /// The QP command handed to the provider and not answered yet. At most one at a
    /// time: a phase that replaced the one which issued it (an override) waits for its
    /// answer before its own command goes out (`Engine::issue_qp`).
    pub(crate) in_flight: Option<InFlight>,
    /// The phase's deadline (timer entries that do not match it are stale).
    pub(crate) deadline: Option<Time>,
    /// What to do once the current phase ends.
    pub(crate) chores: Chores,
    /// A LAP that arrived while busy, handled when the phase ends (or at its deadline).
    pub(crate) deferred_lap: Option<Box<(PeerAddr, PortKey, Lap)>>,
    /// Digest of the last LAP answered and the APStatus sent, for duplicates.
    pub(crate) last_lap: Option<(u64, crate::io::ApStatus)>,
    /// Consecutive failed re-arm attempts (backoff exponent).
    pub(crate) failed_rearms: u32,
    /// When the engine last forced a migration (its own PATH_MIG is not a new one).
    pub(crate) forced_at: Option<Time>,
    /// What this side first saw kill the primary, until it moves off it or the path
    /// works again: what its `Migrated` and `Unprotected` notifications say.
    pub(crate) primary_down: Option<Cause>,
    /// What the application was last told; `Told::Lost` ends the connection's life.
    pub(crate) told: Told,
    /// What arms its QP after a move (hardware APM).
    pub(crate) arming: Arming,
}

/// The phase of a connection with no phase box.
static IDLE: Phase = Phase::Idle;

impl Conn {
    /// What the connection is doing.
    pub(crate) fn phase(&self) -> &Phase {
        self.phase.as_deref().unwrap_or(&IDLE)
    }

    /// What the connection is doing, to change it in place (`None` when idle).
    pub(crate) fn phase_mut(&mut self) -> Option<&mut Phase> {
        self.phase.as_deref_mut()
    }

    pub(crate) fn set_phase(&mut self, phase: Phase) {
        self.phase = match phase {
            Phase::Idle => None,
            p => Some(Box::new(p)),
        };
    }

    pub(crate) fn new(spec: &ConnSpec) -> Conn {
        let mut candidates: Vec<Path> = Vec::with_capacity(spec.candidates.len() + 2);
        let all = std::iter::once(&spec.primary)
            .chain(spec.agreed_alternate.iter())
            .chain(spec.candidates.iter());
        for p in all {
            if !candidates.iter().any(|c| c.same_route(p)) {
                candidates.push(*p);
            }
        }
        // The primary and the agreed alternate usually repeat candidates: the slack
        // reserved for them is 112 bytes a connection, kept for its lifetime.
        candidates.shrink_to_fit();
        Conn {
            role: spec.role,
            mode: spec.mode,
            local_qpn: spec.local_qpn,
            remote_qpn: spec.remote_qpn,
            local_comm_id: spec.local_comm_id,
            remote_comm_id: spec.remote_comm_id,
            primary: spec.primary,
            base_timeout: spec.primary.ack_timeout,
            alt: Alternate::None,
            mig: MigState::Migrated,
            candidates,
            bad: Vec::new(),
            phase: None,
            in_flight: None,
            deadline: None,
            chores: Chores::default(),
            deferred_lap: None,
            last_lap: None,
            failed_rearms: 0,
            forced_at: None,
            primary_down: None,
            told: Told::Nothing,
            arming: Arming::Unknown,
        }
    }

    /// True once the connection is lost (terminal).
    pub(crate) fn is_lost(&self) -> bool {
        self.told == Told::Lost
    }

    /// True when `gid` is one of the peer's port GIDs as far as this connection knows.
    pub(crate) fn is_peer_gid(&self, gid: &Gid) -> bool {
        self.primary.dgid == *gid
            || self.alt.path().is_some_and(|a| a.dgid == *gid)
            || self.candidates.iter().any(|c| c.dgid == *gid)
    }

    /// The distinct peer GIDs (for path resolution).
    pub(crate) fn peer_gids(&self) -> Vec<Gid> {
        let mut gids: Vec<Gid> = Vec::new();
        for g in std::iter::once(self.primary.dgid).chain(self.candidates.iter().map(|c| c.dgid)) {
            if !gids.contains(&g) {
                gids.push(g);
            }
        }
        gids
    }

    /// True when `path` failed as an alternate recently.
    pub(crate) fn is_bad(&self, path: &Path, now: Time) -> bool {
        self.bad
            .iter()
            .any(|(p, until)| p.same_route(path) && now < *until)
    }

    pub(crate) fn mark_bad(&mut self, path: Path, until: Time, now: Time) {
        self.bad.retain(|(p, u)| now < *u && !p.same_route(&path));
        self.bad.push((path, until));
    }

    /// Remember a path learnt later (from a LAP or the SA) as a candidate.
    pub(crate) fn learn(&mut self, path: Path) {
        if !self.candidates.iter().any(|c| c.same_route(&path)) {
            self.candidates.push(path);
        }
    }
}

/// A stable 64-bit digest (FNV-1a) of a LAP, for duplicate detection.
pub(crate) fn lap_digest(lap: &Lap) -> u64 {
    let a = &lap.alt;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(&lap.sender_comm_id.to_be_bytes());
    eat(&lap.receiver_comm_id.to_be_bytes());
    eat(&lap.receiver_qpn.get().to_be_bytes());
    eat(&a.slid.get().to_be_bytes());
    eat(&a.dlid.get().to_be_bytes());
    eat(&a.sgid.0);
    eat(&a.dgid.0);
    eat(&a.flow_label.to_be_bytes());
    eat(&[a.traffic_class, a.hop_limit, a.rate, a.sl, a.ack_timeout]);
    h
}
#[cfg(test)]
#[test]
fn connection_state_stays_small() {
    // The memory target is 512 bytes per connection all told (map overhead, candidate
    // paths): the struct itself must stay well below it.
    assert!(
        std::mem::size_of::<Conn>() <= 300,
        "{}",
        std::mem::size_of::<Conn>()
    );
}
