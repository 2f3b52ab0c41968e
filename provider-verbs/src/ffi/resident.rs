//! apm's failover path made resident before a failure runs it: the code a move executes
//! mapped into the process's page tables ahead of time.
//!
//! Why: a failover runs code that steady traffic never does (the engine's decisions, the
//! QP modifies, the re-initialisation, the words to the peer, and libibverbs' and the
//! verbs provider's paths behind them). Each page of it that this process has not yet
//! executed costs a page fault on first use: cheap on hardware, but the whole chain is
//! hundreds of pages, and in a guest under emulation (qemu TCG) every fault costs tens
//! of microseconds more plus the scheduler's wake-ups around it. Measured in the VM
//! (`cargo xtask bench failover --only apm --reps 8`, link down): a process's first move
//! took a median 83 ms of stall, its second (a false move earlier in the same run had
//! faulted the code in) about 40; with the code made resident at start the first move
//! took 46. Locking all memory (`mlockall`) gained nothing more (43), so only code is
//! made resident, and nothing is locked: no memory limit applies and the pages stay
//! shared with the page cache.
//!
//! What: the object holding apm's code (the program that links apm, or the library it
//! is in), libibverbs and its device providers (in its `libibverbs/` directory, or
//! named `lib*-rdmav*.so` where a build tree holds them), and what they call: the C
//! runtime (libc, and libpthread, librt, libdl where glibc still has them apart, the
//! dynamic loader, libgcc_s) and libnl. What a failover executes, and at most
//! [`BUDGET`] of it: a program that links apm may have a far larger text, which is read
//! in no further. Nothing else: apm may share its process with an application (`apm
//! run`, the C API, a program that links apm), whose other libraries it leaves as they
//! are.
//!
//! How: `madvise(MADV_POPULATE_READ)` (Linux 5.14) on each of those executable file
//! mappings. Older kernels refuse the advice (`EINVAL`); apm then runs as before (the
//! first move pays its faults), and the first refusal's error is reported.

use std::io;

/// The most code made resident: apm's own text is a few MiB, libc and libibverbs' a few
/// more; a program that links apm and is far larger is left to fault in the rest.
pub const BUDGET: usize = 64 << 20;

/// What [`make_code_resident`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// Mappings made resident.
    pub mappings: usize,
    /// Their size, bytes.
    pub bytes: usize,
    /// Mappings on the path that the kernel refused (an old kernel refuses them all).
    pub refused: usize,
    /// The error of the first refusal (EINVAL: a kernel older than 5.14).
    pub first_refusal: Option<i32>,
    /// Mappings on the path left out because [`BUDGET`] was spent.
    pub over_budget: usize,
}

/// One line of `/proc/self/maps` that is an executable mapping of a file: its address
/// range and the file's path.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CodeMapping {
    start: usize,
    end: usize,
    path: String,
}

/// The executable file mappings in `maps` (the text of `/proc/self/maps`); lines that do
/// not parse are skipped.
fn code_mappings(maps: &str) -> Vec<CodeMapping> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            // offset, device, inode, then the path (which may hold spaces).
            let path = fields.nth(3)?;
            if !perms.starts_with("r-x") || !path.starts_with('/') {
                return None;
            }
            let rest = line[line.find(path)?..].trim_end();
            let (a, b) = range.split_once('-')?;
            let start = usize::from_str_radix(a, 16).ok()?;
            let end = usize::from_str_radix(b, 16).ok()?;
            (end > start).then(|| CodeMapping {
                start,
                end,
                path: rest.to_owned(),
            })
        })
        .collect()
}

/// Whether `m` is on apm's failover path (see the module docs); `own_path` is the file
/// holding apm's own code (every executable mapping of it counts).
fn on_the_path(m: &CodeMapping, own_path: Option<&str>) -> bool {
    if own_path == Some(m.path.as_str()) {
        return true;
    }
    let file = m.path.rsplit('/').next().unwrap_or("");
    // libibverbs' device providers live in a directory of that name, and are named
    // lib<driver>-rdmav<ABI>.so wherever they are.
    m.path.contains("/libibverbs/")
        || file.contains("-rdmav")
        || [
            "libibverbs.so",
            "libc.so",
            "libpthread.so",
            "librt.so",
            "libdl.so",
            "libgcc_s.so",
            "ld-linux",
            "libnl-",
        ]
        .iter()
        .any(|lib| file.starts_with(lib))
}

/// Make the executable mappings on apm's failover path resident (see the module docs).
/// Call it once libibverbs has opened the devices (its provider library is loaded
/// then). Errors only when `/proc/self/maps` cannot be read. A path that is not UTF-8
/// is read lossily (it then matches nothing but itself).
pub fn make_code_resident() -> io::Result<Resident> {
    let maps = String::from_utf8_lossy(&std::fs::read("/proc/self/maps")?).into_owned();
    let own = make_code_resident as fn() -> io::Result<Resident> as usize;
    let mappings = code_mappings(&maps);
    let own_path = mappings
        .iter()
        .find(|m| (m.start..m.end).contains(&own))
        .map(|m| m.path.clone());
    let mut done = Resident::default();
    for m in mappings
        .iter()
        .filter(|m| on_the_path(m, own_path.as_deref()))
    {
        let len = m.end - m.start;
        if done.bytes + len > BUDGET {
            done.over_budget += 1;
            continue;
        }
        // SAFETY: no memory of this program is read or written: the call only asks the
        // kernel to fault in the pages of a range this process had mapped when it listed
        // its mappings just now, changing no content and no protection. Should the range
        // have been unmapped since (a library closed meanwhile), the call fails
        // (ENOMEM), or populates whatever was mapped there in the meantime, which is
        // equally harmless.
        let rc =
            unsafe { libc::madvise(m.start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
        if rc == 0 {
            done.mappings += 1;
            done.bytes += len;
        } else {
            done.refused += 1;
            done.first_refusal
                .get_or_insert_with(|| io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0b00000 r--p 00000000 08:01 1234 /usr/bin/apm
55d0c0b00000-55d0c1400000 r-xp 00100000 08:01 1234 /usr/bin/apm
55d0c1400000-55d0c1500000 rw-p 00a00000 08:01 1234 /usr/bin/apm
7f0000000000-7f0000100000 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libcudnn.so.8
7f0000200000-7f0000300000 r-xp 00000000 08:01 98 /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.47.0
7f0000400000-7f0000410000 r-xp 00000000 08:01 97 /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
7f0000420000-7f0000430000 r-xp 00000000 08:01 94 /home/me/rdma-core/build/lib/libmlx5-rdmav34.so
7f0000500000-7f0000600000 r-xp 00000000 08:01 96 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000700000-7f0000800000 r-xp 00000000 08:01 95 /opt/my app/libmine.so
7f0000900000-7f0000901000 r-xp 00000000 00:00 0 [vdso]
7f0000a00000-7f0000b00000 rw-p 00000000 00:00 0 [heap]
";

    #[test]
    fn executable_file_mappings_are_found_with_their_paths() {
        let m = code_mappings(MAPS);
        let paths: Vec<&str> = m.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/apm",
                "/usr/lib/x86_64-linux-gnu/libcudnn.so.8",
                "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.47.0",
                "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
                "/home/me/rdma-core/build/lib/libmlx5-rdmav34.so",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/opt/my app/libmine.so",
            ]
        );
        assert_eq!((m[0].start, m[0].end), (0x55d0_c0b0_0000, 0x55d0_c140_0000));
    }

    #[test]
    fn a_shared_process_keeps_the_applications_libraries_as_they_are() {
        let kept: Vec<String> = code_mappings(MAPS)
            .into_iter()
            .filter(|m| on_the_path(m, Some("/usr/bin/apm")))
            .map(|m| m.path)
            .collect();
        assert_eq!(
            kept,
            [
                "/usr/bin/apm",
                "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.47.0",
                "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
                "/home/me/rdma-core/build/lib/libmlx5-rdmav34.so",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
            ]
        );
    }

    #[test]
    fn this_process_code_is_made_resident() {
        let done = make_code_resident().expect("/proc/self/maps");
        // This test binary's own text at least, unless the kernel predates the advice.
        assert!(done.mappings + done.refused >= 1, "{done:?}");
        assert!(done.bytes <= BUDGET);
        if done.refused == 0 {
            assert!(done.bytes > 0 && done.first_refusal.is_none());
        }
    }
}
