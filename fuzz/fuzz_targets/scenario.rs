//! Simulator scenario files (`apm simulate --scenario`, `apm watch --sim --scenario`):
//! any text is a scenario or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = provider_sim::Scenario::from_toml(text) {
        let _ = s.validate();
    }
});
