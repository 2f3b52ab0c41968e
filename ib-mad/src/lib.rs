//! InfiniBand management datagram (MAD) wire formats: pure encode/decode, no IO.
//!
//! This crate turns 256-byte MADs into typed values and back, for the classes the
//! apm toolkit speaks: subnet administration ([`sa`]: InformInfo, Notice, PathRecord,
//! ClassPortInfo), RMPP segmentation and reassembly ([`rmpp`]), communication
//! management ([`cm`]: LAP, APR, MRA), vendor classes with an OUI ([`vendor`]) and the
//! SMInfo subset of subnet management ([`smp`]) that the ibsim test bed needs.
//!
//! **Architecture invariants.** No IO, no clock, no `unsafe`. Decoding never panics
//! and never allocates more than a bounded amount, whatever the input: every read goes
//! through a bounds-checked reader and every failure is a [`DecodeError`] naming the
//! IBA field (in snake_case) and its byte offset. Typed values ([`types`]) cannot hold
//! what their wire field cannot carry, so encoding cannot fail or truncate silently.
//! Reserved bits are ignored on decode and written as zero.
//!
//! ```
//! use ib_mad::{Mad, sa::{SaMad, InformInfo}};
//! let set = SaMad::set_inform_info(0x42, InformInfo::subscribe_trap(65, true));
//! let wire = set.encode();
//! assert_eq!(Mad::decode(&wire).unwrap(), Mad::Sa(set));
//! ```
#![forbid(unsafe_code)]

mod attribute;
pub mod cm;
mod error;
pub mod fields;
mod header;
pub mod rmpp;
pub mod sa;
pub mod smp;
pub mod types;
pub mod vendor;
mod wire;

pub use attribute::Attribute;
pub use error::{DecodeError, RangeError};
pub use header::{
    AttributeId, MadHeader, Method, MgmtClass, BASE_VERSION, MAD_HEADER_SIZE, MAD_SIZE,
};

use cm::CmMad;
use sa::SaMad;
use smp::Smp;
use vendor::VendorMad;

/// Any MAD, decoded as far as this crate knows its class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mad {
    /// Subnet administration (class 0x03).
    Sa(SaMad),
    /// Communication management (class 0x07).
    Cm(CmMad),
    /// Vendor class with OUI (0x30-0x4F).
    Vendor(VendorMad),
    /// Subnet management (0x01, 0x81).
    Smp(Smp),
    /// Any other class: the header and the raw bytes after it.
    Other(OtherMad),
}

/// A MAD of a class this crate does not decode further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherMad {
    /// Common MAD header.
    pub header: MadHeader,
    /// Bytes 24-255.
    pub data: Box<[u8; MAD_SIZE - MAD_HEADER_SIZE]>,
}

impl Mad {
    /// Decode a whole MAD (exactly 256 bytes), choosing the decoder by class.
    pub fn decode(mad: &[u8]) -> Result<Mad, DecodeError> {
        if mad.len() != MAD_SIZE {
            return Err(DecodeError::Length {
                len: mad.len(),
                expected: MAD_SIZE,
            });
        }
        let header = MadHeader::decode(mad)?;
        Ok(match header.mgmt_class {
            MgmtClass::SUBN_ADM => Mad::Sa(SaMad::decode(mad)?),
            MgmtClass::CM => Mad::Cm(CmMad::decode(mad)?),
            c if c.is_vendor_range2() => Mad::Vendor(VendorMad::decode(mad)?),
            c if c.is_smp() => Mad::Smp(Smp::decode(mad)?),
            _ => {
                let mut data = Box::new([0u8; MAD_SIZE - MAD_HEADER_SIZE]);
                data.copy_from_slice(&mad[MAD_HEADER_SIZE..]);
                Mad::Other(OtherMad { header, data })
            }
        })
    }

    /// Encode the whole MAD.
    pub fn encode(&self) -> [u8; MAD_SIZE] {
        match self {
            Mad::Sa(m) => m.encode(),
            Mad::Cm(m) => m.encode(),
            Mad::Vendor(m) => m.encode(),
            Mad::Smp(m) => m.encode(),
            Mad::Other(m) => {
                let mut mad = [0u8; MAD_SIZE];
                m.header.encode(&mut mad);
                mad[MAD_HEADER_SIZE..].copy_from_slice(&m.data[..]);
                mad
            }
        }
    }

    /// The common MAD header.
    pub fn header(&self) -> &MadHeader {
        match self {
            Mad::Sa(m) => &m.header,
            Mad::Cm(m) => &m.header,
            Mad::Vendor(m) => &m.header,
            Mad::Smp(m) => &m.header,
            Mad::Other(m) => &m.header,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sa::{InformInfo, Notice, NoticeDetails, SaPayload};
    use crate::types::{Gid, Lid, U15, U24, U7};

    #[test]
    fn dispatch_by_class() {
        let sa = SaMad::set_inform_info(1, InformInfo::subscribe_trap(64, true)).encode();
        assert!(matches!(Mad::decode(&sa), Ok(Mad::Sa(_))));
        let mut other = sa;
        other[1] = 0x04;
        let mad = Mad::decode(&other).unwrap();
        assert!(matches!(mad, Mad::Other(_)));
        assert_eq!(mad.encode(), other);
        let err = Mad::decode(&sa[..255]).unwrap_err();
        assert_eq!(
            err,
            DecodeError::Length {
                len: 255,
                expected: 256
            }
        );
    }

    #[test]
    fn attribute_errors_have_mad_offsets() {
        let mut wire = SaMad::set_inform_info(1, InformInfo::subscribe_trap(64, true)).encode();
        wire[56 + 23] = 2;
        let err = Mad::decode(&wire).unwrap_err();
        assert_eq!((err.field(), err.offset()), ("subscribe", 79));
        assert_eq!(
            err.to_string(),
            "subscribe at byte 79: value 0x2 is not 0 or 1"
        );
    }

    #[test]
    fn report_response_keeps_tid() {
        let notice = Notice {
            notice_type: U7::from_masked(3),
            producer_type: U24::from_masked(4),
            issuer_lid: Lid(1),
            toggle: false,
            count: U15::ZERO,
            details: NoticeDetails::GidInService(Gid::new(0xfe80 << 48, 7)),
            issuer_gid: Gid::default(),
        };
        let report = SaMad::new(Method::REPORT, 0xDEAD_BEEF, SaPayload::Notice(notice));
        let resp = report.report_response();
        assert_eq!(resp.header.method, Method::REPORT_RESP);
        assert_eq!(resp.header.transaction_id, 0xDEAD_BEEF);
        assert_eq!(Mad::decode(&resp.encode()), Ok(Mad::Sa(resp)));
    }
}
