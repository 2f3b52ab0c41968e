//! Bounds-checked big-endian reads and writes: the only place that indexes buffers.
//!
//! Every read returns a [`DecodeError`] naming the field instead of panicking, so the
//! decoders above stay panic-free whatever bytes arrive. Writes go into buffers whose
//! size the encoder chose, at offsets fixed by the layout.

use crate::error::DecodeError;

/// A read-only view of bytes; errors report offsets relative to its start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn bytes<const N: usize>(
        &self,
        offset: usize,
        field: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        let end = offset.checked_add(N);
        match end.and_then(|end| self.buf.get(offset..end)) {
            Some(slice) => {
                let mut out = [0u8; N];
                out.copy_from_slice(slice);
                Ok(out)
            }
            None => Err(DecodeError::Truncated {
                field,
                offset,
                len: self.buf.len(),
            }),
        }
    }

    /// Up to `N` bytes from `offset`, zero-filled past the end of the buffer: for
    /// trailing private data whose room depends on the carrier (CM class or vendor).
    pub(crate) fn bytes_padded<const N: usize>(&self, offset: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(rest) = self.buf.get(offset..) {
            let n = rest.len().min(N);
            out[..n].copy_from_slice(&rest[..n]);
        }
        out
    }

    pub(crate) fn u8(&self, offset: usize, field: &'static str) -> Result<u8, DecodeError> {
        self.bytes::<1>(offset, field).map(|b| b[0])
    }

    pub(crate) fn u16(&self, offset: usize, field: &'static str) -> Result<u16, DecodeError> {
        self.bytes(offset, field).map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&self, offset: usize, field: &'static str) -> Result<u32, DecodeError> {
        self.bytes(offset, field).map(u32::from_be_bytes)
    }

    pub(crate) fn u64(&self, offset: usize, field: &'static str) -> Result<u64, DecodeError> {
        self.bytes(offset, field).map(u64::from_be_bytes)
    }
}

/// Writes into a buffer at fixed offsets; writes past the end are dropped, which the
/// encoders never do (their buffers are sized by the layout) and the tests check.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf }
    }

    pub(crate) fn bytes(&mut self, offset: usize, data: &[u8]) {
        let n = self.buf.len().saturating_sub(offset).min(data.len());
        if let Some(dst) = self.buf.get_mut(offset..offset + n) {
            dst.copy_from_slice(&data[..n]);
        }
    }

    pub(crate) fn u8(&mut self, offset: usize, v: u8) {
        self.bytes(offset, &[v]);
    }

    pub(crate) fn u16(&mut self, offset: usize, v: u16) {
        self.bytes(offset, &v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, offset: usize, v: u32) {
        self.bytes(offset, &v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, offset: usize, v: u64) {
        self.bytes(offset, &v.to_be_bytes());
    }
}

/// An `Invalid` error for `value` in `field` at `offset`.
pub(crate) fn invalid(
    field: &'static str,
    offset: usize,
    value: impl Into<u64>,
    reason: &'static str,
) -> DecodeError {
    DecodeError::Invalid {
        field,
        offset,
        value: value.into(),
        reason,
    }
}
