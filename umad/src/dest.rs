//! Where a MAD goes: [`Dest`] (LID, QP, Q_Key, SL) and the QP1 Q_Key. A leaf: the
//! transport sends to a `Dest` and the ibsim test-bed shim answers SMPs with one, and
//! neither needs the other for it.

use crate::ffi::RecvAddr;

/// The well-known Q_Key of QP1 (GSI).
pub const QP1_QKEY: u32 = 0x8001_0000;

/// Where to send a MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// Destination LID (0xFFFF for directed-route SMPs).
    pub lid: u16,
    /// Destination QP (0 SMI, 1 GSI).
    pub qpn: u32,
    /// Q_Key (QP1: [`QP1_QKEY`]; QP0: 0).
    pub qkey: u32,
    /// Service level.
    pub sl: u8,
}

impl Dest {
    /// QP1 of `lid` on SL `sl`.
    pub const fn gsi(lid: u16, sl: u8) -> Dest {
        Dest {
            lid,
            qpn: 1,
            qkey: QP1_QKEY,
            sl,
        }
    }

    /// Reply to the sender of a received MAD (same QP, LID and SL).
    pub fn reply_to(src: &RecvAddr) -> Dest {
        Dest {
            lid: src.lid,
            qpn: src.qpn,
            qkey: if src.qpn == 0 { 0 } else { QP1_QKEY },
            sl: src.sl,
        }
    }
}
