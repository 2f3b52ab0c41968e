//! What `apm agent` reads from others: the hello datagrams of other hosts' agents (UDP)
//! and the lines of the processes on its Unix socket (and the agent's lines a process
//! reads). Nothing may panic; whatever parses writes out and parses back the same.
#![no_main]

use apm_agent::hello::Hello;
use apm_agent::wire::{FromAgent, ToAgent};
use libfuzzer_sys::fuzz_target;

fn again<T>(v: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let bytes = serde_json::to_vec(v).expect("what parsed serializes");
    serde_json::from_slice(&bytes).expect("and parses again")
}

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = serde_json::from_slice::<Hello>(data) {
        assert_eq!(again(&h), h);
    }
    if let Ok(m) = serde_json::from_slice::<ToAgent>(data) {
        assert_eq!(again(&m), m);
    }
    if let Ok(m) = serde_json::from_slice::<FromAgent>(data) {
        assert_eq!(again(&m), m);
    }
});
