//! A flat, positional view of a decoded MAD for tools: every field with its IBA name
//! (snake_case), section, byte offset, bit position, width and value.
//!
//! `apm mad decode` prints this list; `apm mad encode` writes values back at the listed
//! positions with [`write_field`] and then decodes the result with the typed decoders,
//! so a tool can craft any MAD the codec knows without its own copy of the layouts.
//! Tests check that every listed field reads back the typed value from the encoded
//! bytes, so this view cannot drift from the codec.

use crate::cm::{ApStatus, CmBody, CmMad, MessageMraed, Req, ReqPath};
use crate::error::RangeError;
use crate::header::{MadHeader, MgmtClass};
use crate::rmpp::{RmppHeader, RmppType};
use crate::sa::{ClassAddress, InformInfo, Notice, NoticeDetails, PathRecord, SaMad, SaPayload};
use crate::smp::{SmInfo, SmState, Smp};
use crate::types::Gid;
use crate::{Attribute, Mad, MAD_SIZE};

/// A field value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// An integer field (up to 64 bits).
    Uint(u64),
    /// A GID.
    Gid(Gid),
    /// A byte string (private data, raw data, paths).
    Bytes(Vec<u8>),
}

/// One field of a MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The part of the MAD the field belongs to: `mad_header`, `rmpp_header`,
    /// `sa_header`, `vendor_header`, `smp_header`, or the attribute (`inform_info`,
    /// `notice`, `path_record`, `class_port_info`, `lap`, `apr`, `mra`, `sm_info`,
    /// `data`).
    pub section: &'static str,
    /// IBA field name in snake_case.
    pub name: &'static str,
    /// Byte offset in the MAD.
    pub offset: usize,
    /// First bit, counted from the most significant bit of the byte at `offset`.
    pub bit: u8,
    /// Width in bits.
    pub bits: u32,
    /// The value.
    pub value: FieldValue,
    /// What the value means, where it has a name (method, status, trap, ...).
    pub meaning: Option<String>,
}

struct Builder {
    out: Vec<Field>,
    section: &'static str,
    base: usize,
}

impl Builder {
    fn section(&mut self, section: &'static str, base: usize) {
        self.section = section;
        self.base = base;
    }

    fn uint(&mut self, name: &'static str, off: usize, bit: u8, bits: u32, v: impl Into<u64>) {
        self.push(name, off, bit, bits, FieldValue::Uint(v.into()), None);
    }

    fn named(
        &mut self,
        name: &'static str,
        off: usize,
        bit: u8,
        bits: u32,
        v: impl Into<u64>,
        meaning: Option<&str>,
    ) {
        let meaning = meaning.map(str::to_string);
        self.push(name, off, bit, bits, FieldValue::Uint(v.into()), meaning);
    }

    fn gid(&mut self, name: &'static str, off: usize, g: Gid) {
        self.push(name, off, 0, 128, FieldValue::Gid(g), None);
    }

    fn bytes(&mut self, name: &'static str, off: usize, b: &[u8]) {
        let bits = (b.len() * 8) as u32;
        self.push(name, off, 0, bits, FieldValue::Bytes(b.to_vec()), None);
    }

    fn push(
        &mut self,
        name: &'static str,
        off: usize,
        bit: u8,
        bits: u32,
        value: FieldValue,
        meaning: Option<String>,
    ) {
        self.out.push(Field {
            section: self.section,
            name,
            offset: self.base + off,
            bit,
            bits,
            value,
            meaning,
        });
    }
}

/// The fields of a decoded MAD, in wire order within each section.
pub fn describe(mad: &Mad) -> Vec<Field> {
    let mut b = Builder {
        out: Vec::new(),
        section: "mad_header",
        base: 0,
    };
    match mad {
        Mad::Sa(m) => sa(&mut b, m),
        Mad::Cm(m) => cm(&mut b, m),
        Mad::Vendor(v) => {
            header(&mut b, &v.header, Routing::Lid);
            rmpp(&mut b, &v.rmpp);
            b.section("vendor_header", 0);
            b.uint("oui", 37, 0, 24, v.oui.0.get());
            b.section("data", 0);
            b.bytes("vendor_data", 40, &v.data[..]);
        }
        Mad::Smp(s) => smp(&mut b, s),
        Mad::Other(o) => {
            header(&mut b, &o.header, Routing::Lid);
            b.section("data", 0);
            b.bytes("data", 24, &o.data[..]);
        }
    }
    b.out
}

/// How a MAD is routed, which decides how its header's status and class-specific
/// fields read: a directed-route SMP carries the D bit and the hop pointer and count
/// there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Routing {
    Lid,
    DirectedRoute,
}

fn header(b: &mut Builder, h: &MadHeader, routing: Routing) {
    b.section("mad_header", 0);
    b.uint("base_version", 0, 0, 8, 1u8);
    b.named("mgmt_class", 1, 0, 8, h.mgmt_class.0, h.mgmt_class.name());
    b.uint("class_version", 2, 0, 8, h.class_version);
    b.named("method", 3, 0, 8, h.method.0, h.method.name());
    if routing == Routing::DirectedRoute {
        b.uint("d", 4, 0, 1, h.status >> 15);
        b.uint("status", 4, 1, 15, h.status & 0x7FFF);
        b.uint("hop_pointer", 6, 0, 8, h.class_specific >> 8);
        b.uint("hop_count", 7, 0, 8, h.class_specific & 0xFF);
    } else {
        b.uint("status", 4, 0, 16, h.status);
        b.uint("class_specific", 6, 0, 16, h.class_specific);
    }
    b.uint("transaction_id", 8, 0, 64, h.transaction_id);
    let attr = attribute_name(h.mgmt_class, h.attribute_id.0);
    b.named("attribute_id", 16, 0, 16, h.attribute_id.0, attr);
    b.uint("attribute_modifier", 20, 0, 32, h.attribute_modifier);
}

/// The name of an attribute within a class, where this crate knows it.
pub fn attribute_name(class: MgmtClass, id: u16) -> Option<&'static str> {
    Some(match (class.0, id) {
        (_, 0x0001) => "ClassPortInfo",
        (0x03 | 0x01 | 0x81, 0x0002) => "Notice",
        (0x03, 0x0003) => "InformInfo",
        (0x03, 0x0035) => "PathRecord",
        (0x03, 0x0031) => "ServiceRecord",
        (0x01 | 0x81, 0x0020) => "SMInfo",
        (0x01 | 0x81, 0x0011) => "NodeInfo",
        (0x01 | 0x81, 0x0015) => "PortInfo",
        (0x07, 0x0010) => "REQ",
        (0x07, 0x0011) => "MRA",
        (0x07, 0x0012) => "REJ",
        (0x07, 0x0013) => "REP",
        (0x07, 0x0014) => "RTU",
        (0x07, 0x0015) => "DREQ",
        (0x07, 0x0016) => "DREP",
        (0x07, 0x0019) => "LAP",
        (0x07, 0x001A) => "APR",
        _ => return None,
    })
}

fn rmpp(b: &mut Builder, r: &RmppHeader) {
    b.section("rmpp_header", 0);
    b.uint("rmpp_version", 24, 0, 8, r.version);
    let ty = match r.rmpp_type {
        RmppType::None => "none",
        RmppType::Data => "DATA",
        RmppType::Ack => "ACK",
        RmppType::Stop => "STOP",
        RmppType::Abort => "ABORT",
    };
    b.named("rmpp_type", 25, 0, 8, r.rmpp_type as u8, Some(ty));
    b.uint("r_resp_time", 26, 0, 5, r.resp_time.get());
    let mut flags = Vec::new();
    for (set, name) in [
        (r.flags.active, "active"),
        (r.flags.first, "first"),
        (r.flags.last, "last"),
    ] {
        if set {
            flags.push(name);
        }
    }
    let bits =
        u8::from(r.flags.active) | u8::from(r.flags.first) << 1 | u8::from(r.flags.last) << 2;
    b.named("rmpp_flags", 26, 5, 3, bits, Some(&flags.join("|")));
    b.uint("rmpp_status", 27, 0, 8, r.status);
    let (d1, d2) = match r.rmpp_type {
        RmppType::Data => ("segment_number", "payload_length"),
        RmppType::Ack => ("segment_number", "new_window_last"),
        _ => ("data1", "data2"),
    };
    b.uint(d1, 28, 0, 32, r.data1);
    b.uint(d2, 32, 0, 32, r.data2);
}

fn sa(b: &mut Builder, m: &SaMad) {
    header(b, &m.header, Routing::Lid);
    rmpp(b, &m.rmpp);
    b.section("sa_header", 0);
    b.uint("sm_key", 36, 0, 64, m.sa.sm_key);
    b.uint("attribute_offset", 44, 0, 16, m.sa.attribute_offset);
    b.uint("component_mask", 48, 0, 64, m.sa.component_mask);
    match &m.payload {
        SaPayload::InformInfo(i) => inform_info(b, i),
        SaPayload::Notice(n) => notice(b, n),
        SaPayload::PathRecord(p) => path_record(b, p),
        SaPayload::ClassPortInfo(c) => {
            b.section("class_port_info", 56);
            b.uint("base_version", 0, 0, 8, c.base_version);
            b.uint("class_version", 1, 0, 8, c.class_version);
            b.uint("capability_mask", 2, 0, 16, c.capability_mask);
            b.uint("capability_mask2", 4, 0, 27, c.capability_mask2.get());
            b.uint("resp_time_value", 7, 3, 5, c.resp_time_value.get());
            address(b, 8, &c.redirect, REDIRECT);
            address(b, 40, &c.trap, TRAP);
        }
        SaPayload::Raw(raw) => {
            b.section("data", 56);
            b.bytes("sa_data", 0, &raw[..]);
        }
    }
}

fn inform_info(b: &mut Builder, i: &InformInfo) {
    b.section("inform_info", 56);
    b.gid("gid", 0, i.gid);
    b.uint("lid_range_begin", 16, 0, 16, i.lid_range_begin.0);
    b.uint("lid_range_end", 18, 0, 16, i.lid_range_end.0);
    b.uint("is_generic", 22, 0, 8, i.is_generic);
    b.uint("subscribe", 23, 0, 8, i.subscribe);
    b.uint("type", 24, 0, 16, i.inform_type);
    b.named(
        "trap_number",
        26,
        0,
        16,
        i.trap_number,
        trap_name(i.trap_number),
    );
    b.uint("qpn", 28, 0, 24, i.qpn.get());
    b.uint("resp_time_value", 31, 3, 5, i.resp_time_value.get());
    b.uint("producer_type", 33, 0, 24, i.producer_type.get());
}

fn notice(b: &mut Builder, n: &Notice) {
    b.section("notice", 56);
    b.uint("is_generic", 0, 0, 1, n.is_generic());
    b.uint("type", 0, 1, 7, n.notice_type.get());
    b.uint("producer_type", 1, 0, 24, n.producer_type.get());
    let trap = n.trap_number();
    let meaning = if n.is_generic() {
        trap_name(trap)
    } else {
        None
    };
    b.named("trap_number", 4, 0, 16, trap, meaning);
    b.uint("issuer_lid", 6, 0, 16, n.issuer_lid.0);
    b.uint("notice_toggle", 8, 0, 1, n.toggle);
    b.uint("notice_count", 8, 1, 15, n.count.get());
    match n.details {
        NoticeDetails::GidInService(g) | NoticeDetails::GidOutOfService(g) => {
            b.gid("gid_addr", 16, g)
        }
        NoticeDetails::LinkStateChange(l) => b.uint("lid_addr", 10, 0, 16, l.0),
        NoticeDetails::Generic { data, .. } | NoticeDetails::Vendor { data, .. } => {
            b.bytes("data_details", 10, &data)
        }
    }
    b.gid("issuer_gid", 64, n.issuer_gid);
}

fn path_record(b: &mut Builder, p: &PathRecord) {
    b.section("path_record", 56);
    b.uint("service_id", 0, 0, 64, p.service_id);
    b.gid("dgid", 8, p.dgid);
    b.gid("sgid", 24, p.sgid);
    b.uint("dlid", 40, 0, 16, p.dlid.0);
    b.uint("slid", 42, 0, 16, p.slid.0);
    b.uint("raw_traffic", 44, 0, 1, p.raw_traffic);
    b.uint("flow_label", 44, 4, 20, p.flow_label.get());
    b.uint("hop_limit", 47, 0, 8, p.hop_limit);
    b.uint("tclass", 48, 0, 8, p.traffic_class);
    b.uint("reversible", 49, 0, 1, p.reversible);
    b.uint("numb_path", 49, 1, 7, p.numb_path.get());
    b.uint("p_key", 50, 0, 16, p.pkey);
    b.uint("qos_class", 52, 0, 12, p.qos_class.get());
    b.uint("sl", 53, 4, 4, p.sl.get());
    b.uint("mtu_selector", 54, 0, 2, p.mtu_selector.get());
    b.uint("mtu", 54, 2, 6, p.mtu.get());
    b.uint("rate_selector", 55, 0, 2, p.rate_selector.get());
    b.uint("rate", 55, 2, 6, p.rate.get());
    b.uint(
        "packet_life_time_selector",
        56,
        0,
        2,
        p.packet_life_time_selector.get(),
    );
    b.uint("packet_life_time", 56, 2, 6, p.packet_life_time.get());
    b.uint("preference", 57, 0, 8, p.preference);
}

const REDIRECT: [&str; 9] = [
    "redirect_gid",
    "redirect_tc",
    "redirect_sl",
    "redirect_fl",
    "redirect_lid",
    "redirect_p_key",
    "",
    "redirect_qp",
    "redirect_q_key",
];
const TRAP: [&str; 9] = [
    "trap_gid",
    "trap_tc",
    "trap_sl",
    "trap_fl",
    "trap_lid",
    "trap_p_key",
    "trap_hl",
    "trap_qp",
    "trap_q_key",
];

fn address(b: &mut Builder, at: usize, a: &ClassAddress, n: [&'static str; 9]) {
    b.gid(n[0], at, a.gid);
    b.uint(n[1], at + 16, 0, 8, a.traffic_class);
    b.uint(n[2], at + 17, 0, 4, a.sl.get());
    b.uint(n[3], at + 17, 4, 20, a.flow_label.get());
    b.uint(n[4], at + 20, 0, 16, a.lid.0);
    b.uint(n[5], at + 22, 0, 16, a.pkey);
    if !n[6].is_empty() {
        b.uint(n[6], at + 24, 0, 8, a.hop_limit);
    }
    b.uint(n[7], at + 25, 0, 24, a.qp.get());
    b.uint(n[8], at + 28, 0, 32, a.qkey);
}

/// The name of a generic trap number, for the traps this project meets.
pub fn trap_name(trap: u16) -> Option<&'static str> {
    Some(match trap {
        64 => "GID in service",
        65 => "GID out of service",
        66 => "multicast group created",
        67 => "multicast group deleted",
        128 => "link state change",
        129 => "local link integrity threshold",
        130 => "excessive buffer overrun",
        131 => "flow control update watchdog",
        144 => "capability mask changed",
        145 => "system image GUID changed",
        256 => "bad M_Key",
        257 => "bad P_Key",
        258 => "bad Q_Key",
        _ => return None,
    })
}

fn cm(b: &mut Builder, m: &CmMad) {
    header(b, &m.header, Routing::Lid);
    match &m.body {
        CmBody::Lap(l) => {
            b.section("lap", 24);
            b.uint("local_comm_id", 0, 0, 32, l.local_comm_id);
            b.uint("remote_comm_id", 4, 0, 32, l.remote_comm_id);
            b.uint("remote_qpn", 12, 0, 24, l.remote_qpn.get());
            b.uint(
                "remote_cm_response_timeout",
                15,
                0,
                5,
                l.remote_cm_response_timeout.get(),
            );
            b.uint("alt_local_lid", 20, 0, 16, l.alt_local_lid.0);
            b.uint("alt_remote_lid", 22, 0, 16, l.alt_remote_lid.0);
            b.gid("alt_local_gid", 24, l.alt_local_gid);
            b.gid("alt_remote_gid", 40, l.alt_remote_gid);
            b.uint("alt_flow_label", 56, 0, 20, l.alt_flow_label.get());
            b.uint("alt_traffic_class", 59, 0, 8, l.alt_traffic_class);
            b.uint("alt_hop_limit", 60, 0, 8, l.alt_hop_limit);
            b.uint("alt_packet_rate", 61, 2, 6, l.alt_packet_rate.get());
            b.uint("alt_sl", 62, 0, 4, l.alt_sl.get());
            b.uint("alt_subnet_local", 62, 4, 1, l.alt_subnet_local);
            b.uint(
                "alt_local_ack_timeout",
                63,
                0,
                5,
                l.alt_local_ack_timeout.get(),
            );
            b.bytes("private_data", 64, &l.private_data);
        }
        CmBody::Apr(a) => {
            b.section("apr", 24);
            b.uint("local_comm_id", 0, 0, 32, a.local_comm_id);
            b.uint("remote_comm_id", 4, 0, 32, a.remote_comm_id);
            let info = a.additional_info.as_bytes();
            b.uint("additional_info_length", 8, 0, 8, info.len() as u8);
            let st: ApStatus = a.ap_status;
            b.named("ap_status", 9, 0, 8, st.code(), Some(st.description()));
            // AdditionalInfoLength bytes of it: the rest of the room holds no field (a
            // tool shows what a sender left there as reserved bits).
            b.bytes("additional_info", 12, info);
            b.bytes("private_data", 84, &a.private_data);
        }
        CmBody::Mra(m) => {
            b.section("mra", 24);
            b.uint("local_comm_id", 0, 0, 32, m.local_comm_id);
            b.uint("remote_comm_id", 4, 0, 32, m.remote_comm_id);
            let what = match m.message_mraed {
                MessageMraed::Req => "REQ",
                MessageMraed::Rep => "REP",
                MessageMraed::Lap => "LAP",
            };
            b.named("message_mraed", 8, 0, 2, m.message_mraed as u8, Some(what));
            b.uint("service_timeout", 9, 0, 5, m.service_timeout.get());
            b.bytes("private_data", 10, &m.private_data);
        }
        CmBody::Other(raw) => match Req::decode(&raw[..]) {
            Ok(req) if m.header.attribute_id == Req::ID => cm_req(b, &req),
            _ => {
                b.section("data", 24);
                b.bytes("cm_data", 0, &raw[..]);
            }
        },
    }
}

fn cm_req(b: &mut Builder, r: &Req) {
    b.section("req", 24);
    b.uint("local_comm_id", 0, 0, 32, r.local_comm_id);
    b.uint("service_id", 8, 0, 64, r.service_id);
    b.uint("local_ca_guid", 16, 0, 64, r.local_ca_guid);
    b.uint("local_q_key", 28, 0, 32, r.local_q_key);
    b.uint("local_qpn", 32, 0, 24, r.local_qpn.get());
    b.uint("responder_resources", 35, 0, 8, r.responder_resources);
    b.uint("local_eecn", 36, 0, 24, r.local_eecn.get());
    b.uint("initiator_depth", 39, 0, 8, r.initiator_depth);
    b.uint("remote_eecn", 40, 0, 24, r.remote_eecn.get());
    b.uint(
        "remote_cm_response_timeout",
        43,
        0,
        5,
        r.remote_cm_response_timeout.get(),
    );
    b.uint(
        "transport_service_type",
        43,
        5,
        2,
        r.transport_service_type.get(),
    );
    b.uint(
        "end_to_end_flow_control",
        43,
        7,
        1,
        r.end_to_end_flow_control,
    );
    b.uint("starting_psn", 44, 0, 24, r.starting_psn.get());
    b.uint(
        "local_cm_response_timeout",
        47,
        0,
        5,
        r.local_cm_response_timeout.get(),
    );
    b.uint("retry_count", 47, 5, 3, r.retry_count.get());
    b.uint("partition_key", 48, 0, 16, r.partition_key);
    b.uint(
        "path_packet_payload_mtu",
        50,
        0,
        4,
        r.path_packet_payload_mtu.get(),
    );
    b.uint("rdc_exists", 50, 4, 1, r.rdc_exists);
    b.uint("rnr_retry_count", 50, 5, 3, r.rnr_retry_count.get());
    b.uint("max_cm_retries", 51, 0, 4, r.max_cm_retries.get());
    b.uint("srq", 51, 4, 1, r.srq);
    b.uint(
        "extended_transport_type",
        51,
        5,
        3,
        r.extended_transport_type.get(),
    );
    req_path(b, 52, &r.primary, &REQ_PRIMARY);
    req_path(b, 96, &r.alternate, &REQ_ALTERNATE);
    b.uint("sap_supported", 139, 5, 1, r.sap_supported);
    b.bytes("private_data", 140, &r.private_data);
}

const REQ_PRIMARY: [&str; 11] = [
    "primary_local_port_lid",
    "primary_remote_port_lid",
    "primary_local_port_gid",
    "primary_remote_port_gid",
    "primary_flow_label",
    "primary_packet_rate",
    "primary_traffic_class",
    "primary_hop_limit",
    "primary_sl",
    "primary_subnet_local",
    "primary_local_ack_timeout",
];
const REQ_ALTERNATE: [&str; 11] = [
    "alternate_local_port_lid",
    "alternate_remote_port_lid",
    "alternate_local_port_gid",
    "alternate_remote_port_gid",
    "alternate_flow_label",
    "alternate_packet_rate",
    "alternate_traffic_class",
    "alternate_hop_limit",
    "alternate_sl",
    "alternate_subnet_local",
    "alternate_local_ack_timeout",
];

fn req_path(b: &mut Builder, at: usize, p: &ReqPath, n: &[&'static str; 11]) {
    b.uint(n[0], at, 0, 16, p.local_lid.0);
    b.uint(n[1], at + 2, 0, 16, p.remote_lid.0);
    b.gid(n[2], at + 4, p.local_gid);
    b.gid(n[3], at + 20, p.remote_gid);
    b.uint(n[4], at + 36, 0, 20, p.flow_label.get());
    b.uint(n[5], at + 39, 2, 6, p.packet_rate.get());
    b.uint(n[6], at + 40, 0, 8, p.traffic_class);
    b.uint(n[7], at + 41, 0, 8, p.hop_limit);
    b.uint(n[8], at + 42, 0, 4, p.sl.get());
    b.uint(n[9], at + 42, 4, 1, p.subnet_local);
    b.uint(n[10], at + 43, 0, 5, p.local_ack_timeout.get());
}

fn smp(b: &mut Builder, s: &Smp) {
    let dr = s.is_directed_route();
    let routing = if dr {
        Routing::DirectedRoute
    } else {
        Routing::Lid
    };
    header(b, &s.header, routing);
    b.section("smp_header", 0);
    b.uint("m_key", 24, 0, 64, s.m_key);
    if dr {
        b.uint("dr_slid", 32, 0, 16, s.dr_slid.0);
        b.uint("dr_dlid", 34, 0, 16, s.dr_dlid.0);
    }
    match SmInfo::decode(&s.data) {
        Ok(info) if s.header.attribute_id == SmInfo::ID && s.data[21..].iter().all(|x| *x == 0) => {
            b.section("sm_info", 64);
            b.uint("guid", 0, 0, 64, info.guid);
            b.uint("sm_key", 8, 0, 64, info.sm_key);
            b.uint("act_count", 16, 0, 32, info.act_count);
            b.uint("priority", 20, 0, 4, info.priority.get());
            let st = match info.sm_state {
                SmState::NotActive => "NOT_ACTIVE",
                SmState::Discovering => "DISCOVERING",
                SmState::Standby => "STANDBY",
                SmState::Master => "MASTER",
            };
            b.named("sm_state", 20, 4, 4, info.sm_state as u8, Some(st));
        }
        _ => {
            b.section("data", 0);
            b.bytes("smp_data", 64, &s.data);
        }
    }
    if dr {
        b.section("smp_header", 0);
        b.bytes("initial_path", 128, &s.initial_path);
        b.bytes("return_path", 192, &s.return_path);
    }
}

/// Write `value` into `mad` at the position of `field` (its offset, bit and width).
/// Fails when the value needs more bits than the field has, or is of the wrong kind.
pub fn write_field(
    mad: &mut [u8; MAD_SIZE],
    field: &Field,
    value: &FieldValue,
) -> Result<(), RangeError> {
    let start = field.offset * 8 + usize::from(field.bit);
    let width = field.bits as usize;
    let range = |what: &'static str, v: u64, max: u64| RangeError {
        what,
        value: v,
        max,
    };
    if start + width > MAD_SIZE * 8 {
        return Err(range(
            field.name,
            width as u64,
            (MAD_SIZE * 8 - start) as u64,
        ));
    }
    let bits: Vec<bool> = match value {
        FieldValue::Uint(v) => {
            let max = if width >= 64 {
                u64::MAX
            } else {
                (1u64 << width) - 1
            };
            if width > 64 || *v > max {
                return Err(range(field.name, *v, max));
            }
            (0..width).rev().map(|i| (v >> i) & 1 == 1).collect()
        }
        FieldValue::Gid(g) => {
            bytes_to_bits(&g.0, width).ok_or(range(field.name, 128, width as u64))?
        }
        FieldValue::Bytes(b) => {
            bytes_to_bits(b, width).ok_or(range(field.name, (b.len() * 8) as u64, width as u64))?
        }
    };
    for (i, bit) in bits.into_iter().enumerate() {
        let pos = start + i;
        let mask = 0x80u8 >> (pos % 8);
        if bit {
            mad[pos / 8] |= mask;
        } else {
            mad[pos / 8] &= !mask;
        }
    }
    Ok(())
}

/// Bits of `b`, padded with zero to `width`; `None` when `b` is longer.
fn bytes_to_bits(b: &[u8], width: usize) -> Option<Vec<bool>> {
    if b.len() * 8 > width {
        return None;
    }
    let mut bits: Vec<bool> = b
        .iter()
        .flat_map(|x| (0..8).rev().map(move |i| (x >> i) & 1 == 1))
        .collect();
    bits.resize(width, false);
    Some(bits)
}

/// Read the value at `field`'s position from `mad`, as an integer (fields up to 64
/// bits) or bytes: what [`write_field`] writes. Used to check the view against the
/// codec.
pub fn read_field(mad: &[u8; MAD_SIZE], field: &Field) -> FieldValue {
    let start = field.offset * 8 + usize::from(field.bit);
    let width = field.bits as usize;
    let bit = |pos: usize| {
        mad.get(pos / 8)
            .is_some_and(|b| b & (0x80 >> (pos % 8)) != 0)
    };
    match field.value {
        FieldValue::Uint(_) => {
            FieldValue::Uint((0..width).fold(0u64, |acc, i| (acc << 1) | u64::from(bit(start + i))))
        }
        _ => {
            let bytes: Vec<u8> = (0..width / 8)
                .map(|j| (0..8).fold(0u8, |acc, i| (acc << 1) | u8::from(bit(start + j * 8 + i))))
                .collect();
            match field.value {
                FieldValue::Gid(_) => {
                    let mut g = [0u8; 16];
                    let n = bytes.len().min(16);
                    g[..n].copy_from_slice(&bytes[..n]);
                    FieldValue::Gid(Gid(g))
                }
                _ => FieldValue::Bytes(bytes),
            }
        }
    }
}
