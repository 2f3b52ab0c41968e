//! Simulator scenario files (`apm simulate --scenario`, `apm watch --sim --scenario`):
//! any text is a scenario or a list of located problems, never a panic; a scenario that
//! reads builds a simulation (its workload cut to a few connections: the fuzzer's
//! memory is not a million connections') and plays its first simulated 50 ms.
#![no_main]

use libfuzzer_sys::fuzz_target;
use provider_sim::{PolicyKind, RunConfig, Scenario, Sim};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Scenario::from_toml(text) {
        Ok(mut s) => {
            assert!(s.validate().is_ok(), "a scenario read is valid");
            s.workload.connections = s.workload.connections.min(8);
            s.workload.connections_per_host = None;
            s.topology.hosts = s.topology.hosts.min(64);
            if s.validate().is_err() {
                return; // fewer hosts than its links name
            }
            if let Ok(mut sim) = Sim::new(&s, RunConfig::new(PolicyKind::Apm, 1)) {
                sim.run_until(apm_core::Time::from_millis(50));
            }
        }
        Err(e) => {
            let lines = text.lines().count() + 1;
            assert!(!e.problems().is_empty(), "refused without a reason");
            for p in e.problems() {
                assert!(p.line <= lines, "{p} is past the end");
            }
        }
    }
});
