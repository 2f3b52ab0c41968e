//! LAP, Load Alternate Path (CM attribute 0x0019, IBA 12.8.1): asks the peer to load
//! a new alternate path for a connection.
//!
//! Bit positions use the IBA's Byte[Bit] notation: bit 7 is the most significant bit of
//! a byte. Offsets are within the CM data (MAD byte 24 is offset 0).

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::{FlowLabel, Gid, Lid, Qpn, Sl, Timeout, U6};
use crate::wire::{Reader, Writer};

/// Private data bytes of a LAP.
pub const LAP_PRIVATE_DATA_SIZE: usize = 168;

/// LAP: the alternate path as seen from the sender (local = sender's side).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lap {
    /// LocalCommID (0-3).
    pub local_comm_id: u32,
    /// RemoteCommID (4-7).
    pub remote_comm_id: u32,
    /// RemoteQPN/EECN (12-14).
    pub remote_qpn: Qpn,
    /// RemoteCMResponseTimeout (byte 15, bits 7-3).
    pub remote_cm_response_timeout: Timeout,
    /// AlternateLocalPortLID (20-21).
    pub alt_local_lid: Lid,
    /// AlternateRemotePortLID (22-23).
    pub alt_remote_lid: Lid,
    /// AlternateLocalPortGID (24-39).
    pub alt_local_gid: Gid,
    /// AlternateRemotePortGID (40-55).
    pub alt_remote_gid: Gid,
    /// AlternateFlowLabel (bytes 56-58, upper 20 bits).
    pub alt_flow_label: FlowLabel,
    /// AlternateTrafficClass (byte 59).
    pub alt_traffic_class: u8,
    /// AlternateHopLimit (byte 60).
    pub alt_hop_limit: u8,
    /// AlternatePacketRate (byte 61, bits 5-0).
    pub alt_packet_rate: U6,
    /// AlternateSL (byte 62, bits 7-4).
    pub alt_sl: Sl,
    /// AlternateSubnetLocal (byte 62, bit 3).
    pub alt_subnet_local: bool,
    /// AlternateLocalACKTimeout (byte 63, bits 7-3).
    pub alt_local_ack_timeout: Timeout,
    /// PrivateData (64-231).
    pub private_data: [u8; LAP_PRIVATE_DATA_SIZE],
}

impl Default for Lap {
    fn default() -> Self {
        Lap {
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: Qpn::ZERO,
            remote_cm_response_timeout: Timeout::ZERO,
            alt_local_lid: Lid(0),
            alt_remote_lid: Lid(0),
            alt_local_gid: Gid::default(),
            alt_remote_gid: Gid::default(),
            alt_flow_label: FlowLabel::ZERO,
            alt_traffic_class: 0,
            alt_hop_limit: 0,
            alt_packet_rate: U6::ZERO,
            alt_sl: Sl::ZERO,
            alt_subnet_local: false,
            alt_local_ack_timeout: Timeout::ZERO,
            private_data: [0; LAP_PRIVATE_DATA_SIZE],
        }
    }
}

impl Attribute for Lap {
    const ID: AttributeId = AttributeId::CM_LAP;
    const SIZE: usize = 232;
    const MIN_SIZE: usize = 64;

    fn decode(buf: &[u8]) -> Result<Lap, DecodeError> {
        let r = Reader::new(buf);
        let qpn = r.u32(12, "remote_qpn")?;
        let b62 = r.u8(62, "alt_sl")?;
        // Fail on the last fixed byte before reading the private data, so a short
        // buffer names the field it cuts.
        let b63 = r.u8(63, "alt_local_ack_timeout")?;
        Ok(Lap {
            local_comm_id: r.u32(0, "local_comm_id")?,
            remote_comm_id: r.u32(4, "remote_comm_id")?,
            remote_qpn: Qpn::from_masked(qpn >> 8),
            remote_cm_response_timeout: Timeout::from_masked((qpn as u8) >> 3),
            alt_local_lid: Lid(r.u16(20, "alt_local_lid")?),
            alt_remote_lid: Lid(r.u16(22, "alt_remote_lid")?),
            alt_local_gid: Gid(r.bytes(24, "alt_local_gid")?),
            alt_remote_gid: Gid(r.bytes(40, "alt_remote_gid")?),
            alt_flow_label: FlowLabel::from_masked(r.u32(56, "alt_flow_label")? >> 12),
            alt_traffic_class: r.u8(59, "alt_traffic_class")?,
            alt_hop_limit: r.u8(60, "alt_hop_limit")?,
            alt_packet_rate: U6::from_masked(r.u8(61, "alt_packet_rate")?),
            alt_sl: Sl::from_masked(b62 >> 4),
            alt_subnet_local: b62 & 0x08 != 0,
            alt_local_ack_timeout: Timeout::from_masked(b63 >> 3),
            private_data: r.bytes_padded(64),
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u32(0, self.local_comm_id);
        w.u32(4, self.remote_comm_id);
        w.u32(8, 0);
        w.u32(
            12,
            (self.remote_qpn.get() << 8) | (u32::from(self.remote_cm_response_timeout.get()) << 3),
        );
        w.u32(16, 0);
        w.u16(20, self.alt_local_lid.0);
        w.u16(22, self.alt_remote_lid.0);
        w.bytes(24, &self.alt_local_gid.0);
        w.bytes(40, &self.alt_remote_gid.0);
        // Byte 59 is the traffic class; the flow label's 20 bits are followed by 4
        // reserved bits in the first three bytes.
        w.u32(
            56,
            (self.alt_flow_label.get() << 12) | u32::from(self.alt_traffic_class),
        );
        w.u8(60, self.alt_hop_limit);
        w.u8(61, self.alt_packet_rate.get());
        w.u8(
            62,
            (self.alt_sl.get() << 4) | (u8::from(self.alt_subnet_local) << 3),
        );
        w.u8(63, self.alt_local_ack_timeout.get() << 3);
        w.bytes(64, &self.private_data);
    }
}
