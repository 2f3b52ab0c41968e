//! What goes into the engine (`Input`) and what comes out (`Command`, `Notification`).
//!
//! These enums are the whole contract between the engine and the world: providers turn
//! device events, SA Reports and peer MADs into `Input`s, carry out `Command`s, and hand
//! each command's result back as [`Input::CommandDone`]. Nothing here does IO.

pub use crate::provider_error::{Operation, ProviderError, Reason};
use crate::types::*;
use serde::{Deserialize, Serialize};

/// An event of the world for the engine. Each comes with the time it happened
/// (see [`crate::Engine::handle_input`]). API calls are the engine's methods
/// ([`crate::Engine::protect`], ...), not inputs: only they can be refused.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub enum Input {
    /// A local port appeared or its attributes changed (enumeration, after LID change).
    PortInfo(PortInfo),
    /// An unaffiliated async event on a local port.
    PortEvent {
        /// The port.
        port: PortKey,
        /// What happened.
        event: PortEvent,
    },
    /// A device-wide fatal error: every connection on the device is lost.
    DeviceFatal {
        /// Provider device index.
        device: u16,
    },
    /// A QP-affiliated async event, already mapped to the connection by the provider.
    QpEvent {
        /// The connection whose QP raised it.
        conn: ConnId,
        /// What happened.
        event: QpEvent,
    },
    /// An SA notice (trap 64 / 65 delivered in a Report) about a remote port GID.
    RemoteGid {
        /// The port GID the notice is about.
        gid: Gid,
        /// What the notice says (trap 64: in service, trap 65: out of service).
        service: GidService,
    },
    /// A liveness probe session ([`crate::probe`]) that was up went down: every
    /// connection whose primary runs between these two GIDs moves, and no alternate
    /// between them is armed onto until the session comes back.
    PathDown {
        /// The path (this host's GID, the peer's GID).
        ends: crate::probe::PathEnds,
        /// What kind of failure the prober saw.
        kind: crate::probe::FailureKind,
    },
    /// A probe session is up (the first time, or again after being down): like trap 64
    /// for that path; nothing for a path the engine does not hold dead.
    PathUp {
        /// The path.
        ends: crate::probe::PathEnds,
    },
    /// A probe session is up again, but its path has been flapping: held until `until`
    /// (the prober's damping). Like a port held down for flapping: nothing is armed
    /// onto it before then, but a connection whose primary is dead still moves onto it
    /// (a flapping path beats a dead one).
    PathHeld {
        /// The path.
        ends: crate::probe::PathEnds,
        /// When it is usable again unless it fails first.
        until: Time,
    },
    /// The link of the interface behind a local RoCE GID (a rail) went down or came
    /// back. On RoCE one port carries several rails (VLANs, one per address), so a rail's
    /// link going down raises no `PORT_ERR`, and the kernel keeps its IPv4 GID in the
    /// table: the provider watches the interfaces' link state itself.
    RailLink {
        /// The port whose GID it is.
        port: PortKey,
        /// The rail's GID.
        gid: Gid,
        /// The interface's link now.
        link: Link,
    },
    /// A LAP/APR/MRA (or software-migration message) from a peer.
    PeerMessage {
        /// Where the transport says it came from.
        from: PeerAddr,
        /// The local port it arrived on.
        port: PortKey,
        /// The message.
        msg: PeerMsg,
    },
    /// The result of a command the engine issued earlier.
    CommandDone {
        /// The command's id.
        id: CommandId,
        /// What happened.
        result: Result<CommandOutcome, ProviderError>,
    },
}

/// Unaffiliated async events of a port (`ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortEvent {
    /// `IBV_EVENT_PORT_ACTIVE`.
    Active,
    /// `IBV_EVENT_PORT_ERR`.
    Down,
    /// `IBV_EVENT_LID_CHANGE` (a `PortInfo` with the new LID should follow).
    LidChange,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange,
    /// `IBV_EVENT_CLIENT_REREGISTER`: the SA forgot our subscriptions.
    ClientReregister,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange,
}

/// The link state of an interface ([`Input::RailLink`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// Carrier up: the rail can carry traffic.
    Up,
    /// No carrier (the link or the interface is down).
    Down,
}

/// QP-affiliated async events (`ibv_event_type`), plus the software path monitor's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QpEvent {
    /// `IBV_EVENT_PATH_MIG`: the QP now runs on what was its alternate path.
    PathMigrated,
    /// `IBV_EVENT_PATH_MIG_ERR`: migration to the alternate failed.
    PathMigrationError,
    /// `IBV_EVENT_COMM_EST`: traffic arrived on the (possibly new) primary.
    CommEstablished,
    /// `IBV_EVENT_QP_FATAL` (or an error completion that put the QP in ERR).
    Fatal,
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained,
    /// The provider's progress monitor saw no progress on the primary path for too long
    /// (software migration, where a dead path never errors).
    PrimaryStalled,
}

/// Id of a command; echoed in [`Input::CommandDone`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommandId(pub u64);

/// A command for the provider, with the id its result must carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Echo this in [`Input::CommandDone`].
    pub id: CommandId,
    /// What to do.
    pub op: CommandOp,
}

/// What the provider must do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CommandOp {
    /// Load `path` as the QP's alternate (RTS->RTS with `IBV_QP_ALT_PATH`).
    LoadAlternate {
        /// The connection.
        conn: ConnId,
        /// The new alternate path.
        path: Path,
    },
    /// Arm the loaded alternate (RTS->RTS, `path_mig_state = REARM`).
    SetRearm {
        /// The connection.
        conn: ConnId,
    },
    /// Force a migration to the alternate (RTS->RTS, `path_mig_state = MIGRATED`).
    ForceMigrate {
        /// The connection.
        conn: ConnId,
    },
    /// Move the QP's primary address vector to `path` in software (RoCE).
    SoftwareMigrate {
        /// The connection.
        conn: ConnId,
        /// The path to move to.
        path: Path,
        /// Where the peer is as the move starts: what the provider may do with the
        /// sends it replays.
        #[serde(default)]
        peer: PeerMove,
        /// The word the engine will send the peer once this move has succeeded (its
        /// answer to the peer's request, or "moved"). A driver may send it the moment the
        /// move is done, ahead of the engine hearing of it, and then not again when the
        /// engine asks (the `Manager` does: the peer, holding its own replay for ours,
        /// waits for exactly this word); one that leaves it to the engine loses nothing.
        #[serde(default)]
        announce: Option<Box<PeerWord>>,
    },
    /// The peer now runs on `path`, the connection's primary: sends a provider held
    /// back after a `SoftwareMigrate` to it whose peer had not moved yet may go. Issued
    /// while that `SoftwareMigrate` is still in flight, `path` is where the move goes:
    /// the provider need not hold when the move is done (the engine says it again once
    /// it hears the move is done). A hint, not a QP operation: answered at once, and
    /// ignored where nothing is held for, or moving to, `path` (a hint can reach the
    /// provider after a later move has begun).
    PeerThere {
        /// The connection.
        conn: ConnId,
        /// Where the peer runs.
        path: Path,
    },
    /// Post a zero-length RDMA WRITE of apm's own on the QP (unsignaled; a
    /// zero-length WRITE names no memory, so no R_Key is checked), so that a QP in
    /// REARM arms without waiting for the application's traffic: the write reaching the
    /// peer on its primary with MigReq=0 arms the peer's QP, its acknowledgement ours
    /// (IBA: REARM becomes ARMED on the peer's packets). Only a provider that may post
    /// on the QP does it (apm's own QPs, or an application's that allows it); the
    /// others answer `Unsupported`, and the engine leaves that connection's moves to
    /// the HCA ([`crate::Policy::fast_moves`]).
    ArmingWrite {
        /// The connection.
        conn: ConnId,
    },
    /// Read back the QP's state, migration state and primary path.
    QueryQp {
        /// The connection.
        conn: ConnId,
    },
    /// Send a message to a peer.
    SendPeer {
        /// The local port to send from.
        port: PortKey,
        /// The destination.
        to: PeerAddr,
        /// The message.
        msg: PeerMsg,
    },
    /// Find every path from a local port to a remote port GID (SA PathRecord query).
    ResolvePaths {
        /// The local port.
        port: PortKey,
        /// The remote port GID.
        dgid: Gid,
    },
    /// Subscribe for GID in/out of service notices (traps 64/65) through a port.
    Subscribe {
        /// The local port whose SA to ask.
        port: PortKey,
    },
}

impl CommandOp {
    /// The connection the command acts on, if any.
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            CommandOp::LoadAlternate { conn, .. }
            | CommandOp::SetRearm { conn }
            | CommandOp::ForceMigrate { conn }
            | CommandOp::SoftwareMigrate { conn, .. }
            | CommandOp::QueryQp { conn } => Some(*conn),
            _ => None,
        }
    }

    /// A short name for logs and statistics.
    pub fn name(&self) -> &'static str {
        match self {
            CommandOp::LoadAlternate { .. } => "load_alternate",
            CommandOp::SetRearm { .. } => "set_rearm",
            CommandOp::ForceMigrate { .. } => "force_migrate",
            CommandOp::SoftwareMigrate { .. } => "software_migrate",
            CommandOp::PeerThere { .. } => "peer_there",
            CommandOp::ArmingWrite { .. } => "arming_write",
            CommandOp::QueryQp { .. } => "query_qp",
            CommandOp::SendPeer { .. } => "send_peer",
            CommandOp::ResolvePaths { .. } => "resolve_paths",
            CommandOp::Subscribe { .. } => "subscribe",
        }
    }
}

/// A successful command's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CommandOutcome {
    /// Done, nothing to report.
    Done,
    /// `SetRearm` done; the migration state read back afterwards.
    MigState(MigState),
    /// `QueryQp` answer.
    Qp(QpSnapshot),
    /// `ResolvePaths` answer: every path found (may be empty).
    Paths(Vec<Path>),
}

/// A QP as read back from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpSnapshot {
    /// False when the QP is in ERR (or RESET).
    pub operational: bool,
    /// Migration state.
    pub mig_state: MigState,
    /// The local port of the primary path.
    pub primary_port: PortKey,
    /// The DLID of the primary path.
    pub primary_dlid: Lid,
    /// The DGID of the primary path.
    pub primary_dgid: Gid,
}

/// Peer messages at the engine's level. The cm-lap crate maps them to CM MADs
/// (LAP/APR/MRA), vendor MADs or UDP datagrams.
///
/// Comm ids are written from the sender's point of view: `sender_comm_id` is the
/// sender's own local comm id, `receiver_comm_id` the receiver's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PeerMsg {
    /// Load Alternate Path: "use this path as the alternate".
    Lap(Lap),
    /// Alternate Path Response.
    Apr(Apr),
    /// Message Receipt Acknowledgement: "I got your LAP, answer takes up to `timeout`".
    Mra(Mra),
    /// Software migration: "I moved the connection to the agreed alternate; move too".
    Migrate(Migrate),
    /// Answer to [`PeerMsg::Migrate`].
    MigrateAck(MigrateAck),
    /// A liveness probe ([`crate::probe`]): for the host's prober, never the engine.
    Probe(crate::probe::Probe),
}

impl PeerMsg {
    /// The connection a message names: (the receiver's comm id, the sender's); none
    /// for a probe, which names a path, not a connection.
    pub fn comm_ids(&self) -> Option<(u32, u32)> {
        Some(match self {
            PeerMsg::Lap(m) => (m.receiver_comm_id, m.sender_comm_id),
            PeerMsg::Apr(m) => (m.receiver_comm_id, m.sender_comm_id),
            PeerMsg::Mra(m) => (m.receiver_comm_id, m.sender_comm_id),
            PeerMsg::Migrate(m) => (m.receiver_comm_id, m.sender_comm_id),
            PeerMsg::MigrateAck(m) => (m.receiver_comm_id, m.sender_comm_id),
            PeerMsg::Probe(_) => return None,
        })
    }
}

/// LAP contents. `alt` is written from the sender's point of view (its `slid`/`sgid` are
/// the sender's port, `dlid`/`dgid` the receiver's); its `port` and `sgid_index` are
/// meaningless to the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lap {
    /// The sender's comm id.
    pub sender_comm_id: u32,
    /// The receiver's comm id.
    pub receiver_comm_id: u32,
    /// The receiver's QPN.
    pub receiver_qpn: Qpn,
    /// The proposed alternate path.
    pub alt: Path,
}

/// APR contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Apr {
    /// The sender's comm id (0 when the LAP named an unknown comm id).
    pub sender_comm_id: u32,
    /// The receiver's comm id (the LAP's sender).
    pub receiver_comm_id: u32,
    /// The verdict.
    pub status: ApStatus,
}

/// MRA contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mra {
    /// The sender's comm id.
    pub sender_comm_id: u32,
    /// The receiver's comm id.
    pub receiver_comm_id: u32,
    /// Service timeout (5 bits: 4.096 us * 2^t) the receiver should wait before resending.
    pub service_timeout: u8,
}

/// Path migration between peers: "I moved to `path`, follow me", "move to `path`
/// first, I follow on your answer", or (software, own port dead) "I am moving to `path`
/// now, follow me".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migrate {
    /// The sender's comm id.
    pub sender_comm_id: u32,
    /// The receiver's comm id.
    pub receiver_comm_id: u32,
    /// The path, from the sender's point of view.
    pub path: Path,
    /// Whether the sender runs on `path` already, moves there now, or waits for us.
    pub intent: MigrateIntent,
}

/// A message for a peer and where it goes, as [`CommandOp::SendPeer`] carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerWord {
    /// The local port to send from.
    pub port: PortKey,
    /// The destination.
    pub to: PeerAddr,
    /// The message.
    pub msg: PeerMsg,
}

impl PeerWord {
    /// The command that sends it.
    pub fn send(self) -> CommandOp {
        CommandOp::SendPeer {
            port: self.port,
            to: self.to,
            msg: self.msg,
        }
    }
}

/// Whether the sender of a [`Migrate`] has moved yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrateIntent {
    /// The sender runs on the path now: follow it.
    Moved,
    /// The sender's primary died and the path is its armed alternate: move there
    /// first (which proves the path works), and the sender follows on the answer.
    Probe,
    /// The sender's own port under the primary died and the path is probed alive: it
    /// is moving there now, without waiting for an answer, and says "moved" once there.
    /// Follow it; the answer says we are there.
    Moving,
}

/// Where the peer of a software migration is as the move starts. RoCE takes an RC
/// packet only from the QP's primary address, so what reaches a peer that has not moved
/// yet is dropped; a provider may hold the sends it replays rather than send them into
/// that drop, until [`CommandOp::PeerThere`] or the peer's first packet on the new path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerMove {
    /// The peer runs on the path already (it moved first and said so, or answered our
    /// request by moving): send at once.
    Done,
    /// The peer moves only once it hears of this move (it asked us to move first).
    #[default]
    After,
    /// The peer is moving there now as well ([`MigrateIntent::Moving`], ours or its
    /// own), and either may finish first: hold the replay until
    /// [`CommandOp::PeerThere`] or the peer's first packet on the path, whatever the
    /// provider's own reasons to hold or not.
    Alongside,
}

/// Software migration answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateAck {
    /// The sender's comm id.
    pub sender_comm_id: u32,
    /// The receiver's comm id.
    pub receiver_comm_id: u32,
    /// True when the sender moved (or had already moved) to the path.
    pub ok: bool,
}

/// APStatus values of an APR (IBA Vol 1 12.8.2): ib-mad's, the wire format's own, so
/// that the engine and the MAD codec share one type.
pub use ib_mad::cm::ApStatus;

/// Something the application should know about a protected connection.
///
/// A consumer can track protection from the stream alone: after `Protected` or `Rearmed`
/// the connection has an armed alternate; after `Migrated`, `Unprotected` or `Lost` it
/// does not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// When the engine decided it.
    pub time: Time,
    /// The connection.
    pub conn: ConnId,
    /// What happened.
    pub kind: NotificationKind,
}

/// What an armed alternate protects against, by the ports it shares with the primary.
/// Ordered worst to best: the engine arms the best kind it can find (see
/// `engine::select`), and a dead port-disjoint alternate is worth more than a working
/// one through the same ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlternateKind {
    /// The same two ports through other LIDs (an LMC variant): survives a switch path
    /// failing, not a port or a cable.
    SamePorts,
    /// Another port at one end only: survives a failure at that end.
    OnePortShared,
    /// Another local port and another remote port: survives either port, its cable or
    /// its switch failing.
    PortDisjoint,
}

impl AlternateKind {
    /// The kind of `alt` as an alternate of `primary`.
    pub fn of(primary: &Path, alt: &Path) -> AlternateKind {
        match (alt.port != primary.port, alt.dgid != primary.dgid) {
            (true, true) => AlternateKind::PortDisjoint,
            (true, false) | (false, true) => AlternateKind::OnePortShared,
            (false, false) => AlternateKind::SamePorts,
        }
    }

    /// The name used in JSON and the C API: `port_disjoint`, `one_port_shared`,
    /// `same_ports`.
    pub fn name(self) -> &'static str {
        match self {
            AlternateKind::PortDisjoint => "port_disjoint",
            AlternateKind::OnePortShared => "one_port_shared",
            AlternateKind::SamePorts => "same_ports",
        }
    }
}

/// Kinds of [`Notification`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum NotificationKind {
    /// First armed alternate since `protect`.
    Protected {
        /// The armed alternate.
        alternate: Path,
        /// What it survives that the primary does not.
        survives: AlternateKind,
    },
    /// Armed again after a migration or a loss of protection.
    Rearmed {
        /// The armed alternate.
        alternate: Path,
        /// What it survives that the primary does not.
        survives: AlternateKind,
    },
    /// The connection moved to its alternate path.
    Migrated {
        /// The new primary.
        primary: Path,
        /// True when the engine forced it (hardware migrations report false).
        forced: bool,
        /// What this side saw kill the old primary; `None` when it saw nothing (the
        /// peer asked it to move, or the device migrated by itself).
        cause: Option<Cause>,
    },
    /// No armed healthy alternate any more.
    Unprotected {
        /// Why.
        reason: UnprotectedReason,
        /// For [`UnprotectedReason::PrimaryDownUnarmed`]: what killed the primary, as
        /// far as this side knows; `None` otherwise.
        cause: Option<Cause>,
    },
    /// The QP is in ERR: the connection is gone.
    Lost {
        /// Why.
        reason: LostReason,
    },
}

/// What this side saw kill a connection's primary path: the failure kind of a port
/// event, an SA notice or a liveness probe verdict (the prober's names), or a stall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Cause {
    /// This host's port on the path: its `PORT_ERR`, or the prober's verdict.
    LocalPort,
    /// The peer's port on the path: the SA's trap 65, or the peer's probes naming it
    /// down (on RoCE, where no SA exists).
    PeerPort,
    /// Both ports up, and probes between them lost: a cable, switch or route between.
    Fabric,
    /// The connection's sends stopped completing: the provider's progress monitor, the
    /// application's `report_stall`, or an operator's rail-down verdict.
    Stall,
}

impl Cause {
    /// The name used in JSON and the C API: `local_port`, `peer_port`, `fabric`,
    /// `stall`.
    pub fn name(self) -> &'static str {
        match self {
            Cause::LocalPort => "local_port",
            Cause::PeerPort => "peer_port",
            Cause::Fabric => "fabric",
            Cause::Stall => "stall",
        }
    }
}

impl From<crate::probe::FailureKind> for Cause {
    fn from(kind: crate::probe::FailureKind) -> Cause {
        match kind {
            crate::probe::FailureKind::LocalPort => Cause::LocalPort,
            crate::probe::FailureKind::PeerPort => Cause::PeerPort,
            crate::probe::FailureKind::Fabric => Cause::Fabric,
        }
    }
}

/// Why a connection is unprotected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UnprotectedReason {
    /// No healthy candidate path exists (both rails down, no LMC variant, ...).
    NoCandidate,
    /// The armed alternate's port or remote GID went down.
    AlternateDown,
    /// The HCA reported `PATH_MIG_ERR`: the alternate did not work.
    AlternateFailed,
    /// The peer never answered our LAPs.
    PeerUnresponsive,
    /// The peer answered the LAP with an error status.
    PeerRejected(ApStatus),
    /// The device refused to load or arm the alternate.
    ModifyFailed,
    /// The primary failed and there was no armed alternate to move to.
    PrimaryDownUnarmed,
}

/// Why a connection was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LostReason {
    /// `QP_FATAL` or the QP found in ERR.
    QpFatal,
    /// `DEVICE_FATAL` on the QP's device.
    DeviceFatal,
}

/// One unit of engine output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Output {
    /// Something for the provider to do.
    Command(Command),
    /// Something for the application to know.
    Notify(Notification),
}
