//! The 24-byte common MAD header and the names of its code points.
//!
//! Method, class and attribute are newtypes over their wire integer rather than closed
//! enums: every value can arrive, and a debugging tool must show unknown ones too.

use crate::error::DecodeError;
use crate::wire::{invalid, Reader, Writer};
use core::fmt;

/// Size of every MAD handled here (UD QP0/QP1 MADs and the CM/vendor MADs).
pub const MAD_SIZE: usize = 256;
/// Size of the common MAD header.
pub const MAD_HEADER_SIZE: usize = 24;
/// The only BaseVersion of InfiniBand MADs.
pub const BASE_VERSION: u8 = 1;

/// A management class (MgmtClass, byte 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MgmtClass(pub u8);

impl MgmtClass {
    /// Subnet management, LID routed.
    pub const SUBN_LID_ROUTED: MgmtClass = MgmtClass(0x01);
    /// Subnet administration (the SA).
    pub const SUBN_ADM: MgmtClass = MgmtClass(0x03);
    /// Performance management.
    pub const PERF: MgmtClass = MgmtClass(0x04);
    /// Communication management (REQ/REP/LAP/APR/MRA...).
    pub const CM: MgmtClass = MgmtClass(0x07);
    /// Subnet management, directed route.
    pub const SUBN_DIRECTED_ROUTE: MgmtClass = MgmtClass(0x81);

    /// Whether this is a vendor class of range 2 (0x30-0x4F), the range that carries an
    /// OUI and may use RMPP.
    pub const fn is_vendor_range2(self) -> bool {
        matches!(self.0, 0x30..=0x4F)
    }

    /// Whether this is a subnet management (SMP) class.
    pub const fn is_smp(self) -> bool {
        matches!(self.0, 0x01 | 0x81)
    }

    /// A short name, when the class is one this crate knows.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x01 => "SubnMgmt (LID routed)",
            0x03 => "SubnAdm",
            0x04 => "Perf",
            0x07 => "CM",
            0x81 => "SubnMgmt (directed route)",
            0x30..=0x4F => "Vendor (OUI)",
            _ => return None,
        })
    }
}

impl fmt::Display for MgmtClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x}", self.0)
    }
}

/// A MAD method (byte 3); bit 7 is the response bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Method(pub u8);

impl Method {
    /// Get.
    pub const GET: Method = Method(0x01);
    /// Set.
    pub const SET: Method = Method(0x02);
    /// Send (CM messages, vendor datagrams).
    pub const SEND: Method = Method(0x03);
    /// Trap.
    pub const TRAP: Method = Method(0x05);
    /// Report (the SA forwards a Notice to a subscriber).
    pub const REPORT: Method = Method(0x06);
    /// TrapRepress.
    pub const TRAP_REPRESS: Method = Method(0x07);
    /// GetTable (SA).
    pub const GET_TABLE: Method = Method(0x12);
    /// GetMulti (SA).
    pub const GET_MULTI: Method = Method(0x14);
    /// Delete (SA).
    pub const DELETE: Method = Method(0x15);
    /// GetResp (answers Get and Set).
    pub const GET_RESP: Method = Method(0x81);
    /// ReportResp (a subscriber acknowledges a Report; same TID).
    pub const REPORT_RESP: Method = Method(0x86);
    /// GetTableResp (SA, RMPP when longer than one MAD).
    pub const GET_TABLE_RESP: Method = Method(0x92);
    /// GetMultiResp (SA).
    pub const GET_MULTI_RESP: Method = Method(0x94);
    /// DeleteResp (SA).
    pub const DELETE_RESP: Method = Method(0x95);

    /// Whether the response bit (bit 7) is set.
    pub const fn is_response(self) -> bool {
        self.0 & 0x80 != 0
    }

    /// The response method for this request (Set is answered by GetResp).
    pub const fn response(self) -> Method {
        match self.0 {
            0x02 => Method::GET_RESP,
            m => Method(m | 0x80),
        }
    }

    /// The IBA name, when the method is a standard one.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x01 => "Get",
            0x02 => "Set",
            0x03 => "Send",
            0x05 => "Trap",
            0x06 => "Report",
            0x07 => "TrapRepress",
            0x12 => "GetTable",
            0x13 => "GetTraceTable",
            0x14 => "GetMulti",
            0x15 => "Delete",
            0x81 => "GetResp",
            0x86 => "ReportResp",
            0x92 => "GetTableResp",
            0x94 => "GetMultiResp",
            0x95 => "DeleteResp",
            _ => return None,
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x}", self.0)
    }
}

/// An attribute ID (bytes 16-17). Meaning depends on the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttributeId(pub u16);

impl AttributeId {
    /// ClassPortInfo (every class).
    pub const CLASS_PORT_INFO: AttributeId = AttributeId(0x0001);
    /// Notice (SA; also SMP traps).
    pub const NOTICE: AttributeId = AttributeId(0x0002);
    /// InformInfo (SA subscriptions). Not 0x0031, which is ServiceRecord.
    pub const INFORM_INFO: AttributeId = AttributeId(0x0003);
    /// SMInfo (SMP).
    pub const SM_INFO: AttributeId = AttributeId(0x0020);
    /// NodeRecord (SA; the same number is CM MRA and SMP NodeInfo in their classes).
    pub const NODE_RECORD: AttributeId = AttributeId(0x0011);
    /// PathRecord (SA).
    pub const PATH_RECORD: AttributeId = AttributeId(0x0035);
    /// CM REQ.
    pub const CM_REQ: AttributeId = AttributeId(0x0010);
    /// CM MRA (message receipt acknowledgement).
    pub const CM_MRA: AttributeId = AttributeId(0x0011);
    /// CM LAP (load alternate path).
    pub const CM_LAP: AttributeId = AttributeId(0x0019);
    /// CM APR (alternate path response).
    pub const CM_APR: AttributeId = AttributeId(0x001A);
}

impl fmt::Display for AttributeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// The common MAD header (IBA 13.4.3), bytes 0-23 of every MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// MgmtClass (byte 1).
    pub mgmt_class: MgmtClass,
    /// ClassVersion (byte 2): 2 for SA and CM, 1 for SMPs.
    pub class_version: u8,
    /// Method (byte 3).
    pub method: Method,
    /// Status (bytes 4-5). For directed-route SMPs bit 15 is the D (direction) bit.
    pub status: u16,
    /// ClassSpecific (bytes 6-7). For directed-route SMPs: hop pointer, hop count.
    pub class_specific: u16,
    /// TransactionID (bytes 8-15).
    pub transaction_id: u64,
    /// AttributeID (bytes 16-17).
    pub attribute_id: AttributeId,
    /// AttributeModifier (bytes 20-23).
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// A request header with status 0 and no modifier.
    pub fn new(
        mgmt_class: MgmtClass,
        class_version: u8,
        method: Method,
        transaction_id: u64,
        attribute_id: AttributeId,
    ) -> MadHeader {
        MadHeader {
            mgmt_class,
            class_version,
            method,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Decode from the first 24 bytes of `buf` (BaseVersion must be 1).
    pub fn decode(buf: &[u8]) -> Result<MadHeader, DecodeError> {
        let r = Reader::new(buf);
        let base = r.u8(0, "base_version")?;
        if base != BASE_VERSION {
            return Err(invalid("base_version", 0, base, "is not 1"));
        }
        Ok(MadHeader {
            mgmt_class: MgmtClass(r.u8(1, "mgmt_class")?),
            class_version: r.u8(2, "class_version")?,
            method: Method(r.u8(3, "method")?),
            status: r.u16(4, "status")?,
            class_specific: r.u16(6, "class_specific")?,
            transaction_id: r.u64(8, "transaction_id")?,
            attribute_id: AttributeId(r.u16(16, "attribute_id")?),
            attribute_modifier: r.u32(20, "attribute_modifier")?,
        })
    }

    /// Encode into the first 24 bytes of `buf` (reserved bytes 18-19 are zeroed).
    pub fn encode(&self, buf: &mut [u8; MAD_SIZE]) {
        let mut w = Writer::new(buf);
        w.u8(0, BASE_VERSION);
        w.u8(1, self.mgmt_class.0);
        w.u8(2, self.class_version);
        w.u8(3, self.method.0);
        w.u16(4, self.status);
        w.u16(6, self.class_specific);
        w.u64(8, self.transaction_id);
        w.u16(16, self.attribute_id.0);
        w.u16(18, 0);
        w.u32(20, self.attribute_modifier);
    }

    /// The header of a response to this request: response method, same TID, class,
    /// attribute and modifier, the given status.
    pub fn response(&self, status: u16) -> MadHeader {
        MadHeader {
            method: self.method.response(),
            status,
            ..*self
        }
    }

    /// Check the class version; `field` offsets are those of the common header.
    pub(crate) fn expect_class_version(&self, version: u8) -> Result<(), DecodeError> {
        if self.class_version != version {
            return Err(invalid(
                "class_version",
                2,
                self.class_version,
                "is not the version this class uses",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_layout() {
        let h = MadHeader {
            mgmt_class: MgmtClass::SUBN_ADM,
            class_version: 2,
            method: Method::REPORT,
            status: 0x1234,
            class_specific: 0x5678,
            transaction_id: 0x0102_0304_0506_0708,
            attribute_id: AttributeId::NOTICE,
            attribute_modifier: 0x9abc_def0,
        };
        let mut buf = [0u8; MAD_SIZE];
        h.encode(&mut buf);
        assert_eq!(
            &buf[..24],
            &[
                1, 3, 2, 6, 0x12, 0x34, 0x56, 0x78, 1, 2, 3, 4, 5, 6, 7, 8, 0, 2, 0, 0, 0x9a, 0xbc,
                0xde, 0xf0
            ]
        );
        assert_eq!(MadHeader::decode(&buf), Ok(h));
        assert_eq!(h.response(0).method, Method::REPORT_RESP);
        assert_eq!(Method::SET.response(), Method::GET_RESP);
    }

    #[test]
    fn header_errors_name_field() {
        let err = MadHeader::decode(&[2u8; 24]).unwrap_err();
        assert_eq!((err.field(), err.offset()), ("base_version", 0));
        let err = MadHeader::decode(&[1u8; 10]).unwrap_err();
        assert_eq!((err.field(), err.offset()), ("transaction_id", 8));
    }
}
