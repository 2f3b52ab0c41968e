//! Tidy: the invariants ARCHITECTURE.md states about the tree, checked on the source
//! text so that a change that breaks one fails `cargo test` instead of waiting for a
//! reader to notice.
//!
//! - unsafe code only in the FFI crates and modules: every other crate root says
//!   `#![forbid(unsafe_code)]`, the FFI crates say `deny` and only their FFI modules
//!   `allow` it;
//! - no clock, sleep or timer in apm-core's engine (time is an input);
//! - the command line prints only through `apm/src/out.rs` (`println!` and `eprintln!`
//!   panic on a closed or full stream);
//! - every crate root has crate documentation (`//!`);
//! - no Rust file over [`MAX_LINES`] lines, except generated code and integration tests;
//! - nothing cites a file outside the repository (the background notes the project was
//!   started from are not part of it: the facts live in `docs/`).
//!
//! It reads files only; it never changes one.

use std::fs;
use std::path::{Path, PathBuf};

/// The line limit of a Rust source file.
const MAX_LINES: usize = 800;

/// Generated files, exempt from the line limit (regenerated, never edited by hand).
const GENERATED: &[&str] = &[
    "provider-verbs/src/ffi/sys.rs",
    "provider-verbs/tests/layout/table.rs",
];

/// Crates whose job is FFI: their root denies unsafe code and only the modules in
/// [`UNSAFE_MODULES`] allow it.
const FFI_CRATES: &[&str] = &["umad", "provider-verbs", "apm-preload"];

/// Where `allow(unsafe_code)` may appear outside tests and benches. `apm-capi` is the C
/// ABI as a whole: every entry point takes raw pointers.
const UNSAFE_MODULES: &[&str] = &[
    "umad/src/ffi.rs",
    "provider-verbs/src/ffi/mod.rs",
    "apm-preload/src/ffi.rs",
    "apm-capi/src/lib.rs",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The workspace members, read from the root manifest.
fn members() -> Vec<String> {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("a members list")
        .0;
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every file under `dir` whose name ends with one of `exts`, skipping build output.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files(&p, exts, out);
            }
        } else if exts.iter().any(|x| name.ends_with(x)) {
            out.push(p);
        }
    }
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

fn crate_roots(member: &str) -> Vec<PathBuf> {
    ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(|f| root().join(member).join(f))
        .filter(|p| p.exists())
        .collect()
}

fn is_test_or_bench(rel: &str) -> bool {
    rel.contains("/tests/") || rel.contains("/benches/") || rel.contains("/examples/")
}

#[test]
fn unsafe_code_lives_only_in_ffi_modules() {
    let mut wrong = Vec::new();
    for m in members() {
        for r in crate_roots(&m) {
            let text = fs::read_to_string(&r).expect("crate root");
            let ok = if UNSAFE_MODULES.contains(&rel(&r).as_str()) {
                true
            } else if FFI_CRATES.contains(&m.as_str()) {
                text.contains("#![deny(unsafe_code)]")
            } else {
                text.contains("#![forbid(unsafe_code)]")
            };
            if !ok {
                wrong.push(format!(
                    "{}: crate root without forbid/deny(unsafe_code)",
                    rel(&r)
                ));
            }
        }
        let mut srcs = Vec::new();
        files(&root().join(&m).join("src"), &[".rs"], &mut srcs);
        for f in srcs {
            let r = rel(&f);
            let text = fs::read_to_string(&f).expect("source");
            if text.contains("allow(unsafe_code)")
                && !UNSAFE_MODULES.contains(&r.as_str())
                && !is_test_or_bench(&r)
            {
                wrong.push(format!("{r}: allows unsafe code outside the FFI modules"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_engine_reads_no_clock() {
    let mut srcs = Vec::new();
    files(&root().join("apm-core/src/engine"), &[".rs"], &mut srcs);
    assert!(
        !srcs.is_empty(),
        "apm-core/src/engine has moved: update tidy"
    );
    let clocks = [
        "Instant",
        "SystemTime",
        "tokio::time",
        "thread::sleep",
        "sleep(",
    ];
    let mut wrong = Vec::new();
    for f in srcs {
        let text = fs::read_to_string(&f).expect("source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for c in clocks {
                if code.contains(c) {
                    wrong.push(format!("{}:{}: {c}", rel(&f), n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the engine takes time as an input:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_command_line_prints_only_through_out() {
    let mut srcs = Vec::new();
    files(&root().join("apm/src"), &[".rs"], &mut srcs);
    assert!(!srcs.is_empty(), "apm/src has moved: update tidy");
    let mut wrong = Vec::new();
    for f in srcs {
        let text = fs::read_to_string(&f).expect("source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for m in ["println!(", "print!(", "eprintln!(", "eprint!("] {
                let at = code.match_indices(m).any(|(i, _)| {
                    // `eprintln!(` also holds `println!(`: count a macro once, by its start.
                    !code[..i].ends_with('e')
                });
                if at {
                    wrong.push(format!("{}:{}: {m}", rel(&f), n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "print through apm/src/out.rs (outln!, errln!): a closed pipe must not panic:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_crate_is_documented() {
    let mut wrong = Vec::new();
    for m in members() {
        for r in crate_roots(&m) {
            let text = fs::read_to_string(&r).expect("crate root");
            if !text.trim_start().starts_with("//!") {
                wrong.push(rel(&r));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "crate roots without `//!` docs:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_file_is_over_the_line_limit() {
    let mut srcs = Vec::new();
    files(&root(), &[".rs"], &mut srcs);
    let mut wrong = Vec::new();
    for f in srcs {
        let r = rel(&f);
        if GENERATED.contains(&r.as_str()) || r.contains("/tests/") || r.starts_with("fuzz/") {
            continue;
        }
        let lines = fs::read_to_string(&f).expect("source").lines().count();
        if lines > MAX_LINES {
            wrong.push(format!("{r}: {lines} lines"));
        }
    }
    assert!(
        wrong.is_empty(),
        "over {MAX_LINES} lines (split along the seams):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn nothing_cites_a_file_outside_the_repository() {
    // Spelled in pieces so that this file does not trip its own check.
    let outside = [
        ["DOMAIN", ".md"].concat(),
        ["DESIGN", ".md"].concat(),
        ["STYLE", ".md"].concat(),
        ["KERNEL", ".md"].concat(),
        ["(VM", ".md"].concat(),
        [" VM", ".md"].concat(),
        ["/wo", "rk/"].concat(),
        ["seeds", "/"].concat(),
    ];
    let mut srcs = Vec::new();
    files(
        &root(),
        &[".rs", ".md", ".toml", ".c", ".h", ".sh", ".py", "run"],
        &mut srcs,
    );
    let mut wrong = Vec::new();
    for f in srcs {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for o in &outside {
                if line.contains(o.as_str()) {
                    wrong.push(format!("{}:{}: {o}", rel(&f), n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the repository speaks for itself (write the fact into docs/):\n{}",
        wrong.join("\n")
    );
}
