//! PathRecord (SA attribute 0x0035, 64 bytes) and its component-mask bits.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::{FlowLabel, Gid, Lid, Sl, U12, U2, U6, U7};
use crate::wire::{Reader, Writer};

/// ComponentMask bits for PathRecord queries (IBA 15.2.5.16).
pub mod mask {
    /// ServiceID.
    pub const SERVICE_ID: u64 = 0b11;
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// RawTraffic.
    pub const RAW_TRAFFIC: u64 = 1 << 6;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 8;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 9;
    /// TClass.
    pub const TCLASS: u64 = 1 << 10;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// NumbPath.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
    /// QoSClass.
    pub const QOS_CLASS: u64 = 1 << 14;
    /// SL.
    pub const SL: u64 = 1 << 15;
    /// MtuSelector.
    pub const MTU_SELECTOR: u64 = 1 << 16;
    /// MTU.
    pub const MTU: u64 = 1 << 17;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 18;
    /// Rate.
    pub const RATE: u64 = 1 << 19;
    /// PacketLifeTimeSelector.
    pub const PACKET_LIFE_TIME_SELECTOR: u64 = 1 << 20;
    /// PacketLifeTime.
    pub const PACKET_LIFE_TIME: u64 = 1 << 21;
    /// Preference.
    pub const PREFERENCE: u64 = 1 << 22;
}

/// PathRecord: one path between two ports, as the SA reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecord {
    /// ServiceID (bytes 0-7; reserved before IBA 1.2.1).
    pub service_id: u64,
    /// DGID (8-23).
    pub dgid: Gid,
    /// SGID (24-39).
    pub sgid: Gid,
    /// DLID (40-41).
    pub dlid: Lid,
    /// SLID (42-43).
    pub slid: Lid,
    /// RawTraffic (byte 44, bit 7).
    pub raw_traffic: bool,
    /// FlowLabel (bytes 44-47: 20 bits after 4 high bits).
    pub flow_label: FlowLabel,
    /// HopLimit (byte 47).
    pub hop_limit: u8,
    /// TClass (byte 48).
    pub traffic_class: u8,
    /// Reversible (byte 49, bit 7).
    pub reversible: bool,
    /// NumbPath (byte 49, low 7 bits).
    pub numb_path: U7,
    /// P_Key (50-51).
    pub pkey: u16,
    /// QoSClass (bytes 52-53, upper 12 bits).
    pub qos_class: U12,
    /// SL (byte 53, low 4 bits).
    pub sl: Sl,
    /// MtuSelector (byte 54, upper 2 bits).
    pub mtu_selector: U2,
    /// MTU (byte 54, low 6 bits).
    pub mtu: U6,
    /// RateSelector (byte 55, upper 2 bits).
    pub rate_selector: U2,
    /// Rate (byte 55, low 6 bits).
    pub rate: U6,
    /// PacketLifeTimeSelector (byte 56, upper 2 bits).
    pub packet_life_time_selector: U2,
    /// PacketLifeTime (byte 56, low 6 bits).
    pub packet_life_time: U6,
    /// Preference (byte 57).
    pub preference: u8,
}

impl Attribute for PathRecord {
    const ID: AttributeId = AttributeId::PATH_RECORD;
    const SIZE: usize = 64;

    fn decode(buf: &[u8]) -> Result<PathRecord, DecodeError> {
        let r = Reader::new(buf);
        let w44 = r.u32(44, "flow_label")?;
        let b49 = r.u8(49, "numb_path")?;
        let w52 = r.u16(52, "sl")?;
        let sel = |off: usize, field: &'static str| -> Result<(U2, U6), DecodeError> {
            let b = r.u8(off, field)?;
            Ok((U2::from_masked(b >> 6), U6::from_masked(b)))
        };
        let (mtu_selector, mtu) = sel(54, "mtu")?;
        let (rate_selector, rate) = sel(55, "rate")?;
        let (packet_life_time_selector, packet_life_time) = sel(56, "packet_life_time")?;
        Ok(PathRecord {
            service_id: r.u64(0, "service_id")?,
            dgid: Gid(r.bytes(8, "dgid")?),
            sgid: Gid(r.bytes(24, "sgid")?),
            dlid: Lid(r.u16(40, "dlid")?),
            slid: Lid(r.u16(42, "slid")?),
            raw_traffic: w44 & 0x8000_0000 != 0,
            flow_label: FlowLabel::from_masked(w44 >> 8),
            hop_limit: w44 as u8,
            traffic_class: r.u8(48, "traffic_class")?,
            reversible: b49 & 0x80 != 0,
            numb_path: U7::from_masked(b49),
            pkey: r.u16(50, "pkey")?,
            qos_class: U12::from_masked(w52 >> 4),
            sl: Sl::from_masked(w52 as u8),
            mtu_selector,
            mtu,
            rate_selector,
            rate,
            packet_life_time_selector,
            packet_life_time,
            preference: r.u8(57, "preference")?,
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u64(0, self.service_id);
        w.bytes(8, &self.dgid.0);
        w.bytes(24, &self.sgid.0);
        w.u16(40, self.dlid.0);
        w.u16(42, self.slid.0);
        let raw = if self.raw_traffic { 0x8000_0000 } else { 0 };
        w.u32(
            44,
            raw | (self.flow_label.get() << 8) | u32::from(self.hop_limit),
        );
        w.u8(48, self.traffic_class);
        w.u8(49, (u8::from(self.reversible) << 7) | self.numb_path.get());
        w.u16(50, self.pkey);
        w.u16(52, (self.qos_class.get() << 4) | u16::from(self.sl.get()));
        let sel = |s: U2, v: U6| (s.get() << 6) | v.get();
        w.u8(54, sel(self.mtu_selector, self.mtu));
        w.u8(55, sel(self.rate_selector, self.rate));
        w.u8(
            56,
            sel(self.packet_life_time_selector, self.packet_life_time),
        );
        w.u8(57, self.preference);
        w.bytes(58, &[0; 6]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let pr = PathRecord {
            service_id: 0x0102030405060708,
            dgid: Gid([0xD0; 16]),
            sgid: Gid([0x50; 16]),
            dlid: Lid(0x1112),
            slid: Lid(0x1314),
            raw_traffic: true,
            flow_label: FlowLabel::new(0xABCDE).unwrap(),
            hop_limit: 0x40,
            traffic_class: 0x41,
            reversible: true,
            numb_path: U7::new(0x7E).unwrap(),
            pkey: 0xFFFF,
            qos_class: U12::new(0xABC).unwrap(),
            sl: Sl::new(0xD).unwrap(),
            mtu_selector: U2::new(2).unwrap(),
            mtu: U6::new(4).unwrap(),
            rate_selector: U2::new(1).unwrap(),
            rate: U6::new(0x10).unwrap(),
            packet_life_time_selector: U2::new(3).unwrap(),
            packet_life_time: U6::new(0x12).unwrap(),
            preference: 0x99,
        };
        let mut buf = [0u8; 64];
        pr.encode(&mut buf);
        assert_eq!(
            &buf[40..58],
            &[
                0x11, 0x12, 0x13, 0x14, 0x8A, 0xBC, 0xDE, 0x40, 0x41, 0xFE, 0xFF, 0xFF, 0xAB, 0xCD,
                0x84, 0x50, 0xD2, 0x99
            ]
        );
        assert_eq!(PathRecord::decode(&buf), Ok(pr));
    }
}
