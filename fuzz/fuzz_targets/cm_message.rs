//! CM LAP, APR, MRA and REQ decoded from slices of any length (a vendor-class carrier has
//! less room than a CM MAD), and whole CM MADs.
#![no_main]

use ib_mad::cm::{Apr, CmMad, Lap, Mra, Req};
use ib_mad::Attribute;
use libfuzzer_sys::fuzz_target;

fn round_trip<A: Attribute + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(a) = A::decode(data) {
        let mut buf = vec![0u8; A::SIZE];
        a.encode(&mut buf);
        assert_eq!(A::decode(&buf).expect("re-decodes"), a);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => round_trip::<Lap>(rest),
        1 => round_trip::<Apr>(rest),
        2 => round_trip::<Mra>(rest),
        3 => round_trip::<Req>(rest),
        _ => {
            if let Ok(m) = CmMad::decode(rest) {
                assert_eq!(CmMad::decode(&m.encode()).expect("re-decodes"), m);
            }
        }
    }
});
