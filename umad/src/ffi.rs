//! Hand-written bindings for the few libibumad functions this crate uses, loaded at run
//! time so that the workspace builds and its other tests run on machines without
//! rdma-core.
//!
//! This is the only module of the crate with `unsafe`; it exposes safe wrappers that own
//! the buffers they pass to C. It must never hand a raw pointer out.
#![allow(unsafe_code)] // FFI to libibumad: every block says why it is sound.

use crate::Error;
use libc::{c_char, c_int, c_long, c_void, size_t};
use std::ffi::CString;

/// The shared object libibumad is loaded from (Debian package `libibumad3`).
pub const LIBRARY: &str = "libibumad.so.3";
/// The package that ships [`LIBRARY`], named in the error when it is missing.
pub const PACKAGE: &str = "libibumad3";

/// `UMAD_CA_NAME_LEN` of `<infiniband/umad.h>`.
const CA_NAME_LEN: usize = 20;
/// Size of a MAD. This crate sends single MADs; it receives single MADs or, for agents
/// registered with RMPP on a kernel, whole reassembled messages.
pub const MAD_SIZE: usize = 256;
/// The longest reassembled RMPP message accepted (a PathRecord table of 16k records).
const MAX_MESSAGE: usize = 1 << 20;

/// `ib_mad_addr_t` of `<infiniband/umad.h>` (ABI 5): the address of a received MAD.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MadAddr {
    qpn: u32,
    qkey: u32,
    lid: u16,
    sl: u8,
    path_bits: u8,
    grh_present: u8,
    gid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
    gid: [u8; 16],
    flow_label: u32,
    pkey_index: u16,
    reserved: [u8; 6],
}

/// `umad_port_t` of `<infiniband/umad.h>`.
#[repr(C)]
struct UmadPort {
    ca_name: [c_char; CA_NAME_LEN],
    portnum: c_int,
    base_lid: u32,
    lmc: u32,
    sm_lid: u32,
    sm_sl: u32,
    state: u32,
    phys_state: u32,
    rate: u32,
    capmask: u32,
    gid_prefix: u64,
    port_guid: u64,
    pkeys_size: u32,
    pkeys: *mut u16,
    link_layer: [c_char; CA_NAME_LEN],
}

type FnInit = unsafe extern "C" fn() -> c_int;
type FnGetCasNames = unsafe extern "C" fn(*mut [c_char; CA_NAME_LEN], c_int) -> c_int;
type FnGetPort = unsafe extern "C" fn(*const c_char, c_int, *mut UmadPort) -> c_int;
type FnReleasePort = unsafe extern "C" fn(*mut UmadPort) -> c_int;
type FnOpenPort = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FnClosePort = unsafe extern "C" fn(c_int) -> c_int;
type FnRegister = unsafe extern "C" fn(c_int, c_int, c_int, u8, *mut c_long) -> c_int;
type FnRegisterOui = unsafe extern "C" fn(c_int, c_int, u8, *mut u8, *mut c_long) -> c_int;
type FnUnregister = unsafe extern "C" fn(c_int, c_int) -> c_int;
type FnSend = unsafe extern "C" fn(c_int, c_int, *mut c_void, c_int, c_int, c_int) -> c_int;
type FnRecv = unsafe extern "C" fn(c_int, *mut c_void, *mut c_int, c_int) -> c_int;
type FnGetMad = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type FnSize = unsafe extern "C" fn() -> size_t;
type FnSetAddr = unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, c_int) -> c_int;
type FnGetMadAddr = unsafe extern "C" fn(*mut c_void) -> *mut MadAddr;
type FnStatus = unsafe extern "C" fn(*mut c_void) -> c_int;
type FnGetIssmPath = unsafe extern "C" fn(*const c_char, c_int, *mut c_char, c_int) -> c_int;

/// libibumad, loaded. Function pointers stay valid while `_lib` lives (it is never
/// unloaded before the struct is dropped, and every user holds an `Arc` to it).
pub struct Lib {
    init: FnInit,
    get_cas_names: FnGetCasNames,
    get_port: FnGetPort,
    release_port: FnReleasePort,
    open_port: FnOpenPort,
    close_port: FnClosePort,
    register: FnRegister,
    register_oui: FnRegisterOui,
    unregister: FnUnregister,
    send: FnSend,
    recv: FnRecv,
    get_mad: FnGetMad,
    size: FnSize,
    set_addr: FnSetAddr,
    get_mad_addr: FnGetMadAddr,
    status: FnStatus,
    get_issm_path: FnGetIssmPath,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lib").field("library", &LIBRARY).finish()
    }
}

/// Facts about a local port, read through libibumad (which reads sysfs, or umad2sim's
/// fake sysfs under the simulator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// CA name (`mlx5_0`, `ibsim0`).
    pub ca: String,
    /// Port number on the CA (1-based).
    pub port: u8,
    /// Base LID (host order).
    pub lid: u16,
    /// LID mask count.
    pub lmc: u8,
    /// LID of the SM this port knows.
    pub sm_lid: u16,
    /// SL to reach the SM.
    pub sm_sl: u8,
    /// Port state (4 = ACTIVE).
    pub state: u8,
    /// The port's GID 0 (subnet prefix then port GUID), network byte order.
    pub gid: [u8; 16],
}

/// Source address of a received MAD (host byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvAddr {
    /// Source QP.
    pub qpn: u32,
    /// Source LID.
    pub lid: u16,
    /// SL it came on.
    pub sl: u8,
    /// Q_Key of the datagram.
    pub qkey: u32,
}

/// Result of one `umad_recv`.
#[derive(Debug)]
pub enum RecvOutcome {
    /// A MAD for `agent` (or a send completion with a non-zero `status`).
    Mad {
        /// The agent id libibumad returned.
        agent: i32,
        /// `umad_status`: 0, or an errno for a failed send (e.g. ETIMEDOUT).
        status: i32,
        /// Where it came from.
        addr: RecvAddr,
        /// The MAD bytes.
        mad: Vec<u8>,
    },
    /// Nothing within the timeout.
    Timeout,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the type given at the use site is the C prototype of this symbol in
        // <infiniband/umad.h> (rdma-core ABI 5), checked by hand.
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
            Error::LibraryMissing {
                library: LIBRARY,
                package: PACKAGE,
                detail: format!("symbol {}: {source}", $name),
            }
        })?;
        *s
    }};
}

impl Lib {
    /// Load libibumad and call `umad_init`.
    pub fn load() -> Result<Lib, Error> {
        // SAFETY: loading libibumad runs only its (trivial) ELF initialisers.
        let lib =
            unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| Error::LibraryMissing {
                library: LIBRARY,
                package: PACKAGE,
                detail: e.to_string(),
            })?;
        let l = Lib {
            init: sym!(lib, "umad_init"),
            get_cas_names: sym!(lib, "umad_get_cas_names"),
            get_port: sym!(lib, "umad_get_port"),
            release_port: sym!(lib, "umad_release_port"),
            open_port: sym!(lib, "umad_open_port"),
            close_port: sym!(lib, "umad_close_port"),
            register: sym!(lib, "umad_register"),
            register_oui: sym!(lib, "umad_register_oui"),
            unregister: sym!(lib, "umad_unregister"),
            send: sym!(lib, "umad_send"),
            recv: sym!(lib, "umad_recv"),
            get_mad: sym!(lib, "umad_get_mad"),
            size: sym!(lib, "umad_size"),
            set_addr: sym!(lib, "umad_set_addr"),
            get_mad_addr: sym!(lib, "umad_get_mad_addr"),
            status: sym!(lib, "umad_status"),
            get_issm_path: sym!(lib, "umad_get_issm_path"),
            _lib: lib,
        };
        // SAFETY: umad_init takes no arguments; it only checks the ABI version.
        let rc = unsafe { (l.init)() };
        if rc < 0 {
            return Err(Error::Call {
                func: "umad_init",
                rc,
            });
        }
        Ok(l)
    }

    /// Names of the local CAs.
    pub fn ca_names(&self) -> Result<Vec<String>, Error> {
        let mut names = [[0 as c_char; CA_NAME_LEN]; 32];
        // SAFETY: `names` has room for 32 entries of UMAD_CA_NAME_LEN, as `max` says.
        let n = unsafe { (self.get_cas_names)(names.as_mut_ptr(), 32) };
        if n < 0 {
            return Err(Error::Call {
                func: "umad_get_cas_names",
                rc: n,
            });
        }
        Ok(names
            .iter()
            .take(n.clamp(0, 32) as usize)
            .map(|n| c_name(n))
            .collect())
    }

    /// Facts about `ca`/`port`.
    pub fn port_info(&self, ca: &str, port: u8) -> Result<PortInfo, Error> {
        let cname = CString::new(ca).map_err(|_| Error::NoSuchPort(ca.to_owned()))?;
        // SAFETY: UmadPort is plain old data; all-zero is a valid value (null pkeys).
        let mut p: UmadPort = unsafe { std::mem::zeroed() };
        // SAFETY: cname is NUL-terminated and outlives the call; `p` is a valid
        // umad_port_t that libibumad fills (and allocates `pkeys`, freed below).
        let rc = unsafe { (self.get_port)(cname.as_ptr(), c_int::from(port), &mut p) };
        if rc < 0 {
            return Err(Error::Call {
                func: "umad_get_port",
                rc,
            });
        }
        let mut gid = [0u8; 16];
        // gid_prefix and port_guid are __be64: their in-memory bytes are wire order.
        gid[..8].copy_from_slice(&p.gid_prefix.to_ne_bytes());
        gid[8..].copy_from_slice(&p.port_guid.to_ne_bytes());
        let info = PortInfo {
            ca: c_name(&p.ca_name),
            port: u8::try_from(p.portnum).unwrap_or(port),
            lid: u16::try_from(p.base_lid).unwrap_or(0),
            lmc: u8::try_from(p.lmc).unwrap_or(0),
            sm_lid: u16::try_from(p.sm_lid).unwrap_or(0),
            sm_sl: u8::try_from(p.sm_sl).unwrap_or(0),
            state: u8::try_from(p.state).unwrap_or(0),
            gid,
        };
        // SAFETY: `p` was filled by umad_get_port above; release frees its pkeys once.
        unsafe { (self.release_port)(&mut p) };
        Ok(info)
    }

    /// `umad_open_port`: returns the port id.
    pub fn open_port(&self, ca: &str, port: u8) -> Result<i32, Error> {
        let cname = CString::new(ca).map_err(|_| Error::NoSuchPort(ca.to_owned()))?;
        // SAFETY: cname is NUL-terminated and outlives the call.
        let rc = unsafe { (self.open_port)(cname.as_ptr(), c_int::from(port)) };
        if rc < 0 {
            return Err(Error::Call {
                func: "umad_open_port",
                rc,
            });
        }
        Ok(rc)
    }

    /// `umad_close_port`.
    pub fn close_port(&self, portid: i32) {
        // SAFETY: takes an integer id; an unknown id only returns an error.
        unsafe { (self.close_port)(portid) };
    }

    /// The `/dev/infiniband/issmN` path of `ca`/`port`, if libibumad knows it.
    pub fn issm_path(&self, ca: &str, port: u8) -> Option<String> {
        let cname = CString::new(ca).ok()?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: buf has 256 bytes as `max` says; cname is NUL-terminated.
        let rc = unsafe {
            (self.get_issm_path)(cname.as_ptr(), c_int::from(port), buf.as_mut_ptr(), 256)
        };
        (rc >= 0).then(|| c_name(&buf)).filter(|s| !s.is_empty())
    }

    /// `umad_register` (or `umad_register_oui` for vendor classes with an OUI), with an
    /// all-methods mask (umad2sim ignores masks; the kernel honours them).
    pub fn register(
        &self,
        portid: i32,
        class: u8,
        version: u8,
        rmpp_version: u8,
        oui: Option<[u8; 3]>,
    ) -> Result<i32, Error> {
        // 128 method bits; all set so that every method of the class reaches the agent
        // (requests and responses alike; the transport sorts them).
        let mut mask: [c_long; 16 / std::mem::size_of::<c_long>()] =
            [-1; 16 / std::mem::size_of::<c_long>()];
        let rc = match oui {
            None => {
                // SAFETY: mask has the 16 bytes the prototype's array needs.
                unsafe {
                    (self.register)(
                        portid,
                        c_int::from(class),
                        c_int::from(version),
                        rmpp_version,
                        mask.as_mut_ptr(),
                    )
                }
            }
            Some(mut oui) => {
                // SAFETY: oui has 3 bytes and mask 16, as the prototype's arrays need.
                unsafe {
                    (self.register_oui)(
                        portid,
                        c_int::from(class),
                        rmpp_version,
                        oui.as_mut_ptr(),
                        mask.as_mut_ptr(),
                    )
                }
            }
        };
        if rc < 0 {
            return Err(Error::Call {
                func: "umad_register",
                rc,
            });
        }
        Ok(rc)
    }

    /// `umad_unregister`.
    pub fn unregister(&self, portid: i32, agent: i32) {
        // SAFETY: takes integer ids; unknown ids only return an error.
        unsafe { (self.unregister)(portid, agent) };
    }

    /// Send one MAD (`mad.len() <= 256`) to `dlid`/`dqp`. `timeout_ms` > 0 for requests
    /// (the kernel only routes a response to an agent whose send is still pending).
    #[allow(clippy::too_many_arguments)] // mirrors the C address fields one to one
    pub fn send(
        &self,
        portid: i32,
        agent: i32,
        mad: &[u8],
        dlid: u16,
        dqp: u32,
        sl: u8,
        qkey: u32,
        timeout_ms: u32,
    ) -> Result<(), Error> {
        if mad.len() > MAD_SIZE {
            return Err(Error::BadMad(format!("{} bytes", mad.len())));
        }
        let hdr = self.umad_size();
        let mut buf = vec![0u8; hdr + MAD_SIZE];
        // SAFETY: buf is umad_size()+256 bytes, a valid ib_user_mad with room for a MAD;
        // umad_get_mad returns a pointer inside it.
        let data = unsafe { (self.get_mad)(buf.as_mut_ptr().cast()) }.cast::<u8>();
        let off = (data as usize).wrapping_sub(buf.as_ptr() as usize);
        if off + mad.len() > buf.len() {
            return Err(Error::BadMad("umad_get_mad offset out of range".into()));
        }
        buf[off..off + mad.len()].copy_from_slice(mad);
        // SAFETY: buf is a valid ib_user_mad (see above); set_addr writes its header.
        let rc = unsafe {
            (self.set_addr)(
                buf.as_mut_ptr().cast(),
                c_int::from(dlid),
                dqp as c_int,
                c_int::from(sl),
                qkey as c_int,
            )
        };
        if rc < 0 {
            return Err(Error::Call {
                func: "umad_set_addr",
                rc,
            });
        }
        // SAFETY: buf holds the header and `mad.len()` bytes of MAD, as `length` says.
        let rc = unsafe {
            (self.send)(
                portid,
                agent,
                buf.as_mut_ptr().cast(),
                mad.len() as c_int,
                timeout_ms.min(i32::MAX as u32) as c_int,
                0,
            )
        };
        if rc < 0 {
            return Err(Error::Call {
                func: "umad_send",
                rc,
            });
        }
        Ok(())
    }

    /// `umad_size()`: the ib_user_mad header size.
    fn umad_size(&self) -> usize {
        // SAFETY: no arguments; returns a constant.
        unsafe { (self.size)() }
    }

    /// Block up to `timeout_ms` for one MAD on `portid`.
    pub fn recv(&self, portid: i32, timeout_ms: i32) -> Result<RecvOutcome, Error> {
        let hdr = self.umad_size();
        // Room for a few MADs; a longer kernel-reassembled RMPP message makes umad_recv
        // fail with ENOSPC and say how much it needs (the kernel keeps the message), and
        // the call is repeated with that much, up to MAX_MESSAGE.
        let mut room = 8 * MAD_SIZE;
        let (rc, mut buf, len) = loop {
            let mut buf = vec![0u8; hdr + room];
            let mut len: c_int = c_int::try_from(room).unwrap_or(c_int::MAX);
            // SAFETY: buf is a valid ib_user_mad with `len` bytes of room after the
            // header.
            let rc = unsafe { (self.recv)(portid, buf.as_mut_ptr().cast(), &mut len, timeout_ms) };
            let needed = usize::try_from(len).unwrap_or(0);
            if rc == -libc::ENOSPC && needed > room && needed <= MAX_MESSAGE {
                room = needed;
                continue;
            }
            break (rc, buf, len);
        };
        if rc < 0 {
            if rc == -libc::ETIMEDOUT || rc == -libc::EWOULDBLOCK || rc == -libc::EINTR {
                return Ok(RecvOutcome::Timeout);
            }
            return Err(Error::Call {
                func: "umad_recv",
                rc,
            });
        }
        // SAFETY: buf holds the ib_user_mad that umad_recv filled.
        let status = unsafe { (self.status)(buf.as_mut_ptr().cast()) };
        // SAFETY: as above; the returned pointer is inside buf and suitably sized.
        let a = unsafe { (self.get_mad_addr)(buf.as_mut_ptr().cast()) };
        let addr = if a.is_null() {
            RecvAddr::default()
        } else {
            // SAFETY: non-null pointer into buf at the header's address field;
            // read_unaligned because buf is a byte vector.
            let a = unsafe { std::ptr::read_unaligned(a) };
            RecvAddr {
                qpn: u32::from_be(a.qpn),
                lid: u16::from_be(a.lid),
                sl: a.sl,
                qkey: u32::from_be(a.qkey),
            }
        };
        let n = usize::try_from(len)
            .unwrap_or(0)
            .min(buf.len() - hdr)
            .max(MAD_SIZE.min(buf.len() - hdr));
        let mad = buf[hdr..hdr + n].to_vec();
        Ok(RecvOutcome::Mad {
            agent: rc,
            status,
            addr,
            mad,
        })
    }
}

/// A NUL-terminated C char array as a String (lossy, bounded by the array).
fn c_name(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Open `path` read-write with `libc::open` (umad2sim interposes `open`, not the
/// `open64`/`openat` that Rust's std uses). Returns the fd.
pub fn raw_open_rdwr(path: &str) -> Result<i32, Error> {
    let c = CString::new(path).map_err(|_| Error::NoSuchPort(path.to_owned()))?;
    // SAFETY: c is NUL-terminated and outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR) };
    if fd < 0 {
        return Err(Error::Call {
            func: "open",
            rc: -std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        });
    }
    Ok(fd)
}

/// Close an fd from [`raw_open_rdwr`].
pub fn raw_close(fd: i32) {
    // SAFETY: closes an fd this crate opened and owns.
    unsafe { libc::close(fd) };
}
