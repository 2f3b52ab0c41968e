//! Unit tests of the CM messages inside whole MADs: error offsets, carriers.

use super::*;
use crate::types::{FlowLabel, Gid, Lid, Qpn, Sl, Timeout, U6};

fn lap() -> Lap {
    Lap {
        local_comm_id: 0x1122_3344,
        remote_comm_id: 0x5566_7788,
        remote_qpn: Qpn::new(0xABCDEF).unwrap(),
        remote_cm_response_timeout: Timeout::new(0x15).unwrap(),
        alt_local_lid: Lid(0x0102),
        alt_remote_lid: Lid(0x0304),
        alt_local_gid: Gid([0xA1; 16]),
        alt_remote_gid: Gid([0xB2; 16]),
        alt_flow_label: FlowLabel::new(0x9_8765).unwrap(),
        alt_traffic_class: 0xC3,
        alt_hop_limit: 0xD4,
        alt_packet_rate: U6::new(0x2A).unwrap(),
        alt_sl: Sl::new(0xB).unwrap(),
        alt_subnet_local: true,
        alt_local_ack_timeout: Timeout::new(0x13).unwrap(),
        private_data: [0x77; lap::LAP_PRIVATE_DATA_SIZE],
    }
}

#[test]
fn lap_round_trip_in_cm_mad() {
    let mad = CmMad::new(9, CmBody::Lap(lap()));
    let wire = mad.encode();
    assert_eq!(&wire[..4], &[1, 7, 2, 3]);
    assert_eq!(&wire[16..18], &[0x00, 0x19]);
    assert_eq!(CmMad::decode(&wire), Ok(mad));
}

#[test]
fn lap_in_vendor_room_cuts_private_data() {
    let mut room = [0u8; 216];
    lap().encode(&mut room);
    let back = Lap::decode(&room).unwrap();
    assert_eq!(&back.private_data[..152], &[0x77; 152][..]);
    assert_eq!(&back.private_data[152..], &[0; 16][..]);
    let err = Lap::decode(&room[..63]).unwrap_err();
    assert_eq!((err.field(), err.offset()), ("alt_local_ack_timeout", 63));
}

#[test]
fn apr_every_status_and_bad_status_offset() {
    for status in ApStatus::ALL {
        let apr = Apr {
            additional_info: AdditionalInfo::new(&[1, 2, 3]).unwrap(),
            ..Apr::answer(1, 2, status)
        };
        let wire = CmMad::new(3, CmBody::Apr(apr.clone())).encode();
        assert_eq!(wire[24 + 9], status.code());
        assert_eq!(wire[24 + 8], 3);
        assert_eq!(CmMad::decode(&wire).unwrap().body, CmBody::Apr(apr));
    }
    let mut wire = CmMad::new(3, CmBody::Apr(Apr::answer(1, 2, ApStatus::Success))).encode();
    wire[33] = 14;
    let err = CmMad::decode(&wire).unwrap_err();
    assert_eq!((err.field(), err.offset()), ("ap_status", 33));
    wire[33] = 0;
    wire[32] = 73;
    let err = CmMad::decode(&wire).unwrap_err();
    assert_eq!((err.field(), err.offset()), ("additional_info_length", 32));
    assert!(AdditionalInfo::new(&[0; 73]).is_err());
}

#[test]
fn mra_layout_and_reserved_code() {
    let mra = Mra::for_lap(0x0A0B0C0D, 0x01020304, Timeout::new(0x11).unwrap());
    let wire = CmMad::new(5, CmBody::Mra(mra.clone())).encode();
    assert_eq!(
        &wire[24..34],
        &[0x0A, 0x0B, 0x0C, 0x0D, 1, 2, 3, 4, 0x80, 0x88]
    );
    assert_eq!(CmMad::decode(&wire).unwrap().body, CmBody::Mra(mra));
    let mut bad = wire;
    bad[32] = 0xC0;
    let err = CmMad::decode(&bad).unwrap_err();
    assert_eq!((err.field(), err.offset()), ("message_mraed", 32));
}

#[test]
fn other_cm_message_kept_raw() {
    let mut wire = CmMad::new(5, CmBody::Lap(lap())).encode();
    wire[17] = 0x10; // REQ
    let mad = CmMad::decode(&wire).unwrap();
    assert!(matches!(mad.body, CmBody::Other(_)));
    assert_eq!(mad.encode(), wire);
}

#[test]
fn wrong_class_version() {
    let mut wire = CmMad::new(5, CmBody::Lap(lap())).encode();
    wire[2] = 1;
    let err = CmMad::decode(&wire).unwrap_err();
    assert_eq!((err.field(), err.offset()), ("class_version", 2));
}

#[test]
fn apr_bytes_past_info_length_are_ignored() {
    // Found by the `mad` fuzz target: decode kept them, re-encode dropped them.
    let mut wire = CmMad::new(1, CmBody::Apr(Apr::answer(1, 2, ApStatus::Success))).encode();
    wire[24 + 8] = 1;
    wire[24 + 13] = 2;
    let mad = CmMad::decode(&wire).unwrap();
    assert_eq!(CmMad::decode(&mad.encode()), Ok(mad));
}
