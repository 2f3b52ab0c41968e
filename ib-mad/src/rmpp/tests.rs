//! Unit tests of the RMPP sender and receiver talking to each other.

use super::*;
use crate::attribute::Attribute;
use crate::header::{Method, MAD_SIZE};
use crate::sa::{table_records, PathRecord, SaMad, SaPayload, SA_DATA_SIZE};
use crate::types::Lid;

fn table(n: usize) -> Vec<u8> {
    let mut data = vec![0u8; n * 64];
    for (i, chunk) in data.chunks_mut(64).enumerate() {
        PathRecord {
            dlid: Lid(i as u16),
            slid: Lid(0x100 + i as u16),
            ..PathRecord::default()
        }
        .encode(chunk);
    }
    data
}

fn template() -> [u8; MAD_SIZE] {
    let mut mad = SaMad::new(
        Method::GET_TABLE_RESP,
        0xABCD,
        SaPayload::Raw(Box::new([0; SA_DATA_SIZE])),
    );
    mad.header.attribute_id = PathRecord::ID;
    mad.sa.attribute_offset = 8;
    mad.encode()
}

/// Drive a transfer of `records` PathRecords with receiver window `window`, dropping
/// segment numbers in `drop_once` the first time they are sent.
fn transfer(records: usize, window: u32, drop_once: &[u32]) -> (Vec<u8>, usize) {
    let data = table(records);
    let mut tx = RmppSender::new(&template(), data.clone(), Timeout::ZERO).unwrap();
    let mut rx = RmppReceiver::with_limits(window, 1 << 20);
    let mut dropped: Vec<u32> = Vec::new();
    let mut acks = 0;
    for _round in 0..1000 {
        let mut progressed = false;
        while let Some(seg) = tx.poll_transmit() {
            progressed = true;
            let n = RmppHeader::decode(&seg).unwrap().data1;
            if drop_once.contains(&n) && !dropped.contains(&n) {
                dropped.push(n);
                continue;
            }
            match rx.handle(&seg).unwrap() {
                RecvEvent::Continue { ack } => {
                    if let Some(ack) = ack {
                        acks += 1;
                        assert_eq!(ack[3], 0x12, "ACK flips the response bit");
                        tx.handle_ack(&ack).unwrap();
                    }
                }
                RecvEvent::Complete { ack, message } => {
                    tx.handle_ack(&ack.unwrap()).unwrap();
                    assert!(tx.is_complete());
                    assert_eq!(message.header().unwrap().transaction_id, 0xABCD);
                    return (message.into_data(), acks + 1);
                }
            }
        }
        if !progressed {
            tx.retransmit();
        }
    }
    panic!("transfer did not finish");
}

#[test]
fn single_segment() {
    let (data, acks) = transfer(3, 64, &[]);
    assert_eq!(data, table(3));
    assert_eq!(acks, 1);
}

#[test]
fn many_segments_with_windows() {
    // 100 records = 6400 bytes = 32 segments of 200.
    let (data, acks) = transfer(100, 4, &[]);
    assert_eq!(data, table(100));
    // ACKs after segment 1, then every 4, then the last.
    assert_eq!(acks, 1 + 7 + 1);
    let records: Vec<PathRecord> = table_records(&data, 8).map(Result::unwrap).collect();
    assert_eq!(records.len(), 100);
    assert_eq!(records[99].dlid, Lid(99));
}

#[test]
fn lost_segments_are_resent() {
    let (data, _) = transfer(50, 3, &[2, 5, 16]);
    assert_eq!(data, table(50));
}

#[test]
fn payload_length_and_flags() {
    let tx = RmppSender::new(&template(), table(7), Timeout::ZERO).unwrap();
    // 448 bytes of data: 3 segments (200, 200, 48).
    assert_eq!(tx.segment_count(), 3);
    let h1 = RmppHeader::decode(&tx.segment(1)).unwrap();
    let h3 = RmppHeader::decode(&tx.segment(3)).unwrap();
    assert!(h1.flags.first && !h1.flags.last && h1.flags.active);
    assert_eq!(h1.data2, 3 * 220 - 152);
    assert!(h3.flags.last);
    assert_eq!(h3.data2, 20 + 48);
}

#[test]
fn too_large_is_refused_before_storing() {
    let tx = RmppSender::new(&template(), table(100), Timeout::ZERO).unwrap();
    let mut rx = RmppReceiver::with_limits(4, 1000);
    let err = rx.handle(&tx.segment(1)).unwrap_err();
    assert!(matches!(err, RmppError::TooLarge { .. }));
}

#[test]
fn abort_ends_the_transfer() {
    let tx = RmppSender::new(&template(), table(10), Timeout::ZERO).unwrap();
    let mut rx = RmppReceiver::new();
    let abort = tx.abort(status::UNSPECIFIED);
    assert_eq!(
        rx.handle(&abort),
        Err(RmppError::Ended {
            rmpp_type: RmppType::Abort,
            status: status::UNSPECIFIED
        })
    );
}

#[test]
fn receiver_side_abort() {
    let tx = RmppSender::new(&template(), table(10), Timeout::ZERO).unwrap();
    let seg = tx.segment(1);
    let abort = abort_mad(&seg, status::BAD_TYPE).unwrap();
    let h = RmppHeader::decode(&abort).unwrap();
    assert_eq!((h.rmpp_type, h.status), (RmppType::Abort, status::BAD_TYPE));
    assert_eq!(
        abort[3], 0x12,
        "response bit flipped back to the request method"
    );
    assert_eq!(&abort[8..16], &seg[8..16], "same TID");
    let mut tx = tx;
    assert!(matches!(
        tx.handle_ack(&abort),
        Err(RmppError::Ended {
            rmpp_type: RmppType::Abort,
            ..
        })
    ));
    let mut cm = seg;
    cm[1] = 0x07;
    assert_eq!(
        abort_mad(&cm, 0),
        Err(RmppError::NotRmppClass(crate::header::MgmtClass::CM))
    );
}
