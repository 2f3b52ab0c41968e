//! Devices: the device list, opening a context, and querying device, port and GID table.

use super::{c_array, c_string, sys, Result, Verbs, VerbsError};
use std::sync::Arc;

/// A device as listed by libibverbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Node GUID in host order (0 for devices that have none, e.g. rxe before use).
    pub guid: u64,
}

pub(super) fn list(verbs: &Verbs) -> Result<Vec<DeviceInfo>> {
    let lib = &verbs.lib;
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned array is NULL or holds `n` device
    // pointers followed by NULL, valid until `ibv_free_device_list`, which is called
    // before returning.
    let devs = unsafe { (lib.ibv_get_device_list)(&mut n) };
    if devs.is_null() {
        return Err(VerbsError::last("ibv_get_device_list"));
    }
    let mut out = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: i < n, inside the array returned above; each entry is a valid device.
        let dev = unsafe { *devs.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a live device of the list; both calls only read it.
        let (name, guid) = unsafe {
            (
                c_string((lib.ibv_get_device_name)(dev)),
                u64::from_be((lib.ibv_get_device_guid)(dev)),
            )
        };
        out.push(DeviceInfo { name, guid });
    }
    // SAFETY: `devs` came from ibv_get_device_list and is freed once.
    unsafe { (lib.ibv_free_device_list)(devs) };
    Ok(out)
}

pub(super) fn open(verbs: &Verbs, name: &str) -> Result<Context> {
    let lib = &verbs.lib;
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: as in `list`.
    let devs = unsafe { (lib.ibv_get_device_list)(&mut n) };
    if devs.is_null() {
        return Err(VerbsError::last("ibv_get_device_list"));
    }
    let mut ctx = std::ptr::null_mut();
    let mut found = false;
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: i < n, inside the array; entries are valid devices.
        let dev = unsafe { *devs.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a live device; the name array is NUL-terminated by libibverbs.
        let dev_name = unsafe { c_array(&(*dev).name) };
        if dev_name == name {
            found = true;
            // SAFETY: opening a listed device; the context does not borrow the list
            // (libibverbs keeps the device refcounted), so freeing the list below is fine.
            ctx = unsafe { (lib.ibv_open_device)(dev) };
            break;
        }
    }
    let err = if found && ctx.is_null() {
        Some(VerbsError::last("ibv_open_device"))
    } else {
        None
    };
    // SAFETY: `devs` came from ibv_get_device_list and is freed once.
    unsafe { (lib.ibv_free_device_list)(devs) };
    if let Some(e) = err {
        return Err(e);
    }
    if !found {
        return Err(VerbsError::NoSuchDevice(name.to_owned()));
    }
    Ok(Context {
        inner: Arc::new(ContextInner {
            verbs: verbs.clone(),
            ctx,
            name: name.to_owned(),
            roce_apm: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            roce_gid_hints: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        }),
    })
}

/// An open device. Cheap to clone; closed when the last clone and every object created
/// from it are dropped.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) verbs: Verbs,
    pub(crate) ctx: *mut sys::ibv_context,
    pub(crate) name: String,
    /// Per RoCE port: whether the kernel accepts alternate paths there
    /// ([`crate::roce_apm`], asked once).
    pub(crate) roce_apm: std::sync::Mutex<std::collections::BTreeMap<u8, bool>>,
    /// Per (port, GID): the RoCE v2 index [`Context::roce_gid_index`] found last, tried
    /// first next time.
    pub(crate) roce_gid_hints: std::sync::Mutex<std::collections::BTreeMap<(u8, [u8; 16]), u32>>,
}

// SAFETY: libibverbs contexts are thread-safe (the library locks internally; rdma-core
// documents every verb as callable from any thread), and the pointer is only freed in
// Drop, once.
unsafe impl Send for ContextInner {}
// SAFETY: as above; shared use only calls thread-safe verbs.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: the context was opened by us, and every object created from it holds an
        // Arc to this, so none is left when it is closed.
        let rc = unsafe { (self.verbs.lib.ibv_close_device)(self.ctx) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .finish_non_exhaustive()
    }
}

/// The parts of `ibv_device_attr` apm uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID, host order.
    pub node_guid: u64,
    /// `ibv_device_cap_flags` bits.
    pub device_cap_flags: u32,
    /// Number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
    /// Largest QP count.
    pub max_qp: i32,
    /// Largest work-request count per queue.
    pub max_qp_wr: i32,
    /// Largest CQ size.
    pub max_cqe: i32,
}

impl DeviceAttr {
    /// Whether the device advertises automatic path migration (hardware APM).
    pub fn auto_path_mig(&self) -> bool {
        self.device_cap_flags & sys::IBV_DEVICE_AUTO_PATH_MIG != 0
    }
}

/// Port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// IBV_PORT_NOP.
    Nop,
    /// IBV_PORT_DOWN.
    Down,
    /// IBV_PORT_INIT.
    Init,
    /// IBV_PORT_ARMED.
    Armed,
    /// IBV_PORT_ACTIVE.
    Active,
    /// IBV_PORT_ACTIVE_DEFER.
    ActiveDefer,
    /// A value this binding does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_PORT_NOP => PortState::Nop,
            sys::IBV_PORT_DOWN => PortState::Down,
            sys::IBV_PORT_INIT => PortState::Init,
            sys::IBV_PORT_ARMED => PortState::Armed,
            sys::IBV_PORT_ACTIVE => PortState::Active,
            sys::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            o => PortState::Other(o),
        }
    }
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkLayer {
    /// InfiniBand (also reported as "unspecified" by old drivers).
    InfiniBand,
    /// Ethernet: RoCE (or iWARP).
    Ethernet,
    /// A value this binding does not know.
    Other(u8),
}

/// The parts of `ibv_port_attr` apm uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Base LID (InfiniBand).
    pub lid: u16,
    /// LID mask count.
    pub lmc: u8,
    /// The SM's LID.
    pub sm_lid: u16,
    /// GID table length.
    pub gid_tbl_len: i32,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// `port_cap_flags`.
    pub port_cap_flags: u32,
}

use super::qp_attr::Mtu;

/// GID type of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GidType {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet, GRH in an Ethernet frame).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
    /// A value this binding does not know.
    Other(u32),
}

/// The most GID table entries one table query reads.
const MAX_GID_ENTRIES: usize = 1 << 16;

/// One GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table (not stable across address changes on RoCE).
    pub index: u32,
    /// The GID, network order.
    pub gid: [u8; 16],
    /// Its type.
    pub gid_type: GidType,
    /// Interface index of the netdev behind it (RoCE), 0 otherwise.
    pub ndev_ifindex: u32,
}

impl GidEntry {
    /// The entry libibverbs filled in, `None` for an empty slot (all-zero GID).
    fn of(e: &sys::ibv_gid_entry) -> Option<GidEntry> {
        // SAFETY: every bit pattern is a valid [u8; 16], the union's `raw` view.
        let gid = unsafe { e.gid.raw };
        if gid == [0u8; 16] {
            return None;
        }
        let gid_type = match e.gid_type {
            sys::IBV_GID_TYPE_IB => GidType::Ib,
            sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            o => GidType::Other(o),
        };
        Some(GidEntry {
            index: e.gid_index,
            gid,
            gid_type,
            ndev_ifindex: e.ndev_ifindex,
        })
    }

    /// The GID as an IPv6 address (RoCE GIDs are IP addresses, IPv4 mapped).
    pub fn as_ipv6(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.gid)
    }
}

impl Context {
    /// Device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The loaded library this context came from.
    pub fn verbs(&self) -> &Verbs {
        &self.inner.verbs
    }

    /// The cached answer of [`crate::roce_apm::accepts_alternates`] for `port`.
    pub(crate) fn roce_apm_cached(&self, port: u8) -> Option<bool> {
        let cache = self
            .inner
            .roce_apm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache.get(&port).copied()
    }

    pub(crate) fn roce_apm_cache(&self, port: u8, accepted: bool) {
        self.inner
            .roce_apm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(port, accepted);
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_context {
        self.inner.ctx
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut a = std::mem::MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: valid context and a writable attribute struct of the header's layout.
        let rc = unsafe { (self.inner.verbs.lib.ibv_query_device)(self.raw(), a.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_query_device", rc));
        }
        // SAFETY: zero-initialised and filled in by the call; all fields are plain data.
        let a = unsafe { a.assume_init() };
        Ok(DeviceAttr {
            fw_ver: c_array(&a.fw_ver),
            node_guid: u64::from_be(a.node_guid),
            device_cap_flags: a.device_cap_flags,
            phys_port_cnt: a.phys_port_cnt,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_cqe: a.max_cqe,
        })
    }

    /// `ibv_query_port`, as the inline in `verbs.h` does it: through the extended
    /// context's `query_port` op when the provider has one (it fills the whole current
    /// `ibv_port_attr`), else through the exported compat symbol, which fills only the old
    /// prefix of the struct (the rest stays zero).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut a = std::mem::MaybeUninit::<sys::ibv_port_attr>::zeroed();
        let ctx = self.raw();
        let rc = match query_port_op(ctx) {
            // SAFETY: `op` is the provider's query_port, taken from the extended context
            // after the size check of `verbs_get_ctx_op`; it writes at most the length
            // passed, which is the size of the struct we pass.
            Some(op) => unsafe {
                op(
                    ctx,
                    port,
                    a.as_mut_ptr(),
                    std::mem::size_of::<sys::ibv_port_attr>(),
                )
            },
            // SAFETY: the compat entry point writes a `_compat_ibv_port_attr`, a prefix of
            // `ibv_port_attr` (the header casts the same way); the struct is zeroed.
            None => unsafe {
                (self.inner.verbs.lib.ibv_query_port)(ctx, port, a.as_mut_ptr().cast())
            },
        };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_query_port", rc));
        }
        // SAFETY: zero-initialised and filled in by the call; all fields are plain data.
        let a = unsafe { a.assume_init() };
        let link_layer = match u32::from(a.link_layer) {
            sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            sys::IBV_LINK_LAYER_INFINIBAND | sys::IBV_LINK_LAYER_UNSPECIFIED => {
                LinkLayer::InfiniBand
            }
            _ => LinkLayer::Other(a.link_layer),
        };
        Ok(PortAttr {
            state: PortState::from_raw(a.state),
            phys_state: a.phys_state,
            link_layer,
            lid: a.lid,
            lmc: a.lmc,
            sm_lid: a.sm_lid,
            gid_tbl_len: a.gid_tbl_len,
            active_mtu: Mtu::from_raw(a.active_mtu),
            port_cap_flags: a.port_cap_flags,
        })
    }

    /// One GID table entry (`ibv_query_gid_ex`); `Ok(None)` for an empty slot.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        let mut e = std::mem::MaybeUninit::<sys::ibv_gid_entry>::zeroed();
        // SAFETY: valid context, writable entry of the size passed (the inline
        // `ibv_query_gid_ex` passes sizeof(*entry) the same way), flags 0.
        let rc = unsafe {
            (self.inner.verbs.lib._ibv_query_gid_ex)(
                self.raw(),
                u32::from(port),
                index,
                e.as_mut_ptr(),
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        if rc != 0 {
            let err = VerbsError::from_ret("ibv_query_gid_ex", rc);
            // An empty slot is ENODATA; a slot past the table end EINVAL.
            return match err.errno() {
                Some(libc::ENODATA) | Some(libc::EINVAL) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: filled in by the call.
        Ok(GidEntry::of(&unsafe { e.assume_init() }))
    }

    /// The non-empty entries of a port's GID table.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let len = self.query_port(port)?.gid_tbl_len;
        let slots = usize::try_from(len).unwrap_or(0);
        match self.valid_gids(slots) {
            Ok(all) => Ok(all
                .into_iter()
                .filter(|(p, _)| *p == u32::from(port))
                .map(|(_, e)| e)
                .collect()),
            Err(_) => {
                // A libibverbs or kernel without the table query: slot by slot.
                let mut out = Vec::new();
                for i in 0..u32::try_from(len).unwrap_or(0) {
                    if let Some(e) = self.query_gid(port, i)? {
                        out.push(e);
                    }
                }
                Ok(out)
            }
        }
    }

    /// Every valid GID of the device, with its port (`ibv_query_gid_table`: one call for
    /// the whole table, where reading rxe's 1024 slots one by one costs about a second of
    /// CPU under emulation). `slots` bounds the entries of one port; the buffer has room for
    /// that many on every port of the device (the call lists them all).
    fn valid_gids(&self, slots: usize) -> Result<Vec<(u32, GidEntry)>> {
        let ports = usize::from(self.query_device()?.phys_port_cnt.max(1));
        // Bounded whatever the device says its table holds (2 MB of entries); a table
        // with more valid entries than that is read slot by slot instead.
        let max = slots.max(1).saturating_mul(ports).min(MAX_GID_ENTRIES);
        let mut raw: Vec<sys::ibv_gid_entry> = Vec::with_capacity(max);
        // SAFETY: valid context; `raw` has room for `max` entries of the size passed (the
        // inline `ibv_query_gid_table` passes sizeof(*entries) the same way), flags 0;
        // the call writes at most `max` entries and returns how many, or a negative errno.
        let n = unsafe {
            (self.inner.verbs.lib._ibv_query_gid_table)(
                self.raw(),
                raw.as_mut_ptr(),
                max,
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            let rc = i32::try_from(n).unwrap_or(-libc::EINVAL);
            return Err(VerbsError::from_ret("ibv_query_gid_table", rc));
        };
        // SAFETY: the call filled the first `n` (<= max) entries.
        unsafe { raw.set_len(n.min(max)) };
        Ok(raw
            .iter()
            .filter_map(|e| Some((e.port_num, GidEntry::of(e)?)))
            .collect())
    }

    /// The first entry of `port`'s GID table, in index order, that `want` accepts,
    /// reading no further than it (rxe's table has 1024 slots, and reading them all one
    /// by one takes about a second under emulation) and no further than index 255 (an
    /// address vector's GID index is one byte).
    pub fn first_gid(
        &self,
        port: u8,
        mut want: impl FnMut(&GidEntry) -> bool,
    ) -> Result<Option<GidEntry>> {
        let len = self.query_port(port)?.gid_tbl_len;
        for i in 0..u32::try_from(len).unwrap_or(0).min(256) {
            if let Some(e) = self.query_gid(port, i)? {
                if want(&e) {
                    return Ok(Some(e));
                }
            }
        }
        Ok(None)
    }

    /// The index of `gid` in `port`'s GID table for a RoCE address vector: its RoCE v2
    /// entry, or where it has none the first entry of another type; `None` when the
    /// table does not hold it. Reads in index order, stops at the RoCE v2 entry and
    /// never past index 255, as [`Context::first_gid`] does.
    ///
    /// RoCE GID indexes move when addresses come and go, so an index is never trusted
    /// blindly; but a software migration looks one up on its critical path, where a scan
    /// of the table costs one query per slot (milliseconds on a loaded or emulated
    /// host). So the RoCE v2 index found last for this GID is read first, with one query,
    /// and kept when that slot still holds the GID as RoCE v2; otherwise the table is
    /// scanned again.
    pub fn roce_gid_index(&self, port: u8, gid: &[u8; 16]) -> Result<Option<u8>> {
        let hints = &self.inner.roce_gid_hints;
        let hint = hints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(port, *gid))
            .copied();
        if let Some(index) = hint {
            // A failed read of the hinted slot is no answer either way: the scan decides.
            if let Ok(Some(e)) = self.query_gid(port, index) {
                if e.gid == *gid && e.gid_type == GidType::RoceV2 {
                    return Ok(u8::try_from(index).ok());
                }
            }
        }
        let mut other_type = None;
        let v2 = self.first_gid(port, |e| {
            if e.gid != *gid {
                return false;
            }
            if e.gid_type == GidType::RoceV2 {
                return true;
            }
            other_type.get_or_insert(e.index);
            false
        })?;
        let mut hints = hints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &v2 {
            Some(e) => hints.insert((port, *gid), e.index),
            None => hints.remove(&(port, *gid)),
        };
        Ok(v2
            .map(|e| e.index)
            .or(other_type)
            .and_then(|i| u8::try_from(i).ok()))
    }

    /// The GID table index holding `addr` (as a RoCE GID: IPv6, or IPv4-mapped), with the
    /// wanted type. RoCE GID indexes move when addresses change: look them up each time.
    pub fn find_gid(
        &self,
        port: u8,
        addr: std::net::IpAddr,
        gid_type: GidType,
    ) -> Result<Option<GidEntry>> {
        let want = match addr {
            std::net::IpAddr::V4(a) => a.to_ipv6_mapped(),
            std::net::IpAddr::V6(a) => a,
        };
        Ok(self
            .gid_table(port)?
            .into_iter()
            .find(|e| e.as_ipv6() == want && e.gid_type == gid_type))
    }
}

type QueryPortOp = unsafe extern "C" fn(
    *mut sys::ibv_context,
    u8,
    *mut sys::ibv_port_attr,
    usize,
) -> std::os::raw::c_int;

/// `verbs_get_ctx_op(ctx, query_port)` from `verbs.h`: the extended context's op, if the
/// context is extended, big enough to have the field, and the provider set it.
fn query_port_op(ctx: *mut sys::ibv_context) -> Option<QueryPortOp> {
    // `__VERBS_ABI_IS_EXTENDED` in verbs.h: ((void *)UINTPTR_MAX).
    const ABI_IS_EXTENDED: usize = usize::MAX;
    // SAFETY: `ctx` is a live context; reading its `abi_compat` field is always valid.
    let abi = unsafe { (*ctx).abi_compat };
    if abi as usize != ABI_IS_EXTENDED {
        return None;
    }
    let ctx_off = std::mem::offset_of!(sys::verbs_context, context);
    let op_off = std::mem::offset_of!(sys::verbs_context, query_port);
    // SAFETY: an extended context is the last member of a `verbs_context` (the header's
    // container_of), so stepping back by its offset stays inside that allocation.
    let vctx = unsafe { ctx.cast::<u8>().sub(ctx_off) }.cast::<sys::verbs_context>();
    // SAFETY: `sz` sits immediately before `context` in every ABI version ("Must be
    // immediately before struct ibv_context"), so it is readable whatever the provider's
    // struct size.
    let sz = unsafe { (*vctx).sz };
    if sz < std::mem::size_of::<sys::verbs_context>() - op_off {
        return None;
    }
    // SAFETY: the size check above says the provider's struct reaches this field.
    unsafe { (*vctx).query_port }
}
