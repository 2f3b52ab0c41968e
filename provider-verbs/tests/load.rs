//! Loading libibverbs at run time: works where rdma-core is installed, and otherwise
//! fails with an error that names the packages to install.

use provider_verbs::{Verbs, VerbsError};

#[test]
fn missing_library_error_names_the_packages() {
    let e = VerbsError::LibraryMissing {
        detail: "libibverbs.so.1: cannot open shared object file".into(),
    };
    let msg = e.to_string();
    assert!(msg.contains("libibverbs1"), "{msg}");
    assert!(msg.contains("ibverbs-providers"), "{msg}");
}

#[test]
fn load_succeeds_or_says_what_to_install() {
    match Verbs::load() {
        Ok(v) => {
            // No device is needed to list devices; an empty list is fine here.
            match v.devices() {
                Ok(d) => println!("libibverbs loaded; {} device(s)", d.len()),
                Err(e) => println!("libibverbs loaded; listing devices failed: {e}"),
            }
        }
        Err(e @ VerbsError::LibraryMissing { .. }) => {
            println!("libibverbs not installed here: {e}");
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn opening_a_missing_device_is_an_error_not_a_panic() {
    let Ok(v) = Verbs::load() else {
        println!("SKIPPED: libibverbs not installed");
        return;
    };
    match v.open("apm-no-such-device") {
        Err(VerbsError::NoSuchDevice(n)) => assert_eq!(n, "apm-no-such-device"),
        Err(e) => println!("listing devices failed here: {e}"),
        Ok(_) => panic!("opened a device that does not exist"),
    }
}
