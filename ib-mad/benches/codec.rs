//! Encode and decode throughput per message kind (criterion), plus RMPP segmentation
//! and reassembly of a PathRecord table. Run with `cargo xtask bench`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use ib_mad::cm::{AdditionalInfo, ApStatus, Apr, CmBody, CmMad, Lap, Mra};
use ib_mad::rmpp::{RecvEvent, RmppReceiver, RmppSender};
use ib_mad::sa::{ClassPortInfo, InformInfo, Notice, NoticeDetails, PathRecord, SaMad, SaPayload};
use ib_mad::smp::{SmInfo, Smp};
use ib_mad::types::{Gid, Lid, Oui, Timeout, U15, U24, U7};
use ib_mad::vendor::VendorMad;
use ib_mad::{Attribute, AttributeId, Mad, Method, MgmtClass, MAD_SIZE};

fn kinds() -> Vec<(&'static str, Mad)> {
    let notice = Notice {
        notice_type: U7::from_masked(3),
        producer_type: U24::from_masked(4),
        issuer_lid: Lid(1),
        toggle: true,
        count: U15::from_masked(7),
        details: NoticeDetails::GidOutOfService(Gid::new(0xfe80 << 48, 0x1234)),
        issuer_gid: Gid::new(0xfe80 << 48, 1),
    };
    let pr = PathRecord {
        dgid: Gid::new(0xfe80 << 48, 2),
        sgid: Gid::new(0xfe80 << 48, 3),
        dlid: Lid(2),
        slid: Lid(3),
        ..PathRecord::default()
    };
    let mut req = [0u8; MAD_SIZE];
    req[..8].copy_from_slice(&[1, 0x81, 1, 1, 0, 0, 1, 1]);
    req[16..18].copy_from_slice(&AttributeId::SM_INFO.0.to_be_bytes());
    let smp = Smp::decode(&req).expect("valid SMP");
    vec![
        (
            "sa_inform_info",
            Mad::Sa(SaMad::set_inform_info(
                1,
                InformInfo::subscribe_trap(65, true),
            )),
        ),
        (
            "sa_notice",
            Mad::Sa(SaMad::new(Method::REPORT, 2, SaPayload::Notice(notice))),
        ),
        (
            "sa_path_record",
            Mad::Sa(SaMad::path_record_query(3, pr, 0x3C)),
        ),
        (
            "sa_class_port_info",
            Mad::Sa(SaMad::new(
                Method::GET_RESP,
                4,
                SaPayload::ClassPortInfo(ClassPortInfo::default()),
            )),
        ),
        (
            "cm_lap",
            Mad::Cm(CmMad::new(5, CmBody::Lap(Lap::default()))),
        ),
        (
            "cm_apr",
            Mad::Cm(CmMad::new(
                6,
                CmBody::Apr(Apr {
                    additional_info: AdditionalInfo::new(&[1, 2]).expect("fits"),
                    ..Apr::answer(1, 2, ApStatus::InvalidGid)
                }),
            )),
        ),
        (
            "cm_mra",
            Mad::Cm(CmMad::new(
                7,
                CmBody::Mra(Mra::for_lap(1, 2, Timeout::ZERO)),
            )),
        ),
        (
            "vendor",
            Mad::Vendor(
                VendorMad::new(
                    MgmtClass(0x30),
                    1,
                    Method::SEND,
                    8,
                    AttributeId::CM_LAP,
                    Oui(U24::from_masked(0x1405)),
                )
                .expect("vendor class"),
            ),
        ),
        (
            "smp_sminfo",
            Mad::Smp(smp.response(U15::ZERO, SmInfo::not_active(9).to_smp_data())),
        ),
    ]
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Bytes(MAD_SIZE as u64));
    for (name, mad) in kinds() {
        g.bench_function(name, |b| b.iter(|| black_box(&mad).encode()));
    }
    g.finish();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Bytes(MAD_SIZE as u64));
    for (name, mad) in kinds() {
        let wire = mad.encode();
        g.bench_function(name, |b| b.iter(|| Mad::decode(black_box(&wire))));
    }
    g.finish();
}

fn rmpp(c: &mut Criterion) {
    // 100 PathRecords: 6400 bytes, 32 segments.
    let mut data = vec![0u8; 100 * 64];
    for (i, chunk) in data.chunks_mut(64).enumerate() {
        PathRecord {
            dlid: Lid(i as u16),
            ..PathRecord::default()
        }
        .encode(chunk);
    }
    let mut t = SaMad::new(
        Method::GET_TABLE_RESP,
        1,
        SaPayload::Raw(Box::new([0; 200])),
    );
    t.header.attribute_id = PathRecord::ID;
    let template = t.encode();
    let mut g = c.benchmark_group("rmpp");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("transfer_100_path_records", |b| {
        b.iter(|| {
            let mut tx = RmppSender::new(&template, data.clone(), Timeout::ZERO).expect("SA");
            let mut rx = RmppReceiver::new();
            let mut out = None;
            while let Some(seg) = tx.poll_transmit() {
                match rx.handle(&seg).expect("valid") {
                    RecvEvent::Continue { ack: Some(ack) } => tx.handle_ack(&ack).expect("ack"),
                    RecvEvent::Continue { ack: None } => {}
                    RecvEvent::Complete { ack, message } => {
                        if let Some(ack) = ack {
                            tx.handle_ack(&ack).expect("ack");
                        }
                        out = Some(message.into_data());
                    }
                }
            }
            out
        })
    });
    g.finish();
}

criterion_group!(benches, codec, rmpp);
criterion_main!(benches);
