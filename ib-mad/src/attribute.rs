//! The [`Attribute`] trait shared by SA attributes, CM messages and SMP attributes.

use crate::error::DecodeError;
use crate::header::AttributeId;

/// A fixed-layout MAD attribute (or CM message) that encodes into and decodes from a
/// byte slice starting at the attribute. Error offsets are relative to that start.
pub trait Attribute: Sized {
    /// The AttributeID that names this attribute in the common MAD header.
    const ID: AttributeId;
    /// Size on the wire in bytes (for CM messages: including all private data).
    const SIZE: usize;
    /// Bytes that [`Attribute::decode`] needs at least. Equal to [`Attribute::SIZE`]
    /// except for CM messages, whose trailing private data may be cut short by a carrier
    /// with less room (a vendor-class MAD has 216 data bytes, not 232); missing private
    /// data reads as zero.
    const MIN_SIZE: usize = Self::SIZE;

    /// Decode from `buf` (at least [`Attribute::MIN_SIZE`] bytes; extra bytes ignored).
    fn decode(buf: &[u8]) -> Result<Self, DecodeError>;

    /// Encode into `buf`. Bytes past the end of `buf` are dropped (only trailing private
    /// data of CM messages can be, when `buf` is at least [`Attribute::MIN_SIZE`] long);
    /// reserved bits inside the attribute are written as zero.
    fn encode(&self, buf: &mut [u8]);
}
