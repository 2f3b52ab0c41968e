//! `cargo xtask codegen`: regenerate the committed libibverbs bindings of provider-verbs
//! from rdma-core's installed headers.
//!
//! Writes `provider-verbs/src/ffi/sys.rs` (bindgen output: the structs, constants and a
//! run-time-loaded function table) and `provider-verbs/tests/layout/table.rs` (every
//! named field of every generated struct, which the layout test checks against the C
//! header compiled with gcc). The header hash recorded in `sys.rs` lets a test see that
//! the bindings are current when the headers are installed.
//!
//! bindgen (and libclang) are needed only here: they sit behind xtask's `codegen` feature
//! so that `cargo xtask test` does not build them. Without the feature this re-runs
//! itself with it.

#[cfg(feature = "codegen")]
use anyhow::Context;
use anyhow::{bail, Result};
use std::path::Path;

/// The headers whose content the bindings depend on (hashed into `sys.rs`).
pub const HEADERS: &[&str] = &[
    "/usr/include/infiniband/verbs.h",
    "/usr/include/infiniband/verbs_api.h",
    "/usr/include/infiniband/ib_user_ioctl_verbs.h",
];

#[cfg(feature = "codegen")]
pub const SYS_RS: &str = "provider-verbs/src/ffi/sys.rs";
#[cfg(feature = "codegen")]
pub const TABLE_RS: &str = "provider-verbs/tests/layout/table.rs";

pub fn main(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("cargo xtask codegen takes no arguments");
    }
    for h in HEADERS {
        if !Path::new(h).is_file() {
            bail!("{h} is missing: install the Debian package libibverbs-dev (rdma-core)");
        }
    }
    run()
}

#[cfg(not(feature = "codegen"))]
fn run() -> Result<()> {
    // bindgen is behind a feature: build and run xtask again with it. libclang is loaded at
    // run time by bindgen; on Debian it comes with libclang-dev.
    if !Path::new("/usr/lib/x86_64-linux-gnu/libclang-14.so.1").exists()
        && Command::new("sh")
            .args([
                "-c",
                "ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1",
            ])
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
    {
        crate::apt::ensure(&["libclang-dev"], "cargo xtask codegen (bindgen)")?;
    }
    crate::util::run(
        "cargo",
        &[
            "run",
            "--quiet",
            "-p",
            "xtask",
            "--features",
            "codegen",
            "--",
            "codegen",
        ],
    )
}

#[cfg(not(feature = "codegen"))]
use std::process::Command;

#[cfg(feature = "codegen")]
fn run() -> Result<()> {
    let types = [
        "ibv_device",
        "ibv_context",
        "verbs_context",
        "ibv_device_attr",
        "ibv_port_attr",
        "ibv_gid_entry",
        "ibv_async_event",
        "ibv_pd",
        "ibv_cq",
        "ibv_mr",
        "ibv_qp",
        "ibv_qp_attr",
        "ibv_qp_init_attr",
        "ibv_ah_attr",
        "ibv_global_route",
        "ibv_send_wr",
        "ibv_recv_wr",
        "ibv_sge",
        "ibv_wc",
        "ibv_qp_state",
        "ibv_mig_state",
        "ibv_qp_type",
        "ibv_qp_attr_mask",
        "ibv_event_type",
        "ibv_wc_status",
        "ibv_wc_opcode",
        "ibv_wc_flags",
        "ibv_wr_opcode",
        "ibv_send_flags",
        "ibv_access_flags",
        "ibv_port_state",
        "ibv_mtu",
        "ibv_device_cap_flags",
        "ibv_gid_type",
        "ibv_node_type",
        "ibv_transport_type",
    ];
    let functions = [
        "ibv_get_device_list",
        "ibv_free_device_list",
        "ibv_get_device_name",
        "ibv_get_device_guid",
        "ibv_open_device",
        "ibv_close_device",
        "ibv_query_device",
        "ibv_query_port",
        "ibv_query_gid",
        "_ibv_query_gid_ex",
        "ibv_get_async_event",
        "ibv_ack_async_event",
        "ibv_alloc_pd",
        "ibv_dealloc_pd",
        "ibv_create_cq",
        "ibv_destroy_cq",
        "ibv_reg_mr",
        "ibv_dereg_mr",
        "ibv_create_qp",
        "ibv_destroy_qp",
        "ibv_modify_qp",
        "ibv_query_qp",
        "ibv_wc_status_str",
        "ibv_event_type_str",
        "ibv_port_state_str",
    ];
    let mut b = bindgen::Builder::default()
        .header_contents("apm_verbs.h", "#include <infiniband/verbs.h>\n")
        .dynamic_library_name("IbvLib")
        .dynamic_link_require_all(true)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_debug(false)
        .derive_default(false)
        .layout_tests(true)
        .generate_comments(false)
        .allowlist_var("IBV_LINK_LAYER_.*")
        .allowlist_recursively(true);
    for t in types {
        b = b.allowlist_type(t);
    }
    for f in functions {
        b = b.allowlist_function(f);
    }
    let bindings = b
        .generate()
        .map_err(|e| anyhow::anyhow!("bindgen failed on verbs.h: {e}"))?;
    let body = bindings.to_string();

    let hash = header_hash()?;
    let header = format!(
        "//! libibverbs bindings generated by `cargo xtask codegen` from rdma-core's\n\
         //! `infiniband/verbs.h` with bindgen. Do not edit: regenerate.\n\
         //!\n\
         //! Header hash (FNV-1a 64 of the headers, checked by a test): {hash:016x}\n\
         #![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code)]\n\
         #![allow(clippy::all, missing_debug_implementations, unsafe_op_in_unsafe_fn)]\n\n"
    );
    std::fs::write(SYS_RS, header + &body).with_context(|| format!("write {SYS_RS}"))?;
    let table = layout_table(&body);
    if let Some(dir) = Path::new(TABLE_RS).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(TABLE_RS, table).with_context(|| format!("write {TABLE_RS}"))?;
    crate::util::run("rustfmt", &["--edition", "2021", SYS_RS, TABLE_RS])?;
    println!("codegen: wrote {SYS_RS} and {TABLE_RS} (headers {hash:016x})");
    Ok(())
}

/// FNV-1a 64 over the headers' contents, in order; provider-verbs' freshness test computes
/// the same.
#[cfg(feature = "codegen")]
fn header_hash() -> Result<u64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in HEADERS {
        let data = std::fs::read(p).with_context(|| format!("read {p}"))?;
        for b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(h)
}

/// A Rust table of (C type, field, Rust offset, Rust size) for every named field of every
/// generated `struct`/`union`, from bindgen's (prettyplease-formatted) output. Fields that
/// bindgen invented (anonymous unions, padding, bitfield units) have no C name: skipped.
#[cfg(feature = "codegen")]
fn layout_table(body: &str) -> String {
    let mut out = String::from(
        "// Generated by `cargo xtask codegen`: every named field of the generated structs.\n\
         // (C keyword and type, field, Rust offset, Rust size), checked against gcc.\n\
         pub fn table() -> Vec<(&'static str, &'static str, usize, usize)> {\n\
         use provider_verbs::ffi::sys::*;\n\
         #[allow(unused_imports)] use std::mem::{offset_of, size_of};\n\
         fn sz<T, F>(_: fn(&T) -> &F) -> usize { size_of::<F>() }\n\
         vec![\n",
    );
    // bindgen renames C fields that are Rust keywords by appending `_`.
    const KEYWORDS: &[&str] = &["type", "priv", "ref", "match", "move", "mod", "fn", "loop"];
    let mut current: Option<(String, String)> = None;
    // Entries of the struct being read, kept back until its end: an incomplete C type
    // (which bindgen makes opaque, `_unused` or `_address`) has no layout to check.
    let mut pending: Vec<String> = Vec::new();
    let mut opaque = false;
    for line in body.lines() {
        let t = line.trim();
        if let Some((kw, r)) = t
            .strip_prefix("pub struct ")
            .map(|r| ("struct", r))
            .or_else(|| t.strip_prefix("pub union ").map(|r| ("union", r)))
        {
            if let Some(name) = r.strip_suffix(" {") {
                // Only rdma-core's own named types: not bindgen's anonymous members,
                // libc's types or the function table.
                let ours = ["ibv_", "verbs_", "_compat_ibv_"]
                    .iter()
                    .any(|p| name.starts_with(p));
                let c_kw = (ours && !name.contains("__bindgen")).then_some(kw);
                current = c_kw.map(|k| (k.to_owned(), name.to_owned()));
                pending.clear();
                opaque = false;
                if let Some((k, n)) = &current {
                    pending.push(format!("(\"{k} {n}\", \"\", 0, size_of::<{n}>()),\n"));
                }
            }
            continue;
        }
        if t == "}" {
            if current.take().is_some() && !opaque {
                out.extend(pending.drain(..));
            }
            pending.clear();
            continue;
        }
        let Some((kw, name)) = &current else { continue };
        let field = t.strip_prefix("pub ").unwrap_or(t);
        let Some((fname, _)) = field.split_once(':') else {
            continue;
        };
        let fname = fname.trim();
        if fname == "_unused" || fname == "_address" {
            opaque = true;
            continue;
        }
        if !t.starts_with("pub ")
            || fname.starts_with("__bindgen")
            || fname.starts_with("_bitfield")
            || fname == "__pad"
        {
            continue;
        }
        let c_field = match fname.strip_suffix('_') {
            Some(k) if KEYWORDS.contains(&k) => k,
            _ => fname,
        };
        // The closure is never called (`sz` only reads its type); a union field needs
        // `unsafe` to be named at all.
        let access = if kw == "union" {
            format!("unsafe {{ &s.{fname} }}")
        } else {
            format!("&s.{fname}")
        };
        pending.push(format!(
            "(\"{kw} {name}\", \"{c_field}\", offset_of!({name}, {fname}), sz(|s: &{name}| {access})),\n"
        ));
    }
    out.push_str("]\n}\n");
    out
}
