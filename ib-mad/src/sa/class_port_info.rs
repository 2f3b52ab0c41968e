//! ClassPortInfo (attribute 0x0001, 72 bytes): a class agent's capabilities and its
//! redirect and trap addresses. The SA answers Get(ClassPortInfo); umad-sa reads the
//! capability mask and RespTimeValue from it.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::{FlowLabel, Gid, Lid, Qpn, Sl, Timeout, U27};
use crate::wire::{Reader, Writer};

/// The address part that redirect and trap share: TC/SL/FL, LID, P_Key, QP, Q_Key
/// (and the hop limit, trap only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassAddress {
    /// GID.
    pub gid: Gid,
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: Sl,
    /// Flow label.
    pub flow_label: FlowLabel,
    /// LID.
    pub lid: Lid,
    /// P_Key.
    pub pkey: u16,
    /// The byte above the QP: reserved for redirect, HopLimit for trap.
    pub hop_limit: u8,
    /// QP.
    pub qp: Qpn,
    /// Q_Key.
    pub qkey: u32,
}

impl ClassAddress {
    fn decode(r: &Reader<'_>, at: usize, names: [&'static str; 6]) -> Result<Self, DecodeError> {
        let tsf = r.u32(at + 16, names[1])?;
        let qp = r.u32(at + 24, names[4])?;
        Ok(ClassAddress {
            gid: Gid(r.bytes(at, names[0])?),
            traffic_class: (tsf >> 24) as u8,
            sl: Sl::from_masked((tsf >> 20) as u8),
            flow_label: FlowLabel::from_masked(tsf),
            lid: Lid(r.u16(at + 20, names[2])?),
            pkey: r.u16(at + 22, names[3])?,
            hop_limit: (qp >> 24) as u8,
            qp: Qpn::from_masked(qp),
            qkey: r.u32(at + 28, names[5])?,
        })
    }

    fn encode(&self, w: &mut Writer<'_>, at: usize) {
        w.bytes(at, &self.gid.0);
        w.u32(
            at + 16,
            (u32::from(self.traffic_class) << 24)
                | (u32::from(self.sl.get()) << 20)
                | self.flow_label.get(),
        );
        w.u16(at + 20, self.lid.0);
        w.u16(at + 22, self.pkey);
        w.u32(at + 24, (u32::from(self.hop_limit) << 24) | self.qp.get());
        w.u32(at + 28, self.qkey);
    }
}

/// ClassPortInfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassPortInfo {
    /// BaseVersion (byte 0).
    pub base_version: u8,
    /// ClassVersion (byte 1).
    pub class_version: u8,
    /// CapabilityMask (bytes 2-3).
    pub capability_mask: u16,
    /// CapabilityMask2 (bytes 4-7, upper 27 bits).
    pub capability_mask2: U27,
    /// RespTimeValue (byte 7, low 5 bits).
    pub resp_time_value: Timeout,
    /// Redirect address (bytes 8-39; its hop-limit byte is reserved).
    pub redirect: ClassAddress,
    /// Trap address (bytes 40-71).
    pub trap: ClassAddress,
}

impl Attribute for ClassPortInfo {
    const ID: AttributeId = AttributeId::CLASS_PORT_INFO;
    const SIZE: usize = 72;

    fn decode(buf: &[u8]) -> Result<ClassPortInfo, DecodeError> {
        let r = Reader::new(buf);
        let w4 = r.u32(4, "capability_mask2")?;
        let mut redirect = ClassAddress::decode(
            &r,
            8,
            [
                "redirect_gid",
                "redirect_tc",
                "redirect_lid",
                "redirect_pkey",
                "redirect_qp",
                "redirect_qkey",
            ],
        )?;
        redirect.hop_limit = 0;
        let trap = ClassAddress::decode(
            &r,
            40,
            [
                "trap_gid",
                "trap_tc",
                "trap_lid",
                "trap_pkey",
                "trap_qp",
                "trap_qkey",
            ],
        )?;
        Ok(ClassPortInfo {
            base_version: r.u8(0, "base_version")?,
            class_version: r.u8(1, "class_version")?,
            capability_mask: r.u16(2, "capability_mask")?,
            capability_mask2: U27::from_masked(w4 >> 5),
            resp_time_value: Timeout::from_masked(w4 as u8),
            redirect,
            trap,
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u8(0, self.base_version);
        w.u8(1, self.class_version);
        w.u16(2, self.capability_mask);
        w.u32(
            4,
            (self.capability_mask2.get() << 5) | u32::from(self.resp_time_value.get()),
        );
        let redirect = ClassAddress {
            hop_limit: 0,
            ..self.redirect
        };
        redirect.encode(&mut w, 8);
        self.trap.encode(&mut w, 40);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let cpi = ClassPortInfo {
            base_version: 1,
            class_version: 2,
            capability_mask: 0x0203,
            capability_mask2: U27::new(0x5A5A5A5).unwrap(),
            resp_time_value: Timeout::new(0x13).unwrap(),
            redirect: ClassAddress {
                gid: Gid([0x11; 16]),
                traffic_class: 0x21,
                sl: Sl::new(0xA).unwrap(),
                flow_label: FlowLabel::new(0xBCDEF).unwrap(),
                lid: Lid(0x2223),
                pkey: 0x2425,
                hop_limit: 0,
                qp: Qpn::new(0x262728).unwrap(),
                qkey: 0x292A2B2C,
            },
            trap: ClassAddress {
                gid: Gid([0x31; 16]),
                traffic_class: 0x41,
                sl: Sl::new(0x5).unwrap(),
                flow_label: FlowLabel::new(0x6789A).unwrap(),
                lid: Lid(0x4243),
                pkey: 0x4445,
                hop_limit: 0x46,
                qp: Qpn::new(0x474849).unwrap(),
                qkey: 0x4A4B4C4D,
            },
        };
        let mut buf = [0u8; 72];
        cpi.encode(&mut buf);
        assert_eq!(&buf[..8], &[1, 2, 2, 3, 0xB4, 0xB4, 0xB4, 0xB3]);
        assert_eq!(
            &buf[24..40],
            &[
                0x21, 0xAB, 0xCD, 0xEF, 0x22, 0x23, 0x24, 0x25, 0, 0x26, 0x27, 0x28, 0x29, 0x2A,
                0x2B, 0x2C
            ]
        );
        assert_eq!(
            &buf[56..72],
            &[
                0x41, 0x56, 0x78, 0x9A, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4A, 0x4B,
                0x4C, 0x4D
            ]
        );
        assert_eq!(ClassPortInfo::decode(&buf), Ok(cpi));
    }
}
