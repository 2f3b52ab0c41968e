//! How the program's QPs move to another path: hardware APM where the kernel accepts
//! alternate paths on the device, software migration elsewhere (`APM_RUN_MIGRATION`, which
//! `apm run --migration` sets), and the QP facet each means.

use crate::report;
use apm_core::{ConnId, MigrationMode};
use provider_rxe::RxeQpControl;
use provider_verbs::VerbsQpControl;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How apm moves the program's QPs (`APM_RUN_MIGRATION`, which `apm run --migration`
/// sets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Migration {
    /// Hardware APM where the kernel accepts alternate paths on the device (the
    /// APM-capable soft-RoCE), software migration elsewhere.
    Auto,
    /// Always software migration (no async event tee either).
    Software,
    /// Hardware APM only: a device that cannot is not protected.
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
pub(crate) fn is_soft_roce(device: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/infiniband/{device}/parent")).exists()
}

/// Whether a context the program opens on `device` gets the async event tee: only where
/// apm may use hardware APM (soft-RoCE, unless software migration is asked for), the one
/// case in which apm needs the program's QP events.
pub fn wants_tee(device: &str) -> bool {
    migration() != Migration::Software && is_soft_roce(device)
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
    pub(crate) fn mode(&self) -> MigrationMode {
        match self {
            Facet::Software(_) => MigrationMode::Software,
            Facet::Hardware(_) => MigrationMode::Hardware,
        }
    }

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
