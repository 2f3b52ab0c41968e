//! The generated libibverbs bindings against rdma-core's installed header.
//!
//! - `layout_matches_c_header`: the size of every generated struct and the offset and
//!   size of every named field, as Rust lays them out, against the same numbers from the
//!   header compiled with gcc (`offsetof`/`sizeof`).
//! - `bindings_are_current`: the header hash recorded in `src/ffi/sys.rs` by
//!   `cargo xtask codegen` matches the installed headers.
//!
//! Both skip, saying so, when the headers (Debian `libibverbs-dev`) or gcc are absent.

#[path = "layout/table.rs"]
#[allow(unsafe_code)] // names union fields inside never-called closures (types only)
mod table;

use std::path::Path;
use std::process::Command;

/// Same list and order as xtask's codegen.
const HEADERS: &[&str] = &[
    "/usr/include/infiniband/verbs.h",
    "/usr/include/infiniband/verbs_api.h",
    "/usr/include/infiniband/ib_user_ioctl_verbs.h",
];

fn headers_present() -> bool {
    HEADERS.iter().all(|h| Path::new(h).is_file())
}

#[test]
fn layout_matches_c_header() {
    if !headers_present() {
        println!("SKIPPED: rdma-core headers not installed (Debian package libibverbs-dev)");
        return;
    }
    if Command::new("gcc").arg("--version").output().is_err() {
        println!("SKIPPED: gcc not found");
        return;
    }
    let table = table::table();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (ty, field, _, _) in &table {
        if field.is_empty() {
            c.push_str(&format!("printf(\"%zu 0\\n\", sizeof({ty}));\n"));
        } else {
            c.push_str(&format!(
                "printf(\"%zu %zu\\n\", (size_t)offsetof({ty}, {field}), sizeof((({ty} *)0)->{field}));\n"
            ));
        }
    }
    c.push_str("return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("apm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).expect("write C source");
    let out = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc failed on the layout program:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&run.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), table.len(), "one line per table entry");
    let mut bad = Vec::new();
    for ((ty, field, off, size), line) in table.iter().zip(lines) {
        let mut it = line
            .split_whitespace()
            .map(|n| n.parse::<usize>().unwrap_or(usize::MAX));
        let (a, b) = (
            it.next().unwrap_or(usize::MAX),
            it.next().unwrap_or(usize::MAX),
        );
        let (c_off, c_size) = if field.is_empty() { (0, a) } else { (a, b) };
        if field.is_empty() {
            if c_size != *size {
                bad.push(format!("sizeof({ty}): C {c_size}, Rust {size}"));
            }
        } else if (c_off, c_size) != (*off, *size) {
            bad.push(format!(
                "{ty}.{field}: C offset {c_off} size {c_size}, Rust offset {off} size {size}"
            ));
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    println!(
        "checked {} sizes and field offsets against verbs.h",
        table.len()
    );
}

#[test]
fn bindings_are_current() {
    if !headers_present() {
        println!("SKIPPED: rdma-core headers not installed (Debian package libibverbs-dev)");
        return;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in HEADERS {
        for b in std::fs::read(p).expect("read header") {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let sys = include_str!("../src/ffi/sys.rs");
    let recorded = sys
        .lines()
        .find_map(|l| l.split("checked by a test): ").nth(1))
        .map(str::trim)
        .expect("sys.rs records its header hash");
    assert_eq!(
        recorded,
        format!("{h:016x}"),
        "the installed rdma-core headers differ from those src/ffi/sys.rs was generated \
         from: run `cargo xtask codegen` and commit the result"
    );
}
