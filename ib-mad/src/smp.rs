//! Subnet management packets (classes 0x01 LID-routed, 0x81 directed-route) and the
//! SMInfo attribute: just what the ibsim test-bed shim needs to answer OpenSM's
//! SubnGet(SMInfo) so OpenSM treats the node as a NOT_ACTIVE, non-competing SM.
//!
//! Layout of a directed-route SMP: common header with status bit 15 = D (direction)
//! and ClassSpecific = hop pointer, hop count; M_Key 24-31; DrSLID 32-33; DrDLID 34-35;
//! SMP data 64-127; initial path 128-191; return path 192-255. A LID-routed SMP has
//! M_Key at 24 and data at 64; the rest is reserved.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::{AttributeId, MadHeader, Method, MgmtClass, MAD_SIZE};
use crate::types::{Lid, U15, U4};
use crate::wire::{invalid, Reader, Writer};

/// SMP class version.
pub const SMP_CLASS_VERSION: u8 = 1;
/// Offset of the SMP data.
pub const SMP_DATA_OFFSET: usize = 64;
/// SMP data bytes.
pub const SMP_DATA_SIZE: usize = 64;
/// MAD status "unsupported method/attribute combination" (bits 2-4 = 3), the answer
/// the shim gives to SMPs it does not serve.
pub const STATUS_UNSUPPORTED_ATTRIBUTE: u16 = 0x000C;

/// An SMP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Smp {
    /// Common header; class 0x01 or 0x81. For directed route, status bit 15 is the D
    /// bit and class_specific holds hop pointer (high byte) and hop count (low byte).
    pub header: MadHeader,
    /// M_Key (24-31).
    pub m_key: u64,
    /// DrSLID (32-33), directed route only.
    pub dr_slid: Lid,
    /// DrDLID (34-35), directed route only.
    pub dr_dlid: Lid,
    /// SMP data (64-127).
    pub data: [u8; SMP_DATA_SIZE],
    /// InitialPath (128-191), directed route only.
    pub initial_path: [u8; 64],
    /// ReturnPath (192-255), directed route only.
    pub return_path: [u8; 64],
}

impl Smp {
    /// Whether this is a directed-route SMP (class 0x81).
    pub fn is_directed_route(&self) -> bool {
        self.header.mgmt_class == MgmtClass::SUBN_DIRECTED_ROUTE
    }

    /// The D bit (directed route: set on the way back).
    pub fn direction(&self) -> bool {
        self.is_directed_route() && self.header.status & 0x8000 != 0
    }

    /// The status without the D bit for directed route.
    pub fn status(&self) -> u16 {
        if self.is_directed_route() {
            self.header.status & 0x7FFF
        } else {
            self.header.status
        }
    }

    /// Hop pointer (directed route).
    pub fn hop_pointer(&self) -> u8 {
        (self.header.class_specific >> 8) as u8
    }

    /// Hop count (directed route).
    pub fn hop_count(&self) -> u8 {
        self.header.class_specific as u8
    }

    /// The response to this request: GetResp, same TID and attribute, `status`, `data`.
    /// For directed route the D bit is set and hop pointer/count and both paths are
    /// kept as the request carried them (ibsim routes the response by them).
    pub fn response(&self, status: U15, data: [u8; SMP_DATA_SIZE]) -> Smp {
        let d_bit = if self.is_directed_route() { 0x8000 } else { 0 };
        Smp {
            header: MadHeader {
                method: Method::GET_RESP,
                status: d_bit | status.get(),
                ..self.header
            },
            data,
            ..self.clone()
        }
    }

    /// Decode a whole SMP (exactly 256 bytes, class 0x01 or 0x81, version 1).
    pub fn decode(mad: &[u8]) -> Result<Smp, DecodeError> {
        if mad.len() != MAD_SIZE {
            return Err(DecodeError::Length {
                len: mad.len(),
                expected: MAD_SIZE,
            });
        }
        let header = MadHeader::decode(mad)?;
        if !header.mgmt_class.is_smp() {
            return Err(invalid(
                "mgmt_class",
                1,
                header.mgmt_class.0,
                "is not an SMP class (0x01, 0x81)",
            ));
        }
        header.expect_class_version(SMP_CLASS_VERSION)?;
        let r = Reader::new(mad);
        let directed = header.mgmt_class == MgmtClass::SUBN_DIRECTED_ROUTE;
        let (dr_slid, dr_dlid, initial_path, return_path) = if directed {
            (
                Lid(r.u16(32, "dr_slid")?),
                Lid(r.u16(34, "dr_dlid")?),
                r.bytes(128, "initial_path")?,
                r.bytes(192, "return_path")?,
            )
        } else {
            (Lid(0), Lid(0), [0; 64], [0; 64])
        };
        Ok(Smp {
            header,
            m_key: r.u64(24, "m_key")?,
            dr_slid,
            dr_dlid,
            data: r.bytes(SMP_DATA_OFFSET, "smp_data")?,
            initial_path,
            return_path,
        })
    }

    /// Encode the whole SMP.
    pub fn encode(&self) -> [u8; MAD_SIZE] {
        let mut mad = [0u8; MAD_SIZE];
        self.header.encode(&mut mad);
        let mut w = Writer::new(&mut mad);
        w.u64(24, self.m_key);
        if self.is_directed_route() {
            w.u16(32, self.dr_slid.0);
            w.u16(34, self.dr_dlid.0);
            w.bytes(128, &self.initial_path);
            w.bytes(192, &self.return_path);
        }
        w.bytes(SMP_DATA_OFFSET, &self.data);
        mad
    }
}

/// SMState (SMInfo byte 20, low 4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SmState {
    /// 0: not active. What the shim reports so OpenSM never hands over to it.
    NotActive = 0,
    /// 1: discovering.
    Discovering = 1,
    /// 2: standby.
    Standby = 2,
    /// 3: master.
    Master = 3,
}

/// SMInfo (SMP attribute 0x0020, 24 bytes of the SMP data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SmInfo {
    /// GUID (0-7): the port GUID of the SM.
    pub guid: u64,
    /// SM_Key (8-15).
    pub sm_key: u64,
    /// ActCount (16-19).
    pub act_count: u32,
    /// Priority (byte 20, bits 7-4).
    pub priority: U4,
    /// SMState (byte 20, bits 3-0).
    pub sm_state: SmState,
}

impl SmInfo {
    /// The answer of a node that is not an SM: its port GUID, key 0, NOT_ACTIVE.
    pub fn not_active(guid: u64) -> SmInfo {
        SmInfo {
            guid,
            sm_key: 0,
            act_count: 0,
            priority: U4::ZERO,
            sm_state: SmState::NotActive,
        }
    }

    /// The 64 SMP data bytes holding this SMInfo.
    pub fn to_smp_data(&self) -> [u8; SMP_DATA_SIZE] {
        let mut data = [0u8; SMP_DATA_SIZE];
        self.encode(&mut data);
        data
    }
}

impl Attribute for SmInfo {
    const ID: AttributeId = AttributeId::SM_INFO;
    const SIZE: usize = 21;

    fn decode(buf: &[u8]) -> Result<SmInfo, DecodeError> {
        let r = Reader::new(buf);
        let b20 = r.u8(20, "sm_state")?;
        let sm_state = match b20 & 0x0F {
            0 => SmState::NotActive,
            1 => SmState::Discovering,
            2 => SmState::Standby,
            3 => SmState::Master,
            v => return Err(invalid("sm_state", 20, v, "is not an SMState (0-3)")),
        };
        Ok(SmInfo {
            guid: r.u64(0, "guid")?,
            sm_key: r.u64(8, "sm_key")?,
            act_count: r.u32(16, "act_count")?,
            priority: U4::from_masked(b20 >> 4),
            sm_state,
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u64(0, self.guid);
        w.u64(8, self.sm_key);
        w.u32(16, self.act_count);
        w.u8(20, (self.priority.get() << 4) | self.sm_state as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dr_sminfo_response() {
        let mut req = [0u8; MAD_SIZE];
        req[..8].copy_from_slice(&[1, 0x81, 1, 0x01, 0, 0, 1, 2]);
        req[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
        req[16..18].copy_from_slice(&0x0020u16.to_be_bytes());
        req[32..36].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
        req[129] = 1;
        req[193] = 3;
        let smp = Smp::decode(&req).unwrap();
        assert_eq!((smp.hop_pointer(), smp.hop_count()), (1, 2));
        let resp = smp.response(U15::ZERO, SmInfo::not_active(0xABCD).to_smp_data());
        let wire = resp.encode();
        assert_eq!(&wire[3..8], &[0x81, 0x80, 0x00, 1, 2]);
        assert_eq!(&wire[8..16], &req[8..16]);
        assert_eq!(&wire[64..72], &0xABCDu64.to_be_bytes());
        assert_eq!(wire[64 + 20], 0);
        assert_eq!(&wire[128..], &req[128..]);
        assert!(Smp::decode(&wire).unwrap().direction());
        assert_eq!(
            SmInfo::decode(&wire[64..128]),
            Ok(SmInfo::not_active(0xABCD))
        );
    }
}
