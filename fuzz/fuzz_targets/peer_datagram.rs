//! The peer channel's datagrams (UDP) and vendor MADs (InfiniBand), as their receive
//! tasks handle them: authentication (every mode) then decoding. Nothing may panic;
//! what opens under a key must have been sealed with it, and a sealed MAD opens once
//! and only once.
#![no_main]

use apm_core::PortKey;
use cm_lap::apm_msg;
use cm_lap::auth::{Authenticator, Key, Mode};
use cm_lap::udp::UDP_DEFAULT_OUI;
use cm_lap::umad_transport::DEFAULT_VENDOR_CLASS;
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_800_000_000_000_000_000;

fuzz_target!(|data: &[u8]| {
    let key = Key::new(&[0x5A; 32]).expect("key");
    let port = PortKey::new(0, 1);
    for mode in [
        Mode::Off,
        Mode::Require(key.clone()),
        Mode::AcceptUnauthenticated(key.clone()),
    ] {
        let receiver = Authenticator::new(mode, 1);
        if let Ok(mad) = receiver.open(data, NOW) {
            let _ = apm_msg::decode(DEFAULT_VENDOR_CLASS, UDP_DEFAULT_OUI, port, &mad);
        }
        if let Ok(mad) = receiver.open_mad(data, NOW) {
            let _ = apm_msg::decode(DEFAULT_VENDOR_CLASS, UDP_DEFAULT_OUI, port, &mad);
        }
    }
    // Whatever 256 bytes a sender seals open once under the same key.
    if let Ok(mad) = <[u8; 256]>::try_from(data) {
        let sender = Authenticator::new(Mode::Require(key.clone()), 2);
        let receiver = Authenticator::new(Mode::Require(key), 3);
        let sealed = sender.seal(&mad, NOW);
        assert_eq!(receiver.open(&sealed, NOW), Ok(mad));
        assert!(receiver.open(&sealed, NOW).is_err(), "a replay opened");
        // In a MAD: sealed when its trailer is free, then opened once, trailer zeroed.
        let mut in_mad = mad;
        if sender.seal_mad(&mut in_mad, NOW) {
            assert_eq!(receiver.open_mad(&in_mad, NOW), Ok(mad));
            assert!(receiver.open_mad(&in_mad, NOW).is_err(), "a replayed MAD opened");
        }
    }
});
