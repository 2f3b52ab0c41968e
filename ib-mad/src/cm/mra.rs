//! MRA, Message Receipt Acknowledgement (CM attribute 0x0011, IBA 12.6.6): "received,
//! the answer will take longer". A LAP receiver may send it before the APR.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::Timeout;
use crate::wire::{invalid, Reader, Writer};

/// Private data bytes of an MRA.
pub const MRA_PRIVATE_DATA_SIZE: usize = 222;

/// MessageMRAed (byte 8, bits 7-6): which message the MRA is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageMraed {
    /// 0: a REQ.
    Req = 0,
    /// 1: a REP.
    Rep = 1,
    /// 2: a LAP.
    Lap = 2,
}

/// MRA.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mra {
    /// LocalCommID (0-3).
    pub local_comm_id: u32,
    /// RemoteCommID (4-7).
    pub remote_comm_id: u32,
    /// MessageMRAed (byte 8, bits 7-6).
    pub message_mraed: MessageMraed,
    /// ServiceTimeout (byte 9, bits 7-3): how long the sender should now wait.
    pub service_timeout: Timeout,
    /// PrivateData (10-231).
    pub private_data: [u8; MRA_PRIVATE_DATA_SIZE],
}

impl Mra {
    /// An MRA for a LAP, with no private data.
    pub fn for_lap(local_comm_id: u32, remote_comm_id: u32, service_timeout: Timeout) -> Mra {
        Mra {
            local_comm_id,
            remote_comm_id,
            message_mraed: MessageMraed::Lap,
            service_timeout,
            private_data: [0; MRA_PRIVATE_DATA_SIZE],
        }
    }
}

impl Attribute for Mra {
    const ID: AttributeId = AttributeId::CM_MRA;
    const SIZE: usize = 232;
    const MIN_SIZE: usize = 10;

    fn decode(buf: &[u8]) -> Result<Mra, DecodeError> {
        let r = Reader::new(buf);
        let b8 = r.u8(8, "message_mraed")?;
        let message_mraed = match b8 >> 6 {
            0 => MessageMraed::Req,
            1 => MessageMraed::Rep,
            2 => MessageMraed::Lap,
            v => {
                return Err(invalid(
                    "message_mraed",
                    8,
                    v,
                    "is reserved (0 REQ, 1 REP, 2 LAP)",
                ))
            }
        };
        Ok(Mra {
            local_comm_id: r.u32(0, "local_comm_id")?,
            remote_comm_id: r.u32(4, "remote_comm_id")?,
            message_mraed,
            service_timeout: Timeout::from_masked(r.u8(9, "service_timeout")? >> 3),
            private_data: r.bytes_padded(10),
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u32(0, self.local_comm_id);
        w.u32(4, self.remote_comm_id);
        w.u8(8, (self.message_mraed as u8) << 6);
        w.u8(9, self.service_timeout.get() << 3);
        w.bytes(10, &self.private_data);
    }
}
