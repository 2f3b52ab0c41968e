//! Vendor-class MADs of range 2 (classes 0x30-0x4F): RMPP header, then a reserved byte
//! and the 24-bit OUI that says whose protocol the MAD carries, then 216 data bytes.
//!
//! cm-lap uses such a class with its own OUI where the kernel CM owns class 0x07; the
//! CM messages fit in the data with their private data cut to 216 - fixed part bytes.

use crate::error::DecodeError;
use crate::header::{AttributeId, MadHeader, Method, MgmtClass, MAD_SIZE};
use crate::rmpp::RmppHeader;
use crate::types::{Oui, U24};
use crate::wire::{invalid, Reader, Writer};

/// Offset of the OUI in the MAD (after one reserved byte at 36).
pub const VENDOR_OUI_OFFSET: usize = 37;
/// Offset of the vendor data in the MAD.
pub const VENDOR_DATA_OFFSET: usize = 40;
/// Vendor data bytes in one MAD.
pub const VENDOR_DATA_SIZE: usize = MAD_SIZE - VENDOR_DATA_OFFSET;

/// A vendor-class MAD with an OUI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorMad {
    /// Common MAD header; the class is in 0x30-0x4F.
    pub header: MadHeader,
    /// RMPP header (vendor classes of range 2 may use RMPP).
    pub rmpp: RmppHeader,
    /// OUI (bytes 37-39).
    pub oui: Oui,
    /// Data (bytes 40-255).
    pub data: Box<[u8; VENDOR_DATA_SIZE]>,
}

impl VendorMad {
    /// A vendor MAD with zero data. Fails when `class` is not in 0x30-0x4F.
    pub fn new(
        class: MgmtClass,
        class_version: u8,
        method: Method,
        transaction_id: u64,
        attribute_id: AttributeId,
        oui: Oui,
    ) -> Result<VendorMad, DecodeError> {
        if !class.is_vendor_range2() {
            return Err(invalid(
                "mgmt_class",
                1,
                class.0,
                "is not a vendor class with OUI (0x30-0x4F)",
            ));
        }
        Ok(VendorMad {
            header: MadHeader::new(class, class_version, method, transaction_id, attribute_id),
            rmpp: RmppHeader::NONE,
            oui,
            data: Box::new([0; VENDOR_DATA_SIZE]),
        })
    }

    /// Decode a whole vendor MAD (exactly 256 bytes, class 0x30-0x4F).
    pub fn decode(mad: &[u8]) -> Result<VendorMad, DecodeError> {
        if mad.len() != MAD_SIZE {
            return Err(DecodeError::Length {
                len: mad.len(),
                expected: MAD_SIZE,
            });
        }
        let header = MadHeader::decode(mad)?;
        if !header.mgmt_class.is_vendor_range2() {
            return Err(invalid(
                "mgmt_class",
                1,
                header.mgmt_class.0,
                "is not a vendor class with OUI (0x30-0x4F)",
            ));
        }
        let r = Reader::new(mad);
        let oui = r.bytes::<3>(VENDOR_OUI_OFFSET, "oui")?;
        Ok(VendorMad {
            header,
            rmpp: RmppHeader::decode(mad)?,
            oui: Oui(U24::from_masked(u32::from_be_bytes([
                0, oui[0], oui[1], oui[2],
            ]))),
            data: Box::new(r.bytes(VENDOR_DATA_OFFSET, "vendor_data")?),
        })
    }

    /// Encode the whole MAD.
    pub fn encode(&self) -> [u8; MAD_SIZE] {
        let mut mad = [0u8; MAD_SIZE];
        self.header.encode(&mut mad);
        self.rmpp.encode(&mut mad);
        let mut w = Writer::new(&mut mad);
        w.u8(36, 0);
        w.bytes(VENDOR_OUI_OFFSET, &self.oui.0.get().to_be_bytes()[1..]);
        w.bytes(VENDOR_DATA_OFFSET, &self.data[..]);
        mad
    }
}
