//! Probe sessions the simulation carries no packet for: a session whose two ends are
//! Up over a path that works both ways, with no MAD loss, is parked at both ends
//! (`apm_core::probe::Prober::park`) and costs nothing per interval. The simulation
//! holds the fabric's truth, so it knows when that stops being so: at every change of
//! the fabric it looks at the parked pairs' routes, when MAD loss begins it resumes
//! them all, and a parked end that leaves Up by itself (its peer's word, its own port)
//! has its other end resumed too.
//!
//! Resuming puts both ends where carrying every probe would have: each end's probes
//! go out on a grid known in closed form, so the last probe of each before now, and
//! when it arrived (its route's hops and the receiving agent's processing), are
//! computed, and so are the counts of probes sent. The agent's queue is the one thing
//! left out: an arrival is taken as if the agent were idle, and the probes not carried
//! take none of its time. Where MADs are processed in no time
//! (`fabric.mad_processing_us = 0`) the two ways of running agree to the digit
//! (`tests/probe_parking.rs`); otherwise a verdict's time may differ by the agent's
//! queue at that instant, and what follows from it with it.
//!
//! Off with `RunConfig::probe_packets` (every probe carried, for the comparison).

use super::*;
use apm_core::probe::PathEnds;

/// One parked session, seen from one end.
#[derive(Clone, Copy, Debug)]
pub(super) struct ParkedEnd {
    /// The other end's host.
    peer: usize,
    /// This end's LID and the peer's.
    lid: u16,
    peer_lid: u16,
    /// A probe's time from this end to the peer (wire and agent), and back.
    to_peer: Time,
    from_peer: Time,
    /// This entry is the pair's first (the walk visits each pair once).
    first: bool,
}

/// Every parked pair, under both of its ends.
#[derive(Debug, Default)]
pub(super) struct Parking {
    ends: BTreeMap<(usize, PathEnds), ParkedEnd>,
    /// The fabric generation last looked at.
    gen: u64,
}

impl Sim {
    /// A probe from `from` reached `host`'s port: park the session when both ends are Up
    /// and nothing the simulation does not carry could end it.
    pub(super) fn try_park(&mut self, host: usize, from: PeerAddr, probe: &Probe) {
        if self.cfg.probe_packets
            || probe.state != SessionState::Up
            || self.loss_rate() > 0.0
            || self.external.contains_key(&host)
        {
            return;
        }
        let here = probe.ends.reversed();
        let Some(peer) = self
            .fab
            .lid_owner(from.lid.get())
            .map(|p| self.fab.ports[p].host)
        else {
            return;
        };
        if self.external.contains_key(&peer) || self.parking.ends.contains_key(&(host, here)) {
            return;
        }
        let peer_lid = from.lid.get();
        let Some(lid) = self.lid_of_gid(host, here.local) else {
            return;
        };
        let (Some(there), Some(back)) = (
            self.probe_delay(peer_lid, lid),
            self.probe_delay(lid, peer_lid),
        ) else {
            return;
        };
        let ok = |ctl: &dyn Controller, e| {
            ctl.prober()
                .is_some_and(|p| p.state(e) == Some(SessionState::Up) && !p.parked(e))
        };
        if !ok(self.hosts[host].ctl.as_ref(), here)
            || !ok(self.hosts[peer].ctl.as_ref(), probe.ends)
        {
            return;
        }
        let parked =
            |sim: &mut Sim, h: usize, e| sim.hosts[h].ctl.prober_mut().is_some_and(|p| p.park(e));
        if !parked(self, host, here) {
            return;
        }
        if !parked(self, peer, probe.ends) {
            let now = self.now;
            if let Some(p) = self.hosts[host].ctl.prober_mut() {
                p.resume(now, here, None, 0);
            }
            return;
        }
        let end = |peer, lid, peer_lid, to_peer, from_peer, first| ParkedEnd {
            peer,
            lid,
            peer_lid,
            to_peer,
            from_peer,
            first,
        };
        self.parking
            .ends
            .insert((host, here), end(peer, lid, peer_lid, back, there, true));
        self.parking.ends.insert(
            (peer, probe.ends),
            end(host, peer_lid, lid, there, back, false),
        );
    }

    /// After an event: resume the pairs the fabric no longer carries (when it changed),
    /// or every pair (when MADs are being lost).
    pub(super) fn check_parked(&mut self) {
        if self.parking.ends.is_empty() {
            self.parking.gen = self.fab_gen;
            return;
        }
        let lossy = self.loss_rate() > 0.0;
        if self.parking.gen == self.fab_gen && !lossy {
            return;
        }
        self.parking.gen = self.fab_gen;
        let broken: Vec<(usize, PathEnds)> = self
            .parking
            .ends
            .iter()
            .filter(|(_, e)| e.first)
            .filter(|((h, _), e)| {
                lossy
                    || self.hosts[*h].dead
                    || self.hosts[e.peer].dead
                    || self.fab.route(e.lid, e.peer_lid).is_none()
                    || self.fab.route(e.peer_lid, e.lid).is_none()
            })
            .map(|(k, _)| *k)
            .collect();
        for (h, ends) in broken {
            self.resume_pair(h, ends);
        }
    }

    /// Resume the parked pair `host`'s `ends` belongs to, both ends at once.
    pub(super) fn resume_pair(&mut self, host: usize, ends: PathEnds) {
        let Some(e) = self.parking.ends.remove(&(host, ends)) else {
            return;
        };
        let back = ends.reversed();
        self.parking.ends.remove(&(e.peer, back));
        let now = self.now;
        let last = |sim: &Sim, h: usize, x| {
            sim.hosts[h].ctl.prober().map_or((0, None), |p| {
                (p.unsent_before(x, now), p.last_send_before(x, now))
            })
        };
        let (unsent_here, last_here) = last(self, host, ends);
        let (unsent_there, last_there) = last(self, e.peer, back);
        if let Some(p) = self.hosts[host].ctl.prober_mut() {
            p.resume(
                now,
                ends,
                last_there.map(|t| after(t, e.from_peer)),
                unsent_there,
            );
        }
        if let Some(p) = self.hosts[e.peer].ctl.prober_mut() {
            p.resume(
                now,
                back,
                last_here.map(|t| after(t, e.to_peer)),
                unsent_here,
            );
        }
        self.count_unsent_probes(unsent_here + unsent_there);
        self.pump(host);
        self.pump(e.peer);
    }

    /// Parked ends that `host`'s prober let go of by itself: their peers' ends resume.
    pub(super) fn follow_unparked(&mut self, host: usize) {
        let Some(left) = self.hosts[host].ctl.prober_mut().map(|p| p.take_unparked()) else {
            return;
        };
        for ends in left {
            self.resume_pair(host, ends);
        }
    }

    /// At the end of the run: the probes parked sessions did not send, counted as sent.
    pub(super) fn count_parked_probes(&mut self) {
        let end = after(self.end, Time(1));
        let mut n = 0;
        for (h, ends) in self.parking.ends.keys() {
            n += self.hosts[*h]
                .ctl
                .prober()
                .map_or(0, |p| p.unsent_before(*ends, end));
        }
        self.count_unsent_probes(n);
    }

    /// Probes counted as sent: on InfiniBand each a MAD, on RoCE a datagram, counted
    /// with the MADs as `send_peer` counts them.
    fn count_unsent_probes(&mut self, n: u64) {
        self.c.probes_sent += n;
        self.c.mads_sent += n;
    }

    /// A probe's time from LID `from` to `to` now (its hops, then the receiving agent's
    /// processing), `None` when it has no route.
    fn probe_delay(&self, from: u16, to: u16) -> Option<Time> {
        let hops = self.fab.route(from, to)?;
        Some(after(
            us(u64::from(hops) * self.p.hop_latency_us),
            us(self.p.mad_processing_us),
        ))
    }

    /// The LID of `host`'s port whose GID is `gid`.
    fn lid_of_gid(&self, host: usize, gid: Gid) -> Option<u16> {
        (1..=self.fab.ports_per_host())
            .filter_map(|n| self.fab.port_of(host, n))
            .find(|&p| self.fab.ports[p].gid == gid)
            .map(|p| self.fab.ports[p].lid)
    }
}
