//! Notice (SA attribute 0x0002, 80 bytes): a trap as the SA forwards it in a Report,
//! with the data details of the traps this project reacts to decoded.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::{Gid, Lid, U15, U24, U7};
use crate::wire::{Reader, Writer};

/// Size of the DataDetails field.
pub const DATA_DETAILS_SIZE: usize = 54;

/// Notice DataDetails (bytes 10-63), typed for the traps this project reacts to.
///
/// Decoding picks the variant from IsGeneric and TrapNumber; reserved bytes of the typed
/// variants are ignored on decode and written as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoticeDetails {
    /// Generic trap 64, "GID in service": GIDADDR at details byte 6.
    GidInService(Gid),
    /// Generic trap 65, "GID out of service": GIDADDR at details byte 6.
    GidOutOfService(Gid),
    /// Generic trap 128, "link state change": LIDADDR of the switch at details byte 0.
    LinkStateChange(Lid),
    /// Another generic trap (not 64, 65 or 128), details as they are.
    Generic {
        /// TrapNumber.
        trap_number: u16,
        /// DataDetails.
        data: [u8; DATA_DETAILS_SIZE],
    },
    /// A vendor (non-generic) notice.
    Vendor {
        /// DeviceID (in the TrapNumber bits).
        device_id: u16,
        /// DataDetails.
        data: [u8; DATA_DETAILS_SIZE],
    },
}

impl NoticeDetails {
    /// TrapNumber (or DeviceID for vendor notices).
    pub fn trap_number(&self) -> u16 {
        match self {
            NoticeDetails::GidInService(_) => 64,
            NoticeDetails::GidOutOfService(_) => 65,
            NoticeDetails::LinkStateChange(_) => 128,
            NoticeDetails::Generic { trap_number, .. } => *trap_number,
            NoticeDetails::Vendor { device_id, .. } => *device_id,
        }
    }

    /// Whether this is a generic notice.
    pub fn is_generic(&self) -> bool {
        !matches!(self, NoticeDetails::Vendor { .. })
    }

    /// The 54 DataDetails bytes.
    pub fn to_bytes(&self) -> [u8; DATA_DETAILS_SIZE] {
        let mut out = [0u8; DATA_DETAILS_SIZE];
        match self {
            NoticeDetails::GidInService(gid) | NoticeDetails::GidOutOfService(gid) => {
                out[6..22].copy_from_slice(&gid.0)
            }
            NoticeDetails::LinkStateChange(lid) => out[..2].copy_from_slice(&lid.0.to_be_bytes()),
            NoticeDetails::Generic { data, .. } | NoticeDetails::Vendor { data, .. } => out = *data,
        }
        out
    }

    fn from_bytes(is_generic: bool, trap_number: u16, data: [u8; DATA_DETAILS_SIZE]) -> Self {
        let gid = || {
            let mut raw = [0u8; 16];
            raw.copy_from_slice(&data[6..22]);
            Gid(raw)
        };
        match (is_generic, trap_number) {
            (false, device_id) => NoticeDetails::Vendor { device_id, data },
            (true, 64) => NoticeDetails::GidInService(gid()),
            (true, 65) => NoticeDetails::GidOutOfService(gid()),
            (true, 128) => {
                NoticeDetails::LinkStateChange(Lid(u16::from_be_bytes([data[0], data[1]])))
            }
            (true, trap_number) => NoticeDetails::Generic { trap_number, data },
        }
    }
}

/// Notice: the attribute a Report carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Notice {
    /// Type (byte 0, low 7 bits): 0 fatal, 1 urgent, 2 security, 3 SM, 4 informational.
    pub notice_type: U7,
    /// ProducerType / VendorID (bytes 1-3): 1 CA, 2 switch, 3 router, 4 class manager.
    pub producer_type: U24,
    /// IssuerLID (bytes 6-7).
    pub issuer_lid: Lid,
    /// NoticeToggle (byte 8, bit 7).
    pub toggle: bool,
    /// NoticeCount (bytes 8-9, low 15 bits).
    pub count: U15,
    /// IsGeneric (byte 0 bit 7), TrapNumber/DeviceID (bytes 4-5) and DataDetails
    /// (bytes 10-63).
    pub details: NoticeDetails,
    /// IssuerGID (bytes 64-79).
    pub issuer_gid: Gid,
}

impl Notice {
    /// IsGeneric.
    pub fn is_generic(&self) -> bool {
        self.details.is_generic()
    }

    /// TrapNumber (or DeviceID).
    pub fn trap_number(&self) -> u16 {
        self.details.trap_number()
    }
}

impl Attribute for Notice {
    const ID: AttributeId = AttributeId::NOTICE;
    const SIZE: usize = 80;

    fn decode(buf: &[u8]) -> Result<Notice, DecodeError> {
        let r = Reader::new(buf);
        let word0 = r.u32(0, "is_generic")?;
        let is_generic = word0 & 0x8000_0000 != 0;
        let trap_number = r.u16(4, "trap_number")?;
        let toggle_count = r.u16(8, "notice_count")?;
        Ok(Notice {
            notice_type: U7::from_masked((word0 >> 24) as u8),
            producer_type: U24::from_masked(word0),
            issuer_lid: Lid(r.u16(6, "issuer_lid")?),
            toggle: toggle_count & 0x8000 != 0,
            count: U15::from_masked(toggle_count),
            details: NoticeDetails::from_bytes(
                is_generic,
                trap_number,
                r.bytes(10, "data_details")?,
            ),
            issuer_gid: Gid(r.bytes(64, "issuer_gid")?),
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        let generic = if self.is_generic() { 0x8000_0000 } else { 0 };
        w.u32(
            0,
            generic | (u32::from(self.notice_type.get()) << 24) | self.producer_type.get(),
        );
        w.u16(4, self.details.trap_number());
        w.u16(6, self.issuer_lid.0);
        w.u16(8, (u16::from(self.toggle) << 15) | self.count.get());
        w.bytes(10, &self.details.to_bytes());
        w.bytes(64, &self.issuer_gid.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trap_65_layout() {
        let gid = Gid([0x5A; 16]);
        let n = Notice {
            notice_type: U7::new(3).unwrap(),
            producer_type: U24::new(4).unwrap(),
            issuer_lid: Lid(0x0102),
            toggle: true,
            count: U15::new(0x0304).unwrap(),
            details: NoticeDetails::GidOutOfService(gid),
            issuer_gid: Gid([0xEE; 16]),
        };
        let mut buf = [0u8; 80];
        n.encode(&mut buf);
        assert_eq!(&buf[..10], &[0x83, 0, 0, 4, 0, 65, 1, 2, 0x83, 4]);
        assert_eq!(&buf[10..16], &[0; 6]);
        assert_eq!(&buf[16..32], &[0x5A; 16]);
        assert_eq!(Notice::decode(&buf), Ok(n));
    }

    #[test]
    fn trap_128_and_vendor() {
        let n = Notice {
            notice_type: U7::new(1).unwrap(),
            producer_type: U24::new(2).unwrap(),
            issuer_lid: Lid(7),
            toggle: false,
            count: U15::ZERO,
            details: NoticeDetails::LinkStateChange(Lid(0xBEEF)),
            issuer_gid: Gid::default(),
        };
        let mut buf = [0u8; 80];
        n.encode(&mut buf);
        assert_eq!(&buf[10..12], &[0xBE, 0xEF]);
        assert_eq!(Notice::decode(&buf), Ok(n));
        let v = Notice {
            details: NoticeDetails::Vendor {
                device_id: 64,
                data: [9; DATA_DETAILS_SIZE],
            },
            ..n
        };
        v.encode(&mut buf);
        assert_eq!(buf[0] & 0x80, 0);
        assert_eq!(Notice::decode(&buf), Ok(v));
    }
}
