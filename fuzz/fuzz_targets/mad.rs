//! Whole-MAD decoding through the class dispatcher (SA, CM, vendor, SMP, other): never
//! panics, and whatever decodes re-encodes to bytes that decode to the same value.
#![no_main]

use ib_mad::Mad;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(mad) = Mad::decode(data) {
        let wire = mad.encode();
        let again = Mad::decode(&wire).expect("an encoded MAD decodes");
        assert_eq!(again, mad, "decode(encode(m)) == m");
        assert_eq!(again.encode(), wire, "encoding is stable");
    }
});
