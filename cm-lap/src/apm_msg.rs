//! apm's own vendor-class attributes for software path migration, and the whole peer
//! message (LAP, APR, MRA, Migrate, MigrateAck) as one 256-byte vendor MAD.
//!
//! When a path dies apm asks the peer over the alternate to move first with `Migrate`,
//! answered by `MigrateAck`: on RoCE both QPs then move their primary address vector in
//! software, with hardware APM the QPs are forced to migrate (apm-core's engine decides
//! when; this module only says how they look on the wire). They travel in the same vendor
//! class, class version and OUI as the LAP, APR and MRA of [`crate::umad_transport`]'s
//! vendor channel (on InfiniBand, that channel itself carries them; on RoCE, UDP
//! datagrams of the whole MAD), method Send (0x03), under two attribute IDs of apm's
//! own:
//!
//! **Migrate** (attribute [`MIGRATE_ATTR`] = 0xA001). Offsets within the 216 vendor data
//! bytes (MAD byte 40 on), big-endian; every byte not listed is reserved and sent as 0:
//!
//! | offset | size | field                                                        |
//! |-------:|-----:|--------------------------------------------------------------|
//! | 0      | 4    | SenderCommID (the sender's own comm id)                      |
//! | 4      | 4    | ReceiverCommID                                               |
//! | 8      | 2    | SLID of the path the sender moved to (0 on RoCE)             |
//! | 10     | 2    | DLID                                                         |
//! | 12     | 16   | SGID: the sender's GID on that path                          |
//! | 28     | 16   | DGID: the receiver's GID on that path                        |
//! | 44     | 4    | FlowLabel (low 20 bits; the upper 12 are reserved)           |
//! | 48     | 1    | TrafficClass                                                 |
//! | 49     | 1    | HopLimit                                                     |
//! | 50     | 1    | SL (low 4 bits)                                              |
//! | 51     | 1    | PacketRate (low 6 bits, IBA encoding)                        |
//! | 52     | 1    | PathMTU (IBA encoding, 1 = 256 .. 5 = 4096)                  |
//! | 53     | 1    | LocalAckTimeout (low 5 bits)                                 |
//! | 54     | 1    | Intent: 0 = moved (the sender runs on the path), 1 = probe,  |
//! |        |      | 2 = moving                                                   |
//!
//! A probe is sent before a forced migration or a software move: the receiver moves
//! first (which proves the path works) and the sender follows on its answer. "Moving"
//! is sent by a software engine whose own port under the primary died: it moves now
//! and says "moved" once there; the receiver follows, and each side holds what it
//! replays until it hears that the other is there.
//! **MigrateAck** (attribute [`MIGRATE_ACK_ATTR`] = 0xA002): SenderCommID @0 (4),
//! ReceiverCommID @4 (4), Status @8 (1): 0 = moved (or already there), 1 = refused.
//!
//! **Probe** (attribute [`PROBE_ATTR`] = 0xA003): a liveness probe of one path
//! (`apm_core::probe`, after BFD's control packet, RFC 5880 4.1, with GIDs in place of
//! addresses and the sender's dead ports added):
//!
//! | offset | size | field                                                        |
//! |-------:|-----:|--------------------------------------------------------------|
//! | 0      | 1    | Version (1)                                                  |
//! | 1      | 1    | State: 0 AdminDown, 1 Down, 2 Init, 3 Up                     |
//! | 2      | 1    | Diag: 0 none, 1 detection expired, 3 neighbour down, 4 port down |
//! | 3      | 1    | DetectMult (at least 1)                                      |
//! | 4      | 4    | MyDiscriminator (never 0)                                    |
//! | 8      | 4    | YourDiscriminator (0 until the sender has heard the receiver) |
//! | 12     | 4    | DesiredMinTxInterval, microseconds                           |
//! | 16     | 4    | RequiredMinRxInterval, microseconds                          |
//! | 20     | 16   | Sender's GID on the path                                     |
//! | 36     | 16   | Receiver's GID on the path                                   |
//! | 52     | 1    | N: how many of the sender's ports are down (at most 8)       |
//! | 56     | 16 N | their GIDs                                                   |
//!
//! Values the engine's types cannot hold (a reserved status, an over-wide field) make a
//! received message undecodable: it is dropped, never truncated into something else.

use crate::peer_channel::{from_peer_msg, to_peer_msg};
use crate::umad_transport::{self, CmChannel, VENDOR_CLASS_VERSION};
use apm_core::probe::{Diag, PathEnds, PortsDown, Probe, SessionState, MAX_PORTS_DOWN};
use apm_core::{Gid, Lid, Migrate, MigrateAck, MigrateIntent, Path, PeerMsg, PortKey};
use ib_mad::types::{Oui, U24};
use ib_mad::vendor::VendorMad;
use ib_mad::{AttributeId, Method, MgmtClass, MAD_SIZE};

/// Attribute ID of a software-migration request (apm's own, in its vendor class).
pub const MIGRATE_ATTR: AttributeId = AttributeId(0xA001);
/// Attribute ID of a software-migration answer.
pub const MIGRATE_ACK_ATTR: AttributeId = AttributeId(0xA002);
/// Attribute ID of a liveness probe.
pub const PROBE_ATTR: AttributeId = AttributeId(0xA003);
/// The probe layout's version.
const PROBE_VERSION: u8 = 1;

/// Why a peer message could not be put on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A value does not fit its field (e.g. a flow label over 20 bits).
    #[error("cannot encode the peer message: {0}")]
    OutOfRange(String),
    /// The class is not a vendor class with OUI (0x30-0x4F).
    #[error("class {0:#04x} is not a vendor class with an OUI (0x30-0x4F)")]
    NotVendorClass(u8),
}

/// Why a message could not be encoded, as a [`apm_core::Reason`].
pub fn encode_reason(e: &EncodeError) -> apm_core::Reason {
    apm_core::Reason::Because(match e {
        EncodeError::OutOfRange(_) => "a value does not fit its field",
        EncodeError::NotVendorClass(_) => "the class is not a vendor class with an OUI (0x30-0x4F)",
    })
}

/// Encode `msg` as one vendor MAD of `class`/`oui` with transaction id `tid`.
pub fn encode(
    class: u8,
    oui: [u8; 3],
    tid: u64,
    msg: &PeerMsg,
) -> Result<[u8; MAD_SIZE], EncodeError> {
    if !MgmtClass(class).is_vendor_range2() {
        return Err(EncodeError::NotVendorClass(class));
    }
    let (attr, data) = match msg {
        PeerMsg::Migrate(m) => (MIGRATE_ATTR, migrate_data(m)?),
        PeerMsg::MigrateAck(a) => (MIGRATE_ACK_ATTR, ack_data(a)),
        PeerMsg::Probe(p) => (PROBE_ATTR, probe_data(p)),
        other => {
            let body = from_peer_msg(other).map_err(|e| EncodeError::OutOfRange(e.to_string()))?;
            return umad_transport::encode(CmChannel::Vendor { class, oui }, tid, &body)
                .map_err(|e| EncodeError::OutOfRange(e.to_string()));
        }
    };
    let mut v = VendorMad::new(
        MgmtClass(class),
        VENDOR_CLASS_VERSION,
        Method::SEND,
        tid,
        attr,
        oui_of(oui),
    )
    .map_err(|_| EncodeError::NotVendorClass(class))?;
    v.data[..data.len()].copy_from_slice(&data);
    Ok(v.encode())
}

/// Decode a received datagram: `None` unless it is exactly one vendor MAD of
/// `class`/`oui`, method Send, carrying one of the five messages with valid values.
/// `port` is the local port the engine should see it arrive on. Returns the TID too.
pub fn decode(class: u8, oui: [u8; 3], port: PortKey, mad: &[u8]) -> Option<(u64, PeerMsg)> {
    let v = VendorMad::decode(mad).ok()?;
    if v.header.mgmt_class.0 != class
        || v.header.class_version != VENDOR_CLASS_VERSION
        || v.oui != oui_of(oui)
        || v.header.method != Method::SEND
    {
        return None;
    }
    let tid = v.header.transaction_id;
    let msg = match decode_attribute(v.header.attribute_id, &v.data[..], port) {
        Some(m) => m,
        None if is_apm_attribute(v.header.attribute_id) => return None,
        None => {
            let body = umad_transport::decode(CmChannel::Vendor { class, oui }, mad)?;
            to_peer_msg(&body, port)?
        }
    };
    Some((tid, msg))
}

/// Whether `attr` is one of apm's own attributes ([`MIGRATE_ATTR`], [`MIGRATE_ACK_ATTR`],
/// [`PROBE_ATTR`]).
pub fn is_apm_attribute(attr: AttributeId) -> bool {
    attr == MIGRATE_ATTR || attr == MIGRATE_ACK_ATTR || attr == PROBE_ATTR
}

/// The Migrate or MigrateAck in the vendor data `d` of a MAD with attribute `attr`
/// (`None` for another attribute or values the engine's types cannot hold). `port` is
/// the local port the engine should see it arrive on.
pub fn decode_attribute(attr: AttributeId, d: &[u8], port: PortKey) -> Option<PeerMsg> {
    Some(match attr {
        MIGRATE_ATTR => PeerMsg::Migrate(Migrate {
            sender_comm_id: be32(d, 0)?,
            receiver_comm_id: be32(d, 4)?,
            path: Path {
                port,
                slid: Lid::from_wire(be16(d, 8)?),
                dlid: Lid::from_wire(be16(d, 10)?),
                sgid: Gid(d.get(12..28)?.try_into().ok()?),
                dgid: Gid(d.get(28..44)?.try_into().ok()?),
                // Meaningless to the receiver (its own table): the engine fills it in.
                sgid_index: 0,
                flow_label: Some(be32(d, 44)?).filter(|f| *f <= 0xF_FFFF)?,
                traffic_class: *d.get(48)?,
                hop_limit: *d.get(49)?,
                sl: Some(*d.get(50)?).filter(|s| *s <= 15)?,
                rate: Some(*d.get(51)?).filter(|r| *r <= 0x3F)?,
                mtu: *d.get(52)?,
                pkey_index: 0,
                ack_timeout: Some(*d.get(53)?).filter(|t| *t <= 31)?,
            },
            intent: match *d.get(54)? {
                0 => MigrateIntent::Moved,
                1 => MigrateIntent::Probe,
                2 => MigrateIntent::Moving,
                _ => return None,
            },
        }),
        MIGRATE_ACK_ATTR => PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: be32(d, 0)?,
            receiver_comm_id: be32(d, 4)?,
            ok: match *d.get(8)? {
                0 => true,
                1 => false,
                _ => return None,
            },
        }),
        PROBE_ATTR => PeerMsg::Probe(probe_of(d)?),
        _ => return None,
    })
}

fn probe_of(d: &[u8]) -> Option<Probe> {
    if *d.first()? != PROBE_VERSION {
        return None;
    }
    let gid_at = |at: usize| -> Option<Gid> { Some(Gid(d.get(at..at + 16)?.try_into().ok()?)) };
    let n = usize::from(*d.get(52)?);
    if n > MAX_PORTS_DOWN {
        return None;
    }
    // No allocation per probe received: a fixed array, as the probe holds them.
    let mut down = [Gid::default(); MAX_PORTS_DOWN];
    for (i, slot) in down.iter_mut().take(n).enumerate() {
        *slot = gid_at(56 + 16 * i)?;
    }
    Some(Probe {
        state: SessionState::from_code(*d.get(1)?)?,
        diag: Diag::from_code(*d.get(2)?),
        detect_mult: Some(*d.get(3)?).filter(|m| *m >= 1)?,
        my_disc: Some(be32(d, 4)?).filter(|x| *x != 0)?,
        your_disc: be32(d, 8)?,
        tx_interval_us: be32(d, 12)?,
        rx_interval_us: be32(d, 16)?,
        ends: PathEnds {
            local: gid_at(20)?,
            remote: gid_at(36)?,
        },
        ports_down: PortsDown::of(down[..n].iter().copied()),
    })
}

fn probe_data(p: &Probe) -> Vec<u8> {
    let down = p.ports_down.as_slice();
    let mut d = vec![0u8; 56 + 16 * down.len()];
    d[0] = PROBE_VERSION;
    d[1] = p.state.code();
    d[2] = p.diag.code();
    d[3] = p.detect_mult;
    d[4..8].copy_from_slice(&p.my_disc.to_be_bytes());
    d[8..12].copy_from_slice(&p.your_disc.to_be_bytes());
    d[12..16].copy_from_slice(&p.tx_interval_us.to_be_bytes());
    d[16..20].copy_from_slice(&p.rx_interval_us.to_be_bytes());
    d[20..36].copy_from_slice(&p.ends.local.0);
    d[36..52].copy_from_slice(&p.ends.remote.0);
    // At most MAX_PORTS_DOWN (8) by PortsDown's construction.
    d[52] = down.len() as u8;
    for (i, g) in down.iter().enumerate() {
        d[56 + 16 * i..72 + 16 * i].copy_from_slice(&g.0);
    }
    d
}

fn oui_of(oui: [u8; 3]) -> Oui {
    Oui(U24::from_masked(u32::from_be_bytes([
        0, oui[0], oui[1], oui[2],
    ])))
}

fn be32(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn be16(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(at..at + 2)?.try_into().ok()?))
}

fn migrate_data(m: &Migrate) -> Result<Vec<u8>, EncodeError> {
    let p = &m.path;
    let bad = |what: &str| EncodeError::OutOfRange(format!("{what} out of range"));
    if p.flow_label > 0xF_FFFF {
        return Err(bad("flow label"));
    }
    if p.sl > 15 {
        return Err(bad("SL"));
    }
    if p.rate > 0x3F {
        return Err(bad("packet rate"));
    }
    if p.ack_timeout > 31 {
        return Err(bad("ACK timeout"));
    }
    let mut d = vec![0u8; 55];
    d[0..4].copy_from_slice(&m.sender_comm_id.to_be_bytes());
    d[4..8].copy_from_slice(&m.receiver_comm_id.to_be_bytes());
    d[8..10].copy_from_slice(&p.slid.get().to_be_bytes());
    d[10..12].copy_from_slice(&p.dlid.get().to_be_bytes());
    d[12..28].copy_from_slice(&p.sgid.0);
    d[28..44].copy_from_slice(&p.dgid.0);
    d[44..48].copy_from_slice(&p.flow_label.to_be_bytes());
    d[48] = p.traffic_class;
    d[49] = p.hop_limit;
    d[50] = p.sl;
    d[51] = p.rate;
    d[52] = p.mtu;
    d[53] = p.ack_timeout;
    d[54] = match m.intent {
        MigrateIntent::Moved => 0,
        MigrateIntent::Probe => 1,
        MigrateIntent::Moving => 2,
    };
    Ok(d)
}

fn ack_data(a: &MigrateAck) -> Vec<u8> {
    let mut d = vec![0u8; 9];
    d[0..4].copy_from_slice(&a.sender_comm_id.to_be_bytes());
    d[4..8].copy_from_slice(&a.receiver_comm_id.to_be_bytes());
    d[8] = u8::from(!a.ok);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use apm_core::{ApStatus, Apr, Lap, Mra, Qpn};

    const CLASS: u8 = 0x30;
    const OUI: [u8; 3] = [0x02, 0x00, 0x5e];

    fn path() -> Path {
        Path {
            sl: 3,
            flow_label: 0xABCDE,
            traffic_class: 0x20,
            rate: 7,
            ..Path::roce(
                PortKey::new(0, 1),
                "::ffff:10.0.20.1".parse().expect("gid"),
                "::ffff:10.0.20.2".parse().expect("gid"),
                Path::MTU_1024,
                Path::ACK_TIMEOUT_67MS,
            )
        }
    }

    fn probe(down: &[Gid]) -> Probe {
        Probe {
            state: SessionState::Up,
            diag: Diag::DetectionExpired,
            detect_mult: 3,
            my_disc: 0x0102_0304,
            your_disc: 9,
            tx_interval_us: 20_000,
            rx_interval_us: 20_000,
            ends: PathEnds {
                local: path().sgid,
                remote: path().dgid,
            },
            ports_down: PortsDown::of(down.iter().copied()),
        }
    }

    #[test]
    fn a_probe_is_laid_out_as_documented_and_nonsense_is_dropped() {
        let p = probe(&[path().dgid]);
        let wire = encode(CLASS, OUI, 1, &PeerMsg::Probe(p)).expect("encodes");
        assert_eq!(u16::from_be_bytes([wire[16], wire[17]]), PROBE_ATTR.0);
        let d = &wire[40..];
        assert_eq!(&d[..4], &[1, 3, 1, 3]);
        assert_eq!(&d[4..8], &[1, 2, 3, 4]);
        assert_eq!(&d[12..16], &20_000u32.to_be_bytes());
        assert_eq!(&d[20..36], &path().sgid.0);
        assert_eq!(d[52], 1);
        assert_eq!(&d[56..72], &path().dgid.0);
        let port = PortKey::new(0, 1);
        for (at, bad) in [(0usize, 2u8), (1, 4), (3, 0), (52, 9)] {
            let mut w = wire;
            w[40 + at] = bad;
            assert_eq!(decode(CLASS, OUI, port, &w), None, "byte {at} = {bad}");
        }
        let mut w = wire;
        w[44..48].fill(0);
        assert_eq!(decode(CLASS, OUI, port, &w), None, "discriminator 0");
    }

    #[test]
    fn every_message_survives_the_wire() {
        let msgs = [
            PeerMsg::Migrate(Migrate {
                sender_comm_id: 1,
                receiver_comm_id: 2,
                path: path(),
                intent: apm_core::MigrateIntent::Moved,
            }),
            PeerMsg::Migrate(Migrate {
                sender_comm_id: 1,
                receiver_comm_id: 2,
                path: path(),
                intent: apm_core::MigrateIntent::Moving,
            }),
            PeerMsg::MigrateAck(MigrateAck {
                sender_comm_id: 2,
                receiver_comm_id: 1,
                ok: true,
            }),
            PeerMsg::MigrateAck(MigrateAck {
                sender_comm_id: 2,
                receiver_comm_id: 1,
                ok: false,
            }),
            PeerMsg::Lap(Lap {
                sender_comm_id: 5,
                receiver_comm_id: 6,
                receiver_qpn: Qpn::new(0x1234).expect("24-bit"),
                alt: Path { mtu: 0, ..path() },
            }),
            PeerMsg::Apr(Apr {
                sender_comm_id: 6,
                receiver_comm_id: 5,
                status: ApStatus::Success,
            }),
            PeerMsg::Mra(Mra {
                sender_comm_id: 6,
                receiver_comm_id: 5,
                service_timeout: 12,
            }),
            PeerMsg::Probe(probe(&[])),
            PeerMsg::Probe(probe(&[path().sgid, path().dgid])),
        ];
        for msg in msgs {
            let wire = encode(CLASS, OUI, 0x77, &msg).expect("encodes");
            assert_eq!(wire.len(), MAD_SIZE);
            assert_eq!((wire[1], wire[3]), (CLASS, 0x03));
            assert_eq!(&wire[37..40], &OUI);
            let (tid, back) = decode(CLASS, OUI, PortKey::new(0, 1), &wire).expect("decodes");
            assert_eq!(tid, 0x77);
            assert_eq!(back, msg);
        }
    }

    #[test]
    fn migrate_fields_sit_where_documented() {
        let m = PeerMsg::Migrate(Migrate {
            sender_comm_id: 0x0102_0304,
            receiver_comm_id: 0x0506_0708,
            path: path(),
            intent: apm_core::MigrateIntent::Moved,
        });
        let w = encode(CLASS, OUI, 1, &m).expect("encodes");
        assert_eq!(&w[16..18], &[0xA0, 0x01]);
        assert_eq!(&w[40..48], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&w[52..68], &path().sgid.0);
        assert_eq!(&w[84..88], &0xABCDEu32.to_be_bytes());
        assert_eq!(w[93], 14);
    }

    #[test]
    fn foreign_or_malformed_datagrams_are_refused() {
        let m = PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: 2,
            receiver_comm_id: 1,
            ok: true,
        });
        let w = encode(CLASS, OUI, 1, &m).expect("encodes");
        let port = PortKey::new(0, 1);
        assert!(decode(CLASS, [1, 2, 3], port, &w).is_none(), "other OUI");
        assert!(decode(0x31, OUI, port, &w).is_none(), "other class");
        assert!(decode(CLASS, OUI, port, &w[..255]).is_none(), "short");
        assert!(decode(CLASS, OUI, port, &[]).is_none(), "empty");
        let mut bad = w;
        bad[48] = 7; // reserved status
        assert!(decode(CLASS, OUI, port, &bad).is_none());
        let mut bad = w;
        bad[17] = 0x99; // unknown attribute
        assert!(decode(CLASS, OUI, port, &bad).is_none());
        assert!(encode(0x20, OUI, 1, &m).is_err(), "not a vendor class");
        let mut p = path();
        p.flow_label = 0x10_0000;
        let too_wide = PeerMsg::Migrate(Migrate {
            sender_comm_id: 1,
            receiver_comm_id: 2,
            path: p,
            intent: apm_core::MigrateIntent::Moved,
        });
        assert!(encode(CLASS, OUI, 1, &too_wide).is_err());
    }
}
