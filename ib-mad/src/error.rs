//! Typed errors: every decode failure names the field and its byte offset in the MAD.
//!
//! Offsets are absolute within the 256-byte MAD when a whole MAD is decoded, and
//! relative to the start of the attribute when an attribute is decoded on its own
//! (for instance a PathRecord taken from a reassembled RMPP table).

/// Why bytes could not be decoded as a MAD or attribute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The buffer ends before the end of a field.
    #[error("{field} at byte {offset}: the buffer ends at byte {len}")]
    Truncated {
        /// IBA name of the field (snake_case) that does not fit.
        field: &'static str,
        /// Byte offset where the field starts.
        offset: usize,
        /// Length of the buffer that was given.
        len: usize,
    },
    /// The buffer is not exactly one MAD long.
    #[error("mad at byte 0: a MAD is exactly {expected} bytes, got {len}")]
    Length {
        /// Length of the buffer that was given.
        len: usize,
        /// The length a MAD must have.
        expected: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("{field} at byte {offset}: value {value:#x} {reason}")]
    Invalid {
        /// IBA name of the field (snake_case).
        field: &'static str,
        /// Byte offset of the byte holding the field (its first byte when wider).
        offset: usize,
        /// The value found on the wire.
        value: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl DecodeError {
    /// The IBA name (snake_case) of the field that failed.
    pub fn field(&self) -> &'static str {
        match self {
            DecodeError::Truncated { field, .. } | DecodeError::Invalid { field, .. } => field,
            DecodeError::Length { .. } => "mad",
        }
    }

    /// The byte offset of the field that failed.
    pub fn offset(&self) -> usize {
        match self {
            DecodeError::Truncated { offset, .. } | DecodeError::Invalid { offset, .. } => *offset,
            DecodeError::Length { .. } => 0,
        }
    }

    /// The same error with its offset moved by `base`: attributes decode with offsets
    /// relative to their own start, and the MAD decoder adds where they sit.
    pub(crate) fn shifted(self, base: usize) -> Self {
        match self {
            DecodeError::Truncated { field, offset, len } => DecodeError::Truncated {
                field,
                offset: offset + base,
                len: len + base,
            },
            DecodeError::Invalid {
                field,
                offset,
                value,
                reason,
            } => DecodeError::Invalid {
                field,
                offset: offset + base,
                value,
                reason,
            },
            other => other,
        }
    }
}

/// A value does not fit the field it was meant for (for instance a QPN above 24 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {value:#x} is out of range (maximum {max:#x})")]
pub struct RangeError {
    /// The type that refused the value.
    pub what: &'static str,
    /// The value offered.
    pub value: u64,
    /// The largest value the type holds.
    pub max: u64,
}
