//! SA attributes decoded on their own (as from a reassembled table) from slices of any
//! length, and table iteration with any AttributeOffset. The first byte picks the
//! attribute; the next two the AttributeOffset.
#![no_main]

use ib_mad::sa::{table_records, ClassPortInfo, InformInfo, Notice, PathRecord};
use ib_mad::Attribute;
use libfuzzer_sys::fuzz_target;

fn round_trip<A: Attribute + PartialEq + std::fmt::Debug>(data: &[u8], offset: u16) {
    if let Ok(a) = A::decode(data) {
        let mut buf = vec![0u8; A::SIZE];
        a.encode(&mut buf);
        assert_eq!(A::decode(&buf).expect("re-decodes"), a);
    }
    for record in table_records::<A>(data, offset).take(1000) {
        let _ = record;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let (offset, rest) = match rest {
        [a, b, tail @ ..] => (u16::from_be_bytes([*a, *b]), tail),
        _ => (0, rest),
    };
    match which % 4 {
        0 => round_trip::<InformInfo>(rest, offset),
        1 => round_trip::<Notice>(rest, offset),
        2 => round_trip::<PathRecord>(rest, offset),
        _ => round_trip::<ClassPortInfo>(rest, offset),
    }
});
