//! `cargo xtask deb`: the Debian package `apm`, into `target/debian/`, checked by
//! lintian; `cargo xtask test` also installs it on this machine with `dpkg -i`, runs
//! what an operator would (`apm --version`, `man apm`, `systemd-analyze verify` on the
//! unit) from the installed paths, and removes it again.
//!
//! Built with `dpkg-deb` over a staged tree rather than a cargo packaging tool: the
//! package holds files the built program generates (its manual pages and completions,
//! `apm generate`) and files of three crates (the `apm` binary, the preload and C
//! libraries), which a tool that packages one crate's declared assets does not make
//! simpler, and `dpkg-deb` is on every Debian machine (no tool to install in CI).
//! The binaries are built in the `deb` profile (release, stripped, linked with full
//! RELRO and immediate binding as Debian's hardening asks) into `target/deb/`, so
//! that no other build is rebuilt for it.

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The package's Debian revision.
const REVISION: &str = "1";
/// The multiarch directory (x86-64: the only architecture built): pkg-config's file.
const TRIPLET: &str = "x86_64-linux-gnu";

/// The Debian tools the package is built and checked with.
const TOOLS: &[&str] = &["dpkg-dev", "lintian", "man-db", "pkgconf", "systemd"];

pub fn main(args: &[String]) -> Result<()> {
    let install = match args {
        [] => false,
        [a] if a == "--install-check" => true,
        _ => bail!("cargo xtask deb [--install-check]"),
    };
    let deb = build()?;
    lintian(&deb)?;
    if install {
        install_check(&deb)?;
    }
    eprintln!("cargo xtask deb: {}", deb.display());
    Ok(())
}

/// Build the package and return its path.
pub fn build() -> Result<PathBuf> {
    crate::apt::ensure(TOOLS, "cargo xtask deb")?;
    let version = workspace_version()?;
    crate::util::run_env(
        "cargo",
        &[
            "build",
            "--profile",
            "deb",
            "-p",
            "apm",
            "-p",
            "apm-preload",
            "-p",
            "apm-capi",
        ],
        &[("RUSTFLAGS", "-C link-arg=-Wl,-z,relro,-z,now")],
    )?;
    let out = PathBuf::from("target/debian");
    let root = out.join(format!("apm_{version}-{REVISION}_amd64"));
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("rm -r {}", root.display()))?;
    }
    stage(&root, &version)?;
    let deb = out.join(format!("apm_{version}-{REVISION}_amd64.deb"));
    let (root_s, deb_s) = (path_str(&root)?, path_str(&deb)?);
    crate::util::run(
        "dpkg-deb",
        &["--root-owner-group", "--build", root_s, deb_s],
    )?;
    Ok(deb)
}

/// lintian on the package: no error (the warnings it may print are listed and
/// justified in the README).
pub fn lintian(deb: &Path) -> Result<()> {
    crate::util::run("lintian", &["--fail-on", "error", "--info", path_str(deb)?])
}

/// Install the package here, use it from its installed paths, remove it and check
/// that nothing of it is left (its configuration file stays until a purge).
pub fn install_check(deb: &Path) -> Result<()> {
    crate::util::run("dpkg", &["-i", path_str(deb)?])?;
    let checked = (|| {
        expect_output("/usr/bin/apm", &["--version"], "apm ")?;
        expect_output("man", &["-P", "cat", "apm"], "apm")?;
        expect_output("man", &["-P", "cat", "5", "apm.toml"], "metrics")?;
        expect_output("pkg-config", &["--libs", "apm"], "-lapm_capi")?;
        crate::util::run(
            "systemd-analyze",
            &["verify", "/lib/systemd/system/apm-agent.service"],
        )?;
        // The installed configuration reads, and `apm status` answers from it: the
        // service's agent, or (no systemd here, no device) one clear line.
        let status = Command::new("/usr/bin/apm")
            .args(["status", "--config", "/etc/apm/apm.toml"])
            .output()
            .context("apm status")?;
        let said = String::from_utf8_lossy(&status.stderr);
        if !status.status.success() && !said.contains("no apm agent on this host") {
            bail!("apm status --config /etc/apm/apm.toml: {said}");
        }
        Ok(())
    })();
    crate::util::run("dpkg", &["--purge", "apm"])?;
    checked?;
    for left in ["/usr/bin/apm", "/usr/lib/apm", "/etc/apm/apm.toml"] {
        if Path::new(left).exists() {
            bail!("{left} is still there after `dpkg --purge apm`");
        }
    }
    Ok(())
}

/// Run `program args` and fail unless it succeeds and its standard output contains
/// `wanted`.
fn expect_output(program: &str, args: &[&str], wanted: &str) -> Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("could not start {program}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains(wanted) {
        bail!(
            "`{program} {}` ({}) did not print {wanted:?}:\n{text}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// The workspace's version (`[workspace.package] version`).
fn workspace_version() -> Result<String> {
    let manifest = fs::read_to_string("Cargo.toml").context("Cargo.toml")?;
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .context("no version in [workspace.package]")
}

/// Copy `from` to `to` (parents made) with `mode`.
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    }
    fs::copy(from, to).with_context(|| format!("cp {} {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", to.display()))
}

/// Write `text` to `to` (parents made) with `mode`.
fn write(to: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    }
    fs::write(to, text).with_context(|| format!("write {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", to.display()))
}

/// The package's tree under `root`.
fn stage(root: &Path, version: &str) -> Result<()> {
    let built = Path::new("target/deb");
    let apm = root.join("usr/bin/apm");
    install(&built.join("apm"), &apm, 0o755)?;
    // Where `apm run` looks for it: ../lib/apm beside the binary.
    install(
        &built.join("libapm_preload.so"),
        &root.join("usr/lib/apm/libapm_preload.so"),
        0o644,
    )?;
    // The C library has no stable ABI yet (no SONAME): it stays out of the linker's
    // path, beside the preload library, and `pkg-config apm` links programs to it
    // there with an rpath.
    let capi = root.join("usr/lib/apm/libapm_capi.so");
    install(&built.join("libapm_capi.so"), &capi, 0o644)?;
    install(
        Path::new("apm-capi/include/apm.h"),
        &root.join("usr/include/apm.h"),
        0o644,
    )?;
    write(
        &root.join("usr/lib").join(TRIPLET).join("pkgconfig/apm.pc"),
        &pkg_config(version),
        0o644,
    )?;
    let packaging = Path::new("packaging");
    install(
        &packaging.join("apm-agent.service"),
        &root.join("lib/systemd/system/apm-agent.service"),
        0o644,
    )?;
    generated(&apm, root)?;
    let doc = root.join("usr/share/doc/apm");
    install(&packaging.join("copyright"), &doc.join("copyright"), 0o644)?;
    write(&doc.join("changelog.Debian"), &changelog(version), 0o644)?;
    gzip(&doc.join("changelog.Debian"))?;
    let control = root.join("DEBIAN");
    for script in ["postinst", "prerm", "postrm"] {
        install(&packaging.join(script), &control.join(script), 0o755)?;
    }
    write(&control.join("conffiles"), "/etc/apm/apm.toml\n", 0o644)?;
    let depends = shlib_depends(root, &[&apm, &capi])?;
    write(
        &control.join("control"),
        &control_file(version, &depends, root)?,
        0o644,
    )?;
    md5sums(root)
}

/// What the installed binary generates: its manual pages and completions, and the
/// commented default configuration.
fn generated(apm: &Path, root: &Path) -> Result<()> {
    let apm = path_str(apm)?;
    let tmp = root.join("../generated");
    let (man, comp) = (tmp.join("man"), tmp.join("completions"));
    crate::util::run(apm, &["generate", "man", path_str(&man)?])?;
    crate::util::run(apm, &["generate", "completions", path_str(&comp)?])?;
    let config = root.join("etc/apm/apm.toml");
    fs::create_dir_all(root.join("etc/apm"))?;
    crate::util::run(apm, &["generate", "config", path_str(&config)?])?;
    for page in fs::read_dir(&man)?.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = page
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let section = name.rsplit('.').next().unwrap_or("8");
        let to = root.join(format!("usr/share/man/man{section}/{name}"));
        install(&page, &to, 0o644)?;
        gzip(&to)?;
    }
    for (file, to) in [
        ("apm.bash", "usr/share/bash-completion/completions/apm"),
        ("_apm", "usr/share/zsh/vendor-completions/_apm"),
        ("apm.fish", "usr/share/fish/vendor_completions.d/apm.fish"),
    ] {
        install(&comp.join(file), &root.join(to), 0o644)?;
    }
    fs::remove_dir_all(&tmp).context("the generated files' directory")
}

fn gzip(file: &Path) -> Result<()> {
    crate::util::run("gzip", &["-9n", path_str(file)?])
}

fn pkg_config(version: &str) -> String {
    format!(
        "prefix=/usr\nlibdir=${{prefix}}/lib/apm\nincludedir=${{prefix}}/include\n\n\
         Name: apm\nDescription: apm's C API: protect RC connections against path failures\n\
         Version: {version}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lapm_capi\n\
         Cflags: -I${{includedir}}\n"
    )
}

fn changelog(version: &str) -> String {
    format!(
        "apm ({version}-{REVISION}) unstable; urgency=medium\n\n  * Built by cargo xtask deb \
         from the apm workspace.\n\n -- apm developers <apm@example.invalid>  Thu, 01 Jan 2026 \
         00:00:00 +0000\n"
    )
}

/// The shared libraries the binaries need, as a Depends list (dpkg-shlibdeps).
fn shlib_depends(root: &Path, objects: &[&Path]) -> Result<String> {
    // dpkg-shlibdeps reads debian/control from its working directory.
    let work = root.join("../shlibdeps");
    fs::create_dir_all(work.join("debian"))?;
    fs::write(
        work.join("debian/control"),
        "Source: apm\n\nPackage: apm\nArchitecture: amd64\n",
    )?;
    let mut args = vec!["-O".to_owned()];
    for o in objects {
        args.push(fs::canonicalize(o)?.display().to_string());
    }
    let out = Command::new("dpkg-shlibdeps")
        .args(&args)
        .current_dir(&work)
        .output()
        .context("dpkg-shlibdeps")?;
    fs::remove_dir_all(&work)?;
    if !out.status.success() {
        bail!("dpkg-shlibdeps: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .unwrap_or("libc6")
        .to_owned())
}

fn control_file(version: &str, depends: &str, root: &Path) -> Result<String> {
    let out = Command::new("du")
        .args(["-sk", "--exclude=DEBIAN", path_str(root)?])
        .output()
        .context("du")?;
    let size = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .to_owned();
    Ok(format!(
        "Package: apm\n\
         Version: {version}-{REVISION}\n\
         Architecture: amd64\n\
         Maintainer: apm developers <apm@example.invalid>\n\
         Installed-Size: {size}\n\
         Depends: {depends}, init-system-helpers (>= 1.54~), passwd\n\
         Recommends: libibverbs1, ibverbs-providers, libibumad3, rdma-core\n\
         Section: net\n\
         Priority: optional\n\
         Homepage: https://example.invalid/apm\n\
         Description: keeps InfiniBand and RoCE RC connections alive when a path fails\n \
         apm arms hardware Automatic Path Migration on every protected queue pair,\n \
         fails connections over on both sides when a port or link dies, re-arms them\n \
         with the peer when paths come back, and migrates paths in software where\n \
         the hardware cannot (RoCE).\n \
         .\n \
         This package holds the apm command, the apm-agent service (one per host,\n \
         for the programs run under `apm run`), the preload library of `apm run`,\n \
         the C library with its header and pkg-config file, manual pages and shell\n \
         completions.\n"
    ))
}

/// DEBIAN/md5sums: every file of the package but the control files.
fn md5sums(root: &Path) -> Result<()> {
    let out = Command::new("sh")
        .args([
            "-c",
            "find . -path ./DEBIAN -prune -o -type f -printf '%P\\0' | sort -z | xargs -0 md5sum",
        ])
        .current_dir(root)
        .output()
        .context("md5sum")?;
    if !out.status.success() {
        bail!("md5sum: {}", String::from_utf8_lossy(&out.stderr));
    }
    write(
        &root.join("DEBIAN/md5sums"),
        &String::from_utf8_lossy(&out.stdout),
        0o644,
    )
}
