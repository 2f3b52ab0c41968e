//! The APM-capable soft-RoCE modules for the VM: Debian's kernel source of exactly the
//! guest kernel's package version, with the patch set in `kernel/rxe-apm/` applied, built
//! out of tree against the matching `linux-headers-*` package, stripped, and cached under
//! `target/vm/rdma-apm/<key>/` by the content that decides them (like the VM image).
//!
//! Every module of the RDMA stack the VM loads is built: `ib_core`, `ib_uverbs` and
//! `rdma_rxe`, which the patches change, and the connection managers `apm run`'s
//! rdma_cm programs need (`ib_cm`, `iw_cm`, `rdma_cm`, `rdma_ucm`), which are built from
//! the same tree so that they match the patched core's symbols (nothing else the guest
//! loads depends on any of them). The patched tree keeps
//! the kernel's relative paths, so the patches apply with `patch -p1` as to the whole
//! source.
//!
//! What it must never do: build from a source or headers package of another version
//! than the guest kernel's (the modules would not load, or worse, load against a
//! different ABI), touch anything outside `target/vm/` except installing those Debian
//! packages, or keep a half-built result in the cache.

// A driver, not the engine: it reports how long the build took.
#![allow(clippy::disallowed_methods)]

use crate::util::Fnv;
use crate::vm::{file_name, module_name, GuestKernel};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The patch set, applied in the order its `series` file gives.
pub const PATCH_DIR: &str = "kernel/rxe-apm";

/// The built modules, in load order (each after those it depends on), with the path of
/// each inside the kernel tree.
pub const MODULES: &[(&str, &str)] = &[
    ("ib_core", "drivers/infiniband/core/ib_core.ko"),
    ("ib_cm", "drivers/infiniband/core/ib_cm.ko"),
    ("iw_cm", "drivers/infiniband/core/iw_cm.ko"),
    ("rdma_cm", "drivers/infiniband/core/rdma_cm.ko"),
    ("ib_uverbs", "drivers/infiniband/core/ib_uverbs.ko"),
    ("rdma_ucm", "drivers/infiniband/core/rdma_ucm.ko"),
    ("rdma_rxe", "drivers/infiniband/sw/rxe/rdma_rxe.ko"),
];

/// The kernel directories taken from the source (the patches may add single files
/// elsewhere, e.g. a header, which are taken too).
const SOURCE_DIRS: &[&str] = &["drivers/infiniband/core", "drivers/infiniband/sw/rxe"];

/// Bumped whenever the way the modules are built changes in a way the key's inputs
/// would not see.
const RECIPE: &str = "apm-rdma-modules-2";

/// The out-of-tree build's top `Kbuild`. The extra include directory two levels down
/// makes the trace headers' `TRACE_INCLUDE_PATH` (`../../drivers/infiniband/core`,
/// resolved against the include path) find the module tree.
const TOP_KBUILD: &str = "obj-m += drivers/infiniband/core/ drivers/infiniband/sw/rxe/\n\
                          subdir-ccflags-y += -I$(src)/trace-include/x\n";

/// A `Kbuild` beside the core's Makefile (Kbuild files win over Makefiles): the core's
/// own object lists, with only the modules the VM loads kept.
const CORE_KBUILD: &str = "include $(src)/Makefile\n\
                           obj-m := $(filter ib_core.o ib_cm.o iw_cm.o rdma_cm.o ib_uverbs.o \
                           rdma_ucm.o,$(obj-m))\n";

/// Debian packages the build needs besides the version-locked kernel ones.
const BUILD_PACKAGES: &[&str] = &["make", "patch", "xz-utils", "binutils", "gcc"];

/// The patched modules of one guest kernel.
#[derive(Debug, Clone)]
pub struct PatchedModules {
    /// The stripped modules, in load order (names as in [`MODULES`]).
    pub files: Vec<(String, PathBuf)>,
    /// The cache key (also the directory name).
    pub key: String,
}

/// The patch files in `series` order (absolute paths).
fn patches() -> Result<Vec<PathBuf>> {
    let dir = crate::util::workspace_root().join(PATCH_DIR);
    let series = std::fs::read_to_string(dir.join("series"))
        .with_context(|| format!("read {PATCH_DIR}/series"))?;
    let mut out = Vec::new();
    for line in series.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let p = dir.join(line);
        if !p.is_file() {
            bail!("{PATCH_DIR}/series names {line}, which does not exist");
        }
        out.push(p);
    }
    if out.is_empty() {
        bail!("{PATCH_DIR}/series lists no patch");
    }
    Ok(out)
}

/// A patch's file name (the key must not depend on where the checkout is).
fn file_name_bytes(p: &Path) -> &[u8] {
    p.file_name().map_or(&[], |n| n.as_encoded_bytes())
}

/// Files a patch touches outside [`SOURCE_DIRS`] that exist in the source (`--- a/...`).
fn extra_sources(patch: &str) -> Vec<String> {
    patch
        .lines()
        .filter_map(|l| l.strip_prefix("--- a/"))
        .map(|p| p.split('\t').next().unwrap_or(p).trim().to_owned())
        .filter(|p| !SOURCE_DIRS.iter().any(|d| p.starts_with(&format!("{d}/"))))
        .collect()
}

/// The Debian package version of the guest kernel's image package.
fn package_version(deb: &Path) -> Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg("Version")
        .output()
        .context("could not run dpkg-deb")?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || v.is_empty() {
        bail!("cannot read the package version of {}", deb.display());
    }
    Ok(v)
}

/// `6.1` of a kernel release like `6.1.0-48-amd64` (the source package's suffix).
fn series_of(release: &str) -> Result<String> {
    let mut it = release.split('.');
    match (it.next(), it.next()) {
        (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => Ok(format!("{a}.{b}")),
        _ => bail!("cannot tell the kernel series of release {release:?}"),
    }
}

/// Build the patched modules for `kernel`, or reuse them from the cache.
pub fn prepare(vm_dir: &Path, kernel: &GuestKernel) -> Result<PatchedModules> {
    let version = package_version(&kernel.deb)?;
    let series = series_of(&kernel.release)?;
    let source_pkg = format!("linux-source-{series}");
    let headers_pkg = format!("linux-headers-{}", kernel.release);
    let patches = patches()?;

    let mut h = Fnv::new();
    h.write(RECIPE.as_bytes());
    h.write(TOP_KBUILD.as_bytes());
    h.write(CORE_KBUILD.as_bytes());
    h.write(kernel.release.as_bytes());
    h.write(version.as_bytes());
    for p in &patches {
        h.write(file_name_bytes(p));
        h.write(&std::fs::read(p).with_context(|| format!("read {}", p.display()))?);
    }
    let key = format!("{:016x}", h.finish());
    let root = vm_dir.join("rdma-apm");
    let dir = root.join(&key);
    let files: Vec<(String, PathBuf)> = MODULES
        .iter()
        .map(|(name, _)| ((*name).to_owned(), dir.join(format!("{name}.ko"))))
        .collect();
    if files.iter().all(|(_, f)| f.is_file()) {
        eprintln!("rdma-apm: cached modules {key} ({source_pkg} {version}, patched)");
        return Ok(PatchedModules { files, key });
    }

    crate::apt::ensure(BUILD_PACKAGES, "the patched RDMA modules")?;
    crate::apt::ensure_exact(&[(&source_pkg, &version), (&headers_pkg, &version)])?;
    let t0 = Instant::now();
    eprintln!(
        "rdma-apm: building modules {key}: {source_pkg} {version} + {} patches, against \
         {headers_pkg}",
        patches.len()
    );
    // Older builds are stale by construction: keep the cache to the current one.
    if root.is_dir() {
        for e in std::fs::read_dir(&root)?.flatten() {
            if e.path() != dir {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let staging = root.join(format!("build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let built = build(&staging, &series, &kernel.release, &patches, &dir);
    let _ = std::fs::remove_dir_all(&staging);
    built?;
    eprintln!(
        "rdma-apm: built and stripped {} modules in {:.0} s",
        MODULES.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(PatchedModules { files, key })
}

/// Extract, patch, build and strip into `out` (written last, so a failed build leaves
/// no cache entry).
fn build(
    staging: &Path,
    series: &str,
    release: &str,
    patches: &[PathBuf],
    out: &Path,
) -> Result<()> {
    let tree = staging.join("src");
    std::fs::create_dir_all(&tree)?;
    let top = format!("linux-source-{series}");
    let tarball = format!("/usr/src/{top}.tar.xz");
    let mut members: Vec<String> = SOURCE_DIRS.iter().map(|d| (*d).to_owned()).collect();
    for p in patches {
        for f in extra_sources(&std::fs::read_to_string(p)?) {
            if !members.contains(&f) {
                members.push(f);
            }
        }
    }
    let mut tar = Command::new("tar");
    tar.arg("-xJf")
        .arg(&tarball)
        .arg("-C")
        .arg(&tree)
        .arg("--strip-components=1");
    for m in &members {
        tar.arg(format!("{top}/{m}"));
    }
    crate::util::check_status(
        tar.status(),
        &format!("extracting {members:?} from {tarball}"),
    )?;
    for p in patches {
        let status = Command::new("patch")
            .args(["-p1", "--batch", "--forward", "--quiet", "-d"])
            .arg(&tree)
            .arg("-i")
            .arg(p)
            .status();
        crate::util::check_status(status, &format!("applying {}", p.display()))?;
    }
    std::fs::create_dir_all(tree.join("trace-include/x"))?;
    std::fs::write(tree.join("Kbuild"), TOP_KBUILD)?;
    std::fs::write(tree.join("drivers/infiniband/core/Kbuild"), CORE_KBUILD)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Captured, and shown only when the build fails: a good build says nothing worth
    // reading ("Skipping BTF generation" for each module: no vmlinux in the headers).
    let made = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(format!("/usr/src/linux-headers-{release}"))
        .arg(format!("M={}", tree.display()))
        .arg(format!("-j{jobs}"))
        // The patched headers must come before the installed ones.
        .arg(format!(
            "NOSTDINC_FLAGS=-nostdinc -I{}/include",
            tree.display()
        ))
        .arg("modules")
        .output()
        .context("could not run make")?;
    if !made.status.success() {
        eprintln!(
            "{}{}",
            String::from_utf8_lossy(&made.stdout),
            String::from_utf8_lossy(&made.stderr)
        );
        bail!(
            "building the patched modules (make modules) failed: {}",
            made.status
        );
    }
    let tmp = staging.join("out");
    std::fs::create_dir_all(&tmp)?;
    for (name, rel) in MODULES {
        let status = Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(tmp.join(format!("{name}.ko")))
            .arg(tree.join(rel))
            .status();
        crate::util::check_status(status, &format!("stripping {rel}"))?;
    }
    std::fs::create_dir_all(out.parent().unwrap_or(out))?;
    std::fs::rename(&tmp, out).with_context(|| format!("rename to {}", out.display()))?;
    Ok(())
}

/// The guest's module load order (`modules`, paths as in the kernel package) with the
/// patched modules in place of the stock ones of the same name, each added to the
/// image's `files` under `modules/patched/`.
pub fn patched_order(
    modules: &[String],
    patched: &PatchedModules,
    files: &mut BTreeMap<PathBuf, PathBuf>,
) -> String {
    let mut order = String::new();
    for (i, m) in modules.iter().enumerate() {
        let name = module_name(m);
        match patched.files.iter().find(|(n, _)| *n == name) {
            Some((n, host)) => {
                let guest = format!("patched/{i:02}-{n}.ko");
                files.insert(PathBuf::from("modules").join(&guest), host.clone());
                let _ = writeln!(order, "{guest}");
            }
            None => {
                let _ = writeln!(order, "{i:02}-{}", file_name(m));
            }
        }
    }
    order
}

/// Build the patch set's own test (`test/rxe_apm_test.c`, plain libibverbs) under
/// `vm_dir` and return the executable.
pub fn build_test(vm_dir: &Path) -> Result<PathBuf> {
    let dir = vm_dir.join("suite");
    std::fs::create_dir_all(&dir)?;
    let exe = dir.join("rxe_apm_test");
    let status = Command::new("gcc")
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(
            crate::util::workspace_root()
                .join(PATCH_DIR)
                .join("test/rxe_apm_test.c"),
        )
        .arg("-libverbs")
        .status();
    crate::util::check_status(status, "building kernel/rxe-apm/test/rxe_apm_test.c")?;
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_outside_the_source_dirs_are_taken_from_the_patch() {
        let p = "--- a/include/rdma/ib_verbs.h\n+++ b/include/rdma/ib_verbs.h\n\
                 --- a/drivers/infiniband/sw/rxe/rxe.c\n--- /dev/null\n";
        assert_eq!(extra_sources(p), ["include/rdma/ib_verbs.h"]);
    }

    #[test]
    fn patched_modules_take_the_stock_ones_places() {
        let modules = [
            "kernel/drivers/infiniband/core/ib_core.ko".to_owned(),
            "kernel/drivers/net/veth.ko".to_owned(),
        ];
        let patched = PatchedModules {
            files: vec![("ib_core".into(), PathBuf::from("/built/ib_core.ko"))],
            key: "k".into(),
        };
        let mut files = BTreeMap::new();
        let order = patched_order(&modules, &patched, &mut files);
        assert_eq!(order, "patched/00-ib_core.ko\n01-veth.ko\n");
        assert_eq!(
            files.get(Path::new("modules/patched/00-ib_core.ko")),
            Some(&PathBuf::from("/built/ib_core.ko"))
        );
    }

    #[test]
    fn the_series_of_a_release() {
        assert_eq!(series_of("6.1.0-48-amd64").expect("series"), "6.1");
        assert!(series_of("garbage").is_err());
    }

    #[test]
    fn the_patch_set_is_listed_in_its_series() {
        let ps = patches().expect("series");
        assert!(ps.len() >= 2, "{ps:?}");
        for p in ps {
            let text = std::fs::read_to_string(&p).expect("patch");
            assert!(text.contains("\n+++ b/"), "{} is no patch", p.display());
        }
    }
}
