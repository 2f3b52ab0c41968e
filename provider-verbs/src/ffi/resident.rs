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
//! is in), libibverbs and its device providers, and the C runtime: what a failover
//! executes. Nothing else: apm may share its process with an application (`apm run`, the
//! C API, a program that links apm), whose other libraries it leaves as they are.
//!
//! How: `madvise(MADV_POPULATE_READ)` (Linux 5.14) on each of those executable file
//! mappings. Older kernels refuse the advice; apm then runs as before (the first move
//! pays its faults).

use std::io;

/// What [`make_code_resident`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    /// Mappings made resident.
    pub mappings: usize,
    /// Their size, bytes.
    pub bytes: usize,
    /// Mappings on the path that the kernel refused (an old kernel refuses them all).
    pub refused: usize,
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

/// Whether `m` is on apm's failover path (see the module docs); `own` is an address
/// inside apm's own code.
fn on_the_path(m: &CodeMapping, own: usize) -> bool {
    if (m.start..m.end).contains(&own) {
        return true;
    }
    let file = m.path.rsplit('/').next().unwrap_or("");
    // libibverbs' device providers live in a directory of that name.
    m.path.contains("/libibverbs/")
        || [
            "libibverbs.so",
            "libc.so",
            "libgcc_s.so",
            "ld-linux",
            "libnl-",
        ]
        .iter()
        .any(|lib| file.starts_with(lib))
}

/// Make the executable mappings on apm's failover path resident (see the module docs).
/// Call it once libibverbs has opened the devices (its provider library is loaded
/// then). Errors only when `/proc/self/maps` cannot be read.
pub fn make_code_resident() -> io::Result<Resident> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let own = make_code_resident as fn() -> io::Result<Resident> as usize;
    let mut done = Resident::default();
    for m in code_mappings(&maps).iter().filter(|m| on_the_path(m, own)) {
        let len = m.end - m.start;
        // SAFETY: the range is a mapping of this process as the kernel listed it just
        // now; MADV_POPULATE_READ only faults its pages in (it changes no content and no
        // protection), and a range unmapped meanwhile makes the call fail with ENOMEM,
        // nothing worse.
        let rc =
            unsafe { libc::madvise(m.start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
        if rc == 0 {
            done.mappings += 1;
            done.bytes += len;
        } else {
            done.refused += 1;
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
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/opt/my app/libmine.so",
            ]
        );
        assert_eq!((m[0].start, m[0].end), (0x55d0_c0b0_0000, 0x55d0_c140_0000));
    }

    #[test]
    fn a_shared_process_keeps_the_applications_libraries_as_they_are() {
        let own = 0x55d0_c0b0_1234;
        let kept: Vec<String> = code_mappings(MAPS)
            .into_iter()
            .filter(|m| on_the_path(m, own))
            .map(|m| m.path)
            .collect();
        assert_eq!(
            kept,
            [
                "/usr/bin/apm",
                "/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.47.0",
                "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
            ]
        );
    }

    #[test]
    fn this_process_code_is_made_resident() {
        let done = make_code_resident().expect("/proc/self/maps");
        // This test binary's own text at least, unless the kernel predates the advice.
        assert!(done.mappings + done.refused >= 1, "{done:?}");
        if done.refused == 0 {
            assert!(done.bytes > 0);
        }
    }
}
