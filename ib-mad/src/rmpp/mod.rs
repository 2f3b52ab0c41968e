//! RMPP (reliable multi-packet protocol, IBA 13.6): the 12-byte header at MAD bytes
//! 24-35, and sans-IO state machines that split a long payload into segments
//! ([`RmppSender`]) and put one back together while acknowledging windows
//! ([`RmppReceiver`]). Neither reads a clock: the caller owns retransmission timers.
//!
//! Payload accounting follows the IBA (and the Linux MAD layer): the RMPP payload of a
//! segment is everything after the RMPP header (220 bytes), including the class header
//! (the 20-byte SA header or the 4-byte vendor OUI header) that every segment repeats.
//! PayloadLength in the first segment is the total over all segments; in the last, the
//! bytes used in that segment.

mod recv;
mod send;

pub use recv::{Reassembled, RecvEvent, RmppReceiver};
pub use send::RmppSender;

use crate::error::DecodeError;
use crate::header::{MgmtClass, MAD_SIZE};
use crate::types::Timeout;
use crate::wire::{invalid, Reader, Writer};

/// Offset of the RMPP header in a MAD.
pub const RMPP_HEADER_OFFSET: usize = 24;
/// Offset of the RMPP payload (class header and data) in a MAD.
pub const RMPP_PAYLOAD_OFFSET: usize = 36;
/// RMPP payload bytes per segment.
pub const RMPP_SEGMENT_PAYLOAD: usize = MAD_SIZE - RMPP_PAYLOAD_OFFSET;
/// The RMPP version this crate speaks.
pub const RMPP_VERSION: u8 = 1;

/// Where a class's data starts in the MAD (after its class header), for the classes
/// that may use RMPP: the SA (56) and vendor classes 0x30-0x4F (40).
pub fn data_offset(class: MgmtClass) -> Option<usize> {
    if class == MgmtClass::SUBN_ADM {
        Some(56)
    } else if class.is_vendor_range2() {
        Some(40)
    } else {
        None
    }
}

/// RMPPType (byte 25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RmppType {
    /// 0: RMPP not in use.
    #[default]
    None = 0,
    /// 1: DATA segment.
    Data = 1,
    /// 2: ACK (acknowledges up to a segment and opens a window).
    Ack = 2,
    /// 3: STOP (receiver asks the sender to stop).
    Stop = 3,
    /// 4: ABORT (transfer abandoned).
    Abort = 4,
}

impl RmppType {
    fn from_wire(v: u8) -> Option<RmppType> {
        Some(match v {
            0 => RmppType::None,
            1 => RmppType::Data,
            2 => RmppType::Ack,
            3 => RmppType::Stop,
            4 => RmppType::Abort,
            _ => return None,
        })
    }
}

/// RMPPFlags (low 3 bits of byte 26).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RmppFlags {
    /// Bit 0: RMPP is in use for this MAD.
    pub active: bool,
    /// Bit 1: first segment.
    pub first: bool,
    /// Bit 2: last segment.
    pub last: bool,
}

impl RmppFlags {
    fn bits(self) -> u8 {
        u8::from(self.active) | (u8::from(self.first) << 1) | (u8::from(self.last) << 2)
    }
}

/// The RMPP header (MAD bytes 24-35). All zero when RMPP is not in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RmppHeader {
    /// RMPPVersion (byte 24): 1 when in use.
    pub version: u8,
    /// RMPPType (byte 25).
    pub rmpp_type: RmppType,
    /// RRespTime (byte 26, upper 5 bits).
    pub resp_time: Timeout,
    /// RMPPFlags (byte 26, lower 3 bits).
    pub flags: RmppFlags,
    /// RMPPStatus (byte 27).
    pub status: u8,
    /// Data1 (bytes 28-31): SegmentNumber for DATA and ACK.
    pub data1: u32,
    /// Data2 (bytes 32-35): PayloadLength for DATA, NewWindowLast for ACK.
    pub data2: u32,
}

impl RmppHeader {
    /// A header that says RMPP is not in use.
    pub const NONE: RmppHeader = RmppHeader {
        version: 0,
        rmpp_type: RmppType::None,
        resp_time: Timeout::ZERO,
        flags: RmppFlags {
            active: false,
            first: false,
            last: false,
        },
        status: 0,
        data1: 0,
        data2: 0,
    };

    /// Decode from a whole MAD (reads bytes 24-35).
    pub fn decode(mad: &[u8]) -> Result<RmppHeader, DecodeError> {
        let r = Reader::new(mad);
        let raw_type = r.u8(25, "rmpp_type")?;
        let rmpp_type = RmppType::from_wire(raw_type)
            .ok_or_else(|| invalid("rmpp_type", 25, raw_type, "is not an RMPP type (0-4)"))?;
        let b26 = r.u8(26, "rmpp_flags")?;
        Ok(RmppHeader {
            version: r.u8(24, "rmpp_version")?,
            rmpp_type,
            resp_time: Timeout::from_masked(b26 >> 3),
            flags: RmppFlags {
                active: b26 & 1 != 0,
                first: b26 & 2 != 0,
                last: b26 & 4 != 0,
            },
            status: r.u8(27, "rmpp_status")?,
            data1: r.u32(28, "segment_number")?,
            data2: r.u32(32, "payload_length")?,
        })
    }

    /// Encode into MAD bytes 24-35.
    pub fn encode(&self, mad: &mut [u8; MAD_SIZE]) {
        let mut w = Writer::new(mad);
        w.u8(24, self.version);
        w.u8(25, self.rmpp_type as u8);
        w.u8(26, (self.resp_time.get() << 3) | self.flags.bits());
        w.u8(27, self.status);
        w.u32(28, self.data1);
        w.u32(32, self.data2);
    }

    /// Whether the Active flag is set.
    pub fn is_active(&self) -> bool {
        self.flags.active
    }
}

/// Why an RMPP transfer cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RmppError {
    /// The MAD itself does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The class does not use RMPP (only SA and vendor classes 0x30-0x4F do).
    #[error("management class {0} does not use RMPP")]
    NotRmppClass(MgmtClass),
    /// The peer sent STOP or ABORT.
    #[error("the peer ended the transfer with {rmpp_type:?}, status {status}")]
    Ended {
        /// STOP or ABORT.
        rmpp_type: RmppType,
        /// RMPPStatus the peer gave.
        status: u8,
    },
    /// A segment of a type this side does not expect (e.g. DATA at the sender).
    #[error("unexpected RMPP type {0:?} here")]
    UnexpectedType(RmppType),
    /// The transfer is larger than the configured limit.
    #[error("RMPP payload of {needed} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Bytes the transfer needs (at least).
        needed: u64,
        /// The configured limit.
        limit: usize,
    },
    /// PayloadLength of a last segment is not within one segment.
    #[error("payload_length at byte 32: {0} does not fit one segment")]
    BadPayloadLength(u32),
    /// An ACK for a segment that was never sent.
    #[error("ACK for segment {segment} but only {sent} exist")]
    BadAck {
        /// Segment number acknowledged.
        segment: u32,
        /// Segments in the transfer.
        sent: u32,
    },
    /// A segment of another transaction, class or attribute.
    #[error("segment does not belong to this transfer (TID, class or attribute differs)")]
    Mismatch,
}

/// RMPPStatus codes a sender of STOP/ABORT may give.
pub mod status {
    /// Normal.
    pub const NORMAL: u8 = 0;
    /// Resources exhausted (STOP).
    pub const RESOURCES_EXHAUSTED: u8 = 1;
    /// Total time too long (ABORT).
    pub const TOTAL_TIME_TOO_LONG: u8 = 118;
    /// Inconsistent last segment and PayloadLength (ABORT).
    pub const INCONSISTENT_LAST: u8 = 119;
    /// Inconsistent first segment and PayloadLength (ABORT).
    pub const INCONSISTENT_FIRST: u8 = 120;
    /// Bad RMPPType (ABORT).
    pub const BAD_TYPE: u8 = 121;
    /// NewWindowLast too small (ABORT).
    pub const NEW_WINDOW_LAST_TOO_SMALL: u8 = 122;
    /// SegmentNumber too big (ABORT).
    pub const SEGMENT_NUMBER_TOO_BIG: u8 = 123;
    /// Illegal status (ABORT).
    pub const ILLEGAL_STATUS: u8 = 124;
    /// Unsupported version (ABORT).
    pub const UNSUPPORTED_VERSION: u8 = 125;
    /// Too many retries (ABORT).
    pub const TOO_MANY_RETRIES: u8 = 126;
    /// Unspecified (ABORT).
    pub const UNSPECIFIED: u8 = 127;
}

/// Build a bare RMPP control MAD (ACK, STOP or ABORT) answering `template`'s transfer:
/// its headers up to the class data, the response bit flipped (as the Linux MAD layer
/// does), the given RMPP header.
pub(crate) fn control_mad(
    template: &[u8; MAD_SIZE],
    data_off: usize,
    rmpp: RmppHeader,
) -> [u8; MAD_SIZE] {
    let mut out = [0u8; MAD_SIZE];
    let n = data_off.min(MAD_SIZE);
    out[..n].copy_from_slice(&template[..n]);
    out[3] ^= 0x80;
    rmpp.encode(&mut out);
    out
}

/// An ABORT for the transfer `template` belongs to, with `status` (see [`status`]).
pub fn abort_mad(template: &[u8; MAD_SIZE], status: u8) -> Result<[u8; MAD_SIZE], RmppError> {
    let class = MgmtClass(template[1]);
    let data_off = data_offset(class).ok_or(RmppError::NotRmppClass(class))?;
    Ok(control_mad(
        template,
        data_off,
        RmppHeader {
            version: RMPP_VERSION,
            rmpp_type: RmppType::Abort,
            flags: RmppFlags {
                active: true,
                ..RmppFlags::default()
            },
            status,
            ..RmppHeader::NONE
        },
    ))
}

#[cfg(test)]
mod header_tests {
    use super::*;

    #[test]
    fn header_layout() {
        let h = RmppHeader {
            version: 1,
            rmpp_type: RmppType::Data,
            resp_time: Timeout::new(0x13).unwrap(),
            flags: RmppFlags {
                active: true,
                first: false,
                last: true,
            },
            status: 0x7f,
            data1: 0x0102_0304,
            data2: 0x0506_0708,
        };
        let mut mad = [0u8; MAD_SIZE];
        h.encode(&mut mad);
        assert_eq!(
            &mad[24..36],
            &[1, 1, 0x13 << 3 | 0b101, 0x7f, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(RmppHeader::decode(&mad), Ok(h));
        mad[25] = 5;
        let err = RmppHeader::decode(&mad).unwrap_err();
        assert_eq!((err.field(), err.offset()), ("rmpp_type", 25));
    }
}

#[cfg(test)]
mod tests;
