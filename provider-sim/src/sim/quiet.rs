//! Quiet connections: the traffic of a connection that nothing can change is counted,
//! not simulated.
//!
//! A connection whose two QPs are working on mirrored primaries, neither stalled nor
//! waiting in REARM for its peer's packets, does nothing at its message ticks but
//! count: each side offers a message, it is delivered and acknowledged, no state
//! changes, no event is raised. So is a lost one (its application keeps offering,
//! nothing is delivered). Such a connection leaves its tick group's active set at its
//! tick and is only counted: every change that could make a tick do more (a command on
//! its QPs, a migration, a loss, any change of the fabric) re-evaluates it
//! (`Sim::reeval`), which wakes it up first with its skipped ticks counted as they
//! would have gone. A tick then visits only the active connections, in the order it
//! visited all of them, so a run is the same event for event, byte for byte.

use super::*;

/// What a quiet connection's ticks do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Quiet {
    /// Both sides offer, deliver and have acknowledged one message a tick.
    Working,
    /// Lost: both sides offer one message a tick, never delivered.
    Lost,
}

/// The tick groups: how many ticks each has had, and its connections that are not
/// quiet.
#[derive(Debug, Default)]
pub(super) struct Traffic {
    ticks: Vec<u64>,
    active: Vec<BTreeSet<u32>>,
}

impl Traffic {
    pub(super) fn new(groups: usize) -> Traffic {
        Traffic {
            ticks: vec![0; groups],
            active: vec![BTreeSet::new(); groups],
        }
    }
}

impl Sim {
    fn group(&self, i: usize) -> usize {
        i % self.traffic.ticks.len().max(1)
    }

    /// What connection `i`'s ticks would do now, in state `state`, if nothing else.
    pub(super) fn quiet_mode(&self, i: usize, state: ConnState) -> Option<Quiet> {
        let c = &self.conns[i];
        match state {
            ConnState::Lost => Some(Quiet::Lost),
            ConnState::Armed | ConnState::Unprotected
                if c.qp.iter().all(|q| !q.stalled && q.mig != MigState::Rearm) =>
            {
                Some(Quiet::Working)
            }
            _ => None,
        }
    }

    /// Count the ticks connection `i` slept through, as they went.
    fn catch_up(&mut self, i: usize) {
        let g = self.group(i);
        let c = &mut self.conns[i];
        let Some(mode) = c.quiet else {
            return;
        };
        let n = self.traffic.ticks[g] - c.synced;
        c.synced = self.traffic.ticks[g];
        for q in &mut c.qp {
            q.posted += n;
            if mode == Quiet::Working {
                q.delivered += n;
                q.acked += n;
            }
        }
        self.c.messages_posted += 2 * n;
        if mode == Quiet::Working {
            self.c.messages_delivered += 2 * n;
        }
    }

    /// Connection `i` is re-evaluated in `state`: awake it if its ticks would no
    /// longer do what its quiet mode counts.
    pub(super) fn wake_if_changed(&mut self, i: usize, state: ConnState) {
        let Some(mode) = self.conns[i].quiet else {
            return;
        };
        if self.quiet_mode(i, state) == Some(mode) {
            return;
        }
        self.catch_up(i);
        self.conns[i].quiet = None;
        let g = self.group(i);
        self.traffic.active[g].insert(i as u32);
    }

    /// After its tick (or when it is created): connection `i` goes quiet if it can,
    /// or stays in its group's active set.
    pub(super) fn settle(&mut self, i: usize) {
        let g = self.group(i);
        let (state, _) = self.classify(i);
        match self.quiet_mode(i, state) {
            Some(mode) => {
                let c = &mut self.conns[i];
                c.quiet = Some(mode);
                c.synced = self.traffic.ticks[g];
            }
            None => {
                self.traffic.active[g].insert(i as u32);
            }
        }
    }

    /// The tick of group `g`: the connections that are not quiet, in index order.
    pub(super) fn tick_group(&mut self, g: usize) -> Vec<usize> {
        self.traffic.ticks[g] += 1;
        std::mem::take(&mut self.traffic.active[g])
            .into_iter()
            .map(|i| i as usize)
            .collect()
    }

    /// Count every quiet connection's ticks up to now (before the report).
    pub(super) fn catch_up_all(&mut self) {
        for i in 0..self.conns.len() {
            self.catch_up(i);
        }
    }
}
