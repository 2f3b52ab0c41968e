//! Communication management (class 0x07, version 2): the messages that carry an
//! alternate path (LAP), its answer (APR) and the "busy, wait" answer (MRA).
//!
//! [`Req`] is here too, as an attribute of its own, so a connection with an alternate
//! path can be crafted and its layout proven. The messages are [`Attribute`]s over the 232 CM data bytes, so cm-lap can put them
//! in a CM MAD ([`CmMad`]), in the data of a vendor-class MAD (216 bytes: the private
//! data is cut to fit), or in a UDP datagram.

mod apr;
mod lap;
mod mra;
mod req;

pub use apr::{AdditionalInfo, ApStatus, Apr, APR_ADDITIONAL_INFO_SIZE, APR_PRIVATE_DATA_SIZE};
pub use lap::{Lap, LAP_PRIVATE_DATA_SIZE};
pub use mra::{MessageMraed, Mra, MRA_PRIVATE_DATA_SIZE};
pub use req::{Req, ReqPath, REQ_PRIVATE_DATA_SIZE};

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::{AttributeId, MadHeader, Method, MgmtClass, MAD_HEADER_SIZE, MAD_SIZE};
use crate::wire::{Reader, Writer};

/// CM class version.
pub const CM_CLASS_VERSION: u8 = 2;
/// CM message bytes in a MAD (after the common header).
pub const CM_DATA_SIZE: usize = MAD_SIZE - MAD_HEADER_SIZE;

/// The body of a CM MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmBody {
    /// LAP (0x0019).
    Lap(Lap),
    /// APR (0x001A).
    Apr(Apr),
    /// MRA (0x0011).
    Mra(Mra),
    /// Any other CM message (REP, RTU, ...), as raw bytes. A REQ is kept here too (so
    /// this enum stays as cm-lap matches it); decode it with [`Req::decode`].
    Other(Box<[u8; CM_DATA_SIZE]>),
}

impl CmBody {
    /// The AttributeID of a typed body.
    pub fn attribute_id(&self) -> Option<AttributeId> {
        Some(match self {
            CmBody::Lap(_) => Lap::ID,
            CmBody::Apr(_) => Apr::ID,
            CmBody::Mra(_) => Mra::ID,
            CmBody::Other(_) => return None,
        })
    }
}

/// A whole CM MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// Common MAD header (class 0x07, version 2, method Send).
    pub header: MadHeader,
    /// The message.
    pub body: CmBody,
}

impl CmMad {
    /// A CM Send MAD carrying `body`, with the attribute ID that goes with it.
    pub fn new(transaction_id: u64, body: CmBody) -> CmMad {
        let attribute_id = body.attribute_id().unwrap_or(AttributeId(0));
        CmMad {
            header: MadHeader::new(
                MgmtClass::CM,
                CM_CLASS_VERSION,
                Method::SEND,
                transaction_id,
                attribute_id,
            ),
            body,
        }
    }

    /// Decode a whole CM MAD (exactly 256 bytes).
    pub fn decode(mad: &[u8]) -> Result<CmMad, DecodeError> {
        if mad.len() != MAD_SIZE {
            return Err(DecodeError::Length {
                len: mad.len(),
                expected: MAD_SIZE,
            });
        }
        let header = MadHeader::decode(mad)?;
        header.expect_class_version(CM_CLASS_VERSION)?;
        let data = Reader::new(mad).bytes::<CM_DATA_SIZE>(MAD_HEADER_SIZE, "cm_data")?;
        let at = |e: DecodeError| e.shifted(MAD_HEADER_SIZE);
        let body = match header.attribute_id {
            Lap::ID => CmBody::Lap(Lap::decode(&data).map_err(at)?),
            Apr::ID => CmBody::Apr(Apr::decode(&data).map_err(at)?),
            Mra::ID => CmBody::Mra(Mra::decode(&data).map_err(at)?),
            _ => CmBody::Other(Box::new(data)),
        };
        Ok(CmMad { header, body })
    }

    /// Encode the whole MAD.
    pub fn encode(&self) -> [u8; MAD_SIZE] {
        let mut mad = [0u8; MAD_SIZE];
        self.header.encode(&mut mad);
        let data = &mut mad[MAD_HEADER_SIZE..];
        match &self.body {
            CmBody::Lap(m) => m.encode(data),
            CmBody::Apr(m) => m.encode(data),
            CmBody::Mra(m) => m.encode(data),
            CmBody::Other(raw) => Writer::new(data).bytes(0, &raw[..]),
        }
        mad
    }
}

#[cfg(test)]
mod tests;
