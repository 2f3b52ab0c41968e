//! Vendor-class MADs with OUI.
#![no_main]

use ib_mad::vendor::VendorMad;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = VendorMad::decode(data) {
        assert_eq!(VendorMad::decode(&v.encode()).expect("re-decodes"), v);
    }
});
