//! Tidy: the invariants ARCHITECTURE.md states about the tree, checked on the source
//! text so that a change that breaks one fails `cargo test` instead of waiting for a
//! reader to notice.
//!
//! - unsafe code only in the FFI crates and modules: every other crate root says
//!   `#![forbid(unsafe_code)]`, the FFI crates say `deny` and only their FFI modules
//!   `allow` it;
//! - no clock, sleep or timer in apm-core's engine (time is an input);
//! - every crate root has crate documentation (`//!`);
//! - no Rust file over [`MAX_LINES`] lines, except generated code and integration tests;
//! - no function over [`MAX_FN_LINES`] lines outside tests and generated code;
//! - nothing cites a file outside the repository (the background notes the project was
//!   started from are not part of it: the facts live in `docs/`).
//!
//! It reads files only; it never changes one.

use std::fs;
use std::path::{Path, PathBuf};

/// The line limit of a Rust source file.
const MAX_LINES: usize = 800;

/// The line limit of a function (its signature to its closing brace), tests aside.
const MAX_FN_LINES: usize = 100;

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

/// `text` with its comments, string literals and character literals blanked out
/// (newlines kept), so that braces and `fn` are read as code only.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    let ident = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            // Nested block comments, as Rust has them.
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#") || rest.starts_with(b"br"))
            && !ident(i)
        {
            // A raw string: r"..", r#".."#, br"..".
            let start = i + usize::from(b[i] == b'b') + 1;
            let hashes = b[start..].iter().take_while(|&&c| c == b'#').count();
            if b.get(start + hashes) != Some(&b'"') {
                out.push(b[i] as char);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = start + hashes + 1;
            b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| body + p + close.len())
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let lit = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(2).position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match lit {
                Some(n) => i + n,
                None => {
                    out.push('\'');
                    i += 1;
                    continue;
                }
            }
        } else {
            let ch = text[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    out
}

/// Every function of `code` (see [`code_only`]) that is not test code, as (name, first
/// line, lines). Items under `#[cfg(test)]` are test code.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    struct Open {
        name: String,
        line: usize,
        depth: usize,
    }
    let mut out = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    // A `fn` seen whose body has not begun, and the bracket depth it was seen at.
    let mut pending: Option<(String, usize, i32)> = None;
    let mut test_item = false;
    let mut skip_from: Option<usize> = None;
    let (mut depth, mut brackets) = (0usize, 0i32);
    for (n, line) in code.lines().enumerate() {
        if line.contains("#[cfg(test)]") {
            test_item = true;
        }
        let words: Vec<&str> = line
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        if skip_from.is_none() {
            if let Some(k) = words.iter().position(|w| *w == "fn") {
                if let Some(name) = words.get(k + 1) {
                    pending = Some((name.to_string(), n + 1, brackets));
                }
            }
        }
        for c in line.chars() {
            match c {
                '(' | '[' => brackets += 1,
                ')' | ']' => brackets -= 1,
                '{' => {
                    depth += 1;
                    if test_item && skip_from.is_none() {
                        skip_from = Some(depth);
                        pending = None;
                    }
                    test_item = false;
                    if let Some((name, line, _)) = pending.take() {
                        open.push(Open { name, line, depth });
                    }
                }
                '}' => {
                    if open.last().is_some_and(|o| o.depth == depth) {
                        let o = open.pop().expect("checked");
                        out.push((o.name, o.line, n + 1 - o.line + 1));
                    }
                    if skip_from == Some(depth) {
                        skip_from = None;
                    }
                    depth = depth.saturating_sub(1);
                }
                ';' => {
                    // A declaration without a body (a trait's), or a test item that
                    // is one line (`#[cfg(test)] mod tests;`).
                    if pending.as_ref().is_some_and(|p| p.2 == brackets) {
                        pending = None;
                    }
                    if skip_from.is_none() {
                        test_item = false;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn no_function_is_over_the_line_limit() {
    let mut srcs = Vec::new();
    files(&root(), &[".rs"], &mut srcs);
    let mut wrong = Vec::new();
    for f in srcs {
        let r = rel(&f);
        if GENERATED.contains(&r.as_str())
            || r.contains("/tests/")
            || r.ends_with("/tests.rs")
            || is_test_or_bench(&r)
            || r.starts_with("fuzz/")
        {
            continue;
        }
        let code = code_only(&fs::read_to_string(&f).expect("source"));
        for (name, line, lines) in functions(&code) {
            if lines > MAX_FN_LINES {
                wrong.push(format!("{r}:{line}: fn {name}, {lines} lines"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them at their seams):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_function_reader_sees_through_comments_strings_and_tests() {
    let src = r##"
fn short() -> [u8; 2] {
    let s = "} fn fake() {";
    let c = '}';
    // } fn commented() {
    [0; 2]
}
trait T {
    fn declared(&self);
    fn with_body(&self) {
        let _ = r#"{"#;
    }
}
#[cfg(test)]
mod tests {
    fn helper() {}
}
fn last<'a>(x: &'a str) -> &'a str {
    x
}
"##;
    let got: Vec<(String, usize, usize)> = functions(&code_only(src));
    let want = [("short", 2, 6), ("with_body", 10, 3), ("last", 18, 3)];
    assert_eq!(
        got,
        want.map(|(n, l, c)| (n.to_string(), l, c)).to_vec(),
        "{got:?}"
    );
}
