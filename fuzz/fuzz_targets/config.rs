//! The deployment configuration (`apm config check`, `Apm::start`): any text parses or
//! is refused with located errors, never a panic, in time linear in its size.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match apm::Config::parse(text) {
        Ok(config) => {
            let _ = config.engine_policy();
            let _ = config.lap_transport();
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "refused without a reason");
            for e in &errors {
                assert!(e.line <= text.lines().count() + 1, "{e} is past the end");
                let _ = e.to_string();
            }
        }
    }
});
