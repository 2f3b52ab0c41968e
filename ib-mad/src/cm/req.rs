//! REQ, Request for Communication (CM attribute 0x0010, IBA 12.6.5): the message that
//! opens a connection, with its primary and (optional) alternate path. ib-mad encodes it
//! so tools and tests can craft a connection with an alternate path, and so its layout
//! is proven against tshark like the SA attributes.

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::{FlowLabel, Gid, Lid, Qpn, Sl, Timeout, U2, U24, U3, U4, U6};
use crate::wire::{Reader, Writer};

/// Private data bytes of a REQ.
pub const REQ_PRIVATE_DATA_SIZE: usize = 92;

/// One path of a REQ (primary at byte 52, alternate at byte 96 of the CM data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReqPath {
    /// Local port LID.
    pub local_lid: Lid,
    /// Remote port LID.
    pub remote_lid: Lid,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: FlowLabel,
    /// Packet rate (6 bits).
    pub packet_rate: U6,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level.
    pub sl: Sl,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: Timeout,
}

impl ReqPath {
    /// Decode the path at `at`; `n` names its fields (primary or alternate).
    fn decode(r: &Reader<'_>, at: usize, n: &[&'static str; 8]) -> Result<ReqPath, DecodeError> {
        let b42 = r.u8(at + 42, n[6])?;
        Ok(ReqPath {
            local_lid: Lid(r.u16(at, n[0])?),
            remote_lid: Lid(r.u16(at + 2, n[1])?),
            local_gid: Gid(r.bytes(at + 4, n[2])?),
            remote_gid: Gid(r.bytes(at + 20, n[3])?),
            flow_label: FlowLabel::from_masked(r.u32(at + 36, n[4])? >> 12),
            packet_rate: U6::from_masked(r.u8(at + 39, n[5])?),
            traffic_class: r.u8(at + 40, n[5])?,
            hop_limit: r.u8(at + 41, n[5])?,
            sl: Sl::from_masked(b42 >> 4),
            subnet_local: b42 & 0x08 != 0,
            local_ack_timeout: Timeout::from_masked(r.u8(at + 43, n[7])? >> 3),
        })
    }

    /// Encode; `last_bits` is the low 3 bits of the path's last byte (SAP supported in
    /// the alternate path, reserved in the primary).
    fn encode(&self, w: &mut Writer<'_>, at: usize, last_bits: u8) {
        w.u16(at, self.local_lid.0);
        w.u16(at + 2, self.remote_lid.0);
        w.bytes(at + 4, &self.local_gid.0);
        w.bytes(at + 20, &self.remote_gid.0);
        w.u32(
            at + 36,
            (self.flow_label.get() << 12) | u32::from(self.packet_rate.get()),
        );
        w.u8(at + 40, self.traffic_class);
        w.u8(at + 41, self.hop_limit);
        w.u8(
            at + 42,
            (self.sl.get() << 4) | (u8::from(self.subnet_local) << 3),
        );
        w.u8(at + 43, (self.local_ack_timeout.get() << 3) | last_bits);
    }
}

const PRIMARY: [&str; 8] = [
    "primary_local_port_lid",
    "primary_remote_port_lid",
    "primary_local_port_gid",
    "primary_remote_port_gid",
    "primary_flow_label",
    "primary_packet_rate",
    "primary_sl",
    "primary_local_ack_timeout",
];
const ALTERNATE: [&str; 8] = [
    "alternate_local_port_lid",
    "alternate_remote_port_lid",
    "alternate_local_port_gid",
    "alternate_remote_port_gid",
    "alternate_flow_label",
    "alternate_packet_rate",
    "alternate_sl",
    "alternate_local_ack_timeout",
];

/// REQ.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Req {
    /// LocalCommID (0-3).
    pub local_comm_id: u32,
    /// ServiceID (8-15).
    pub service_id: u64,
    /// LocalCAGUID (16-23).
    pub local_ca_guid: u64,
    /// LocalQ_Key (28-31).
    pub local_q_key: u32,
    /// LocalQPN (32-34).
    pub local_qpn: Qpn,
    /// ResponderResources (35).
    pub responder_resources: u8,
    /// LocalEECN (36-38).
    pub local_eecn: U24,
    /// InitiatorDepth (39).
    pub initiator_depth: u8,
    /// RemoteEECN (40-42).
    pub remote_eecn: U24,
    /// RemoteCMResponseTimeout (byte 43, bits 7-3).
    pub remote_cm_response_timeout: Timeout,
    /// TransportServiceType (byte 43, bits 2-1).
    pub transport_service_type: U2,
    /// EndToEndFlowControl (byte 43, bit 0).
    pub end_to_end_flow_control: bool,
    /// StartingPSN (44-46).
    pub starting_psn: U24,
    /// LocalCMResponseTimeout (byte 47, bits 7-3).
    pub local_cm_response_timeout: Timeout,
    /// RetryCount (byte 47, bits 2-0).
    pub retry_count: U3,
    /// PartitionKey (48-49).
    pub partition_key: u16,
    /// PathPacketPayloadMTU (byte 50, bits 7-4).
    pub path_packet_payload_mtu: U4,
    /// RDCExists (byte 50, bit 3).
    pub rdc_exists: bool,
    /// RNRRetryCount (byte 50, bits 2-0).
    pub rnr_retry_count: U3,
    /// MaxCMRetries (byte 51, bits 7-4).
    pub max_cm_retries: U4,
    /// SRQ (byte 51, bit 3).
    pub srq: bool,
    /// ExtendedTransportType (byte 51, bits 2-0).
    pub extended_transport_type: U3,
    /// Primary path (52-95).
    pub primary: ReqPath,
    /// Alternate path (96-139); all zero when there is none.
    pub alternate: ReqPath,
    /// SAPSupported (byte 139, bit 2).
    pub sap_supported: bool,
    /// PrivateData (140-231).
    pub private_data: [u8; REQ_PRIVATE_DATA_SIZE],
}

impl Default for Req {
    fn default() -> Self {
        Req {
            local_comm_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_q_key: 0,
            local_qpn: Qpn::ZERO,
            responder_resources: 0,
            local_eecn: U24::ZERO,
            initiator_depth: 0,
            remote_eecn: U24::ZERO,
            remote_cm_response_timeout: Timeout::ZERO,
            transport_service_type: U2::ZERO,
            end_to_end_flow_control: false,
            starting_psn: U24::ZERO,
            local_cm_response_timeout: Timeout::ZERO,
            retry_count: U3::ZERO,
            partition_key: 0,
            path_packet_payload_mtu: U4::ZERO,
            rdc_exists: false,
            rnr_retry_count: U3::ZERO,
            max_cm_retries: U4::ZERO,
            srq: false,
            extended_transport_type: U3::ZERO,
            primary: ReqPath::default(),
            alternate: ReqPath::default(),
            sap_supported: false,
            private_data: [0; REQ_PRIVATE_DATA_SIZE],
        }
    }
}

impl Req {
    /// Whether an alternate path is present (its local LID or GID is set).
    pub fn has_alternate(&self) -> bool {
        self.alternate.local_lid.0 != 0 || self.alternate.local_gid != Gid::default()
    }
}

impl Attribute for Req {
    const ID: AttributeId = AttributeId::CM_REQ;
    const SIZE: usize = 232;
    const MIN_SIZE: usize = 140;

    fn decode(buf: &[u8]) -> Result<Req, DecodeError> {
        let r = Reader::new(buf);
        // Read the last fixed byte first so a short buffer names the field it cuts.
        let b139 = r.u8(139, "sap_supported")?;
        let w32 = r.u32(32, "local_qpn")?;
        let w36 = r.u32(36, "local_eecn")?;
        let w40 = r.u32(40, "remote_eecn")?;
        let w44 = r.u32(44, "starting_psn")?;
        let b43 = w40 as u8;
        let b47 = w44 as u8;
        let b50 = r.u8(50, "path_packet_payload_mtu")?;
        let b51 = r.u8(51, "max_cm_retries")?;
        Ok(Req {
            local_comm_id: r.u32(0, "local_comm_id")?,
            service_id: r.u64(8, "service_id")?,
            local_ca_guid: r.u64(16, "local_ca_guid")?,
            local_q_key: r.u32(28, "local_q_key")?,
            local_qpn: Qpn::from_masked(w32 >> 8),
            responder_resources: w32 as u8,
            local_eecn: U24::from_masked(w36 >> 8),
            initiator_depth: w36 as u8,
            remote_eecn: U24::from_masked(w40 >> 8),
            remote_cm_response_timeout: Timeout::from_masked(b43 >> 3),
            transport_service_type: U2::from_masked(b43 >> 1),
            end_to_end_flow_control: b43 & 1 != 0,
            starting_psn: U24::from_masked(w44 >> 8),
            local_cm_response_timeout: Timeout::from_masked(b47 >> 3),
            retry_count: U3::from_masked(b47),
            partition_key: r.u16(48, "partition_key")?,
            path_packet_payload_mtu: U4::from_masked(b50 >> 4),
            rdc_exists: b50 & 0x08 != 0,
            rnr_retry_count: U3::from_masked(b50),
            max_cm_retries: U4::from_masked(b51 >> 4),
            srq: b51 & 0x08 != 0,
            extended_transport_type: U3::from_masked(b51),
            primary: ReqPath::decode(&r, 52, &PRIMARY)?,
            alternate: ReqPath::decode(&r, 96, &ALTERNATE)?,
            sap_supported: b139 & 0x04 != 0,
            private_data: r.bytes_padded(140),
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u32(0, self.local_comm_id);
        w.u32(4, 0);
        w.u64(8, self.service_id);
        w.u64(16, self.local_ca_guid);
        w.u32(24, 0);
        w.u32(28, self.local_q_key);
        w.u32(
            32,
            (self.local_qpn.get() << 8) | u32::from(self.responder_resources),
        );
        w.u32(
            36,
            (self.local_eecn.get() << 8) | u32::from(self.initiator_depth),
        );
        let b43 = (self.remote_cm_response_timeout.get() << 3)
            | (self.transport_service_type.get() << 1)
            | u8::from(self.end_to_end_flow_control);
        w.u32(40, (self.remote_eecn.get() << 8) | u32::from(b43));
        let b47 = (self.local_cm_response_timeout.get() << 3) | self.retry_count.get();
        w.u32(44, (self.starting_psn.get() << 8) | u32::from(b47));
        w.u16(48, self.partition_key);
        w.u8(
            50,
            (self.path_packet_payload_mtu.get() << 4)
                | (u8::from(self.rdc_exists) << 3)
                | self.rnr_retry_count.get(),
        );
        w.u8(
            51,
            (self.max_cm_retries.get() << 4)
                | (u8::from(self.srq) << 3)
                | self.extended_transport_type.get(),
        );
        self.primary.encode(&mut w, 52, 0);
        self.alternate
            .encode(&mut w, 96, u8::from(self.sap_supported) << 2);
        w.bytes(140, &self.private_data);
    }
}
