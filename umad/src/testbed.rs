//! The ibsim-only test-bed mode (docs/iba-facts.md §6): how a node process gets unsolicited MADs
//! delivered by stock ibsim 0.10.
//!
//! Stock ibsim hands unsolicited QP0/QP1 requests (SA Reports, CM Sends) only to a client
//! flagged IsSM. In this mode the port registers the SMI agents before any other, becomes
//! IsSM after every agent is in place, and answers OpenSM's SubnGet(SMInfo) as a
//! NOT_ACTIVE SM with SM_Key 0 (so OpenSM never sees a competing SM), and every other SMP
//! with status 0x000C. The receive thread does this itself, so SMPs are serviced at all
//! times, also while async code waits for its own responses.
//!
//! This must never run on a real fabric: pretending to be an SM there would disturb the
//! real SM. [`check_allowed`] refuses unless the caller asked for
//! [`TestBedMode::IbsimOnly`] explicitly **and** umad2sim is loaded in this process
//! **and** the bed's environment variable is set.

use crate::dest::Dest;
use crate::ffi::RecvAddr;
use crate::Error;
use ib_mad::smp::{SmInfo, Smp, SMP_DATA_SIZE, STATUS_UNSUPPORTED_ATTRIBUTE};
use ib_mad::types::U15;
use ib_mad::{AttributeId, Method, MAD_SIZE};

/// LID-routed subnet management class.
pub const CLASS_SMI_LID: u8 = 0x01;
/// Directed-route subnet management class.
pub const CLASS_SMI_DR: u8 = 0x81;
/// Environment variable that `cargo xtask ibsim` sets for processes of its bed.
pub const BED_ENV: &str = "APM_IBSIM_SOCKNAME";

/// Whether a port runs the test-bed shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TestBedMode {
    /// Normal operation (the only mode for real fabrics).
    #[default]
    Off,
    /// Act as a NOT_ACTIVE IsSM node so stock ibsim delivers unsolicited MADs. Refused
    /// unless umad2sim is preloaded and the ibsim bed's environment is present.
    IbsimOnly,
}

/// Refuse the test-bed mode unless this process is inside the ibsim bed.
pub fn check_allowed(mode: TestBedMode) -> Result<(), Error> {
    if mode != TestBedMode::IbsimOnly {
        return Ok(());
    }
    if std::env::var_os(BED_ENV).is_none() {
        return Err(Error::TestBedRefused(format!(
            "{BED_ENV} is not set: this process is not in the ibsim bed of `cargo xtask ibsim`"
        )));
    }
    if !umad2sim_loaded() {
        return Err(Error::TestBedRefused(
            "libumad2sim.so is not loaded in this process: this is not a simulated fabric".into(),
        ));
    }
    Ok(())
}

/// Whether libumad2sim.so is mapped into this process (read from /proc/self/maps, which
/// umad2sim does not fake; std::fs reaches the real file system under umad2sim).
pub fn umad2sim_loaded() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().any(|l| l.ends_with("/libumad2sim.so")))
        .unwrap_or(false)
}

/// The response to a received SMP, if it needs one: SubnGetResp(SMInfo) as NOT_ACTIVE
/// with SM_Key 0 for SubnGet(SMInfo), status 0x000C for any other Get/Set; nothing for
/// responses, traps and malformed MADs.
pub fn answer_smp(mad: &[u8], src: &RecvAddr, port_guid: [u8; 8]) -> Option<(Vec<u8>, Dest)> {
    let smp = Smp::decode(mad.get(..MAD_SIZE)?).ok()?;
    let method = smp.header.method;
    if method != Method::GET && method != Method::SET {
        return None; // only SubnGet/SubnSet are answered
    }
    let resp = if method == Method::GET && smp.header.attribute_id == AttributeId::SM_INFO {
        let info = SmInfo::not_active(u64::from_be_bytes(port_guid));
        smp.response(U15::ZERO, info.to_smp_data())
    } else {
        // 0x000C fits in 15 bits, so U15::new cannot fail here.
        let st = U15::new(STATUS_UNSUPPORTED_ATTRIBUTE).unwrap_or(U15::ZERO);
        smp.response(st, [0; SMP_DATA_SIZE])
    };
    let dest = if smp.is_directed_route() {
        // Directed route: ib-mad keeps the hop pointer/count and the return path as ibsim
        // filled them in; out through the permissive LID to QP0.
        Dest {
            lid: 0xFFFF,
            qpn: 0,
            qkey: 0,
            sl: 0,
        }
    } else {
        Dest {
            lid: src.lid,
            qpn: 0,
            qkey: 0,
            sl: src.sl,
        }
    };
    Some((resp.encode().to_vec(), dest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smp(class: u8, method: u8, attr: u16) -> Vec<u8> {
        let mut m = vec![0u8; 256];
        m[0] = 1;
        m[1] = class;
        m[2] = 1;
        m[3] = method;
        m[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        m[6] = 1; // hop pointer
        m[7] = 2; // hop count
        m[192] = 7; // return path byte
        m
    }

    #[test]
    fn refused_outside_the_bed() {
        // Unit tests never run with umad2sim preloaded.
        assert!(!umad2sim_loaded());
        assert!(matches!(
            check_allowed(TestBedMode::IbsimOnly),
            Err(Error::TestBedRefused(_))
        ));
        assert!(check_allowed(TestBedMode::Off).is_ok());
    }

    #[test]
    fn dr_sminfo_answered_not_active() {
        let guid = [0, 0, 0, 0, 0, 0x10, 0, 5];
        let (r, d) = answer_smp(&smp(0x81, 0x01, 0x20), &RecvAddr::default(), guid).unwrap();
        assert_eq!(r[3], 0x81);
        assert_eq!(&r[4..6], &[0x80, 0x00]);
        assert_eq!(&r[6..8], &[1, 2]);
        assert_eq!(&r[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&r[64..72], &guid);
        assert!(r[72..85].iter().all(|&b| b == 0));
        assert_eq!(r[192], 7);
        assert_eq!((d.lid, d.qpn), (0xFFFF, 0));
    }

    #[test]
    fn other_smps_get_status_0x0c() {
        let src = RecvAddr {
            lid: 1,
            ..Default::default()
        };
        let (r, d) = answer_smp(&smp(0x01, 0x01, 0x15), &src, [0; 8]).unwrap();
        assert_eq!(&r[4..6], &[0x00, 0x0C]);
        assert_eq!((d.lid, d.qpn), (1, 0));
        let (r, _) = answer_smp(&smp(0x81, 0x02, 0x20), &src, [0; 8]).unwrap();
        assert_eq!(&r[4..6], &[0x80, 0x0C]);
        assert!(answer_smp(&smp(0x81, 0x81, 0x20), &src, [0; 8]).is_none());
        assert!(answer_smp(&[0u8; 10], &src, [0; 8]).is_none());
    }
}
