//! What a device port can do to move an RC QP to another path, found by trying it on a
//! connected pair of apm's own QPs on that port, never from the device's name, its
//! driver or its capability bits.
//!
//! Three trials, each on the real kernel and driver (`probe_port`):
//!
//! 1. **alternate path**: the pair goes INIT->RTR with `IBV_QP_ALT_PATH` (the primary
//!    path given again as the alternate). The RDMA core refuses alternates on RoCE ports
//!    (EINVAL) unless the driver declares RoCE APM; mlx5 and mlx4 take them on
//!    InfiniBand ports.
//! 2. **the device arms it**: with the alternate loaded and `REARM` set at RTR->RTS,
//!    each QP sends one message to the other; a device that implements APM turns REARM
//!    into ARMED once the peer's packets carry MigReq=0. Stock soft-RoCE takes REARM
//!    and never arms (it advertises `IBV_DEVICE_AUTO_PATH_MIG` and implements none of
//!    it): the bit is not evidence, this is.
//! 3. **SQ-drain re-path**: RTS->SQD (asking for the drained event), SQD->SQD with a new
//!    address vector (the same path: the modify is the question), SQD->RTS. rxe takes
//!    all three; mlx5's modify table has no SQD transitions at all.
//!
//! From them, [`PortProbe::mechanism`]: hardware APM where the device arms alternates
//! (the device migrates by itself, apm arms and re-arms), else the SQ-drain move where
//! the QP takes it (apm moves the QP in software), else none; [`PortProbe::missing`]
//! says what a QP left unprotected lacks. A port that is not active, or has no address
//! to loop to, is not tried (`Trial::Untried`, with why): nothing is assumed of it.
//!
//! The pair talks to itself through the port (its own LID on InfiniBand, its own GID
//! on RoCE): nothing leaves the host but through the port's own loopback, and the QPs
//! are destroyed before the probe returns. It runs once per device and port a process
//! uses (callers cache it), in milliseconds.
#![forbid(unsafe_code)]
// A driver of real devices: the trials wait for real completions, bounded by the clock.
#![allow(clippy::disallowed_methods)]

use crate::ffi::{
    AddressVector, Context, Cq, GidType, LinkLayer, MigState, Mr, Mtu, PortState, Qp, QpAttr,
    QpAttrMask, QpCaps, QpState, Result, VerbsError,
};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The outcome of one trial.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "detail")]
pub enum Trial {
    /// It worked.
    Yes,
    /// It was refused or did not happen, and how.
    No(String),
    /// It could not be tried, and why.
    Untried(String),
}

impl Trial {
    /// Whether it worked.
    pub fn yes(&self) -> bool {
        matches!(self, Trial::Yes)
    }

    fn text(&self) -> String {
        match self {
            Trial::Yes => "yes".into(),
            Trial::No(why) => format!("no ({why})"),
            Trial::Untried(why) => format!("not tried ({why})"),
        }
    }
}

/// How a QP on a port can be moved to another path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// The device migrates by itself to an armed alternate (apm loads, arms, re-arms
    /// and forces).
    HardwareApm,
    /// apm moves the QP through the SQ drain with a new address vector.
    SoftwareMove,
    /// Neither: a QP there cannot be moved.
    None,
}

impl Mechanism {
    /// Its name for machines (the JSON's): `hardware_apm`, `software_move`, `none`.
    pub fn code(self) -> &'static str {
        match self {
            Mechanism::HardwareApm => "hardware_apm",
            Mechanism::SoftwareMove => "software_move",
            Mechanism::None => "none",
        }
    }

    /// Its name as the report and `apm run --explain` print it.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::HardwareApm => "hardware APM",
            Mechanism::SoftwareMove => "software move (SQ drain)",
            Mechanism::None => "none",
        }
    }
}

/// What one port can do, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortProbe {
    /// The device.
    pub device: String,
    /// The port (1-based).
    pub port: u8,
    /// `infiniband` or `ethernet` (RoCE).
    pub link_layer: String,
    /// Whether the kernel and driver take an alternate path on an RC QP of the port.
    pub alternate_path: Trial,
    /// Whether the device arms a loaded alternate (REARM -> ARMED on the peer's traffic).
    pub arms_alternate: Trial,
    /// Whether a QP takes RTS -> SQD -> SQD with a new address vector -> RTS.
    pub sqd_repath: Trial,
}

impl PortProbe {
    /// The mechanism the evidence allows.
    pub fn mechanism(&self) -> Mechanism {
        if self.alternate_path.yes() && self.arms_alternate.yes() {
            Mechanism::HardwareApm
        } else if self.sqd_repath.yes() {
            Mechanism::SoftwareMove
        } else {
            Mechanism::None
        }
    }

    /// What a QP of the port lacks to be moved at all (for [`Mechanism::None`]).
    pub fn missing(&self) -> String {
        format!(
            "{} port {} can move no QP: alternate path {}; arming it {}; RTS->SQD->RTS \
             with a new address vector {}",
            self.device,
            self.port,
            self.alternate_path.text(),
            self.arms_alternate.text(),
            self.sqd_repath.text()
        )
    }

    /// One line for a person: the port, its mechanism, the evidence.
    pub fn line(&self) -> String {
        format!(
            "{}/{} ({}): {}: alternate path {}, armed {}, SQ-drain re-path {}",
            self.device,
            self.port,
            self.link_layer,
            self.mechanism().name(),
            self.alternate_path.text(),
            self.arms_alternate.text(),
            self.sqd_repath.text()
        )
    }
}

/// How long the pair's two messages may take to arrive (a loaded, emulated host is
/// slow; a real one takes microseconds).
const TRAFFIC_WAIT: Duration = Duration::from_secs(2);

/// Try each way of moving a QP on `port` of `ctx` (a context of apm's own).
pub fn probe_port(ctx: &Context, port: u8) -> PortProbe {
    let untried = |why: String| PortProbe {
        device: ctx.name().to_owned(),
        port,
        link_layer: "unknown".into(),
        alternate_path: Trial::Untried(why.clone()),
        arms_alternate: Trial::Untried(why.clone()),
        sqd_repath: Trial::Untried(why),
    };
    let attr = match ctx.query_port(port) {
        Ok(a) => a,
        Err(e) => return untried(format!("the port cannot be queried: {e}")),
    };
    let link_layer = match attr.link_layer {
        LinkLayer::InfiniBand => "infiniband",
        LinkLayer::Ethernet => "ethernet",
        LinkLayer::Other(_) => "other",
    };
    let mut probe = untried(String::new());
    probe.link_layer = link_layer.into();
    if attr.state != PortState::Active {
        let why = format!("the port is {:?}, not active", attr.state);
        return PortProbe {
            alternate_path: Trial::Untried(why.clone()),
            arms_alternate: Trial::Untried(why.clone()),
            sqd_repath: Trial::Untried(why),
            ..probe
        };
    }
    let av = match loopback(ctx, port, attr.link_layer, attr.lid) {
        Ok(av) => av,
        Err(why) => {
            return PortProbe {
                alternate_path: Trial::Untried(why.clone()),
                arms_alternate: Trial::Untried(why.clone()),
                sqd_repath: Trial::Untried(why),
                ..probe
            }
        }
    };
    match Pair::connect(ctx, port, av) {
        Ok((pair, alternate)) => {
            probe.alternate_path = alternate;
            probe.arms_alternate = if probe.alternate_path.yes() {
                pair.armed_after_traffic()
            } else {
                Trial::Untried("no alternate path".into())
            };
            probe.sqd_repath = pair.sqd_repath(av);
        }
        Err(e) => {
            let why = format!("a loopback pair could not be made: {e}");
            probe.alternate_path = Trial::Untried(why.clone());
            probe.arms_alternate = Trial::Untried(why.clone());
            probe.sqd_repath = Trial::Untried(why);
        }
    }
    tracing::debug!(line = probe.line(), "what the port can do");
    probe
}

/// A path from the port to itself: its own LID on InfiniBand, its first RoCE v2 GID on
/// Ethernet.
fn loopback(
    ctx: &Context,
    port: u8,
    link: LinkLayer,
    lid: u16,
) -> std::result::Result<AddressVector, String> {
    match link {
        LinkLayer::InfiniBand => {
            if lid == 0 {
                return Err("the port has no LID yet (no subnet manager?)".into());
            }
            Ok(AddressVector {
                port_num: port,
                dlid: lid,
                ..AddressVector::default()
            })
        }
        _ => {
            let gid = ctx
                .first_gid(port, |g| g.gid_type == GidType::RoceV2)
                .map_err(|e| format!("the GID table cannot be read: {e}"))?
                .ok_or("the port has no RoCE v2 GID yet")?;
            Ok(AddressVector {
                port_num: port,
                is_global: true,
                dgid: gid.gid,
                sgid_index: u8::try_from(gid.index).map_err(|_| "a GID index above 255")?,
                hop_limit: 64,
                ..AddressVector::default()
            })
        }
    }
}

/// Two RC QPs of apm's own connected to each other through one port, with a buffer and
/// one CQ.
struct Pair {
    a: Qp,
    b: Qp,
    cq: Cq,
    mr: Mr,
}

impl Pair {
    /// Make the pair and bring it to RTS, with the path as its alternate too when the
    /// kernel takes it (and REARM set then); with the answer to that.
    fn connect(ctx: &Context, port: u8, av: AddressVector) -> Result<(Pair, Trial)> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(16)?;
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
        };
        let a = pd.create_rc_qp(&cq, &cq, caps)?;
        let b = pd.create_rc_qp(&cq, &cq, caps)?;
        let mr = pd.reg_mr(64)?;
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: port,
            qp_access_flags: crate::ffi::sys::IBV_ACCESS_REMOTE_WRITE,
            ..QpAttr::default()
        };
        let init_mask = QpAttrMask::STATE
            | QpAttrMask::PKEY_INDEX
            | QpAttrMask::PORT
            | QpAttrMask::ACCESS_FLAGS;
        a.modify(&init, init_mask)?;
        b.modify(&init, init_mask)?;
        let rtr = |peer: &Qp| QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu256,
            dest_qp_num: peer.qp_num(),
            ah_attr: av,
            min_rnr_timer: 12,
            max_dest_rd_atomic: 1,
            ..QpAttr::default()
        };
        let rtr_mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER;
        let with_alt = |peer: &Qp| QpAttr {
            alt_ah_attr: av,
            alt_port_num: port,
            alt_timeout: 14,
            ..rtr(peer)
        };
        let alternate = match a.modify(&with_alt(&b), rtr_mask | QpAttrMask::ALT_PATH) {
            Ok(()) => {
                b.modify(&with_alt(&a), rtr_mask | QpAttrMask::ALT_PATH)?;
                Trial::Yes
            }
            Err(e) => {
                a.modify(&rtr(&b), rtr_mask)?;
                b.modify(&rtr(&a), rtr_mask)?;
                Trial::No(format!("RTR with an alternate path: {e}"))
            }
        };
        let rts = QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            path_mig_state: MigState::Rearm,
            ..QpAttr::default()
        };
        let mut rts_mask = QpAttrMask::STATE
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC;
        if alternate.yes() {
            rts_mask = rts_mask | QpAttrMask::PATH_MIG_STATE;
        }
        a.modify(&rts, rts_mask)?;
        b.modify(&rts, rts_mask)?;
        Ok((Pair { a, b, cq, mr }, alternate))
    }

    /// One message each way, then: did REARM become ARMED on both?
    fn armed_after_traffic(&self) -> Trial {
        if let Err(e) = self.exchange() {
            return Trial::Untried(format!("the pair's messages did not arrive: {e}"));
        }
        let state = |q: &Qp| {
            q.query(QpAttrMask::PATH_MIG_STATE)
                .map(|a| a.path_mig_state)
        };
        match (state(&self.a), state(&self.b)) {
            (Ok(MigState::Armed), Ok(MigState::Armed)) => Trial::Yes,
            (Ok(a), Ok(b)) => Trial::No(format!(
                "after traffic both ways the QPs are {a:?} and {b:?}, not Armed: the device \
                 does not arm alternates"
            )),
            (Err(e), _) | (_, Err(e)) => Trial::No(format!("querying the state: {e}")),
        }
    }

    /// A send from `a` to `b` and one back, both completed.
    fn exchange(&self) -> Result<()> {
        for (wr, q) in [(1u64, &self.a), (2, &self.b)] {
            q.post_recv(wr, &self.mr, 32, 16)?;
        }
        self.a.post_send(3, &self.mr, 0, 8, None)?;
        self.b.post_send(4, &self.mr, 0, 8, None)?;
        let start = Instant::now();
        let mut done = 0;
        while done < 4 {
            for wc in self.cq.poll(8)? {
                if !wc.status.is_success() {
                    return Err(VerbsError::InvalidArgument("a loopback message failed"));
                }
                done += 1;
            }
            if start.elapsed() > TRAFFIC_WAIT {
                return Err(VerbsError::InvalidArgument("no completion within 2 s"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// RTS -> SQD -> SQD with a new address vector -> RTS on `a`.
    fn sqd_repath(&self, av: AddressVector) -> Trial {
        let step = |what: &str, attr: QpAttr, mask: QpAttrMask| {
            self.a
                .modify(&attr, mask)
                .map_err(|e| format!("{what}: {e}"))
        };
        let to_sqd = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: true,
            ..QpAttr::default()
        };
        let new_av = QpAttr {
            ah_attr: av,
            ..QpAttr::default()
        };
        let back = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        let tried = step(
            "RTS->SQD",
            to_sqd,
            QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .and_then(|()| self.drained())
        .and_then(|()| step("SQD->SQD with a new address vector", new_av, QpAttrMask::AV))
        .and_then(|()| step("SQD->RTS", back, QpAttrMask::STATE));
        match tried {
            Ok(()) => Trial::Yes,
            Err(why) => Trial::No(why),
        }
    }

    /// Wait (bounded) until `a` reads back as SQD: an idle send queue drains at once.
    fn drained(&self) -> std::result::Result<(), String> {
        let start = Instant::now();
        loop {
            match self.a.query(QpAttrMask::STATE).map(|a| a.qp_state) {
                Ok(QpState::Sqd) => return Ok(()),
                Ok(s) if start.elapsed() > TRAFFIC_WAIT => {
                    return Err(format!("the QP stayed {s:?} after RTS->SQD"))
                }
                Ok(_) => std::thread::sleep(Duration::from_micros(200)),
                Err(e) => return Err(format!("querying after RTS->SQD: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mechanisms_code_is_its_json_name() {
        for m in [
            Mechanism::HardwareApm,
            Mechanism::SoftwareMove,
            Mechanism::None,
        ] {
            let json = serde_json::to_value(m).expect("serialises");
            assert_eq!(json.as_str(), Some(m.code()));
        }
    }
}
