//! Writes one valid MAD of every kind ib-mad encodes into a directory, as a seed
//! corpus for the fuzz targets (`cargo xtask fuzz` runs it for an empty corpus).
//!
//! Usage: `cargo run -p ib-mad --example fuzz_seeds -- DIR`

use ib_mad::cm::{AdditionalInfo, ApStatus, Apr, CmBody, CmMad, Lap, Mra};
use ib_mad::rmpp::RmppSender;
use ib_mad::sa::{ClassPortInfo, InformInfo, Notice, NoticeDetails, PathRecord, SaMad, SaPayload};
use ib_mad::smp::{SmInfo, Smp};
use ib_mad::types::{Gid, Lid, Oui, Timeout, U15, U24, U7};
use ib_mad::vendor::VendorMad;
use ib_mad::{Attribute, AttributeId, Method, MgmtClass, MAD_SIZE};

fn main() -> std::io::Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    std::fs::create_dir_all(&dir)?;
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    let notice = |details| Notice {
        notice_type: U7::from_masked(3),
        producer_type: U24::from_masked(4),
        issuer_lid: Lid(1),
        toggle: true,
        count: U15::from_masked(9),
        details,
        issuer_gid: Gid::new(0xfe80 << 48, 2),
    };
    let pr = PathRecord {
        dgid: Gid::new(0xfe80 << 48, 3),
        sgid: Gid::new(0xfe80 << 48, 4),
        dlid: Lid(3),
        slid: Lid(4),
        ..PathRecord::default()
    };
    let sa = [
        SaMad::set_inform_info(1, InformInfo::subscribe_trap(64, true)),
        SaMad::new(
            Method::REPORT,
            2,
            SaPayload::Notice(notice(NoticeDetails::GidOutOfService(Gid::new(1, 2)))),
        ),
        SaMad::new(
            Method::REPORT,
            3,
            SaPayload::Notice(notice(NoticeDetails::LinkStateChange(Lid(5)))),
        ),
        SaMad::path_record_query(4, pr, 0x3C),
        SaMad::new(
            Method::GET_RESP,
            5,
            SaPayload::ClassPortInfo(ClassPortInfo::default()),
        ),
    ];
    for (i, m) in sa.iter().enumerate() {
        seeds.push((
            ["sa-inform", "sa-trap65", "sa-trap128", "sa-pr", "sa-cpi"][i],
            m.encode().to_vec(),
        ));
    }
    let mut template = SaMad::new(
        Method::GET_TABLE_RESP,
        6,
        SaPayload::Raw(Box::new([0; 200])),
    );
    template.header.attribute_id = PathRecord::ID;
    template.sa.attribute_offset = 8;
    let mut table = vec![0u8; 5 * 64];
    for chunk in table.chunks_mut(64) {
        pr.encode(chunk);
    }
    if let Ok(mut tx) = RmppSender::new(&template.encode(), table, Timeout::ZERO) {
        // Segment 1, and segments 1-2 back to back for the RMPP target.
        let s1 = tx.segment(1);
        let s2 = tx.segment(2);
        seeds.push(("rmpp-seg1", s1.to_vec()));
        seeds.push(("rmpp-seg1-2", [s1.as_slice(), s2.as_slice()].concat()));
        let _ = tx.poll_transmit();
    }
    let cm = [
        CmBody::Lap(Lap::default()),
        CmBody::Apr(Apr {
            additional_info: AdditionalInfo::new(&[1, 2, 3]).unwrap_or_default(),
            ..Apr::answer(1, 2, ApStatus::InvalidLid)
        }),
        CmBody::Mra(Mra::for_lap(1, 2, Timeout::from_masked(10))),
    ];
    for (name, body) in ["cm-lap", "cm-apr", "cm-mra"].into_iter().zip(cm) {
        seeds.push((name, CmMad::new(7, body).encode().to_vec()));
    }
    if let Ok(v) = VendorMad::new(
        MgmtClass(0x30),
        1,
        Method::SEND,
        8,
        AttributeId::CM_LAP,
        Oui(U24::from_masked(0x1405)),
    ) {
        seeds.push(("vendor", v.encode().to_vec()));
    }
    let mut req = [0u8; MAD_SIZE];
    req[..8].copy_from_slice(&[1, 0x81, 1, 1, 0, 0, 1, 1]);
    req[16..18].copy_from_slice(&AttributeId::SM_INFO.0.to_be_bytes());
    if let Ok(smp) = Smp::decode(&req) {
        let resp = smp.response(U15::ZERO, SmInfo::not_active(9).to_smp_data());
        seeds.push(("smp-dr-req", req.to_vec()));
        seeds.push(("smp-dr-resp", resp.encode().to_vec()));
    }
    for (name, bytes) in &seeds {
        std::fs::write(std::path::Path::new(&dir).join(name), bytes)?;
    }
    println!("wrote {} seeds to {dir}", seeds.len());
    Ok(())
}
