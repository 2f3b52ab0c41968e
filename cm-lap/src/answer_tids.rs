//! Which transaction id an answer travels with. An APR or MRA reuses the TID of the LAP
//! it answers, so the sender's transport can match it; every peer channel (umad, UDP)
//! keeps this book the same way.

use apm_core::PeerMsg;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The TID each peer's last LAP arrived with, keyed by the LAP sender's comm id.
/// Cloning shares the book (the receive task records, `send` looks up).
#[derive(Clone, Debug, Default)]
pub(crate) struct AnswerTids(Arc<Mutex<BTreeMap<u32, u64>>>);

impl AnswerTids {
    /// Remember the TID `msg` arrived with, if it is a LAP.
    pub(crate) fn record(&self, msg: &PeerMsg, tid: u64) {
        if let PeerMsg::Lap(l) = msg {
            // A poisoned book still holds valid entries.
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(l.sender_comm_id, tid);
        }
    }

    /// The TID to send `msg` with: its LAP's for an answer we have seen the LAP of,
    /// `None` (use a fresh one) for anything else.
    pub(crate) fn for_answer(&self, msg: &PeerMsg) -> Option<u64> {
        let answered = match msg {
            PeerMsg::Apr(a) => a.receiver_comm_id,
            PeerMsg::Mra(m) => m.receiver_comm_id,
            _ => return None,
        };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&answered)
            .copied()
    }

    #[cfg(test)]
    pub(crate) fn get(&self, comm_id: u32) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&comm_id)
            .copied()
    }
}
