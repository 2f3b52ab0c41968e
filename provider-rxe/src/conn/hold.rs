//! Holding a re-initialisation's replay until the peer has followed.
//!
//! A QP that moves first, before its peer has heard of the move, sends its replay into
//! a drop: the peer's QP takes RC packets only from its own primary address, still the
//! old path's. What the peer dropped goes again only when our requester retries, and on
//! rxe the peer's PSN-sequence NAK, which would make it retry at once, is ignored while
//! a retry the retransmit timer started is unanswered (`comp.started_retry`, which
//! neither an ACK-less RESET nor a modify clears). After any silent cut longer than one
//! ACK timeout that is the case, and the replay waited a whole ACK timeout more (67 ms
//! at 14). So a first mover whose sends have waited that long, or so nearly that the
//! timer fires before the peer can have followed ([`retry_due`]), holds its replay,
//! and the sends posted after it, until the peer is there. So does a side whose peer
//! moves at the same time
//! (`Replay::HeldUntilPeerThere`), whatever the timer did: rxe's timer armed before the
//! move survives the RESET and fires at its old expiry, starting that retry if a replay
//! sent too early is still outstanding then, and firing harmlessly on an empty send
//! queue if it is held. The hold ends when:
//! - the engine says so ([`RcConn::peer_there`]: the peer's "moved", or its answer to
//!   ours);
//! - or a message from the peer arrives over the new path (the peer's own replay: it
//!   has moved), or any packet of its in sequence, seen as the QP's receive PSN moving
//!   (an RDMA write or a kick completes no receive; the PSN is read every
//!   [`PSN_WATCH`]);
//! - or, failing both, one ACK timeout after the move, when rxe's timer would have
//!   retried anyway (so a lost word costs no more than not holding did).
//!
//! The side that moves second (the peer asked, or said it had moved) replays at once, and
//! so does a first mover whose timer is far from firing (its sends unacknowledged for
//! less than 7/8 of an ACK timeout less [`FOLLOW_ALLOWANCE`]: 18.7 ms at timeout 14;
//! at timeout 13 or less every first mover with sends outstanding holds): the peer's
//! NAK, drawn by the nudges once it has followed, is quicker than any word.

use super::*;

/// The shortest and longest wait for the peer, whatever the ACK timeout says.
const FOLLOW_WAIT_MIN: Duration = Duration::from_millis(10);
const FOLLOW_WAIT_MAX: Duration = Duration::from_millis(500);

/// How long a peer may take to follow a first mover, as far as its retransmit timer is
/// concerned: our word's way to it, its own move, its first packet back. Traced in the
/// VM under emulation: 20 to 40 ms (far less on hardware). A first mover whose timer
/// could fire within this after its replay holds as if it had fired: in a silent cut
/// the first mover had waited 54 ms at ACK timeout 14 (58.7 ms counts as fired), its
/// replay went out unheld, the timer fired before the peer followed 25 ms later, and
/// the stall took a whole ACK timeout more (162 ms against 80 to 95). `waited` is taken
/// as the re-initialisation starts, so the allowance also covers the move's own steps
/// before the replay.
const FOLLOW_ALLOWANCE: Duration = Duration::from_millis(40);

/// How often a held replay's QP is asked for its receive PSN: a query is a system call,
/// and the peer's sends, when it has any, release the hold at once anyway.
const PSN_WATCH: Duration = Duration::from_millis(4);

impl RcConn {
    /// The peer runs on the path to its GID `dgid`: if that is where our replay waits
    /// for it, send what was held; if it is where the move in flight goes, that move
    /// replays at once instead of holding. A no-op otherwise: a word about another path
    /// (one that reached us after a later move began) releases nothing.
    pub fn peer_there(&self, dgid: &[u8; 16]) {
        let mut g = self.lock();
        match &mut g.mode {
            Mode::Migrating { to, peer_there } if to == dgid => {
                *peer_there = true;
                debug!(
                    qpn = self.qp_num(),
                    "the peer is there before our move is done"
                );
            }
            Mode::AwaitingPeer { on, .. } if on == dgid => {
                self.release_held(&mut g, Released::PeerSaid);
            }
            _ => debug!(qpn = self.qp_num(), "word that the peer is on a path we are not moving to or waiting on: nothing to release"),
        }
    }

    /// Post what was held for the peer, replay first, if anything is; true if it was.
    pub(super) fn release_held(&self, g: &mut Inner, why: Released) -> bool {
        let Mode::AwaitingPeer { since, .. } = g.mode else {
            return false;
        };
        g.mode = Mode::Running;
        let now = Instant::now();
        // The wait was ours, not the path's: the stall monitor starts again.
        g.last_progress = now;
        g.migrated_at = Some(now);
        let held = g.held.len();
        while let Some(wr) = g.held.pop_front() {
            if let Err(e) = self.post_now(g, wr) {
                // The QP failed under us: the monitor sees the failed send and moves
                // or repairs it, replaying what is outstanding and held.
                g.held.push_front(wr);
                g.failed = true;
                warn!(qpn = self.qp_num(), error = %e, "posting the held sends failed");
                break;
            }
        }
        let level_info = why != Released::Migration;
        if level_info {
            info!(qpn = self.qp_num(), ?why, held, waited = ?now.saturating_duration_since(since), "sends held for the peer released");
        } else {
            debug!(
                qpn = self.qp_num(),
                held, "sends held for the peer released for another migration"
            );
        }
        self.released_notify.notify_waiters();
        true
    }

    /// While the replay is held for the peer, wait for it to be released; release it
    /// when the QP's receive PSN moves, or at the follow wait's end.
    pub(super) async fn await_release(&self) {
        let (since, deadline, rq_psn) = {
            let g = self.lock();
            let Mode::AwaitingPeer { since, rq_psn, .. } = g.mode else {
                return;
            };
            (since, since + follow_wait(g.params.as_ref()), rq_psn)
        };
        loop {
            // Created before the check, so a release in between still wakes it.
            let released = self.released_notify.notified();
            // Asked outside the lock: the application's posts do not wait on the query.
            let arrived = self
                .qp
                .query(QpAttrMask::RQ_PSN)
                .is_ok_and(|a| a.rq_psn != rq_psn);
            {
                let mut g = self.lock();
                // Released, or released and held again by a later move, which has a
                // watch of its own (with its own PSN and deadline).
                if !matches!(g.mode, Mode::AwaitingPeer { since: s, .. } if s == since) {
                    return;
                }
                if arrived {
                    self.release_held(&mut g, Released::PeerPacket);
                    return;
                }
                if Instant::now() >= deadline {
                    self.release_held(&mut g, Released::Deadline);
                    return;
                }
            }
            let wake = deadline.min(Instant::now() + PSN_WATCH);
            let _ = tokio::time::timeout_at(wake.into(), released).await;
        }
    }
}

/// How long a first mover holds its replay without word from the peer: one ACK timeout,
/// the time rxe's own retry would have taken.
fn follow_wait(params: Option<&ConnectParams>) -> Duration {
    ack_timeout(params.map_or(14, |p| p.timeout)).clamp(FOLLOW_WAIT_MIN, FOLLOW_WAIT_MAX)
}

/// Whether a re-initialisation holds its (non-empty) replay for the peer, `waited` being
/// how long its sends had gone unacknowledged (see the module docs).
pub(super) fn holds_replay(when: Replay, params: &ConnectParams, waited: Option<Duration>) -> bool {
    match when {
        Replay::Now => false,
        Replay::WhenPeerThere => retry_due(params, waited),
        Replay::HeldUntilPeerThere => true,
    }
}

/// True when rxe may ignore PSN-sequence NAKs on this QP before the peer has followed:
/// sends unacknowledged for `waited`, about one ACK timeout or more, mean its
/// retransmit timer has fired since the last ACK, and that marks a retry as started
/// (docs/iba-facts.md, section 4); so nearly that (within [`FOLLOW_ALLOWANCE`]) mean it
/// fires before the peer's NAK can come. `None`: nothing was outstanding. The timer
/// cannot fire sooner than one timeout after the last acknowledgement, as rxe arms it
/// in whole jiffies rounded down (64 ms for the 67 ms of timeout 14 at 250 Hz, 60 at
/// 100 Hz): an eighth off covers that. A hold not needed costs a message from the peer;
/// a replay not held when it was, a whole ACK timeout.
pub(super) fn retry_due(params: &ConnectParams, waited: Option<Duration>) -> bool {
    let timer = ack_timeout(params.timeout);
    waited.is_some_and(|w| w + FOLLOW_ALLOWANCE >= timer - timer / 8)
}

/// The local ACK timeout, 4.096 us x 2^timeout (docs/iba-facts.md, section 7).
fn ack_timeout(timeout: u8) -> Duration {
    Duration::from_nanos(4096u64 << timeout.min(31))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's parameters with ACK timeout `timeout`.
    fn p(timeout: u8) -> ConnectParams {
        ConnectParams {
            remote_qpn: 1,
            remote_psn: 0,
            local_psn: 0,
            mtu: Mtu::Mtu1024,
            timeout,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }

    #[test]
    fn follow_wait_is_one_ack_timeout_within_bounds() {
        assert_eq!(follow_wait(Some(&p(14))), Duration::from_nanos(4096 << 14));
        assert_eq!(follow_wait(Some(&p(1))), FOLLOW_WAIT_MIN);
        assert_eq!(follow_wait(Some(&p(20))), FOLLOW_WAIT_MAX);
        assert_eq!(follow_wait(Some(&p(255))), FOLLOW_WAIT_MAX);
        assert_eq!(follow_wait(None), Duration::from_nanos(4096 << 14));
    }

    #[test]
    fn a_retry_is_due_within_the_follow_allowance_of_one_ack_timeout() {
        let p14 = p(14);
        assert!(!retry_due(&p14, None));
        // 67.1 ms less an eighth (58.7) less the allowance (40): 18.7 ms.
        assert!(!retry_due(&p14, Some(Duration::from_millis(10))));
        assert!(!retry_due(&p14, Some(Duration::from_millis(18))));
        assert!(retry_due(&p14, Some(Duration::from_millis(19))));
        // The silent cut that showed it: 54 ms without an acknowledgement.
        assert!(retry_due(&p14, Some(Duration::from_millis(54))));
        assert!(retry_due(&p14, Some(Duration::from_millis(68))));
        // At timeout 20 (4.3 s) a cut found in 45 ms is far from the timer.
        assert!(!retry_due(&p(20), Some(Duration::from_millis(45))));
    }

    #[test]
    fn a_move_alongside_the_peer_holds_whatever_the_timer_did() {
        let p = p(14);
        for waited in [
            None,
            Some(Duration::from_millis(5)),
            Some(Duration::from_millis(68)),
        ] {
            assert!(holds_replay(Replay::HeldUntilPeerThere, &p, waited));
            assert!(!holds_replay(Replay::Now, &p, waited));
            assert_eq!(
                holds_replay(Replay::WhenPeerThere, &p, waited),
                retry_due(&p, waited)
            );
        }
    }
}
