//! The positional field view `apm mad` uses: for any decodable MAD, every listed field
//! reads back its value from the wire and writing it back changes nothing.
#![no_main]

use ib_mad::fields::{describe, read_field, write_field};
use ib_mad::Mad;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(mad) = Mad::decode(data) {
        let wire = mad.encode();
        for f in describe(&mad) {
            assert_eq!(read_field(&wire, &f), f.value, "{}", f.name);
            let mut copy = wire;
            write_field(&mut copy, &f, &f.value).expect("a described value fits");
            assert_eq!(copy, wire, "{}", f.name);
        }
    }
});
