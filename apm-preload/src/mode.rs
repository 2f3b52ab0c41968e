//! How the program's QPs move to another path: hardware APM where the port has it,
//! software migration where the port takes the SQ drain, none elsewhere; what
//! `APM_RUN_MIGRATION` (which `apm run --migration` sets) asks for; and the QP facet
//! each means.

use crate::report;
use apm_core::{ConnId, MigrationMode};
use provider_rxe::RxeQpControl;
use provider_verbs::capability::{Mechanism, PortProbe};
use provider_verbs::VerbsQpControl;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How apm moves the program's QPs (`APM_RUN_MIGRATION`, which `apm run --migration`
/// sets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Migration {
    /// Hardware APM where the port has it (InfiniBand HCAs, the APM-capable
    /// soft-RoCE), else the software move where the port takes it, else none.
    Auto,
    /// Always software migration (no async event tee either).
    Software,
    /// Hardware APM only: a port that has none is not protected.
    Hardware,
}

/// This process's [`Migration`] (read once; an unknown value is `Auto`, said once).
pub fn migration() -> Migration {
    static MODE: OnceLock<Migration> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("APM_RUN_MIGRATION").as_deref() {
        Err(_) | Ok("auto") | Ok("") => Migration::Auto,
        Ok("software") => Migration::Software,
        Ok("hardware") => Migration::Hardware,
        Ok(other) => {
            report::note(&format!(
                "APM_RUN_MIGRATION={other:?} is not auto, software or hardware: auto"
            ));
            Migration::Auto
        }
    })
}

/// Whether `device` is soft-RoCE: rxe devices name their netdev in sysfs' `parent`.
fn is_soft_roce(device: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/infiniband/{device}/parent")).exists()
}

/// Whether a port of `device` is InfiniBand (sysfs' `link_layer` of each port).
fn has_infiniband_port(device: &str) -> bool {
    let Ok(ports) = std::fs::read_dir(format!("/sys/class/infiniband/{device}/ports")) else {
        return false;
    };
    ports.flatten().any(|p| {
        std::fs::read_to_string(p.path().join("link_layer")).is_ok_and(|l| l.trim() == "InfiniBand")
    })
}

/// Whether a context the program opens on `device` gets the async event tee: only where
/// apm may use hardware APM (unless software migration is asked for), the one case in
/// which apm needs the program's QP events. The devices that may migrate a QP by
/// themselves are the InfiniBand ones and the APM-capable soft-RoCE; the kernel takes
/// no alternate path on any other RoCE device (its core refuses an alternate address
/// vector on an Ethernet port), so there the program's events are left alone. Which
/// mechanism a port really has is tried later, at its first QP (`chosen`).
pub fn wants_tee(device: &str) -> bool {
    migration() != Migration::Software && (is_soft_roce(device) || has_infiniband_port(device))
}

/// How the QPs of the port `probe` describes are moved under `asked`, or why they
/// cannot be: what was asked for (`APM_RUN_MIGRATION`) against what the port showed it
/// can do when apm tried it.
pub(crate) fn chosen(asked: Migration, probe: &PortProbe) -> Result<MigrationMode, String> {
    let mechanism = probe.mechanism();
    match (asked, mechanism) {
        (Migration::Software, _) if probe.sqd_repath.yes() => Ok(MigrationMode::Software),
        (Migration::Software, _) => Err(format!(
            "software migration was asked for (APM_RUN_MIGRATION) and this port cannot              move a QP through the SQ drain: {}",
            probe.line()
        )),
        (Migration::Hardware, Mechanism::HardwareApm) => Ok(MigrationMode::Hardware),
        (Migration::Hardware, _) => Err(format!(
            "hardware APM was asked for (APM_RUN_MIGRATION) and this port has none: {}",
            probe.line()
        )),
        (Migration::Auto, Mechanism::HardwareApm) => Ok(MigrationMode::Hardware),
        (Migration::Auto, Mechanism::SoftwareMove) => Ok(MigrationMode::Software),
        (Migration::Auto, Mechanism::None) => Err(probe.missing()),
    }
}

/// Why an RC QP that receives through a shared receive queue (SRQ) is not protected when
/// its device's QPs move by `mode`, or `None` when it can be.
///
/// With hardware APM the device moves the QP by itself, and apm's part is RTS -> RTS
/// modifies of its paths alone (load the alternate, REARM, force MIGRATED): no drain, no
/// re-initialisation, nothing posted or flushed, so where its receives come from makes
/// no difference. Software migration takes the program's QP out of RTS (RTS -> SQD, the
/// drain, SQD -> SQD with the new address vector, SQD -> RTS and a send-queue kick), and
/// that procedure has been checked only on QPs with a receive queue of their own (an SRQ
/// is shared by many QPs, the drain and its kick were never run on one).
pub(crate) fn srq_refusal(mode: MigrationMode) -> Option<&'static str> {
    match mode {
        MigrationMode::Hardware => None,
        MigrationMode::Software => Some(
            "it receives through a shared receive queue (SRQ): apm's software migration \
             (the SQ drain) is verified only on QPs with their own receive queue; hardware \
             APM, which leaves the QP's queues alone, protects SRQ QPs",
        ),
    }
}

/// The longest the program's destroy waits for a verb of apm's on its QP: loading a
/// RoCE alternate resolves its neighbour, seconds on a dead rail.
const VERB_IN_FLIGHT: Duration = Duration::from_secs(10);

/// Wait (at most [`VERB_IN_FLIGHT`]) until `qp`, which the hardware facet no longer
/// holds, is held by no verb of apm's either: the facet's verbs run on clones of it.
/// The kernel refuses to destroy a QP while another command uses it (EBUSY; seen:
/// ib_write_bw's server failed its QP's destroy, then its CQ's and PD's, while apm
/// re-armed it onto a downed rail), so the program's destroy goes after them.
pub(crate) fn wait_for_verbs(qp: &Arc<provider_verbs::ffi::Qp>) {
    let since = Instant::now();
    while Arc::strong_count(qp) > 1 && since.elapsed() < VERB_IN_FLIGHT {
        std::thread::sleep(Duration::from_millis(2));
    }
    if since.elapsed() > Duration::from_millis(5) {
        let waited_ms = since.elapsed().as_millis();
        tracing::info!(
            waited_ms,
            "the program's destroy waited for apm's verb on its QP"
        );
    }
}

/// The QP facet of a device: how its engine's commands reach the program's QPs.
pub(crate) enum Facet {
    /// provider-rxe: software migration through the SQ drain.
    Software(Arc<RxeQpControl>),
    /// provider-verbs: hardware APM (the kernel accepts alternate paths here); the QPs'
    /// events come from the program's contexts through the tee.
    Hardware(Arc<VerbsQpControl>),
}

impl Facet {
    pub(crate) fn unregister(&self, id: ConnId) {
        match self {
            Facet::Software(f) => f.unregister(id),
            Facet::Hardware(f) => f.unregister(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use provider_verbs::capability::Trial;

    /// A port that answered each trial as given (`None`: refused).
    fn port(link: &str, alternate: bool, armed: bool, sqd: bool) -> PortProbe {
        let t = |ok: bool| {
            if ok {
                Trial::Yes
            } else {
                Trial::No("refused".into())
            }
        };
        PortProbe {
            device: "dev0".into(),
            port: 1,
            link_layer: link.into(),
            alternate_path: t(alternate),
            arms_alternate: t(armed),
            sqd_repath: t(sqd),
        }
    }

    #[test]
    fn each_kind_of_port_gets_what_it_showed_it_can_do() {
        use Migration::*;
        use MigrationMode as M;
        // An InfiniBand HCA (mlx5: no SQD), an mlx4 (both), the APM-capable soft-RoCE,
        // the stock soft-RoCE, a RoCE HCA (the core refuses alternates, mlx5 no SQD).
        let ib_mlx5 = port("infiniband", true, true, false);
        let ib_mlx4 = port("infiniband", true, true, true);
        let rxe_apm = port("ethernet", true, true, true);
        let rxe = port("ethernet", false, false, true);
        let roce_mlx5 = port("ethernet", false, false, false);
        let cases = [
            (&ib_mlx5, Auto, Some(M::Hardware)),
            (&ib_mlx5, Hardware, Some(M::Hardware)),
            (&ib_mlx5, Software, None),
            (&ib_mlx4, Auto, Some(M::Hardware)),
            (&ib_mlx4, Software, Some(M::Software)),
            (&rxe_apm, Auto, Some(M::Hardware)),
            (&rxe, Auto, Some(M::Software)),
            (&rxe, Hardware, None),
            (&roce_mlx5, Auto, None),
            (&roce_mlx5, Software, None),
        ];
        for (probe, asked, want) in cases {
            let got = chosen(asked, probe);
            assert_eq!(
                got.as_ref().ok().copied(),
                want,
                "{asked:?} on {}: {got:?}",
                probe.line()
            );
            if let Err(why) = got {
                // The refusal carries the evidence, naming the port.
                assert!(why.contains("dev0") && why.contains("port"), "{why}");
            }
        }
    }

    #[test]
    fn an_alternate_the_device_never_arms_is_no_hardware_apm() {
        let probe = port("infiniband", true, false, false);
        let why = chosen(Migration::Auto, &probe).expect_err("no mechanism");
        assert!(why.contains("can move no QP"), "{why}");
    }

    #[test]
    fn srq_qps_are_protected_with_hardware_apm_only() {
        assert_eq!(srq_refusal(MigrationMode::Hardware), None);
        let why = srq_refusal(MigrationMode::Software).expect("refused in software mode");
        assert!(
            why.contains("SRQ") && why.contains("software migration"),
            "{why}"
        );
    }
}
