//! InformInfo (SA attribute 0x0003, 36 bytes): subscribe to or unsubscribe from traps.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::{Gid, Lid, Qpn, Timeout, U24};
use crate::wire::{invalid, Reader, Writer};

/// InformInfo: which notices a subscriber wants forwarded as Reports.
///
/// For generic notices (`is_generic`) `trap_number` and `producer_type` are what the
/// IBA calls TrapNumber and ProducerType; for vendor notices they carry DeviceID and
/// VendorID in the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InformInfo {
    /// GID (bytes 0-15): the port whose notices are wanted; zero for "by LID range".
    pub gid: Gid,
    /// LIDRangeBegin (16-17); 0xFFFF means all LIDs.
    pub lid_range_begin: Lid,
    /// LIDRangeEnd (18-19).
    pub lid_range_end: Lid,
    /// IsGeneric (byte 22): generic (true) or vendor-specific notices.
    pub is_generic: bool,
    /// Subscribe (byte 23): subscribe (true) or unsubscribe.
    pub subscribe: bool,
    /// Type (24-25): notice type; 0xFFFF for all.
    pub inform_type: u16,
    /// TrapNumber / DeviceID (26-27); 0xFFFF for all.
    pub trap_number: u16,
    /// QPN (bytes 28-30): where Reports go.
    pub qpn: Qpn,
    /// RespTimeValue (byte 31, low 5 bits).
    pub resp_time_value: Timeout,
    /// ProducerType / VendorID (bytes 33-35); 0xFFFFFF for all.
    pub producer_type: U24,
}

impl Attribute for InformInfo {
    const ID: AttributeId = AttributeId::INFORM_INFO;
    const SIZE: usize = 36;

    fn decode(buf: &[u8]) -> Result<InformInfo, DecodeError> {
        let r = Reader::new(buf);
        let flag = |off: usize, field: &'static str| -> Result<bool, DecodeError> {
            match r.u8(off, field)? {
                0 => Ok(false),
                1 => Ok(true),
                v => Err(invalid(field, off, v, "is not 0 or 1")),
            }
        };
        let qpn_word = r.u32(28, "qpn")?;
        Ok(InformInfo {
            gid: Gid(r.bytes(0, "gid")?),
            lid_range_begin: Lid(r.u16(16, "lid_range_begin")?),
            lid_range_end: Lid(r.u16(18, "lid_range_end")?),
            is_generic: flag(22, "is_generic")?,
            subscribe: flag(23, "subscribe")?,
            inform_type: r.u16(24, "type")?,
            trap_number: r.u16(26, "trap_number")?,
            qpn: Qpn::from_masked(qpn_word >> 8),
            resp_time_value: Timeout::from_masked(qpn_word as u8),
            producer_type: U24::from_masked(r.u32(32, "producer_type")?),
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.bytes(0, &self.gid.0);
        w.u16(16, self.lid_range_begin.0);
        w.u16(18, self.lid_range_end.0);
        w.u16(20, 0);
        w.u8(22, u8::from(self.is_generic));
        w.u8(23, u8::from(self.subscribe));
        w.u16(24, self.inform_type);
        w.u16(26, self.trap_number);
        w.u32(
            28,
            (self.qpn.get() << 8) | u32::from(self.resp_time_value.get()),
        );
        w.u32(32, self.producer_type.get());
    }
}

impl InformInfo {
    /// A subscription to generic trap `trap_number` from every LID and producer, with
    /// Reports sent to QP1 (`qpn` 1 is what OpenSM expects from ordinary clients).
    pub fn subscribe_trap(trap_number: u16, subscribe: bool) -> InformInfo {
        InformInfo {
            gid: Gid::default(),
            lid_range_begin: Lid::PERMISSIVE,
            lid_range_end: Lid(0),
            is_generic: true,
            subscribe,
            inform_type: 0xFFFF,
            trap_number,
            qpn: Qpn::from_masked(1),
            resp_time_value: Timeout::from_masked(18),
            producer_type: U24::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let info = InformInfo {
            gid: Gid([0xAA; 16]),
            lid_range_begin: Lid(0x0102),
            lid_range_end: Lid(0x0304),
            is_generic: true,
            subscribe: true,
            inform_type: 0x0506,
            trap_number: 0x0041,
            qpn: Qpn::new(0x0A0B0C).unwrap(),
            resp_time_value: Timeout::new(0x15).unwrap(),
            producer_type: U24::new(0x0D0E0F).unwrap(),
        };
        let mut buf = [0u8; 36];
        info.encode(&mut buf);
        assert_eq!(
            &buf[16..],
            &[1, 2, 3, 4, 0, 0, 1, 1, 5, 6, 0, 0x41, 0x0A, 0x0B, 0x0C, 0x15, 0, 0x0D, 0x0E, 0x0F]
        );
        assert_eq!(InformInfo::decode(&buf), Ok(info));
        buf[23] = 7;
        let err = InformInfo::decode(&buf).unwrap_err();
        assert_eq!((err.field(), err.offset()), ("subscribe", 23));
    }
}
