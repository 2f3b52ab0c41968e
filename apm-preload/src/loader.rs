//! Programs that load libibverbs themselves: `dlopen` and a `dlsym`/`dlvsym` per verb on
//! that handle, as NCCL does (`dlopen("libibverbs.so.1")`, then `dlvsym(handle, name,
//! "IBVERBS_1.1")`). Such a lookup searches the handle's own scope, never an
//! `LD_PRELOAD`ed library, so without this module the program would call libibverbs'
//! verbs directly and apm would see none of them.
//!
//! **How**: the library exports `dlsym` and `dlvsym` (x86-64 Linux). A lookup with a real
//! handle, by anyone but apm itself, is answered by the real function; when what it
//! found is one of the libibverbs functions apm interposes (the very function apm calls
//! as the real one, `IBVERBS_1.1`), the program gets apm's instead
//! ([`crate::ffi::interposed`]), exactly what it would get had it linked libibverbs.
//! Everything else is the real lookup's answer, `dlerror` state included. `RTLD_NEXT`
//! and `RTLD_DEFAULT` lookups, and apm's own (provider-verbs binds libibverbs with
//! `dlsym`: it must get the real verbs), go straight to the real function: the entry
//! points are trampolines that decide and then *jump* to it, so that it finds its
//! caller's return address where glibc looks for it (`RTLD_NEXT` searches the objects
//! after its caller's; a call through a Rust frame would make that apm's).
//!
//! **Why this way**: an rtld-audit library (`LD_AUDIT`, `la_symbind64`) sees the same
//! lookups, but it is a second library for every user to set, it runs in a link-map
//! namespace of its own, and which bindings it is told of changed across glibc releases
//! (`BIND_NOW` bindings only since 2.35). Interposing `dlopen` instead cannot work: the
//! handle it returns is what the program searches.
//!
//! **The real functions** are found without `dlsym` (ours), by reading the dynamic
//! symbol tables of the objects loaded after this one (`dl_iterate_phdr`, the GNU or the
//! SysV hash table): the first that defines `dlsym` (resp. `dlvsym`) as a function is
//! what `RTLD_NEXT` would give. glibc 2.34 and later define both in `libc.so.6`
//! (`GLIBC_2.34`, with the `GLIBC_2.2.5` versions as compatibility symbols of the same
//! functions; `libdl.so.2` is an empty stub); earlier releases in `libdl.so.2`, which
//! every program that can call `dlopen` links and Rust's standard library (inside this
//! library) links too. A program built against any of these calls this library's
//! `dlsym`: an unversioned definition satisfies every version a reference asks for.
//!
//! **What it cannot cover** (such a program is "not seen", said at exit with the
//! reason, [`unseen_reason`]): a statically linked libibverbs, or one of the program's
//! own under another name; libibverbs loaded with `dlmopen` into another namespace (the
//! lookup finds another copy than the one apm calls); a program that reaches its device
//! only through a provider's direct verbs (`mlx5dv_open_device`, DevX objects); lookups
//! through another loader than glibc's. On other architectures than x86-64 the
//! trampolines are not built and a program that binds libibverbs with `dlsym` is one
//! apm cannot see.
// The FFI boundary: the exported dlsym/dlvsym trampolines (naked functions), the ELF
// tables of loaded objects read through dl_iterate_phdr. Every block carries a SAFETY
// comment.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real `dlsym` and `dlvsym`, and the span of this library's own mappings (lookups
/// from inside it are apm's); 0 until found.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);
static OWN_START: AtomicUsize = AtomicUsize::new(0);
static OWN_END: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// Whether the program's `dlsym`/`dlvsym` lookups are interposed on this architecture.
pub const INTERPOSES_LOOKUPS: bool = cfg!(target_arch = "x86_64");

/// `dlsym`: [`route_dlsym`] decides, then a jump (not a call) to what it chose.
///
/// # Safety
/// The caller's contract of `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // Entry: rsp = 8 mod 16. Two pushes and 8 bytes keep the call aligned; the return
    // address is then at rsp + 24 and goes as the third argument.
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdx, [rsp + 24]",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym route_dlsym,
    )
}

/// `dlvsym`: [`route_dlvsym`] decides, then a jump to what it chose.
///
/// # Safety
/// The caller's contract of `dlvsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // Three pushes keep the call aligned; the return address is at rsp + 24, the
    // fourth argument.
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "mov rcx, [rsp + 24]",
        "call {route}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym route_dlvsym,
    )
}

/// Where a `dlsym` from `caller` goes: the real one, or [`apm_dlsym`].
#[cfg(target_arch = "x86_64")]
extern "C" fn route_dlsym(handle: *mut c_void, _name: *const c_char, caller: usize) -> usize {
    match REAL_DLSYM.load(Ordering::Acquire).max(find_real().0) {
        0 => no_dlsym as *const () as usize,
        real if straight(handle, caller) => real,
        _ => apm_dlsym as *const () as usize,
    }
}

/// Where a `dlvsym` from `caller` goes: the real one, or [`apm_dlvsym`].
#[cfg(target_arch = "x86_64")]
extern "C" fn route_dlvsym(
    handle: *mut c_void,
    _name: *const c_char,
    _version: *const c_char,
    caller: usize,
) -> usize {
    match REAL_DLVSYM.load(Ordering::Acquire).max(find_real().1) {
        0 => no_dlvsym as *const () as usize,
        real if straight(handle, caller) => real,
        _ => apm_dlvsym as *const () as usize,
    }
}

/// Whether a lookup goes to the real function untouched: `RTLD_NEXT` and
/// `RTLD_DEFAULT` (whose answers depend on the caller, and already find apm's verbs
/// first in the global scope), and apm's own lookups.
#[cfg(target_arch = "x86_64")]
fn straight(handle: *mut c_void, caller: usize) -> bool {
    handle == libc::RTLD_NEXT
        || handle == libc::RTLD_DEFAULT
        || (OWN_START.load(Ordering::Relaxed)..OWN_END.load(Ordering::Relaxed)).contains(&caller)
}

/// The program's `dlsym` on a handle: the real answer, or apm's verb in place of
/// libibverbs' own.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn apm_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let real = REAL_DLSYM.load(Ordering::Acquire);
    // SAFETY: found by `find_real` as the function `dlsym`, whose signature this is.
    let real = unsafe { std::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: the caller's arguments.
    let found = unsafe { real(handle, name) };
    // SAFETY: a non-null name is a C string per the caller's contract.
    unsafe { instead(name, found) }
}

/// The program's `dlvsym` on a handle: as [`apm_dlsym`].
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn apm_dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    let real = REAL_DLVSYM.load(Ordering::Acquire);
    // SAFETY: found by `find_real` as the function `dlvsym`, whose signature this is.
    let real = unsafe { std::mem::transmute::<usize, DlvsymFn>(real) };
    // SAFETY: the caller's arguments.
    let found = unsafe { real(handle, name, version) };
    // SAFETY: as in `apm_dlsym`.
    unsafe { instead(name, found) }
}

/// apm's function for what a lookup of `name` `found`, or `found`.
///
/// # Safety
/// `name` is null or a C string.
#[cfg(target_arch = "x86_64")]
unsafe fn instead(name: *const c_char, found: *mut c_void) -> *mut c_void {
    if name.is_null() || found.is_null() {
        return found;
    }
    // SAFETY: a C string per the contract.
    let name = unsafe { CStr::from_ptr(name) };
    std::panic::catch_unwind(|| crate::ffi::interposed(name, found))
        .ok()
        .flatten()
        .unwrap_or(found)
}

/// What `dlsym` answers when glibc's own could not be found (never seen): nothing.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// As [`no_dlsym`].
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn no_dlvsym(_: *mut c_void, _: *const c_char, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// Find the real `dlsym` and `dlvsym` (and this library's span) if not found yet;
/// returns them. Run when the library is loaded and again by a lookup that finds them
/// missing. Idempotent, no locks, no allocation, no `dlsym`.
pub fn find_real() -> (usize, usize) {
    let known = (
        REAL_DLSYM.load(Ordering::Acquire),
        REAL_DLVSYM.load(Ordering::Acquire),
    );
    if known.0 != 0 && known.1 != 0 {
        return known;
    }
    let mut search = Search::default();
    // SAFETY: `visit` matches dl_iterate_phdr's callback and reads only what each
    // object's headers describe; `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    if let Some((lo, hi)) = search.own {
        OWN_START.store(lo, Ordering::Relaxed);
        OWN_END.store(hi, Ordering::Relaxed);
    }
    REAL_DLSYM.store(search.dlsym, Ordering::Release);
    REAL_DLVSYM.store(search.dlvsym, Ordering::Release);
    (search.dlsym, search.dlvsym)
}

/// What [`visit`] finds, object by object in load order.
#[derive(Default)]
struct Search {
    /// This library's span, once passed.
    own: Option<(usize, usize)>,
    dlsym: usize,
    dlvsym: usize,
}

/// One loaded object: this library's span, or, after it, `dlsym` and `dlvsym`.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr hands a valid info for the call, and `data` is the
    // `Search` of `find_real`.
    let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
    // SAFETY: the object's program headers, as the loader describes them.
    let object = unsafe { Object::of(info) };
    if search.own.is_none() {
        let here = visit as *const () as usize;
        if (object.start..object.end).contains(&here) {
            search.own = Some((object.start, object.end));
        }
        return 0;
    }
    if search.dlsym == 0 {
        // SAFETY: a loaded object's own dynamic tables.
        search.dlsym = unsafe { object.function(b"dlsym") }.unwrap_or(0);
    }
    if search.dlvsym == 0 {
        // SAFETY: as above.
        search.dlvsym = unsafe { object.function(b"dlvsym") }.unwrap_or(0);
    }
    c_int::from(search.dlsym != 0 && search.dlvsym != 0)
}

/// Whether a shared libibverbs is loaded in this process.
pub fn libibverbs_loaded() -> bool {
    let mut found = false;
    // SAFETY: `named_libibverbs` matches the callback type and reads only the name.
    unsafe { libc::dl_iterate_phdr(Some(named_libibverbs), (&mut found as *mut bool).cast()) };
    found
}

unsafe extern "C" fn named_libibverbs(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: valid for the call; `data` is the `bool` of `libibverbs_loaded`.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<bool>()) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: the loader's C string naming the object.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let file = name.rsplit(|b| *b == b'/').next().unwrap_or(name);
    *found = file.starts_with(b"libibverbs.so");
    c_int::from(*found)
}

/// A loaded object: its address span and its dynamic symbol tables.
struct Object {
    start: usize,
    end: usize,
    base: usize,
    dynamic: Option<*const Dyn>,
}

/// `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
/// A version index with this bit is hidden: not the default version of its name.
const VERSYM_HIDDEN: u16 = 0x8000;

/// The tables one lookup needs.
struct Tables {
    symtab: *const libc::Elf64_Sym,
    strtab: *const u8,
    versym: *const u16,
}

impl Object {
    /// # Safety
    /// `info` describes a loaded object (from dl_iterate_phdr).
    unsafe fn of(info: &libc::dl_phdr_info) -> Object {
        let base = info.dlpi_addr as usize;
        let headers: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
            &[]
        } else {
            // SAFETY: the loader's program headers of the object, `dlpi_phnum` of them.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        let (mut start, mut end, mut dynamic) = (usize::MAX, 0, None);
        for h in headers {
            let at = base.wrapping_add(h.p_vaddr as usize);
            match h.p_type {
                libc::PT_LOAD => {
                    start = start.min(at);
                    end = end.max(at.wrapping_add(h.p_memsz as usize));
                }
                libc::PT_DYNAMIC => dynamic = Some(at as *const Dyn),
                _ => {}
            }
        }
        Object {
            start,
            end,
            base,
            dynamic,
        }
    }

    /// An address of the object's dynamic table: the loader relocates most in place
    /// (glibc on x86-64), not all (the vDSO's): an unrelocated one is below the base.
    fn at(&self, value: u64) -> usize {
        let v = value as usize;
        if v < self.base {
            self.base.wrapping_add(v)
        } else {
            v
        }
    }

    /// The address of the function `name` the object defines, its default version
    /// first.
    ///
    /// # Safety
    /// The object is loaded and its dynamic section is what the loader mapped.
    unsafe fn function(&self, name: &[u8]) -> Option<usize> {
        let mut d = self.dynamic?;
        let (mut symtab, mut strtab, mut versym, mut gnu, mut sysv) = (0, 0, 0, 0, 0);
        loop {
            // SAFETY: the dynamic section is an array ended by DT_NULL.
            let e = unsafe { &*d };
            match e.tag {
                DT_NULL => break,
                DT_SYMTAB => symtab = self.at(e.val),
                DT_STRTAB => strtab = self.at(e.val),
                DT_VERSYM => versym = self.at(e.val),
                DT_GNU_HASH => gnu = self.at(e.val),
                DT_HASH => sysv = self.at(e.val),
                _ => {}
            }
            // SAFETY: not past DT_NULL.
            d = unsafe { d.add(1) };
        }
        if symtab == 0 || strtab == 0 {
            return None;
        }
        let t = Tables {
            symtab: symtab as *const libc::Elf64_Sym,
            strtab: strtab as *const u8,
            versym: versym as *const u16,
        };
        // SAFETY: the object's own hash tables, which index its symbol table.
        let index = unsafe {
            match (gnu, sysv) {
                (g, _) if g != 0 => gnu_lookup(g as *const u32, &t, name),
                (_, h) if h != 0 => sysv_lookup(h as *const u32, &t, name),
                _ => None,
            }
        }?;
        // SAFETY: an index the hash table gave.
        let sym = unsafe { &*t.symtab.add(index) };
        Some(self.base.wrapping_add(sym.st_value as usize))
    }
}

/// Whether symbol `i` is a defined function named `name`; `Some(true)` for its default
/// version (or an unversioned one).
///
/// # Safety
/// `i` indexes the object's symbol table.
unsafe fn defines(t: &Tables, i: usize, name: &[u8]) -> Option<bool> {
    // SAFETY: per the contract.
    let sym = unsafe { &*t.symtab.add(i) };
    if sym.st_shndx == 0 || sym.st_value == 0 || sym.st_info & 0xf != STT_FUNC {
        return None;
    }
    // SAFETY: a string table offset of the symbol's own.
    let found = unsafe { CStr::from_ptr(t.strtab.add(sym.st_name as usize).cast()) };
    if found.to_bytes() != name {
        return None;
    }
    // SAFETY: the version table has an entry per symbol.
    let hidden = !t.versym.is_null() && unsafe { *t.versym.add(i) } & VERSYM_HIDDEN != 0;
    Some(!hidden)
}

/// The symbol index of `name` in a GNU hash table (the default version if several).
///
/// # Safety
/// `table` is the object's `DT_GNU_HASH` table for `t`.
unsafe fn gnu_lookup(table: *const u32, t: &Tables, name: &[u8]) -> Option<usize> {
    let hash = name.iter().fold(5381u32, |h, c| {
        h.wrapping_mul(33).wrapping_add(u32::from(*c))
    });
    // SAFETY: the table's header: bucket count, first hashed symbol, bloom words.
    let (buckets_n, first, bloom_words) = unsafe {
        (
            *table as usize,
            *table.add(1) as usize,
            *table.add(2) as usize,
        )
    };
    if buckets_n == 0 {
        return None;
    }
    // SAFETY: after the 16-byte header and the 64-bit bloom words come the buckets,
    // then the chains (one word per hashed symbol).
    let buckets = unsafe { table.add(4 + 2 * bloom_words) };
    // SAFETY: as above.
    let chains = unsafe { buckets.add(buckets_n) };
    // SAFETY: a bucket of the table.
    let mut i = unsafe { *buckets.add(hash as usize % buckets_n) } as usize;
    if i < first {
        return None;
    }
    let mut hidden = None;
    loop {
        // SAFETY: the chain word of hashed symbol `i`.
        let word = unsafe { *chains.add(i - first) };
        if word | 1 == hash | 1 {
            // SAFETY: `i` is a symbol index of the table.
            match unsafe { defines(t, i, name) } {
                Some(true) => return Some(i),
                Some(false) => hidden = hidden.or(Some(i)),
                None => {}
            }
        }
        if word & 1 != 0 {
            return hidden;
        }
        i += 1;
    }
}

/// The symbol index of `name` in a SysV hash table (the default version if several).
///
/// # Safety
/// `table` is the object's `DT_HASH` table for `t`.
unsafe fn sysv_lookup(table: *const u32, t: &Tables, name: &[u8]) -> Option<usize> {
    let hash = name.iter().fold(0u32, |h, c| {
        let h = (h << 4).wrapping_add(u32::from(*c));
        (h ^ ((h & 0xf000_0000) >> 24)) & 0x0fff_ffff
    });
    // SAFETY: the header: bucket count, chain count.
    let (buckets_n, chains_n) = unsafe { (*table as usize, *table.add(1) as usize) };
    if buckets_n == 0 {
        return None;
    }
    // SAFETY: buckets follow the header, chains the buckets.
    let (buckets, chains) = unsafe { (table.add(2), table.add(2 + buckets_n)) };
    // SAFETY: a bucket of the table.
    let mut i = unsafe { *buckets.add(hash as usize % buckets_n) } as usize;
    let mut hidden = None;
    let mut steps = 0;
    while i != 0 && i < chains_n && steps < chains_n {
        // SAFETY: `i` is a symbol index below the chain count.
        match unsafe { defines(t, i, name) } {
            Some(true) => return Some(i),
            Some(false) => hidden = hidden.or(Some(i)),
            None => {}
        }
        // SAFETY: as above.
        i = unsafe { *chains.add(i) } as usize;
        steps += 1;
    }
    hidden
}

/// Why apm saw none of the program's verbs though it holds an RDMA device (a uverbs
/// file open at exit), or `None`: it saw some, or the program holds none.
pub fn unseen_reason(saw_verbs: bool) -> Option<String> {
    if saw_verbs {
        return None;
    }
    let devices = held_devices();
    if devices.is_empty() {
        return None;
    }
    let held = devices.join(", ");
    let how = if !libibverbs_loaded() {
        "it has no shared libibverbs loaded: its verbs (a statically linked libibverbs, or \
         one of its own) are out of reach of apm, which interposes the shared library's \
         exported functions"
    } else if !INTERPOSES_LOOKUPS {
        "it reached libibverbs in a way apm does not interpose here (dlsym and dlvsym are \
         interposed on x86-64 only), a provider's direct verbs (mlx5dv, DevX), or a copy \
         loaded with dlmopen"
    } else {
        "it reached its device in a way apm does not interpose: a provider's direct verbs \
         (mlx5dv, DevX), or a libibverbs loaded with dlmopen or under another name"
    };
    Some(format!(
        "apm saw none of the verbs of this process, which holds {held}: {how}; it ran \
         unprotected"
    ))
}

/// The RDMA devices whose uverbs file this process holds open (`uverbs0`, ...).
fn held_devices() -> Vec<String> {
    let mut held: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_string_lossy().into_owned();
            t.strip_prefix("/dev/infiniband/")
                .filter(|d| d.starts_with("uverbs"))
                .map(str::to_owned)
        })
        .collect();
    held.sort();
    held.dedup();
    held
}
