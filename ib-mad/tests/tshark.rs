//! Proof of the wire layouts against an independent decoder: Wireshark's `infiniband`
//! dissector, run as `tshark -T pdml`.
//!
//! Every message kind tshark can decode is encoded by ib-mad with distinctive values,
//! wrapped in LRH|BTH|DETH|MAD|ICRC|VCRC behind an exported-PDU header (link type 252),
//! and decoded by tshark. Three checks per packet:
//! 1. every field tshark reports inside the MAD shows the bytes ib-mad wrote at that
//!    position and size (raw `value`, or `unmaskedvalue` for bit fields);
//! 2. every field in the expectation table has the name, position, size, bit mask and
//!    value that the ib-mad typed value says;
//! 3. every field tshark reports inside the MAD is either in the table or a listed
//!    container (so a field tshark decodes is never left unchecked).
//!
//! tshark 4.0 bugs and limits are listed in [`KNOWN_DISSECTOR_ISSUES`] with reasons;
//! fields affected are still checked, against what the bug makes tshark show.
//!
//! Without tshark the test fails when `CI` is set (`cargo xtask test` installs it) and
//! is skipped with a message otherwise.

mod pdml;

use ib_mad::cm::{
    AdditionalInfo, ApStatus, Apr, CmBody, CmMad, Lap, MessageMraed, Mra, Req, ReqPath,
};
use ib_mad::rmpp::{RecvEvent, RmppHeader, RmppReceiver, RmppSender, RmppType};
use ib_mad::sa::{
    path_record, ClassPortInfo, InformInfo, Notice, NoticeDetails, PathRecord, SaMad, SaPayload,
};
use ib_mad::smp::{SmInfo, SmState, Smp};
use ib_mad::types::*;
use ib_mad::vendor::VendorMad;
use ib_mad::{Attribute, AttributeId, Mad, MadHeader, Method, MgmtClass, MAD_SIZE};
use pdml::{Field, MAD_POS};
use std::process::Command;

/// tshark 4.0 behaviour that differs from the IBA; the checks below expect it.
const KNOWN_DISSECTOR_ISSUES: &[(&str, &str)] = &[
    (
        "infiniband.rmpp.rresptime / infiniband.rmpp.rmppflags",
        "the dissector splits byte 26 as 4+4 bits; the IBA has RRespTime in bits 7-3 and \
         RMPPFlags in bits 2-0. Checked: tshark shows byte26>>4 and byte26&0xF.",
    ),
    (
        "infiniband.smpdirected.d",
        "declared with a 64-bit mask on a 1-byte item, its value is always 0. Checked: \
         position only; the D bit is checked through infiniband.smpdirected.smpstatus.",
    ),
    (
        "infiniband.pathrecord (bytes 0-7)",
        "tshark 4.0 shows PathRecord bytes 0-7 as Reserved; IBA 1.2.1 made them ServiceID. \
         Checked as raw bytes.",
    ),
    (
        "infiniband.pathrecord.sl",
        "tshark has no QoSClass field; SL is a 16-bit item with mask 0x000F. Checked; \
         QoSClass is only covered by the raw bytes.",
    ),
    (
        "infiniband.pathrecord in RMPP segments",
        "tshark decodes the data of every GetTableResp segment, and of ACK and ABORT \
         MADs, as if a PathRecord started there (and shows ACK/ABORT payload as one \
         reserved block). Checked against ib-mad's PathRecord decode of those bytes.",
    ),
    (
        "infiniband.cm.req.{prim,alt}_{flowlabel,reserved0,pktrate}",
        "the flow label is read as 32 bits from a 3-byte item (tshark shows FlowLabel>>8) \
         and the reserved bits and PacketRate are taken from the first flow-label byte \
         instead of byte 3 of the word. Checked: what that reading of ib-mad's bytes \
         gives; the true positions are checked in tests/layout_table.rs.",
    ),
    (
        "infiniband.cm.req.alt_reserved1 (byte 139)",
        "tshark names the low 3 bits of the alternate LocalACKTimeout byte Reserved; \
         bit 2 there is SAPSupported. Checked as those 3 bits.",
    ),
    (
        "infiniband.notice (IssuerGID)",
        "tshark stops the Notice at 64 bytes and does not show IssuerGID.",
    ),
    (
        "CM LAP, APR, MRA (REQ is decoded); vendor classes",
        "'Dissector Not Implemented': only the common MAD header is decoded. Their layout \
         is checked against an independent IBA table in tests/layout_table.rs.",
    ),
];

/// Containers and payload fields: no value of their own beyond their bytes, which
/// check 1 compares with the MAD.
const CONTAINERS: &[&str] = &[
    "infiniband.mad",
    "infiniband.mad.data",
    "infiniband.rmpp",
    "infiniband.rmpp.transferreddata",
    "infiniband.sa.drdlid",
    "infiniband.smplid.smpdata",
    "infiniband.smpdirected",
    "infiniband.smplid",
    "infiniband.notice.datadetails",
];

#[derive(Debug, Clone)]
enum Value {
    Uint(u64),
    Bytes(Vec<u8>),
    /// Only the position and size are checked (see KNOWN_DISSECTOR_ISSUES).
    Any,
}

#[derive(Debug, Clone)]
struct Exp {
    name: &'static str,
    offset: usize,
    size: usize,
    mask: Option<u64>,
    value: Value,
}

fn u(name: &'static str, offset: usize, size: usize, value: impl Into<u64>) -> Exp {
    Exp {
        name,
        offset,
        size,
        mask: None,
        value: Value::Uint(value.into()),
    }
}

fn bits(name: &'static str, offset: usize, size: usize, mask: u64, value: impl Into<u64>) -> Exp {
    Exp {
        name,
        offset,
        size,
        mask: Some(mask),
        value: Value::Uint(value.into()),
    }
}

fn raw(name: &'static str, offset: usize, bytes: &[u8]) -> Exp {
    Exp {
        name,
        offset,
        size: bytes.len(),
        mask: None,
        value: Value::Bytes(bytes.to_vec()),
    }
}

fn header(h: &MadHeader) -> Vec<Exp> {
    vec![
        u("infiniband.mad.baseversion", 0, 1, 1u8),
        u("infiniband.mad.mgmtclass", 1, 1, h.mgmt_class.0),
        u("infiniband.mad.classversion", 2, 1, h.class_version),
        u("infiniband.mad.method", 3, 1, h.method.0),
        u("infiniband.mad.status", 4, 2, h.status),
        u("infiniband.mad.classspecific", 6, 2, h.class_specific),
        u("infiniband.mad.transactionid", 8, 8, h.transaction_id),
        u("infiniband.mad.attributeid", 16, 2, h.attribute_id.0),
        u("infiniband.reserved", 18, 2, 0u16),
        u(
            "infiniband.mad.attributemodifier",
            20,
            4,
            h.attribute_modifier,
        ),
    ]
}

fn rmpp(r: &RmppHeader) -> Vec<Exp> {
    let b26 = (r.resp_time.get() << 3)
        | u8::from(r.flags.active)
        | (u8::from(r.flags.first) << 1)
        | (u8::from(r.flags.last) << 2);
    let (d1, d2) = match r.rmpp_type {
        RmppType::Data => (
            "infiniband.rmpp.segmentnumber",
            "infiniband.rmpp.payloadlength",
        ),
        RmppType::Ack => (
            "infiniband.rmpp.segmentnumber",
            "infiniband.rmpp.newwindowlast",
        ),
        RmppType::None => ("infiniband.rmpp.data1", "infiniband.rmpp.data2"),
        // tshark shows Data1/Data2 of STOP and ABORT as reserved.
        RmppType::Stop | RmppType::Abort => ("infiniband.reserved", "infiniband.reserved"),
    };
    vec![
        u("infiniband.rmpp.rmppversion", 24, 1, r.version),
        u("infiniband.rmpp.rmpptype", 25, 1, r.rmpp_type as u8),
        // Known issue: 4+4 split of byte 26.
        bits("infiniband.rmpp.rresptime", 26, 1, 0xF0, b26 >> 4),
        bits("infiniband.rmpp.rmppflags", 26, 1, 0x0F, b26 & 0x0F),
        u("infiniband.rmpp.rmppstatus", 27, 1, r.status),
        u(d1, 28, 4, r.data1),
        u(d2, 32, 4, r.data2),
    ]
}

fn sa_header(m: &SaMad) -> Vec<Exp> {
    vec![
        u("infiniband.sa.smkey", 36, 8, m.sa.sm_key),
        u(
            "infiniband.sa.attributeoffset",
            44,
            2,
            m.sa.attribute_offset,
        ),
        u("infiniband.reserved", 46, 2, 0u16),
        u("infiniband.sa.componentmask", 48, 8, m.sa.component_mask),
    ]
}

fn sa(m: &SaMad) -> Vec<Exp> {
    let mut e = header(&m.header);
    e.extend(rmpp(&m.rmpp));
    e.extend(sa_header(m));
    e
}

const D: usize = 56; // SA data offset in the MAD

fn inform_info(i: &InformInfo) -> Vec<Exp> {
    vec![
        raw("infiniband.informinfo.gid", D, &i.gid.0),
        u(
            "infiniband.informinfo.lidrangebegin",
            D + 16,
            2,
            i.lid_range_begin.0,
        ),
        u(
            "infiniband.informinfo.lidrangeend",
            D + 18,
            2,
            i.lid_range_end.0,
        ),
        u("infiniband.reserved", D + 20, 2, 0u16),
        u("infiniband.informinfo.isgeneric", D + 22, 1, i.is_generic),
        u("infiniband.informinfo.subscribe", D + 23, 1, i.subscribe),
        u("infiniband.informinfo.type", D + 24, 2, i.inform_type),
        u(
            "infiniband.informinfo.trapnumberdeviceid",
            D + 26,
            2,
            i.trap_number,
        ),
        u("infiniband.informinfo.qpn", D + 28, 3, i.qpn.get()),
        bits(
            "infiniband.informinfo.resptimevalue",
            D + 31,
            1,
            0x1F,
            i.resp_time_value.get(),
        ),
        u("infiniband.reserved", D + 32, 1, 0u8),
        u(
            "infiniband.informinfo.producertypevendorid",
            D + 33,
            3,
            i.producer_type.get(),
        ),
    ]
}

fn notice(n: &Notice) -> Vec<Exp> {
    let mut e = vec![
        bits("infiniband.notice.isgeneric", D, 1, 0x80, n.is_generic()),
        bits("infiniband.notice.type", D, 1, 0x7F, n.notice_type.get()),
        u(
            "infiniband.notice.producertypevendorid",
            D + 1,
            3,
            n.producer_type.get(),
        ),
        u(
            "infiniband.notice.trapnumberdeviceid",
            D + 4,
            2,
            n.trap_number(),
        ),
        u("infiniband.notice.issuerlid", D + 6, 2, n.issuer_lid.0),
        bits("infiniband.notice.noticetoggle", D + 8, 1, 0x80, n.toggle),
        bits(
            "infiniband.notice.noticecount",
            D + 8,
            2,
            0x7FFF,
            n.count.get(),
        ),
    ];
    match n.details {
        NoticeDetails::GidInService(g) | NoticeDetails::GidOutOfService(g) => {
            e.push(raw("infiniband.trap.gidaddr", D + 10 + 6, &g.0));
        }
        NoticeDetails::LinkStateChange(lid) => {
            e.push(u("infiniband.trap.lidaddr", D + 10, 2, lid.0));
        }
        _ => {}
    }
    e
}

fn path_record(p: &PathRecord) -> Vec<Exp> {
    vec![
        // Known issue: ServiceID shown as Reserved.
        u("infiniband.reserved", D, 8, p.service_id),
        raw("infiniband.pathrecord.dgid", D + 8, &p.dgid.0),
        raw("infiniband.pathrecord.sgid", D + 24, &p.sgid.0),
        u("infiniband.pathrecord.dlid", D + 40, 2, p.dlid.0),
        u("infiniband.pathrecord.slid", D + 42, 2, p.slid.0),
        bits(
            "infiniband.pathrecord.rawtraffic",
            D + 44,
            1,
            0x80,
            p.raw_traffic,
        ),
        bits(
            "infiniband.pathrecord.flowlabel",
            D + 44,
            3,
            0x0F_FFFF,
            p.flow_label.get(),
        ),
        u("infiniband.pathrecord.hoplimit", D + 47, 1, p.hop_limit),
        u("infiniband.pathrecord.tclass", D + 48, 1, p.traffic_class),
        bits(
            "infiniband.pathrecord.reversible",
            D + 49,
            1,
            0x80,
            p.reversible,
        ),
        bits(
            "infiniband.pathrecord.numbpath",
            D + 49,
            1,
            0x7F,
            p.numb_path.get(),
        ),
        u("infiniband.pathrecord.p_key", D + 50, 2, p.pkey),
        bits("infiniband.pathrecord.sl", D + 52, 2, 0x000F, p.sl.get()),
        bits(
            "infiniband.pathrecord.mtuselector",
            D + 54,
            1,
            0xC0,
            p.mtu_selector.get(),
        ),
        bits("infiniband.pathrecord.mtu", D + 54, 1, 0x3F, p.mtu.get()),
        bits(
            "infiniband.pathrecord.rateselector",
            D + 55,
            1,
            0xC0,
            p.rate_selector.get(),
        ),
        bits("infiniband.pathrecord.rate", D + 55, 1, 0x3F, p.rate.get()),
        bits(
            "infiniband.pathrecord.packetlifetimeselector",
            D + 56,
            1,
            0xC0,
            p.packet_life_time_selector.get(),
        ),
        bits(
            "infiniband.pathrecord.packetlifetime",
            D + 56,
            1,
            0x3F,
            p.packet_life_time.get(),
        ),
        u("infiniband.pathrecord.preference", D + 57, 1, p.preference),
    ]
}

fn class_port_info(c: &ClassPortInfo) -> Vec<Exp> {
    let mut e = vec![
        u("infiniband.classportinfo.baseversion", D, 1, c.base_version),
        u(
            "infiniband.classportinfo.classversion",
            D + 1,
            1,
            c.class_version,
        ),
        u(
            "infiniband.classportinfo.capabilitymask",
            D + 2,
            2,
            c.capability_mask,
        ),
        bits(
            "infiniband.classportinfo.capabilitymask2",
            D + 4,
            4,
            0xFFFF_FFE0,
            c.capability_mask2.get(),
        ),
        bits(
            "infiniband.classportinfo.resptimevalue",
            D + 7,
            1,
            0x1F,
            c.resp_time_value.get(),
        ),
    ];
    let addr = |e: &mut Vec<Exp>, at: usize, a: &ib_mad::sa::ClassAddress, n: [&'static str; 9]| {
        e.push(raw(n[0], at, &a.gid.0));
        e.push(u(n[1], at + 16, 1, a.traffic_class));
        e.push(bits(n[2], at + 17, 1, 0xF0, a.sl.get()));
        e.push(bits(n[3], at + 17, 3, 0x0F_FFFF, a.flow_label.get()));
        e.push(u(n[4], at + 20, 2, a.lid.0));
        e.push(u(n[5], at + 22, 2, a.pkey));
        e.push(u(n[6], at + 24, 1, a.hop_limit));
        e.push(u(n[7], at + 25, 3, a.qp.get()));
        e.push(u(n[8], at + 28, 4, a.qkey));
    };
    addr(
        &mut e,
        D + 8,
        &c.redirect,
        [
            "infiniband.classportinfo.redirectgid",
            "infiniband.classportinfo.redirecttc",
            "infiniband.classportinfo.redirectsl",
            "infiniband.classportinfo.redirectfl",
            "infiniband.classportinfo.redirectlid",
            "infiniband.classportinfo.redirectpkey",
            "infiniband.classportinfo.reserved",
            "infiniband.classportinfo.redirectqp",
            "infiniband.classportinfo.redirectqkey",
        ],
    );
    addr(
        &mut e,
        D + 40,
        &c.trap,
        [
            "infiniband.classportinfo.trapgid",
            "infiniband.classportinfo.traptc",
            "infiniband.classportinfo.trapsl",
            "infiniband.classportinfo.trapfl",
            "infiniband.classportinfo.traplid",
            "infiniband.classportinfo.trappkey",
            // tshark calls the trap hop limit byte "Reserved" too.
            "infiniband.classportinfo.reserved",
            "infiniband.classportinfo.trapqp",
            "infiniband.classportinfo.trapqkey",
        ],
    );
    e
}

fn smp_dr(s: &Smp, info: &SmInfo) -> Vec<Exp> {
    let mut e = header(&s.header);
    e.extend([
        Exp {
            name: "infiniband.smpdirected.d",
            offset: 4,
            size: 1,
            mask: None,
            value: Value::Any, // known issue
        },
        u("infiniband.smpdirected.smpstatus", 4, 2, s.header.status),
        u("infiniband.smpdirected.hoppointer", 6, 1, s.hop_pointer()),
        u("infiniband.smpdirected.hopcount", 7, 1, s.hop_count()),
        u("infiniband.smplid.mkey", 24, 8, s.m_key),
        u("infiniband.smpdirected.drslid", 32, 2, s.dr_slid.0),
        u("infiniband.smpdirected.drdlid", 34, 2, s.dr_dlid.0),
        raw("infiniband.reserved", 36, &[0; 28]),
        raw("infiniband.smpdirected.initialpath", 128, &s.initial_path),
        raw("infiniband.smpdirected.returnpath", 192, &s.return_path),
    ]);
    e.extend(sm_info(info));
    e
}

fn sm_info(i: &SmInfo) -> Vec<Exp> {
    vec![
        u("infiniband.sminfo.guid", 64, 8, i.guid),
        u("infiniband.sminfo.sm_key", 72, 8, i.sm_key),
        u("infiniband.sminfo.actcount", 80, 4, i.act_count),
        bits("infiniband.sminfo.priority", 84, 1, 0xF0, i.priority.get()),
        bits("infiniband.sminfo.smstate", 84, 1, 0x0F, i.sm_state as u8),
    ]
}

fn req_message() -> Req {
    let path = |seed: u8| ReqPath {
        local_lid: Lid(0x0100 | u16::from(seed)),
        remote_lid: Lid(0x0200 | u16::from(seed)),
        local_gid: gid(seed),
        remote_gid: gid(seed.wrapping_add(0x40)),
        flow_label: FlowLabel::new(0xA_5C30 | u32::from(seed & 0xF)).unwrap(),
        packet_rate: U6::new(0x2D).unwrap(),
        traffic_class: 0xB0 | (seed & 0xF),
        hop_limit: 0x40 | (seed & 0xF),
        sl: Sl::new(0xB).unwrap(),
        subnet_local: true,
        local_ack_timeout: Timeout::new(0x13).unwrap(),
    };
    let mut pd = [0u8; 92];
    for (i, b) in pd.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(5);
    }
    Req {
        local_comm_id: 0x8765_4321,
        service_id: 0x0102_0304_0506_0708,
        local_ca_guid: 0x0002_C903_00AB_CDEF,
        local_q_key: 0x8001_0000,
        local_qpn: Qpn::new(0xA1B2C3).unwrap(),
        responder_resources: 0x5A,
        local_eecn: U24::new(0x0D0E0F).unwrap(),
        initiator_depth: 0xA5,
        remote_eecn: U24::new(0x102030).unwrap(),
        remote_cm_response_timeout: Timeout::new(0x15).unwrap(),
        transport_service_type: U2::new(2).unwrap(),
        end_to_end_flow_control: true,
        starting_psn: U24::new(0xC0FFEE).unwrap(),
        local_cm_response_timeout: Timeout::new(0x11).unwrap(),
        retry_count: U3::new(5).unwrap(),
        partition_key: 0xFFFF,
        path_packet_payload_mtu: U4::new(4).unwrap(),
        rdc_exists: true,
        rnr_retry_count: U3::new(6).unwrap(),
        max_cm_retries: U4::new(0xE).unwrap(),
        srq: true,
        extended_transport_type: U3::new(3).unwrap(),
        primary: path(0x11),
        alternate: path(0x22),
        sap_supported: true,
        private_data: pd,
    }
}

fn req_fields(r: &Req) -> Vec<Exp> {
    const C: usize = 24; // CM data offset in the MAD
    let mut e = vec![
        u("infiniband.cm.req", C, 4, r.local_comm_id),
        u("infiniband.reserved", C + 4, 4, 0u32),
        u("infiniband.cm.req.serviceid", C + 8, 8, r.service_id),
        u("infiniband.cm.req.localcaguid", C + 16, 8, r.local_ca_guid),
        u("infiniband.reserved", C + 24, 4, 0u32),
        u("infiniband.cm.req.localqkey", C + 28, 4, r.local_q_key),
        u("infiniband.cm.req.localqpn", C + 32, 3, r.local_qpn.get()),
        u(
            "infiniband.cm.req.responderres",
            C + 35,
            1,
            r.responder_resources,
        ),
        u("infiniband.cm.req.localeecn", C + 36, 3, r.local_eecn.get()),
        u("infiniband.cm.req.initdepth", C + 39, 1, r.initiator_depth),
        u(
            "infiniband.cm.req.remoteeecn",
            C + 40,
            3,
            r.remote_eecn.get(),
        ),
        bits(
            "infiniband.cm.req.remoteresptout",
            C + 43,
            1,
            0xF8,
            r.remote_cm_response_timeout.get(),
        ),
        bits(
            "infiniband.cm.req.transpsvctype",
            C + 43,
            1,
            0x06,
            r.transport_service_type.get(),
        ),
        bits(
            "infiniband.cm.req.e2eflowctrl",
            C + 43,
            1,
            0x01,
            r.end_to_end_flow_control,
        ),
        u(
            "infiniband.cm.req.startpsn",
            C + 44,
            3,
            r.starting_psn.get(),
        ),
        bits(
            "infiniband.cm.req.localresptout",
            C + 47,
            1,
            0xF8,
            r.local_cm_response_timeout.get(),
        ),
        bits(
            "infiniband.cm.req.retrcount",
            C + 47,
            1,
            0x07,
            r.retry_count.get(),
        ),
        u("infiniband.cm.req.pkey", C + 48, 2, r.partition_key),
        bits(
            "infiniband.cm.req.pppmtu",
            C + 50,
            1,
            0xF0,
            r.path_packet_payload_mtu.get(),
        ),
        bits("infiniband.cm.req.rdcexist", C + 50, 1, 0x08, r.rdc_exists),
        bits(
            "infiniband.cm.req.rnrretrcount",
            C + 50,
            1,
            0x07,
            r.rnr_retry_count.get(),
        ),
        bits(
            "infiniband.cm.req.maxcmretr",
            C + 51,
            1,
            0xF0,
            r.max_cm_retries.get(),
        ),
        bits("infiniband.cm.req.srq", C + 51, 1, 0x08, r.srq),
        bits(
            "infiniband.cm.req.ext_transport",
            C + 51,
            1,
            0x07,
            r.extended_transport_type.get(),
        ),
    ];
    for (at, p, n) in [
        (C + 52, &r.primary, REQ_PRIM),
        (C + 96, &r.alternate, REQ_ALT),
    ] {
        e.extend([
            u(n[0], at, 2, p.local_lid.0),
            u(n[1], at + 2, 2, p.remote_lid.0),
            raw(n[2], at + 4, &p.local_gid.0),
            raw(n[3], at + 20, &p.remote_gid.0),
            // Known issue: flow label, its reserved bits and the packet rate are read
            // from the wrong bytes (see KNOWN_DISSECTOR_ISSUES); expect what that
            // reading of ib-mad's bytes gives. tests/layout_table.rs checks them.
            u(n[4], at + 36, 3, p.flow_label.get() >> 8),
            u(n[5], at + 36, 1, (p.flow_label.get() >> 12) as u8 >> 6),
            u(n[6], at + 36, 1, (p.flow_label.get() >> 12) as u8 & 0x3F),
            u(n[7], at + 40, 1, p.traffic_class),
            u(n[8], at + 41, 1, p.hop_limit),
            bits(n[9], at + 42, 1, 0xF0, p.sl.get()),
            bits(n[10], at + 42, 1, 0x08, p.subnet_local),
            bits(n[11], at + 42, 1, 0x07, 0u8),
            bits(n[12], at + 43, 1, 0xF8, p.local_ack_timeout.get()),
        ]);
    }
    e.push(bits(
        "infiniband.cm.req.prim_reserved2",
        C + 95,
        1,
        0x07,
        0u8,
    ));
    e.push(bits(
        "infiniband.cm.req.alt_reserved1",
        C + 139,
        1,
        0x07,
        u8::from(r.sap_supported) << 2,
    ));
    e.push(raw("infiniband.cm.req.private", C + 140, &r.private_data));
    e
}

const REQ_PRIM: [&str; 13] = [
    "infiniband.cm.req.prim_locallid",
    "infiniband.cm.req.prim_remotelid",
    "infiniband.cm.req.prim_localgid",
    "infiniband.cm.req.prim_remotegid",
    "infiniband.cm.req.prim_flowlabel",
    "infiniband.cm.req.prim_reserved0",
    "infiniband.cm.req.prim_pktrate",
    "infiniband.cm.req.prim_tfcclass",
    "infiniband.cm.req.prim_hoplim",
    "infiniband.cm.req.prim_sl",
    "infiniband.cm.req.prim_subnetlocal",
    "infiniband.cm.req.prim_reserved1",
    "infiniband.cm.req.prim_localacktout",
];
const REQ_ALT: [&str; 13] = [
    "infiniband.cm.req.alt_locallid",
    "infiniband.cm.req.alt_remotelid",
    "infiniband.cm.req.alt_localgid",
    "infiniband.cm.req.alt_remotegid",
    "infiniband.cm.req.alt_flowlabel",
    "infiniband.cm.req.alt_reserved0",
    "infiniband.cm.req.alt_pktrate",
    "infiniband.cm.req.alt_tfcclass",
    "infiniband.cm.req.alt_hoplim",
    "infiniband.cm.req.alt_sl",
    "infiniband.cm.req.alt_subnetlocal",
    "infiniband.cm.req.alt_reserved1",
    "infiniband.cm.req.alt_localacktout",
];

fn gid(seed: u8) -> Gid {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8 * 17);
    }
    Gid(g)
}

/// One packet: what it is, the MAD bytes, the destination QP, the expectations.
type Case = (&'static str, [u8; MAD_SIZE], u32, Vec<Exp>);

/// Expectations for an RMPP ACK or ABORT (see KNOWN_DISSECTOR_ISSUES).
fn control(mad: &[u8; MAD_SIZE]) -> Vec<Exp> {
    let m = SaMad::decode(mad).unwrap();
    let mut e = sa(&m);
    let block = if m.rmpp.rmpp_type == RmppType::Ack {
        "infiniband.reserved"
    } else {
        "infiniband.rmpp.extendederrordata"
    };
    e.push(raw(block, 36, &mad[36..]));
    e.extend(path_record(&PathRecord::decode(&mad[D..]).unwrap()));
    e
}

fn sa_case(out: &mut Vec<Case>, what: &'static str, m: SaMad, extra: Vec<Exp>) {
    let mut e = sa(&m);
    e.extend(extra);
    out.push((what, m.encode(), 1, e));
}

/// The packets.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();

    let info = InformInfo {
        gid: gid(0xA0),
        lid_range_begin: Lid(0x1234),
        lid_range_end: Lid(0x5678),
        is_generic: true,
        subscribe: true,
        inform_type: 0x0304,
        trap_number: 0x0041,
        qpn: Qpn::new(0xABCDEF).unwrap(),
        resp_time_value: Timeout::new(0x13).unwrap(),
        producer_type: U24::new(0x123456).unwrap(),
    };
    let mut set = SaMad::set_inform_info(0x0102_0304_0506_0708, info);
    set.header.class_specific = 0xA5C3;
    set.header.attribute_modifier = 0x8765_4321;
    set.sa.sm_key = 0x1122_3344_5566_7788;
    set.sa.component_mask = 0x8000_0000_0000_0001;
    sa_case(&mut out, "Set(InformInfo)", set, inform_info(&info));

    let unsub = InformInfo {
        is_generic: false,
        subscribe: false,
        ..InformInfo::subscribe_trap(65, false)
    };
    let resp = SaMad::new(Method::GET_RESP, 9, SaPayload::InformInfo(unsub));
    sa_case(&mut out, "GetResp(InformInfo)", resp, inform_info(&unsub));

    for (what, details) in [
        (
            "Report(Notice trap 64)",
            NoticeDetails::GidInService(gid(0x31)),
        ),
        (
            "Report(Notice trap 65)",
            NoticeDetails::GidOutOfService(gid(0x42)),
        ),
        (
            "Report(Notice trap 128)",
            NoticeDetails::LinkStateChange(Lid(0xBEEF)),
        ),
    ] {
        let n = Notice {
            notice_type: U7::new(0x55).unwrap(),
            producer_type: U24::new(0xA1B2C3).unwrap(),
            issuer_lid: Lid(0x0F0E),
            toggle: true,
            count: U15::new(0x5A5A).unwrap(),
            details,
            issuer_gid: gid(0x77),
        };
        let report = SaMad::new(Method::REPORT, 0xFEED_0000_0000_0001, SaPayload::Notice(n));
        let rr = report.report_response();
        sa_case(&mut out, what, report, notice(&n));
        if let NoticeDetails::GidOutOfService(_) = details {
            sa_case(&mut out, "ReportResp(Notice trap 65)", rr, notice(&n));
        }
    }
    let vendor_notice = Notice {
        notice_type: U7::new(4).unwrap(),
        producer_type: U24::new(0x00_02C9).unwrap(),
        issuer_lid: Lid(3),
        toggle: false,
        count: U15::new(1).unwrap(),
        details: NoticeDetails::Vendor {
            device_id: 0x1003,
            data: [0x3C; 54],
        },
        issuer_gid: gid(1),
    };
    sa_case(
        &mut out,
        "Report(vendor Notice)",
        SaMad::new(Method::REPORT, 2, SaPayload::Notice(vendor_notice)),
        notice(&vendor_notice),
    );

    let pr = PathRecord {
        service_id: 0x1122_3344_5566_7788,
        dgid: gid(0xD0),
        sgid: gid(0x50),
        dlid: Lid(0x1112),
        slid: Lid(0x1314),
        raw_traffic: true,
        flow_label: FlowLabel::new(0xABCDE).unwrap(),
        hop_limit: 0x40,
        traffic_class: 0x41,
        reversible: true,
        numb_path: U7::new(0x5E).unwrap(),
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
    let query = SaMad::path_record_query(
        0x77,
        pr,
        path_record::mask::DGID | path_record::mask::SGID | path_record::mask::NUMB_PATH,
    );
    sa_case(&mut out, "GetTable(PathRecord)", query, path_record(&pr));

    // A three-segment GetTableResp from the RMPP sender, and the receiver's ACK.
    let records: Vec<PathRecord> = (0..7u16)
        .map(|i| PathRecord {
            dlid: Lid(0x100 + i),
            ..pr
        })
        .collect();
    let mut data = vec![0u8; records.len() * 64];
    for (r, chunk) in records.iter().zip(data.chunks_mut(64)) {
        r.encode(chunk);
    }
    let mut template = SaMad::new(
        Method::GET_TABLE_RESP,
        0x77,
        SaPayload::Raw(Box::new([0; 200])),
    );
    template.header.attribute_id = PathRecord::ID;
    template.sa.attribute_offset = 8;
    let mut tx = RmppSender::new(&template.encode(), data, Timeout::new(0x11).unwrap()).unwrap();
    let mut rx = RmppReceiver::with_limits(1, 1 << 16);
    let mut n = 0;
    while !tx.is_complete() && n < 10 {
        n += 1;
        let Some(seg) = tx.poll_transmit() else { break };
        let m = SaMad::decode(&seg).unwrap();
        let mut e = sa(&m);
        if m.rmpp.data1 == 1 {
            e.extend(path_record(&records[0]));
        } else {
            e.extend(path_record(&PathRecord::decode(&seg[D..]).unwrap()));
        }
        out.push(("GetTableResp(PathRecord) RMPP DATA", seg, 1, e));
        let ack = match rx.handle(&seg).unwrap() {
            RecvEvent::Continue { ack } => ack,
            RecvEvent::Complete { ack, .. } => ack,
        };
        if let Some(ack) = ack {
            tx.handle_ack(&ack).unwrap();
            out.push(("GetTable RMPP ACK", ack, 1, control(&ack)));
        }
    }
    assert!(tx.is_complete(), "RMPP transfer for the capture completed");
    let abort = tx.abort(ib_mad::rmpp::status::TOO_MANY_RETRIES);
    out.push(("GetTableResp RMPP ABORT", abort, 1, control(&abort)));

    let cpi = ClassPortInfo {
        base_version: 1,
        class_version: 2,
        capability_mask: 0x1234,
        capability_mask2: U27::new(0x5A5_A5A5).unwrap(),
        resp_time_value: Timeout::new(0x13).unwrap(),
        redirect: ib_mad::sa::ClassAddress {
            gid: gid(0x11),
            traffic_class: 0x21,
            sl: Sl::new(0xA).unwrap(),
            flow_label: FlowLabel::new(0xBCDEF).unwrap(),
            lid: Lid(0x2223),
            pkey: 0x2425,
            hop_limit: 0,
            qp: Qpn::new(0x262728).unwrap(),
            qkey: 0x292A_2B2C,
        },
        trap: ib_mad::sa::ClassAddress {
            gid: gid(0x31),
            traffic_class: 0x41,
            sl: Sl::new(0x5).unwrap(),
            flow_label: FlowLabel::new(0x6789A).unwrap(),
            lid: Lid(0x4243),
            pkey: 0x4445,
            hop_limit: 0x46,
            qp: Qpn::new(0x474849).unwrap(),
            qkey: 0x4A4B_4C4D,
        },
    };
    let mut m = SaMad::new(Method::GET_RESP, 0x99, SaPayload::ClassPortInfo(cpi));
    m.sa.attribute_offset = 9;
    sa_case(&mut out, "GetResp(ClassPortInfo)", m, class_port_info(&cpi));

    // CM REQ with both paths.
    let req = req_message();
    let mut data = [0u8; 232];
    req.encode(&mut data);
    let mad = CmMad::new(0xC0BE, CmBody::Other(Box::new(data)));
    let mut mad = mad;
    mad.header.attribute_id = Req::ID;
    let mut e = header(&mad.header);
    e.extend(req_fields(&req));
    out.push(("CM REQ", mad.encode(), 1, e));

    // CM and vendor: tshark decodes the common header only (known issue).
    let lap = CmMad::new(
        0xC0C0,
        CmBody::Lap(Lap {
            local_comm_id: 0x1234_5678,
            ..Lap::default()
        }),
    );
    out.push(("CM LAP", lap.encode(), 1, header(&lap.header)));
    let apr = CmMad::new(
        0xC0C1,
        CmBody::Apr(Apr {
            additional_info: AdditionalInfo::new(&[1, 2]).unwrap(),
            ..Apr::answer(1, 2, ApStatus::InvalidGid)
        }),
    );
    out.push(("CM APR", apr.encode(), 1, header(&apr.header)));
    let mra = CmMad::new(
        0xC0C2,
        CmBody::Mra(Mra {
            message_mraed: MessageMraed::Lap,
            ..Mra::for_lap(1, 2, Timeout::new(9).unwrap())
        }),
    );
    out.push(("CM MRA", mra.encode(), 1, header(&mra.header)));
    let mut v = VendorMad::new(
        MgmtClass(0x4F),
        1,
        Method::SEND,
        0x5151,
        AttributeId(0x19),
        Oui(U24::new(0x00_1405).unwrap()),
    )
    .unwrap();
    v.data[0] = 0x99;
    out.push(("vendor 0x4F", v.encode(), 1, header(&v.header)));

    // Directed-route SubnGetResp(SMInfo) as the ibsim shim sends it.
    let mut req = [0u8; MAD_SIZE];
    req[..8].copy_from_slice(&[1, 0x81, 1, 0x01, 0, 0, 2, 3]);
    req[8..16].copy_from_slice(&0x0000_1234_0000_5678u64.to_be_bytes());
    req[16..18].copy_from_slice(&AttributeId::SM_INFO.0.to_be_bytes());
    req[24..32].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    req[32..36].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
    req[129] = 1;
    req[130] = 2;
    req[193] = 3;
    req[194] = 4;
    let info = SmInfo {
        guid: 0x0002_C903_00AB_CDEF,
        sm_key: 0x99,
        act_count: 0x1234_5678,
        priority: U4::new(0xA).unwrap(),
        sm_state: SmState::Standby,
    };
    let resp = Smp::decode(&req)
        .unwrap()
        .response(U15::ZERO, info.to_smp_data());
    out.push((
        "SMP DR GetResp(SMInfo)",
        resp.encode(),
        0,
        smp_dr(&resp, &info),
    ));
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Check 1: the bytes tshark shows for a field are the MAD's bytes at that place.
fn check_bytes(what: &str, mad: &[u8; MAD_SIZE], f: &Field) -> Result<(), String> {
    let off = f.pos - MAD_POS;
    let Some(bytes) = mad.get(off..off + f.size) else {
        return Err(format!(
            "{what}: {} at {off}+{} is outside the MAD",
            f.name, f.size
        ));
    };
    let shown = f
        .unmasked
        .as_deref()
        .unwrap_or(&f.value)
        .to_ascii_lowercase();
    // Long byte fields are shown in full in `value`; numbers are hex of the bytes.
    if shown.len() == f.size * 2 && shown != hex(bytes) {
        return Err(format!(
            "{what}: {} at MAD byte {off} shows {shown}, ib-mad wrote {}",
            f.name,
            hex(bytes)
        ));
    }
    Ok(())
}

/// Check 2 for one expectation.
fn check_exp(what: &str, fields: &[Field], e: &Exp) -> Result<usize, String> {
    let pos = MAD_POS + e.offset;
    let Some(i) = fields
        .iter()
        .position(|f| f.name == e.name && f.pos == pos && (f.size == e.size || e.mask.is_none()))
    else {
        let near: Vec<String> = fields
            .iter()
            .filter(|f| f.name == e.name)
            .map(|f| format!("{}@{}+{}", f.name, f.pos as i64 - MAD_POS as i64, f.size))
            .collect();
        return Err(format!(
            "{what}: tshark shows no {} at MAD byte {} (size {}); same name at: {near:?}",
            e.name, e.offset, e.size
        ));
    };
    let f = &fields[i];
    if f.size != e.size {
        return Err(format!(
            "{what}: {} at MAD byte {} has size {}, expected {}",
            e.name, e.offset, f.size, e.size
        ));
    }
    if let Some(mask) = e.mask {
        if f.bit_mask() != Some(mask) {
            return Err(format!(
                "{what}: {} bit mask {:?} (from {:?}), expected {mask:#x}",
                e.name,
                f.bit_mask(),
                f.showname
            ));
        }
    }
    match &e.value {
        Value::Any => {}
        Value::Uint(v) => {
            let got = u64::from_str_radix(&f.value, 16)
                .map_err(|_| format!("{what}: {} value {:?} is not hex", e.name, f.value))?;
            if got != *v {
                return Err(format!(
                    "{what}: {} = {got:#x} in tshark, {v:#x} in ib-mad",
                    e.name
                ));
            }
        }
        Value::Bytes(b) => {
            if f.value.to_ascii_lowercase() != hex(b) {
                return Err(format!(
                    "{what}: {} = {} in tshark, {} in ib-mad",
                    e.name,
                    f.value,
                    hex(b)
                ));
            }
        }
    }
    Ok(i)
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn tshark_agrees_with_ib_mad() {
    if !tshark_available() {
        let msg = "tshark is not installed (Debian: DEBIAN_FRONTEND=noninteractive apt-get \
                   install -y tshark; `cargo xtask test` does it)";
        if std::env::var_os("CI").is_some() {
            panic!("{msg}: the layout proof cannot run in CI");
        }
        eprintln!("SKIPPED: {msg}");
        return;
    }
    let cases = cases();
    let mut errors = Vec::new();
    // Every MAD also round-trips through ib-mad's own decoder.
    for (what, mad, _, _) in &cases {
        match Mad::decode(mad) {
            Ok(decoded) if &decoded.encode() == mad => {}
            Ok(_) => errors.push(format!("{what}: decode/encode changes the bytes")),
            Err(e) => errors.push(format!("{what}: ib-mad cannot decode it: {e}")),
        }
    }
    let frames: Vec<Vec<u8>> = cases
        .iter()
        .map(|(_, m, q, _)| pdml::frame(m, *q))
        .collect();
    let dir = std::env::temp_dir().join(format!("ib-mad-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mads.pcap");
    std::fs::write(&file, pdml::pcap(&frames)).unwrap();
    let out = Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(&file)
        .args(["-T", "pdml"])
        .output()
        .expect("run tshark");
    if std::env::var_os("IB_MAD_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packets = pdml::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(packets.len(), cases.len(), "one PDML packet per frame");

    let mut checked_fields = 0;
    let mut checked_bytes = 0;
    for ((what, mad, _, exps), fields) in cases.iter().zip(&packets) {
        let in_mad: Vec<Field> = fields
            .iter()
            .filter(|f| f.pos >= MAD_POS && f.pos < MAD_POS + MAD_SIZE)
            .cloned()
            .collect();
        let mut matched = vec![false; in_mad.len()];
        for f in &in_mad {
            match check_bytes(what, mad, f) {
                Ok(()) => checked_bytes += 1,
                Err(e) => errors.push(e),
            }
        }
        for e in exps {
            match check_exp(what, &in_mad, e) {
                Ok(i) => {
                    matched[i] = true;
                    checked_fields += 1;
                }
                Err(err) => errors.push(err),
            }
        }
        for (f, m) in in_mad.iter().zip(&matched) {
            if !m && !CONTAINERS.contains(&f.name.as_str()) {
                errors.push(format!(
                    "{what}: tshark field {} at MAD byte {} (size {}) has no expectation",
                    f.name,
                    f.pos - MAD_POS,
                    f.size
                ));
            }
        }
    }
    eprintln!(
        "tshark proof: {} packets, {checked_fields} typed field checks, {checked_bytes} \
         byte-position checks; known dissector issues: {}",
        cases.len(),
        KNOWN_DISSECTOR_ISSUES.len()
    );
    assert!(
        errors.is_empty(),
        "{} mismatches:\n{}",
        errors.len(),
        errors.join("\n")
    );
}
