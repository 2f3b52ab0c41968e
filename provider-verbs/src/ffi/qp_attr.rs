//! QP attributes as values: path MTU, QP and migration states, the attribute mask, the
//! address vector (one path) and `QpAttr`, each with its conversion to and from
//! libibverbs' structs. No resource lives here: [`super::resources`] and [`super::qp`]
//! use these to modify and query QPs.

use super::sys;

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
    /// A value this binding does not know.
    Other(u32),
}

impl Mtu {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_MTU_256 => Mtu::Mtu256,
            sys::IBV_MTU_512 => Mtu::Mtu512,
            sys::IBV_MTU_1024 => Mtu::Mtu1024,
            sys::IBV_MTU_2048 => Mtu::Mtu2048,
            sys::IBV_MTU_4096 => Mtu::Mtu4096,
            o => Mtu::Other(o),
        }
    }
    /// The IBA path-MTU code (1 = 256 ... 5 = 4096, `enum ibv_mtu`'s values), as an
    /// engine `Path` carries it; 0 for a value no code fits.
    pub fn code(self) -> u8 {
        u8::try_from(self.raw()).unwrap_or(0)
    }

    /// The MTU of an IBA path-MTU code (see [`Mtu::code`]).
    pub fn from_code(code: u8) -> Self {
        Self::from_raw(u32::from(code))
    }

    pub(crate) fn raw(self) -> u32 {
        match self {
            Mtu::Mtu256 => sys::IBV_MTU_256,
            Mtu::Mtu512 => sys::IBV_MTU_512,
            Mtu::Mtu1024 => sys::IBV_MTU_1024,
            Mtu::Mtu2048 => sys::IBV_MTU_2048,
            Mtu::Mtu4096 => sys::IBV_MTU_4096,
            Mtu::Other(o) => o,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpState {
    /// RESET.
    Reset,
    /// INIT.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain(ed).
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error.
    Err,
    /// A value this binding does not know.
    Other(u32),
}

impl QpState {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::Rtr,
            sys::IBV_QPS_RTS => QpState::Rts,
            sys::IBV_QPS_SQD => QpState::Sqd,
            sys::IBV_QPS_SQE => QpState::Sqe,
            sys::IBV_QPS_ERR => QpState::Err,
            o => QpState::Other(o),
        }
    }
    pub(crate) fn raw(self) -> u32 {
        match self {
            QpState::Reset => sys::IBV_QPS_RESET,
            QpState::Init => sys::IBV_QPS_INIT,
            QpState::Rtr => sys::IBV_QPS_RTR,
            QpState::Rts => sys::IBV_QPS_RTS,
            QpState::Sqd => sys::IBV_QPS_SQD,
            QpState::Sqe => sys::IBV_QPS_SQE,
            QpState::Err => sys::IBV_QPS_ERR,
            QpState::Other(o) => o,
        }
    }
}

/// Path migration state (`enum ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigState {
    /// Nothing armed (start state, and after a migration).
    Migrated,
    /// Software asked to arm the loaded alternate path.
    Rearm,
    /// Armed: the hardware may migrate.
    Armed,
    /// A value this binding does not know.
    Other(u32),
}

impl MigState {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_MIG_MIGRATED => MigState::Migrated,
            sys::IBV_MIG_REARM => MigState::Rearm,
            sys::IBV_MIG_ARMED => MigState::Armed,
            o => MigState::Other(o),
        }
    }
    pub(crate) fn raw(self) -> u32 {
        match self {
            MigState::Migrated => sys::IBV_MIG_MIGRATED,
            MigState::Rearm => sys::IBV_MIG_REARM,
            MigState::Armed => sys::IBV_MIG_ARMED,
            MigState::Other(o) => o,
        }
    }
}

/// `enum ibv_qp_attr_mask` bits: which attributes a modify sets or a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttrMask(pub u32);

impl QpAttrMask {
    /// IBV_QP_STATE.
    pub const STATE: Self = Self(sys::IBV_QP_STATE);
    /// IBV_QP_CUR_STATE.
    pub const CUR_STATE: Self = Self(sys::IBV_QP_CUR_STATE);
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(sys::IBV_QP_EN_SQD_ASYNC_NOTIFY);
    /// IBV_QP_ACCESS_FLAGS.
    pub const ACCESS_FLAGS: Self = Self(sys::IBV_QP_ACCESS_FLAGS);
    /// IBV_QP_PKEY_INDEX.
    pub const PKEY_INDEX: Self = Self(sys::IBV_QP_PKEY_INDEX);
    /// IBV_QP_PORT.
    pub const PORT: Self = Self(sys::IBV_QP_PORT);
    /// IBV_QP_AV: the primary address vector.
    pub const AV: Self = Self(sys::IBV_QP_AV);
    /// IBV_QP_PATH_MTU.
    pub const PATH_MTU: Self = Self(sys::IBV_QP_PATH_MTU);
    /// IBV_QP_TIMEOUT.
    pub const TIMEOUT: Self = Self(sys::IBV_QP_TIMEOUT);
    /// IBV_QP_RETRY_CNT.
    pub const RETRY_CNT: Self = Self(sys::IBV_QP_RETRY_CNT);
    /// IBV_QP_RNR_RETRY.
    pub const RNR_RETRY: Self = Self(sys::IBV_QP_RNR_RETRY);
    /// IBV_QP_RQ_PSN.
    pub const RQ_PSN: Self = Self(sys::IBV_QP_RQ_PSN);
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub const MAX_QP_RD_ATOMIC: Self = Self(sys::IBV_QP_MAX_QP_RD_ATOMIC);
    /// IBV_QP_ALT_PATH: the alternate path (address vector, port, pkey, timeout).
    pub const ALT_PATH: Self = Self(sys::IBV_QP_ALT_PATH);
    /// IBV_QP_MIN_RNR_TIMER.
    pub const MIN_RNR_TIMER: Self = Self(sys::IBV_QP_MIN_RNR_TIMER);
    /// IBV_QP_SQ_PSN.
    pub const SQ_PSN: Self = Self(sys::IBV_QP_SQ_PSN);
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub const MAX_DEST_RD_ATOMIC: Self = Self(sys::IBV_QP_MAX_DEST_RD_ATOMIC);
    /// IBV_QP_PATH_MIG_STATE.
    pub const PATH_MIG_STATE: Self = Self(sys::IBV_QP_PATH_MIG_STATE);
    /// IBV_QP_CAP.
    pub const CAP: Self = Self(sys::IBV_QP_CAP);
    /// IBV_QP_DEST_QPN.
    pub const DEST_QPN: Self = Self(sys::IBV_QP_DEST_QPN);

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for QpAttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// An address vector (`struct ibv_ah_attr`): one path to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits (LMC offset of the local LID).
    pub src_path_bits: u8,
    /// Static rate (0 = port rate).
    pub static_rate: u8,
    /// Local port number.
    pub port_num: u8,
    /// Global routing header present (always on RoCE).
    pub is_global: bool,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID table index.
    pub sgid_index: u8,
    /// IPv6 flow label / GRH flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

impl AddressVector {
    pub(crate) fn to_raw(self) -> sys::ibv_ah_attr {
        sys::ibv_ah_attr {
            grh: sys::ibv_global_route {
                dgid: sys::ibv_gid { raw: self.dgid },
                flow_label: self.flow_label,
                sgid_index: self.sgid_index,
                hop_limit: self.hop_limit,
                traffic_class: self.traffic_class,
            },
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: u8::from(self.is_global),
            port_num: self.port_num,
        }
    }
    pub(crate) fn from_raw(a: &sys::ibv_ah_attr) -> Self {
        AddressVector {
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            port_num: a.port_num,
            is_global: a.is_global != 0,
            // SAFETY: every bit pattern is a valid [u8; 16].
            dgid: unsafe { a.grh.dgid.raw },
            sgid_index: a.grh.sgid_index,
            flow_label: a.grh.flow_label,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        }
    }
}

/// QP attributes for modify and query: what the mask names is read (modify) or was
/// filled in (query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state (modify) or current state (query).
    pub qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Path migration state.
    pub path_mig_state: MigState,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Peer QP number.
    pub dest_qp_num: u32,
    /// `ibv_access_flags` for remote access.
    pub qp_access_flags: u32,
    /// Primary path.
    pub ah_attr: AddressVector,
    /// Alternate path.
    pub alt_ah_attr: AddressVector,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate path P_Key index.
    pub alt_pkey_index: u16,
    /// Ask for IBV_EVENT_SQ_DRAINED when moving to SQD.
    pub en_sqd_async_notify: bool,
    /// (query) the send queue is still draining.
    pub sq_draining: bool,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Primary port.
    pub port_num: u8,
    /// Local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retry count (7 on rxe means: retry forever).
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// Alternate path port.
    pub alt_port_num: u8,
    /// Alternate path ACK timeout.
    pub alt_timeout: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: 0,
            ah_attr: AddressVector::default(),
            alt_ah_attr: AddressVector::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
        }
    }
}

impl QpAttr {
    pub(crate) fn to_raw(self) -> sys::ibv_qp_attr {
        // SAFETY: ibv_qp_attr is plain data (integers, arrays, a union of byte arrays);
        // all-zero is a valid value, and the fields are set below.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = self.qp_state.raw();
        a.path_mtu = self.path_mtu.raw();
        a.path_mig_state = self.path_mig_state.raw();
        a.rq_psn = self.rq_psn;
        a.sq_psn = self.sq_psn;
        a.dest_qp_num = self.dest_qp_num;
        a.qp_access_flags = self.qp_access_flags;
        a.ah_attr = self.ah_attr.to_raw();
        a.alt_ah_attr = self.alt_ah_attr.to_raw();
        a.pkey_index = self.pkey_index;
        a.alt_pkey_index = self.alt_pkey_index;
        a.en_sqd_async_notify = u8::from(self.en_sqd_async_notify);
        a.max_rd_atomic = self.max_rd_atomic;
        a.max_dest_rd_atomic = self.max_dest_rd_atomic;
        a.min_rnr_timer = self.min_rnr_timer;
        a.port_num = self.port_num;
        a.timeout = self.timeout;
        a.retry_cnt = self.retry_cnt;
        a.rnr_retry = self.rnr_retry;
        a.alt_port_num = self.alt_port_num;
        a.alt_timeout = self.alt_timeout;
        a
    }
    pub(crate) fn from_raw(a: &sys::ibv_qp_attr) -> Self {
        QpAttr {
            qp_state: QpState::from_raw(a.qp_state),
            path_mtu: Mtu::from_raw(a.path_mtu),
            path_mig_state: MigState::from_raw(a.path_mig_state),
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags,
            ah_attr: AddressVector::from_raw(&a.ah_attr),
            alt_ah_attr: AddressVector::from_raw(&a.alt_ah_attr),
            pkey_index: a.pkey_index,
            alt_pkey_index: a.alt_pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            sq_draining: a.sq_draining != 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: a.alt_port_num,
            alt_timeout: a.alt_timeout,
        }
    }
}
