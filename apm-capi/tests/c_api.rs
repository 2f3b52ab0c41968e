//! The C ABI on the host: called from Rust, and from a C program compiled with gcc
//! against the committed header and the cdylib (on the simulated fabric); and the
//! committed header checked against cbindgen's output.
// The test calls the C ABI as C would: through raw pointers.
#![allow(unsafe_code)]

use apm_capi::*;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>, where cargo put libapm_capi.so (this test is in its deps/).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf()
}

fn last_error() -> String {
    // SAFETY: apm_last_error never returns NULL and the string lives until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr(apm_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn an_endless_config_file_is_refused_at_the_limit() {
    let mut m: *mut ApmManager = std::ptr::null_mut();
    let zero = CString::new("/dev/zero").unwrap();
    // SAFETY: valid C string and out pointer.
    let st = unsafe { apm_manager_new(zero.as_ptr(), &mut m) };
    assert_eq!(st, ApmStatus::Config);
    let e = last_error();
    assert!(e.contains("/dev/zero") && e.contains("16 MiB limit"), "{e}");
    assert!(m.is_null());
}

#[test]
fn rust_calls_through_the_abi() {
    let mut m: *mut ApmManager = std::ptr::null_mut();
    let bad = CString::new("[[device]]\nname = \"x\"\nprovider = \"sim\"\n").unwrap();
    // SAFETY: valid C string and out pointer.
    let st = unsafe { apm_manager_new_from_str(bad.as_ptr(), &mut m) };
    assert_eq!(st, ApmStatus::Config);
    assert!(last_error().contains("line 2"), "{}", last_error());
    assert!(m.is_null());
    // SAFETY: NULL arguments are checked, never dereferenced.
    unsafe {
        assert_eq!(
            apm_manager_new_from_str(std::ptr::null(), &mut m),
            ApmStatus::InvalidArgument
        );
        assert_eq!(
            apm_unprotect(std::ptr::null_mut(), 1),
            ApmStatus::InvalidArgument
        );
        assert_eq!(apm_notification_fd(std::ptr::null_mut()), -1);
        apm_manager_destroy(std::ptr::null_mut());
    }

    let ok = CString::new("[[device]]\nname = \"h1\"\nprovider = \"sim\"\n").unwrap();
    // SAFETY: valid C string and out pointer; the manager is used on this thread only
    // and destroyed once at the end.
    unsafe {
        assert_eq!(apm_manager_new_from_str(ok.as_ptr(), &mut m), ApmStatus::Ok);
        let mut n = 0usize;
        assert_eq!(apm_sim_connection_count(m, &mut n), ApmStatus::Ok);
        assert!(n > 0);
        let mut info = std::mem::MaybeUninit::<ApmConnInfo>::uninit();
        assert_eq!(apm_sim_connection(m, 0, info.as_mut_ptr()), ApmStatus::Ok);
        let info = info.assume_init();
        assert_eq!(apm_protect(m, std::ptr::null_mut(), &info), ApmStatus::Ok);
        // A real QP handed to a simulated deployment is refused, not ignored.
        let fake_qp = std::ptr::NonNull::<IbvQp>::dangling().as_ptr();
        assert_eq!(apm_protect(m, fake_qp, &info), ApmStatus::Unsupported);
        // So is a stall report: a simulated deployment has no application QPs.
        assert_eq!(apm_report_stall(m, info.id), ApmStatus::Unsupported);
        assert_eq!(
            apm_report_stall(std::ptr::null_mut(), 1),
            ApmStatus::InvalidArgument
        );
        assert_eq!(
            apm_sim_connection(m, n + 5, std::ptr::null_mut()),
            ApmStatus::InvalidArgument
        );
        assert_eq!(apm_sim_run_for(m, 200), ApmStatus::Ok);
        let mut note = std::mem::MaybeUninit::<ApmNotification>::uninit();
        assert_eq!(apm_next_notification(m, note.as_mut_ptr()), ApmStatus::Ok);
        let note = note.assume_init();
        assert_eq!(note.conn_id, info.id);
        assert_eq!(note.kind, ApmNotificationKind::Protected);
        assert_eq!(apm_unprotect(m, info.id), ApmStatus::Ok);
        assert_eq!(apm_unprotect(m, info.id), ApmStatus::Engine);
        apm_manager_destroy(m);
    }
}

/// A C string field as Rust text.
fn text(field: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn a_move_for_a_silent_failure_says_fabric_in_its_cause() {
    // Rail A's switch black-holes at 1 s with both ports up: only probes see it. The
    // policy is the scenario's own: its QPs are the application's (apm cannot arm them
    // itself), so apm's default would leave their moves to the HCA, 34 s away at NCCL's
    // timeouts; `fast_moves = "always"` moves them on the probes' verdict.
    let scenario = crate_dir().join("../provider-sim/scenarios/nccl-silent.toml");
    let cfg = CString::new(format!(
        "[[device]]\nname = \"h2\"\nprovider = \"sim\"\n[sim]\nscenario = \"{}\"\nseed = 3\n\
         [policy]\nfast_moves = \"always\"\n\
         [policy.probe]\nenabled = true\ninfiniband = true\n",
        scenario.display()
    ))
    .unwrap();
    let mut m: *mut ApmManager = std::ptr::null_mut();
    let mut causes: Vec<(ApmNotificationKind, String, String)> = Vec::new();
    // SAFETY: valid C strings and out pointers; the manager is used on this thread only
    // and destroyed once at the end.
    unsafe {
        let st = apm_manager_new_from_str(cfg.as_ptr(), &mut m);
        assert_eq!(st, ApmStatus::Ok, "{}", last_error());
        let mut n = 0usize;
        assert_eq!(apm_sim_connection_count(m, &mut n), ApmStatus::Ok);
        for i in 0..n {
            let mut info = std::mem::MaybeUninit::<ApmConnInfo>::uninit();
            assert_eq!(apm_sim_connection(m, i, info.as_mut_ptr()), ApmStatus::Ok);
            let info = info.assume_init();
            assert_eq!(apm_protect(m, std::ptr::null_mut(), &info), ApmStatus::Ok);
        }
        assert_eq!(apm_sim_run_for(m, 1_500), ApmStatus::Ok);
        let mut note = std::mem::MaybeUninit::<ApmNotification>::uninit();
        while apm_next_notification(m, note.as_mut_ptr()) == ApmStatus::Ok {
            let n = note.assume_init_ref();
            causes.push((n.kind, text(&n.reason), text(&n.cause)));
        }
        apm_manager_destroy(m);
    }
    let moved: Vec<&str> = causes
        .iter()
        .filter(|(k, _, _)| *k == ApmNotificationKind::Migrated)
        .map(|(_, _, c)| c.as_str())
        .collect();
    assert!(moved.contains(&"fabric"), "{causes:?}");
    // The others moved because their peer asked: this side saw nothing.
    assert!(
        moved.iter().all(|c| *c == "fabric" || c.is_empty()),
        "{moved:?}"
    );
    assert!(
        causes
            .iter()
            .filter(|(k, _, _)| *k == ApmNotificationKind::Protected)
            .all(|(_, _, c)| c.is_empty()),
        "only moves and losses of a primary have a cause"
    );
}

#[test]
fn the_header_keeps_the_retired_kick_wr_id_of_the_library() {
    assert_eq!(APM_KICK_WR_ID, apm::KICK_WR_ID);
}

#[test]
fn a_device_deployment_without_the_rdma_stack_or_device_is_refused_with_the_reason() {
    // This machine (CI) has no rxe device: creation fails with UNAVAILABLE naming what
    // is missing; nothing half-built is returned.
    let cfg = CString::new(
        "[[device]]\nname = \"rxe_absent\"\nprovider = \"rxe\"\n[lap]\nudp_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let mut m: *mut ApmManager = std::ptr::null_mut();
    // SAFETY: valid C string and out pointer.
    let st = unsafe { apm_manager_new_from_str(cfg.as_ptr(), &mut m) };
    assert_eq!(st, ApmStatus::Unavailable, "{}", last_error());
    assert!(m.is_null());
    let e = last_error();
    assert!(
        e.contains("libibverbs") || e.contains("rxe_absent"),
        "the error names what is missing: {e}"
    );
}

#[test]
fn a_c_program_runs_against_the_header_and_the_cdylib() {
    // Cargo copies the cdylib up to target/<profile>/ only when the library itself is a
    // requested target; under `cargo test` it is rebuilt in deps/ and the copy may be an
    // old build: take the newer of the two.
    let profile = profile_dir();
    let modified = |d: &std::path::PathBuf| {
        std::fs::metadata(d.join("libapm_capi.so"))
            .and_then(|m| m.modified())
            .ok()
    };
    let dir = [profile.clone(), profile.join("deps")]
        .into_iter()
        .filter(|d| modified(d).is_some())
        .max_by_key(|d| modified(d))
        .unwrap_or_else(|| {
            panic!(
                "libapm_capi.so is in neither {} nor its deps/ (cargo test builds it)",
                profile.display()
            )
        });
    let out_dir = std::env::temp_dir().join(format!("apm-capi-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("sim_test");
    let cc = Command::new("gcc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(crate_dir().join("tests/c/sim_test.c"))
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-L")
        .arg(&dir)
        .arg("-lapm_capi")
        .output()
        .expect("gcc runs (install gcc)");
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("the C test runs");
    let _ = std::fs::remove_dir_all(&out_dir);
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "C test failed: {stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("ok"));
}

/// cbindgen, if installed (`cargo install cbindgen`; `cargo xtask capi-header` does it).
fn cbindgen() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH")?).collect();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("cbindgen"))
        .find(|p| p.is_file())
}

#[test]
fn the_committed_header_is_current() {
    let committed = std::fs::read_to_string(crate_dir().join("include/apm.h"))
        .expect("include/apm.h is committed");
    let Some(cbindgen) = cbindgen() else {
        println!(
            "SKIPPED: cbindgen is not installed (`cargo xtask capi-header` installs it and \
             regenerates include/apm.h)"
        );
        return;
    };
    let out = Command::new(cbindgen)
        .current_dir(crate_dir())
        .args([
            "--config",
            "cbindgen.toml",
            "--crate",
            "apm-capi",
            "--quiet",
        ])
        .output()
        .expect("cbindgen runs");
    assert!(
        out.status.success(),
        "cbindgen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh = String::from_utf8_lossy(&out.stdout);
    assert!(
        fresh == committed,
        "apm-capi/include/apm.h is stale: run `cargo xtask capi-header` and commit it"
    );
}
