//! A throw-away qemu VM with a real soft-RoCE (rxe) device, for `cargo xtask hwtest --vm`.
//!
//! The build machines' kernel has no RDMA and cannot load modules, so this boots a stock
//! Debian kernel (the package `linux-image-amd64` depends on, only downloaded and
//! unpacked) under qemu with TCG, from an initramfs holding busybox, the kernel modules
//! rxe needs, the host's iproute2/rdma-core tools and libibverbs with its rxe provider.
//! The binary under test is a host binary handed over a 9p share (so the guest runs the
//! very libibverbs it was built against); its output and exit code come back the same way.
//! This module builds the image; `vm/qemu.rs` boots it and runs the program.
//!
//! What it must never do: leave a qemu running (a wall-clock timeout kills it by PID, and
//! a guard kills it on every early return), touch anything outside `target/vm/` except
//! installing Debian packages, or boot with a NIC (the guest has no network but its own
//! veth pairs).

// A driver, not the engine: it times a real VM and enforces a wall-clock timeout.
#![allow(clippy::disallowed_methods)]

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

mod qemu;
pub(crate) use qemu::shell_quote;
pub use qemu::{run, RunSpec};

/// Debian packages the runner needs on the host (qemu, the initramfs tools, and the
/// userspace that is copied into the guest).
const HOST_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "iproute2",
    "libibverbs1",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdma-core",
    "libibverbs-dev",
    // Unmodified programs `apm run` is checked with.
    "perftest",
    "rdmacm-utils",
    "ucx-utils",
];

/// Kernel modules to load in the guest, by name; their dependencies are added from
/// `modules.dep`. `crc32_generic` is not a declared dependency of `rdma_rxe` but rxe
/// requests the crc32 crypto algorithm at run time: without it `rdma link add` fails.
const MODULE_ROOTS: &[&str] = &[
    "crc32_generic",
    "rdma_rxe",
    // rdma_cm for rdma_cm programs (rping) under `apm run`.
    "rdma_ucm",
    "veth",
    "dummy",
    "8021q",
    "sch_netem",
    // Linux bonding, which `bench failover` compares apm with.
    "bonding",
    "virtio_pci",
    "9pnet_virtio",
    "9p",
];

/// Host programs copied into the guest (with their shared-library closure).
const GUEST_PROGRAMS: &[&str] = &[
    "/usr/bin/ip",
    "/usr/bin/rdma",
    "/usr/sbin/tc",
    "/usr/bin/ibv_devinfo",
    "/usr/bin/ibv_rc_pingpong",
    "/usr/bin/ib_send_bw",
    "/usr/bin/ib_write_bw",
    "/usr/bin/ib_send_lat",
    "/usr/bin/rping",
    "/usr/bin/ucx_perftest",
];

/// Host programs copied into the guest when the host has them: diagnostics that no test
/// needs (`perf` for `bench failover --perf`).
const GUEST_PROGRAMS_IF_PRESENT: &[&str] = &["/usr/bin/perf"];

/// Shared objects that are loaded with `dlopen` and so do not show in `ldd`: libibverbs
/// itself (apm loads it at run time) and the rxe provider it loads.
const GUEST_DLOPENED: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
    "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
    // UCX's InfiniBand/RoCE transports, loaded as modules by ucx_perftest.
    "/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0",
];

/// Plain files copied as they are (libibverbs finds its providers through these).
const GUEST_FILES: &[&str] = &["/etc/libibverbs.d/rxe.driver"];

/// Bumped whenever the layout of the initramfs changes in a way the content hash of its
/// inputs would not see.
const IMAGE_FORMAT: &str = "apm-vm-image-1";

/// Console markers printed by the guest's init, used for the timings.
const MARK_BOOTED: &str = "APM-VM: booted";
const MARK_DONE: &str = "APM-VM: done";

/// The guest's `/init`. Everything the test needs is in place before the marker; the run
/// script comes from the share; the VM always powers off, whatever happened.
const INIT_SCRIPT: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /mnt
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
# `apm.rdma=patched` on the kernel command line: the APM-capable RDMA modules
# (kernel/rxe-apm) instead of the stock ib_core, ib_uverbs and rdma_rxe.
order=/modules/order
grep -q 'apm.rdma=patched' /proc/cmdline && order=/modules/order-patched
for m in $(cat $order); do
    insmod "/modules/$m" || echo "APM-VM: insmod $m failed"
done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /mnt; then
    echo "APM-VM: cannot mount the 9p share"
    poweroff -f
fi
echo "APM-VM: booted"
sh /mnt/run.sh > /mnt/output.txt 2>&1
echo $? > /mnt/exit-code
sync
echo "APM-VM: done"
umount /mnt
poweroff -f
"#;

/// A bootable kernel and initramfs, cached under `target/vm/images/<key>/`.
#[derive(Debug, Clone)]
pub struct Image {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub kernel_version: String,
}

/// The guest kernel: the package `linux-image-amd64` depends on, downloaded and unpacked.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// The downloaded image package.
    pub deb: PathBuf,
    /// Where it is unpacked.
    pub root: PathBuf,
    /// The kernel release (`uname -r` in the guest), e.g. `6.1.0-48-amd64`.
    pub release: String,
}

/// Download and unpack the guest kernel (once).
pub fn guest_kernel(vm_dir: &Path) -> Result<GuestKernel> {
    std::fs::create_dir_all(vm_dir).with_context(|| format!("mkdir {}", vm_dir.display()))?;
    let deb = kernel_deb(vm_dir)?;
    let (root, release) = unpack_kernel(vm_dir, &deb)?;
    Ok(GuestKernel { deb, root, release })
}

/// Install the host packages the runner needs, when any is missing (Debian only).
pub fn ensure_host_packages() -> Result<()> {
    crate::apt::ensure(HOST_PACKAGES, "the VM runner")
}

/// Build (or reuse from the cache) the guest kernel and initramfs. The image holds the
/// stock modules and, in `modules/patched/`, the `patched` RDMA modules that replace
/// theirs when the kernel command line says `apm.rdma=patched`.
pub fn prepare_image(
    vm_dir: &Path,
    kernel: &GuestKernel,
    patched: &crate::kernel::PatchedModules,
) -> Result<Image> {
    let (deb, kroot, version) = (&kernel.deb, &kernel.root, &kernel.release);
    let moddir = kroot.join("lib/modules").join(version);
    let modules = module_load_order(&moddir)?;

    // Every host file that goes into the image, keyed by its path in the guest.
    let mut files: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    let busybox = PathBuf::from("/bin/busybox");
    files.insert(PathBuf::from("bin/busybox"), busybox);
    let mut objects: Vec<PathBuf> = GUEST_PROGRAMS.iter().map(PathBuf::from).collect();
    objects.extend(GUEST_DLOPENED.iter().map(PathBuf::from));
    objects.extend(
        GUEST_PROGRAMS_IF_PRESENT
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.exists()),
    );
    let mut symlinks: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    for obj in &objects {
        add_with_closure(obj, &mut files, &mut symlinks)?;
    }
    for f in GUEST_FILES {
        files.insert(strip_root(Path::new(f)), PathBuf::from(f));
    }
    for (i, m) in modules.iter().enumerate() {
        let name = format!("{i:02}-{}", file_name(m));
        files.insert(PathBuf::from("modules").join(name), moddir.join(m));
    }
    let order: String = modules
        .iter()
        .enumerate()
        .map(|(i, m)| format!("{i:02}-{}\n", file_name(m)))
        .collect();
    let order_patched = crate::kernel::patched_order(&modules, patched, &mut files);

    // The cache key: everything that decides the image's content.
    let mut h = crate::util::Fnv::new();
    h.write(IMAGE_FORMAT.as_bytes());
    h.write(INIT_SCRIPT.as_bytes());
    h.write(order.as_bytes());
    h.write(order_patched.as_bytes());
    h.write(file_name(deb).as_bytes());
    for (guest, host) in &files {
        h.write(guest.as_os_str().as_encoded_bytes());
        let data = std::fs::read(host).with_context(|| format!("read {}", host.display()))?;
        h.write(&data);
    }
    for (link, target) in &symlinks {
        h.write(link.as_os_str().as_encoded_bytes());
        h.write(target.as_os_str().as_encoded_bytes());
    }
    let key = format!("{:016x}", h.finish());
    let images = vm_dir.join("images");
    let dir = images.join(&key);
    let image = Image {
        kernel: dir.join("vmlinuz"),
        initramfs: dir.join("initramfs.cpio.gz"),
        kernel_version: version.clone(),
    };
    if image.kernel.is_file() && image.initramfs.is_file() {
        eprintln!("hwtest --vm: cached image {key} (kernel {version})");
        return Ok(image);
    }

    eprintln!(
        "hwtest --vm: building image {key} (kernel {version}, {} modules)",
        modules.len()
    );
    // Older images are stale by construction: keep the cache to the current one.
    if images.is_dir() {
        for entry in std::fs::read_dir(&images)? {
            let p = entry?.path();
            if p != dir {
                let _ = std::fs::remove_dir_all(&p);
            }
        }
    }
    let staging = vm_dir.join(format!("staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let orders = [("order", order.as_str()), ("order-patched", &order_patched)];
    let result = build_initramfs(&staging, &files, &symlinks, &orders, &dir);
    let _ = std::fs::remove_dir_all(&staging);
    result?;
    copy(
        &kroot.join(format!("boot/vmlinuz-{version}")),
        &image.kernel,
    )?;
    Ok(image)
}

fn build_initramfs(
    staging: &Path,
    files: &BTreeMap<PathBuf, PathBuf>,
    symlinks: &BTreeMap<PathBuf, PathBuf>,
    orders: &[(&str, &str)],
    out_dir: &Path,
) -> Result<()> {
    for d in [
        "bin",
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "etc",
        "modules",
    ] {
        std::fs::create_dir_all(staging.join(d))?;
    }
    // Merged /usr, as on the host, so the paths ldd reports resolve in the guest too.
    std::os::unix::fs::symlink("usr/lib", staging.join("lib"))?;
    std::os::unix::fs::symlink("usr/lib64", staging.join("lib64"))?;
    for (guest, host) in files {
        copy(host, &staging.join(guest))?;
    }
    for (link, target) in symlinks {
        let at = staging.join(link);
        if std::fs::symlink_metadata(&at).is_err() {
            if let Some(parent) = at.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::os::unix::fs::symlink(target, &at)?;
        }
    }
    for (name, order) in orders {
        std::fs::write(staging.join("modules").join(name), order)?;
    }
    let init = staging.join("init");
    std::fs::write(&init, INIT_SCRIPT)?;
    set_mode(&init, 0o755)?;

    std::fs::create_dir_all(out_dir)?;
    let tmp = out_dir.join("initramfs.cpio.gz.tmp");
    let status = Command::new("sh")
        .arg("-c")
        .arg("find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1 > \"$1\"")
        .arg("sh")
        .arg(&tmp)
        .current_dir(staging)
        .status()
        .context("could not run cpio")?;
    if !status.success() {
        bail!("building the initramfs failed: {status}");
    }
    std::fs::rename(&tmp, out_dir.join("initramfs.cpio.gz"))?;
    Ok(())
}

/// The kernel image package `linux-image-amd64` depends on, from the package lists.
fn kernel_package() -> Result<Option<String>> {
    let out = Command::new("apt-cache")
        .args(["depends", "linux-image-amd64"])
        .output()
        .context("could not run apt-cache")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_owned))
}

/// The kernel image package `linux-image-amd64` depends on, downloaded once.
fn kernel_deb(vm_dir: &Path) -> Result<PathBuf> {
    let pkg = match kernel_package()? {
        Some(p) => p,
        None => {
            // Installed packages but no package lists (e.g. cleaned): fetch them once.
            crate::util::run("apt-get", &["update", "-qq"])?;
            kernel_package()?.context(
                "cannot find the kernel package linux-image-amd64 depends on (is this Debian?)",
            )?
        }
    };
    let dir = vm_dir.join("deb");
    std::fs::create_dir_all(&dir)?;
    let find = |dir: &Path| -> Result<Option<PathBuf>> {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            let n = file_name(&p);
            if n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb") {
                return Ok(Some(p));
            }
        }
        Ok(None)
    };
    if let Some(p) = find(&dir)? {
        return Ok(p);
    }
    eprintln!("hwtest --vm: downloading {pkg}");
    let status = Command::new("apt-get")
        .args(["download", "-qq", &pkg])
        .current_dir(&dir)
        .status()
        .context("could not run apt-get download")?;
    if !status.success() {
        bail!("`apt-get download {pkg}` failed: {status}");
    }
    let deb = find(&dir)?.with_context(|| format!("apt-get download {pkg} left no .deb"))?;
    // A newer kernel package replaces older downloads and their unpacked trees.
    for e in std::fs::read_dir(&dir)?.flatten() {
        if e.path() != deb {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let keep = file_name(&deb).trim_end_matches(".deb").to_owned();
    if let Ok(kernels) = std::fs::read_dir(vm_dir.join("kernel")) {
        for e in kernels.flatten() {
            if file_name(e.path()) != keep {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(deb)
}

/// Unpack the kernel package once and generate `modules.dep` (not shipped in the .deb).
fn unpack_kernel(vm_dir: &Path, deb: &Path) -> Result<(PathBuf, String)> {
    let stem = file_name(deb).trim_end_matches(".deb").to_owned();
    let root = vm_dir.join("kernel").join(&stem);
    let done = root.join(".apm-unpacked");
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        crate::util::run(
            "dpkg-deb",
            &["-x", &deb.to_string_lossy(), &root.to_string_lossy()],
        )?;
    }
    let mods = root.join("lib/modules");
    let mut versions = Vec::new();
    for e in std::fs::read_dir(&mods).with_context(|| format!("read {}", mods.display()))? {
        versions.push(file_name(e?.path()));
    }
    versions.sort();
    let Some(version) = versions.pop() else {
        bail!("{} holds no kernel modules", deb.display());
    };
    if !done.exists() {
        crate::util::run("depmod", &["-b", &root.to_string_lossy(), &version])?;
        std::fs::write(&done, "")?;
    }
    Ok((root, version))
}

/// The modules to insmod, dependencies first, as paths relative to the modules dir.
fn module_load_order(moddir: &Path) -> Result<Vec<String>> {
    let dep_file = moddir.join("modules.dep");
    let text = std::fs::read_to_string(&dep_file)
        .with_context(|| format!("read {}", dep_file.display()))?;
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut by_name: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        let Some((module, rest)) = line.split_once(':') else {
            continue;
        };
        let name = module_name(module);
        by_name.insert(name, module.to_owned());
        deps.insert(
            module.to_owned(),
            rest.split_whitespace().map(str::to_owned).collect(),
        );
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for root in MODULE_ROOTS {
        let Some(path) = by_name.get(*root) else {
            // Built into this kernel: nothing to load.
            continue;
        };
        visit(path, &deps, &mut seen, &mut order);
    }
    Ok(order)
}

fn visit(
    m: &str,
    deps: &BTreeMap<String, Vec<String>>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<String>,
) {
    if !seen.insert(m.to_owned()) {
        return;
    }
    // modules.dep lists a module's dependencies so that the last is loaded first.
    if let Some(ds) = deps.get(m) {
        for d in ds.iter().rev() {
            visit(d, deps, seen, order);
        }
    }
    order.push(m.to_owned());
}

pub(crate) fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.trim_end_matches(".ko")
        .trim_end_matches(".ko.xz")
        .replace('-', "_")
}

/// Add an ELF object and its `ldd` closure, each file at its canonical path, with a
/// symlink for the name it was asked for when that differs.
fn add_with_closure(
    obj: &Path,
    files: &mut BTreeMap<PathBuf, PathBuf>,
    symlinks: &mut BTreeMap<PathBuf, PathBuf>,
) -> Result<()> {
    let mut all = vec![obj.to_path_buf()];
    all.extend(ldd(obj)?);
    for f in all {
        let real = std::fs::canonicalize(&f).with_context(|| format!("resolve {}", f.display()))?;
        files.insert(strip_root(&real), real.clone());
        if real != f {
            symlinks.insert(strip_root(&f), real);
        }
    }
    Ok(())
}

/// The shared libraries an ELF object needs, as `ldd` reports them.
pub fn ldd(obj: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(obj)
        .output()
        .with_context(|| format!("ldd {}", obj.display()))?;
    if !out.status.success() {
        // Static binaries make ldd fail: they need nothing.
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim();
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn strip_root(p: &Path) -> PathBuf {
    p.strip_prefix("/").unwrap_or(p).to_path_buf()
}

pub(crate) fn file_name(p: impl AsRef<Path>) -> String {
    p.as_ref()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_are_normalised() {
        assert_eq!(module_name("kernel/net/9p/9pnet_virtio.ko"), "9pnet_virtio");
        assert_eq!(module_name("kernel/x/snd-seq.ko"), "snd_seq");
    }

    #[test]
    fn dependencies_load_first() {
        let mut deps = BTreeMap::new();
        deps.insert(
            "a.ko".to_owned(),
            vec!["b.ko".to_owned(), "c.ko".to_owned()],
        );
        deps.insert("b.ko".to_owned(), vec!["c.ko".to_owned()]);
        deps.insert("c.ko".to_owned(), vec![]);
        let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
        visit("a.ko", &deps, &mut seen, &mut order);
        assert_eq!(order, ["c.ko", "b.ko", "a.ko"]);
    }
}
