//! Parked sessions: a caller that knows a path carries every probe both ways (the
//! simulator, which holds the fabric's truth) takes a session off the wire while both
//! ends are Up. A parked session sends no periodic probe and expects none; it still
//! sends at once what its peer must hear at once (a state change, a port of this host
//! going down or up), and it leaves the parked state by itself when it leaves Up.
//!
//! What makes it exact: probes go out on a grid whose slots are known in closed form
//! (`schedule.rs`), so when the caller stops vouching (the path failed) it can tell each
//! end when the other's last probe before the failure arrived ([`Prober::last_send_before`]
//! and the path's delay), and [`Prober::resume`] puts the session where sending every
//! probe would have left it: the same detection deadline, the next send in the same
//! slot, the same counts. A healthy session then costs nothing per interval; its verdict
//! after a failure follows from the failure's time, the interval, the multiplier and
//! the seeded jitter.

use super::{Due, PathEnds, Prober, SessionState};
use crate::types::Time;

impl Prober {
    /// Take the session of `ends` off the wire: true when it was Up, told so, and not
    /// parked already. The caller vouches that every probe of both ends crosses the
    /// path, and parks the peer's end too.
    pub fn park(&mut self, ends: PathEnds) -> bool {
        match self.sessions.get_mut(&ends) {
            Some(s) if s.state == SessionState::Up && s.told_up && !s.parked => {
                s.parked = true;
                true
            }
            _ => false,
        }
    }

    /// Whether the session of `ends` is parked.
    pub fn parked(&self, ends: PathEnds) -> bool {
        self.sessions.get(&ends).is_some_and(|s| s.parked)
    }

    /// Parked sessions that left Up (or stopped being watched) since the last call: the
    /// caller stops vouching for their peers' ends.
    pub fn take_unparked(&mut self) -> Vec<PathEnds> {
        std::mem::take(&mut self.unparked)
    }

    /// When the session of `ends` last sent, or would have sent had it not been parked,
    /// before `t`.
    pub fn last_send_before(&self, ends: PathEnds, t: Time) -> Option<Time> {
        let s = self.sessions.get(&ends)?;
        let sent = s.grid.next.checked_sub(1).map(|k| s.grid.slot(k));
        let unsent = if s.parked { s.grid.sent_by(t).1 } else { None };
        unsent.or(sent.filter(|&at| at < t))
    }

    /// The periodic probes the parked session of `ends` has not sent that it would
    /// have sent before `t`.
    pub fn unsent_before(&self, ends: PathEnds, t: Time) -> u64 {
        self.sessions
            .get(&ends)
            .filter(|s| s.parked)
            .map_or(0, |s| s.unsent + s.grid.sent_by(t).0)
    }

    /// Put the parked session of `ends` back on the wire at `now`, as if it had sent
    /// every probe of its grid before `now` and heard its peer's `heard` probes, the
    /// last of them at `last_heard`. Returns the probes it is counted as having sent.
    pub fn resume(
        &mut self,
        now: Time,
        ends: PathEnds,
        last_heard: Option<Time>,
        heard: u64,
    ) -> u64 {
        let Some(s) = self.sessions.get_mut(&ends) else {
            return 0;
        };
        if !std::mem::take(&mut s.parked) {
            return 0;
        }
        let (on_grid, _) = s.grid.sent_by(now);
        s.grid.next += on_grid;
        let unsent = on_grid + std::mem::take(&mut s.unsent);
        s.next_tx = s.grid.next_at();
        self.timers.schedule(s.next_tx, (ends, Due::Send));
        self.counters.sent += unsent;
        self.counters.received += heard;
        if let Some(h) = last_heard.filter(|h| s.last_heard.is_none_or(|l| l < *h)) {
            s.last_heard = Some(h);
            s.detect_at = Some(h.plus(s.detect));
        }
        if let Some(d) = s.detect_at {
            if s.detect_queued.is_none_or(|q| d < q) {
                s.detect_queued = Some(d);
                self.timers.schedule(d, (ends, Due::Detect));
            }
        }
        // Sending every probe, this host would have run its timers within an interval
        // of now: it was not held.
        self.last_poll = Some(self.last_poll.map_or(now, |t| t.max(now)));
        unsent
    }
}
