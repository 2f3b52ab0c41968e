//! Value types shared by the engine, the providers and the wire formats: time, LIDs,
//! GIDs, QPNs, ports and paths.
//!
//! Every type here is a plain value: no IO, no interior mutability. Constructors that
//! take raw numbers reject out-of-range values instead of truncating them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A point in time as the engine sees it: nanoseconds since an origin chosen by the
/// driver (the simulator's virtual clock, or the Manager's start instant).
///
/// The engine never reads a clock: every input carries its `Time`, and time never goes
/// backwards (an input older than the last one is treated as happening at the last one).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Time(pub u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);

    /// `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Time {
        Time(ms * 1_000_000)
    }

    /// `us` microseconds after the origin.
    pub const fn from_micros(us: u64) -> Time {
        Time(us * 1_000)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Milliseconds since the origin, as a float for reports.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// `self + d`, saturating at the far future instead of overflowing.
    pub fn plus(self, d: std::time::Duration) -> Time {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }

    /// The duration from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Time) -> std::time::Duration {
        std::time::Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}ms", self.as_millis_f64())
    }
}

/// A 16-bit local identifier. LID 0 is reserved and 0xFFFF is the permissive LID;
/// [`Lid::new`] accepts only unicast LIDs (1..=0xBFFF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Lid(u16);

impl Lid {
    /// A unicast LID, or `None` for 0, multicast (0xC000..) and permissive values.
    pub const fn new(raw: u16) -> Option<Lid> {
        if raw == 0 || raw >= 0xC000 {
            None
        } else {
            Some(Lid(raw))
        }
    }

    /// Any 16-bit value as it appears on the wire (RoCE paths carry LID 0).
    pub const fn from_wire(raw: u16) -> Lid {
        Lid(raw)
    }

    /// The raw value.
    pub const fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Lid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 128-bit global identifier (subnet prefix + port GUID, or a RoCE IP-derived GID).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// A GID from the IB default subnet prefix (fe80::) and a port GUID.
    pub fn from_guid(guid: u64) -> Gid {
        Gid::from_parts(0xfe80_0000_0000_0000, guid)
    }

    /// A GID from a subnet prefix and an interface id (port GUID).
    pub fn from_parts(prefix: u64, guid: u64) -> Gid {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&prefix.to_be_bytes());
        b[8..].copy_from_slice(&guid.to_be_bytes());
        Gid(b)
    }

    /// The interface id (the port GUID for IB GIDs).
    pub fn guid(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::net::Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl std::str::FromStr for Gid {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Gid, Self::Err> {
        let ip: std::net::Ipv6Addr = s.parse()?;
        Ok(Gid(ip.octets()))
    }
}

/// A 24-bit queue pair number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Qpn(u32);

impl Qpn {
    /// A QPN, or `None` when it does not fit in 24 bits.
    pub const fn new(raw: u32) -> Option<Qpn> {
        if raw > 0x00FF_FFFF {
            None
        } else {
            Some(Qpn(raw))
        }
    }

    /// The raw value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A local HCA port as the engine knows it: a device index assigned by the provider
/// (stable for the provider's lifetime) and the 1-based port number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortKey {
    /// Provider-assigned device index.
    pub device: u16,
    /// Port number, 1-based as in verbs.
    pub port: u8,
}

impl PortKey {
    /// Device `device`, port `port`.
    pub const fn new(device: u16, port: u8) -> PortKey {
        PortKey { device, port }
    }
}

impl fmt::Display for PortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dev{}/{}", self.device, self.port)
    }
}

/// Which side of the connection this node is (who sent the CM REQ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sent the REQ. Initiates LAPs at once and wins LAP collisions.
    Active,
    /// Accepted the REQ. Initiates a LAP only after a delay, and yields on collision.
    Passive,
}

/// How a connection changes paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationMode {
    /// InfiniBand hardware APM: alternate path loaded into the QP, REARM, the HCA migrates.
    Hardware,
    /// RoCE: no usable alternate path in the QP; the provider moves the primary address
    /// vector itself and the peer is told to do the same.
    Software,
}

/// What the subnet manager says of a port's GID: in service (trap 64) or out of
/// service (trap 65). One type from the SA notice to the engine and the tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GidService {
    /// Trap 64: the port is in service (it joined, or came back).
    InService,
    /// Trap 65: the port is out of service (it left, or its link went down).
    OutOfService,
}

impl GidService {
    /// The SA trap number that says it: 64 or 65.
    pub fn trap(self) -> u16 {
        match self {
            GidService::InService => 64,
            GidService::OutOfService => 65,
        }
    }

    /// The state a trap number says, if it is 64 or 65.
    pub fn of_trap(trap: u16) -> Option<GidService> {
        match trap {
            64 => Some(GidService::InService),
            65 => Some(GidService::OutOfService),
            _ => None,
        }
    }
}

impl std::fmt::Display for GidService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GidService::InService => "in service",
            GidService::OutOfService => "out of service",
        })
    }
}

/// Path migration state of a QP (`ibv_mig_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigState {
    /// Nothing armed (start state; after every migration).
    Migrated,
    /// Software asked to arm the loaded alternate.
    Rearm,
    /// Armed: the HCA can migrate to the alternate.
    Armed,
}

/// One direction of an RC path: everything `ibv_ah_attr` plus the port and the
/// attributes that must match between primary and alternate.
///
/// Paths are always written from the local node's point of view: `slid`/`sgid` are this
/// node's port, `dlid`/`dgid` the peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Path {
    /// The local port the path leaves from.
    pub port: PortKey,
    /// Source LID (base LID + path bits).
    pub slid: Lid,
    /// Destination LID.
    pub dlid: Lid,
    /// Source GID (the local port's GID).
    pub sgid: Gid,
    /// Destination GID (the peer port's GID).
    pub dgid: Gid,
    /// Index of `sgid` in the local port's GID table.
    pub sgid_index: u8,
    /// Service level.
    pub sl: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit (0 or 1 keeps the path subnet-local).
    pub hop_limit: u8,
    /// Static rate (IBA encoding).
    pub rate: u8,
    /// Path MTU (IBA encoding: 1=256 .. 5=4096); must equal the primary's.
    pub mtu: u8,
    /// P_Key index on the local port.
    pub pkey_index: u16,
    /// Local ACK timeout (5 bits: 4.096 us * 2^t).
    pub ack_timeout: u8,
}

impl Path {
    /// Path MTU 1024 bytes, in the IBA encoding of [`Path::mtu`].
    pub const MTU_1024: u8 = 3;
    /// Path MTU 2048 bytes.
    pub const MTU_2048: u8 = 4;
    /// Path MTU 4096 bytes.
    pub const MTU_4096: u8 = 5;
    /// Local ACK timeout 14 (4.096 us * 2^14, about 67 ms): the usual RC default.
    pub const ACK_TIMEOUT_67MS: u8 = 14;
    /// The hop limit of a RoCE path: routed by IP, like any IPv6 packet's default.
    pub const ROCE_HOP_LIMIT: u8 = 64;

    /// A subnet-local InfiniBand path from `port`: source and destination LID and GID,
    /// SL 0, no flow label or traffic class, hop limit 0 (no GRH hop), the port's
    /// default rate, GID and P_Key index 0.
    pub fn ib(
        port: PortKey,
        (slid, sgid): (Lid, Gid),
        (dlid, dgid): (Lid, Gid),
        mtu: u8,
        ack_timeout: u8,
    ) -> Path {
        Path {
            port,
            slid,
            dlid,
            sgid,
            dgid,
            sgid_index: 0,
            sl: 0,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 0,
            rate: 0,
            mtu,
            pkey_index: 0,
            ack_timeout,
        }
    }

    /// A RoCE path from `port` between two GIDs: LIDs 0 (RoCE has none), hop limit
    /// [`Path::ROCE_HOP_LIMIT`], GID index 0 (the provider looks the GID up when the
    /// path is used).
    pub fn roce(port: PortKey, sgid: Gid, dgid: Gid, mtu: u8, ack_timeout: u8) -> Path {
        Path {
            hop_limit: Path::ROCE_HOP_LIMIT,
            ..Path::ib(
                port,
                (Lid::from_wire(0), sgid),
                (Lid::from_wire(0), dgid),
                mtu,
                ack_timeout,
            )
        }
    }

    /// True when both paths lead between the same LIDs and GIDs (the same route).
    pub fn same_route(&self, other: &Path) -> bool {
        self.port == other.port
            && self.slid == other.slid
            && self.dlid == other.dlid
            && self.sgid == other.sgid
            && self.dgid == other.dgid
    }

    /// The path as the peer sees it (source and destination swapped), with the peer's
    /// local port and GID index supplied by the caller.
    pub fn reversed(&self, peer_port: PortKey, peer_sgid_index: u8) -> Path {
        Path {
            port: peer_port,
            slid: self.dlid,
            dlid: self.slid,
            sgid: self.dgid,
            dgid: self.sgid,
            sgid_index: peer_sgid_index,
            ..*self
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} lid {}->{} gid {}->{}",
            self.port, self.slid, self.dlid, self.sgid, self.dgid
        )
    }
}

/// The application's handle for a protected connection. Chosen by the caller of
/// `protect` (the simulator and the Manager allocate them); unique per engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn{}", self.0)
    }
}

/// Where a peer message came from, as the transport saw it. Used to check that a LAP
/// really comes from the connection's peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PeerAddr {
    /// The sender's port GID (for UDP transports: its RoCE GID).
    pub gid: Gid,
    /// The sender's LID (0 on RoCE).
    pub lid: Lid,
}

impl PeerAddr {
    /// The far end of `path`: where a message over it is addressed.
    pub fn far_end(path: &Path) -> PeerAddr {
        PeerAddr {
            gid: path.dgid,
            lid: path.dlid,
        }
    }
}

/// Everything the engine needs to protect one RC connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnSpec {
    /// The caller's id for the connection.
    pub id: ConnId,
    /// Active (sent REQ) or passive.
    pub role: Role,
    /// Hardware APM or software migration.
    pub mode: MigrationMode,
    /// This side's QPN.
    pub local_qpn: Qpn,
    /// The peer's QPN.
    pub remote_qpn: Qpn,
    /// This side's CM communication id.
    pub local_comm_id: u32,
    /// The peer's CM communication id.
    pub remote_comm_id: u32,
    /// The path the QP uses now.
    pub primary: Path,
    /// An alternate already agreed with the peer at connect time (in REQ/REP) and
    /// loaded by the application, if any. The engine then only sets REARM.
    pub agreed_alternate: Option<Path>,
    /// Other paths to the same peer the engine may choose from, best first as far as
    /// the caller knows. The engine may add paths it resolves itself.
    pub candidates: Vec<Path>,
}

impl ConnSpec {
    /// Every remote port GID this connection may legitimately hear from.
    pub fn peer_gids(&self) -> impl Iterator<Item = Gid> + '_ {
        std::iter::once(self.primary.dgid)
            .chain(self.agreed_alternate.iter().map(|p| p.dgid))
            .chain(self.candidates.iter().map(|p| p.dgid))
    }
}

/// A local port's identity and state as reported by the provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// Which port.
    pub key: PortKey,
    /// Port GUID-derived GIDs (index 0 first). RoCE ports list every GID-table entry.
    pub gids: Vec<Gid>,
    /// Base LID (0 on RoCE).
    pub lid: Lid,
    /// LID mask control: the port answers to `lid .. lid + 2^lmc`.
    pub lmc: u8,
    /// True when the port is ACTIVE.
    pub active: bool,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkLayer {
    /// Native InfiniBand.
    InfiniBand,
    /// RoCE (Ethernet).
    Ethernet,
}
