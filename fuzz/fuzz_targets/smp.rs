//! SMPs and SMInfo, and the response the ibsim shim builds from any decoded request.
#![no_main]

use ib_mad::smp::{SmInfo, Smp};
use ib_mad::types::U15;
use ib_mad::Attribute;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(smp) = Smp::decode(data) {
        assert_eq!(Smp::decode(&smp.encode()).expect("re-decodes"), smp);
        let resp = smp.response(U15::ZERO, SmInfo::not_active(1).to_smp_data());
        assert_eq!(Smp::decode(&resp.encode()).expect("response decodes"), resp);
    }
    if let Ok(info) = SmInfo::decode(data) {
        assert_eq!(
            SmInfo::decode(&info.to_smp_data()).expect("re-decodes"),
            info
        );
    }
});
