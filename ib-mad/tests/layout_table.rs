//! LAP, APR, MRA and the vendor OUI header, which tshark cannot decode, checked against
//! an independent table of field positions transcribed from the IBA (Vol 1 chapter 12,
//! tables 107, 115, 116, as also given by Linux `include/rdma/ibta_vol1_c12.h`) and
//! IBA 13.4 for the vendor header.
//!
//! Positions use the IBA's Byte[Bit] notation: `byte` is the offset in the CM data
//! (MAD byte 24 is byte 0), `bit` counts from the most significant bit of that byte,
//! `width` is in bits. Two checks per field:
//! - isolation: a message where only this field is set (to a value with its top and
//!   bottom bits set) encodes to exactly this field's bits and nothing else, so any
//!   shift, mask or overlap error shows;
//! - combined: a message with distinctive values in every field encodes each field's
//!   value at its place, and decodes back to the same message.

use ib_mad::cm::{AdditionalInfo, ApStatus, Apr, CmBody, CmMad, Lap, MessageMraed, Mra};
use ib_mad::types::*;
use ib_mad::vendor::VendorMad;
use ib_mad::{AttributeId, Method, MgmtClass, MAD_SIZE};

/// One row of the IBA table.
struct Row<M> {
    name: &'static str,
    byte: usize,
    bit: usize,
    width: usize,
    /// Set this field (and only this one) to a value that has its first and last
    /// bits set.
    set: fn(&mut M),
    /// The field's value in the message, as `width` bits, most significant first.
    value: fn(&M) -> Vec<bool>,
}

fn ubits(v: u64, width: usize) -> Vec<bool> {
    (0..width).rev().map(|i| (v >> i) & 1 == 1).collect()
}

fn bbits(b: &[u8]) -> Vec<bool> {
    b.iter().flat_map(|x| ubits(u64::from(*x), 8)).collect()
}

fn wire_bits(body: &[u8], start: usize, width: usize) -> Vec<bool> {
    let all = bbits(body);
    all[start..start + width].to_vec()
}

/// Run both checks for one message type; `encode` gives the bytes the table indexes.
fn check<M: Clone + PartialEq + std::fmt::Debug>(
    what: &str,
    rows: &[Row<M>],
    empty: M,
    distinctive: M,
    encode: fn(&M) -> Vec<u8>,
    decode: fn(&[u8]) -> M,
) {
    for r in rows {
        let mut m = empty.clone();
        (r.set)(&mut m);
        let expect = (r.value)(&m);
        assert_eq!(expect.len(), r.width, "{what}.{}: value width", r.name);
        assert!(
            expect[0] && expect[r.width - 1],
            "{what}.{}: isolation value must set its first and last bit",
            r.name
        );
        let body = encode(&m);
        let bits = bbits(&body);
        let start = r.byte * 8 + r.bit;
        for (i, b) in bits.iter().enumerate() {
            let want = if (start..start + r.width).contains(&i) {
                expect[i - start]
            } else {
                false
            };
            assert_eq!(
                *b,
                want,
                "{what}.{} (byte {} bit {} width {}): wire bit {} (byte {}, bit {} from MSB) is {}",
                r.name,
                r.byte,
                r.bit,
                r.width,
                i,
                i / 8,
                i % 8,
                b
            );
        }
        assert_eq!(
            decode(&body),
            m,
            "{what}.{}: decode of the isolated field",
            r.name
        );
    }
    let body = encode(&distinctive);
    for r in rows {
        assert_eq!(
            wire_bits(&body, r.byte * 8 + r.bit, r.width),
            (r.value)(&distinctive),
            "{what}.{}: distinctive value at byte {} bit {}",
            r.name,
            r.byte,
            r.bit
        );
    }
    assert_eq!(decode(&body), distinctive, "{what}: round trip");
}

fn cm_body(body: CmBody) -> Vec<u8> {
    CmMad::new(1, body).encode()[24..].to_vec()
}

fn gid_ones() -> Gid {
    Gid([0xFF; 16])
}

#[test]
fn lap_matches_iba_table_115() {
    let rows: Vec<Row<Lap>> = vec![
        Row {
            name: "local_comm_id",
            byte: 0,
            bit: 0,
            width: 32,
            set: |m| m.local_comm_id = u32::MAX,
            value: |m| ubits(m.local_comm_id.into(), 32),
        },
        Row {
            name: "remote_comm_id",
            byte: 4,
            bit: 0,
            width: 32,
            set: |m| m.remote_comm_id = u32::MAX,
            value: |m| ubits(m.remote_comm_id.into(), 32),
        },
        Row {
            name: "remote_qpn",
            byte: 12,
            bit: 0,
            width: 24,
            set: |m| m.remote_qpn = Qpn::MAX,
            value: |m| ubits(m.remote_qpn.get().into(), 24),
        },
        Row {
            name: "remote_cm_response_timeout",
            byte: 15,
            bit: 0,
            width: 5,
            set: |m| m.remote_cm_response_timeout = Timeout::MAX,
            value: |m| ubits(m.remote_cm_response_timeout.get().into(), 5),
        },
        Row {
            name: "alt_local_lid",
            byte: 20,
            bit: 0,
            width: 16,
            set: |m| m.alt_local_lid = Lid(0xFFFF),
            value: |m| ubits(m.alt_local_lid.0.into(), 16),
        },
        Row {
            name: "alt_remote_lid",
            byte: 22,
            bit: 0,
            width: 16,
            set: |m| m.alt_remote_lid = Lid(0xFFFF),
            value: |m| ubits(m.alt_remote_lid.0.into(), 16),
        },
        Row {
            name: "alt_local_gid",
            byte: 24,
            bit: 0,
            width: 128,
            set: |m| m.alt_local_gid = gid_ones(),
            value: |m| bbits(&m.alt_local_gid.0),
        },
        Row {
            name: "alt_remote_gid",
            byte: 40,
            bit: 0,
            width: 128,
            set: |m| m.alt_remote_gid = gid_ones(),
            value: |m| bbits(&m.alt_remote_gid.0),
        },
        Row {
            name: "alt_flow_label",
            byte: 56,
            bit: 0,
            width: 20,
            set: |m| m.alt_flow_label = FlowLabel::MAX,
            value: |m| ubits(m.alt_flow_label.get().into(), 20),
        },
        Row {
            name: "alt_traffic_class",
            byte: 59,
            bit: 0,
            width: 8,
            set: |m| m.alt_traffic_class = 0xFF,
            value: |m| ubits(m.alt_traffic_class.into(), 8),
        },
        Row {
            name: "alt_hop_limit",
            byte: 60,
            bit: 0,
            width: 8,
            set: |m| m.alt_hop_limit = 0xFF,
            value: |m| ubits(m.alt_hop_limit.into(), 8),
        },
        Row {
            name: "alt_packet_rate",
            byte: 61,
            bit: 2,
            width: 6,
            set: |m| m.alt_packet_rate = U6::MAX,
            value: |m| ubits(m.alt_packet_rate.get().into(), 6),
        },
        Row {
            name: "alt_sl",
            byte: 62,
            bit: 0,
            width: 4,
            set: |m| m.alt_sl = Sl::MAX,
            value: |m| ubits(m.alt_sl.get().into(), 4),
        },
        Row {
            name: "alt_subnet_local",
            byte: 62,
            bit: 4,
            width: 1,
            set: |m| m.alt_subnet_local = true,
            value: |m| vec![m.alt_subnet_local],
        },
        Row {
            name: "alt_local_ack_timeout",
            byte: 63,
            bit: 0,
            width: 5,
            set: |m| m.alt_local_ack_timeout = Timeout::MAX,
            value: |m| ubits(m.alt_local_ack_timeout.get().into(), 5),
        },
        Row {
            name: "private_data",
            byte: 64,
            bit: 0,
            width: 1344,
            set: |m| m.private_data = [0xFF; 168],
            value: |m| bbits(&m.private_data),
        },
    ];
    let mut pd = [0u8; 168];
    for (i, b) in pd.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    let distinctive = Lap {
        local_comm_id: 0x8123_4567,
        remote_comm_id: 0x89AB_CDEF,
        remote_qpn: Qpn::new(0xA5_C3E1).unwrap(),
        remote_cm_response_timeout: Timeout::new(0b10011).unwrap(),
        alt_local_lid: Lid(0xC001),
        alt_remote_lid: Lid(0x8003),
        alt_local_gid: Gid([0x81, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0x11]),
        alt_remote_gid: Gid([
            0xF1, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE,
            0xF0, 0x0F,
        ]),
        alt_flow_label: FlowLabel::new(0x9_6A5B).unwrap(),
        alt_traffic_class: 0xB7,
        alt_hop_limit: 0x91,
        alt_packet_rate: U6::new(0b10_1101).unwrap(),
        alt_sl: Sl::new(0b1011).unwrap(),
        alt_subnet_local: true,
        alt_local_ack_timeout: Timeout::new(0b11001).unwrap(),
        private_data: pd,
    };
    check(
        "LAP",
        &rows,
        Lap::default(),
        distinctive,
        |m| cm_body(CmBody::Lap(m.clone())),
        |b| match cm_decode_as(AttributeId::CM_LAP, b) {
            CmBody::Lap(l) => l,
            other => panic!("not a LAP: {other:?}"),
        },
    );
}

fn cm_decode_as(attr: AttributeId, body: &[u8]) -> CmBody {
    let mut mad = [0u8; MAD_SIZE];
    mad[..4].copy_from_slice(&[1, 7, 2, 3]);
    mad[16..18].copy_from_slice(&attr.0.to_be_bytes());
    mad[24..].copy_from_slice(body);
    CmMad::decode(&mad).expect("decodes").body
}

#[test]
fn apr_matches_iba_table_116() {
    let rows: Vec<Row<Apr>> = vec![
        Row {
            name: "local_comm_id",
            byte: 0,
            bit: 0,
            width: 32,
            set: |m| m.local_comm_id = u32::MAX,
            value: |m| ubits(m.local_comm_id.into(), 32),
        },
        Row {
            name: "remote_comm_id",
            byte: 4,
            bit: 0,
            width: 32,
            set: |m| m.remote_comm_id = u32::MAX,
            value: |m| ubits(m.remote_comm_id.into(), 32),
        },
        Row {
            name: "private_data",
            byte: 84,
            bit: 0,
            width: 1184,
            set: |m| m.private_data = [0xFF; 148],
            value: |m| bbits(&m.private_data),
        },
    ];
    // AdditionalInfoLength and APStatus cannot be isolated with their first bit set
    // (at most 72 and 13): they are checked for every status below.
    let mut pd = [0u8; 148];
    for (i, b) in pd.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(53).wrapping_add(7);
    }
    let distinctive = Apr {
        local_comm_id: 0x8765_4321,
        remote_comm_id: 0x9ABC_DEF1,
        ap_status: ApStatus::InvalidFlowLabel,
        additional_info: AdditionalInfo::new(&[0xA5, 0x5A, 0xC3]).unwrap(),
        private_data: pd,
    };
    let enc = |m: &Apr| cm_body(CmBody::Apr(m.clone()));
    let dec = |b: &[u8]| match cm_decode_as(AttributeId::CM_APR, b) {
        CmBody::Apr(a) => a,
        other => panic!("not an APR: {other:?}"),
    };
    check(
        "APR",
        &rows,
        Apr::answer(0, 0, ApStatus::Success),
        distinctive.clone(),
        enc,
        dec,
    );

    // AdditionalInfoLength (byte 8) and APStatus (byte 9), every status: only these
    // two bytes and the info bytes change.
    for (i, status) in ApStatus::ALL.into_iter().enumerate() {
        let info: Vec<u8> = (0..i as u8 + 1).map(|x| 0x80 | x).collect();
        let m = Apr {
            ap_status: status,
            additional_info: AdditionalInfo::new(&info).unwrap(),
            ..Apr::answer(0, 0, ApStatus::Success)
        };
        let body = enc(&m);
        assert_eq!(
            body[8] as usize,
            info.len(),
            "additional_info_length at byte 8"
        );
        assert_eq!(body[9], i as u8, "ap_status {status:?} at byte 9");
        assert_eq!(
            &body[12..12 + info.len()],
            &info[..],
            "additional_info at byte 12"
        );
        assert!(body[..8].iter().all(|b| *b == 0));
        assert!(body[10..12].iter().all(|b| *b == 0));
        assert!(body[12 + info.len()..].iter().all(|b| *b == 0));
        assert_eq!(dec(&body), m);
    }
    let m = Apr {
        additional_info: AdditionalInfo::new(&[0xFF; 72]).unwrap(),
        ..distinctive
    };
    let body = enc(&m);
    assert_eq!(body[8], 72);
    assert_eq!(&body[12..84], &[0xFF; 72][..]);
}

#[test]
fn mra_matches_iba_table_107() {
    let rows: Vec<Row<Mra>> = vec![
        Row {
            name: "local_comm_id",
            byte: 0,
            bit: 0,
            width: 32,
            set: |m| m.local_comm_id = u32::MAX,
            value: |m| ubits(m.local_comm_id.into(), 32),
        },
        Row {
            name: "remote_comm_id",
            byte: 4,
            bit: 0,
            width: 32,
            set: |m| m.remote_comm_id = u32::MAX,
            value: |m| ubits(m.remote_comm_id.into(), 32),
        },
        // MessageMRAed 2 (LAP) = 0b10: its last bit is 0, so it is checked by the
        // combined message and the explicit byte check below.
        Row {
            name: "service_timeout",
            byte: 9,
            bit: 0,
            width: 5,
            set: |m| m.service_timeout = Timeout::MAX,
            value: |m| ubits(m.service_timeout.get().into(), 5),
        },
        Row {
            name: "private_data",
            byte: 10,
            bit: 0,
            width: 1776,
            set: |m| m.private_data = [0xFF; 222],
            value: |m| bbits(&m.private_data),
        },
    ];
    let empty = Mra {
        message_mraed: MessageMraed::Req,
        ..Mra::for_lap(0, 0, Timeout::ZERO)
    };
    let enc = |m: &Mra| cm_body(CmBody::Mra(m.clone()));
    let dec = |b: &[u8]| match cm_decode_as(AttributeId::CM_MRA, b) {
        CmBody::Mra(a) => a,
        other => panic!("not an MRA: {other:?}"),
    };
    let mut pd = [0u8; 222];
    for (i, b) in pd.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(29).wrapping_add(3);
    }
    let distinctive = Mra {
        local_comm_id: 0xF00D_BA5E,
        remote_comm_id: 0x8BAD_F00D,
        message_mraed: MessageMraed::Rep,
        service_timeout: Timeout::new(0b10101).unwrap(),
        private_data: pd,
    };
    check("MRA", &rows, empty.clone(), distinctive, enc, dec);
    for (mraed, code) in [
        (MessageMraed::Req, 0u8),
        (MessageMraed::Rep, 1),
        (MessageMraed::Lap, 2),
    ] {
        let body = enc(&Mra {
            message_mraed: mraed,
            ..empty.clone()
        });
        assert_eq!(
            body[8],
            code << 6,
            "message_mraed {mraed:?} in byte 8 bits 7-6"
        );
        assert!(body.iter().enumerate().all(|(i, b)| i == 8 || *b == 0));
    }
}

#[test]
fn vendor_header_matches_iba() {
    // IBA 13.4.5 vendor MAD of range 2 (and Linux struct ib_vendor_mad): RMPP header
    // at 24-35, reserved byte 36, OUI 37-39, data 40-255.
    let mut v = VendorMad::new(
        MgmtClass(0x30),
        1,
        Method::SEND,
        0,
        AttributeId(0),
        Oui(U24::MAX),
    )
    .unwrap();
    let mad = v.encode();
    assert_eq!(&mad[36..40], &[0, 0xFF, 0xFF, 0xFF]);
    assert!(mad[24..36].iter().all(|b| *b == 0));
    assert!(mad[40..].iter().all(|b| *b == 0));
    v.oui = Oui(U24::new(0x81_0203).unwrap());
    *v.data = [0xFF; 216];
    let mad = v.encode();
    assert_eq!(&mad[36..40], &[0, 0x81, 0x02, 0x03]);
    assert!(mad[40..].iter().all(|b| *b == 0xFF));
    assert_eq!(VendorMad::decode(&mad).unwrap(), v);
    let err =
        VendorMad::new(MgmtClass(0x50), 1, Method::SEND, 0, AttributeId(0), v.oui).unwrap_err();
    assert_eq!((err.field(), err.offset()), ("mgmt_class", 1));
}

#[test]
fn req_bit_fields_match_iba_table_106() {
    use ib_mad::cm::{Req, ReqPath};
    // The sub-byte REQ fields (tshark checks the byte-aligned ones, and misreads the
    // flow labels and packet rates: see tests/tshark.rs).
    let rows: Vec<Row<Req>> = vec![
        Row {
            name: "remote_cm_response_timeout",
            byte: 43,
            bit: 0,
            width: 5,
            set: |m| m.remote_cm_response_timeout = Timeout::MAX,
            value: |m| ubits(m.remote_cm_response_timeout.get().into(), 5),
        },
        Row {
            name: "transport_service_type",
            byte: 43,
            bit: 5,
            width: 2,
            set: |m| m.transport_service_type = U2::MAX,
            value: |m| ubits(m.transport_service_type.get().into(), 2),
        },
        Row {
            name: "end_to_end_flow_control",
            byte: 43,
            bit: 7,
            width: 1,
            set: |m| m.end_to_end_flow_control = true,
            value: |m| vec![m.end_to_end_flow_control],
        },
        Row {
            name: "local_cm_response_timeout",
            byte: 47,
            bit: 0,
            width: 5,
            set: |m| m.local_cm_response_timeout = Timeout::MAX,
            value: |m| ubits(m.local_cm_response_timeout.get().into(), 5),
        },
        Row {
            name: "retry_count",
            byte: 47,
            bit: 5,
            width: 3,
            set: |m| m.retry_count = U3::MAX,
            value: |m| ubits(m.retry_count.get().into(), 3),
        },
        Row {
            name: "path_packet_payload_mtu",
            byte: 50,
            bit: 0,
            width: 4,
            set: |m| m.path_packet_payload_mtu = U4::MAX,
            value: |m| ubits(m.path_packet_payload_mtu.get().into(), 4),
        },
        Row {
            name: "rdc_exists",
            byte: 50,
            bit: 4,
            width: 1,
            set: |m| m.rdc_exists = true,
            value: |m| vec![m.rdc_exists],
        },
        Row {
            name: "rnr_retry_count",
            byte: 50,
            bit: 5,
            width: 3,
            set: |m| m.rnr_retry_count = U3::MAX,
            value: |m| ubits(m.rnr_retry_count.get().into(), 3),
        },
        Row {
            name: "max_cm_retries",
            byte: 51,
            bit: 0,
            width: 4,
            set: |m| m.max_cm_retries = U4::MAX,
            value: |m| ubits(m.max_cm_retries.get().into(), 4),
        },
        Row {
            name: "srq",
            byte: 51,
            bit: 4,
            width: 1,
            set: |m| m.srq = true,
            value: |m| vec![m.srq],
        },
        Row {
            name: "extended_transport_type",
            byte: 51,
            bit: 5,
            width: 3,
            set: |m| m.extended_transport_type = U3::MAX,
            value: |m| ubits(m.extended_transport_type.get().into(), 3),
        },
        Row {
            name: "primary_flow_label",
            byte: 88,
            bit: 0,
            width: 20,
            set: |m| m.primary.flow_label = FlowLabel::MAX,
            value: |m| ubits(m.primary.flow_label.get().into(), 20),
        },
        Row {
            name: "primary_packet_rate",
            byte: 91,
            bit: 2,
            width: 6,
            set: |m| m.primary.packet_rate = U6::MAX,
            value: |m| ubits(m.primary.packet_rate.get().into(), 6),
        },
        Row {
            name: "primary_sl",
            byte: 94,
            bit: 0,
            width: 4,
            set: |m| m.primary.sl = Sl::MAX,
            value: |m| ubits(m.primary.sl.get().into(), 4),
        },
        Row {
            name: "primary_subnet_local",
            byte: 94,
            bit: 4,
            width: 1,
            set: |m| m.primary.subnet_local = true,
            value: |m| vec![m.primary.subnet_local],
        },
        Row {
            name: "primary_local_ack_timeout",
            byte: 95,
            bit: 0,
            width: 5,
            set: |m| m.primary.local_ack_timeout = Timeout::MAX,
            value: |m| ubits(m.primary.local_ack_timeout.get().into(), 5),
        },
        Row {
            name: "alternate_flow_label",
            byte: 132,
            bit: 0,
            width: 20,
            set: |m| m.alternate.flow_label = FlowLabel::MAX,
            value: |m| ubits(m.alternate.flow_label.get().into(), 20),
        },
        Row {
            name: "alternate_packet_rate",
            byte: 135,
            bit: 2,
            width: 6,
            set: |m| m.alternate.packet_rate = U6::MAX,
            value: |m| ubits(m.alternate.packet_rate.get().into(), 6),
        },
        Row {
            name: "alternate_sl",
            byte: 138,
            bit: 0,
            width: 4,
            set: |m| m.alternate.sl = Sl::MAX,
            value: |m| ubits(m.alternate.sl.get().into(), 4),
        },
        Row {
            name: "alternate_subnet_local",
            byte: 138,
            bit: 4,
            width: 1,
            set: |m| m.alternate.subnet_local = true,
            value: |m| vec![m.alternate.subnet_local],
        },
        Row {
            name: "alternate_local_ack_timeout",
            byte: 139,
            bit: 0,
            width: 5,
            set: |m| m.alternate.local_ack_timeout = Timeout::MAX,
            value: |m| ubits(m.alternate.local_ack_timeout.get().into(), 5),
        },
        Row {
            name: "sap_supported",
            byte: 139,
            bit: 5,
            width: 1,
            set: |m| m.sap_supported = true,
            value: |m| vec![m.sap_supported],
        },
    ];
    let path = |x: u8| ReqPath {
        local_lid: Lid(0x8001 + u16::from(x)),
        remote_lid: Lid(0x4002 + u16::from(x)),
        local_gid: Gid([x | 0x80; 16]),
        remote_gid: Gid([x | 0x41; 16]),
        flow_label: FlowLabel::new(0x9_6A5B ^ u32::from(x)).unwrap(),
        packet_rate: U6::new(0b10_1101).unwrap(),
        traffic_class: 0xB7,
        hop_limit: 0x91,
        sl: Sl::new(0b1011).unwrap(),
        subnet_local: x & 1 == 1,
        local_ack_timeout: Timeout::new(0b11001).unwrap(),
    };
    let distinctive = Req {
        local_comm_id: 0x8123_4567,
        remote_cm_response_timeout: Timeout::new(0b10011).unwrap(),
        transport_service_type: U2::new(0b10).unwrap(),
        end_to_end_flow_control: true,
        local_cm_response_timeout: Timeout::new(0b11010).unwrap(),
        retry_count: U3::new(0b101).unwrap(),
        path_packet_payload_mtu: U4::new(0b1001).unwrap(),
        rdc_exists: true,
        rnr_retry_count: U3::new(0b110).unwrap(),
        max_cm_retries: U4::new(0b1011).unwrap(),
        srq: false,
        extended_transport_type: U3::new(0b011).unwrap(),
        primary: path(1),
        alternate: path(2),
        sap_supported: true,
        ..Req::default()
    };
    check(
        "REQ",
        &rows,
        Req::default(),
        distinctive,
        |m| {
            let mut b = vec![0u8; 232];
            ib_mad::Attribute::encode(m, &mut b);
            b
        },
        |b| <Req as ib_mad::Attribute>::decode(b).expect("decodes"),
    );
}
