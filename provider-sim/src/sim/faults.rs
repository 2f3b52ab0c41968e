//! Faults: applying the schedule to the fabric (ports, links, switches, SMs, HCAs, MAD
//! loss), what a physical change sets off (PORT_ERR at once, trap 128 to the SM), and
//! the fate of each MAD on the wire.

use super::*;

impl Sim {
    pub(super) fn action(&mut self, idx: usize) {
        let (_, act, text) = self.actions[idx].clone();
        let load = self.load_now();
        self.windows.open(self.now, text.clone(), load);
        self.note(text);
        match act {
            Action::PortAdmin(p, turn) => {
                self.fab.ports[p].admin_up = turn.on();
                self.fab_gen += 1;
                let s = self.fab.ports[p].subnet;
                self.phys_changed(&[s]);
            }
            Action::Link(l, turn) => {
                self.fab.links[l].intact = turn.on();
                self.fab_gen += 1;
                let s = self.fab.link_subnet(l).into_iter().collect::<Vec<_>>();
                self.phys_changed(&s);
            }
            Action::Switch(k, turn) => {
                self.fab.switches[k].up = turn.on();
                self.fab_gen += 1;
                let s = self.fab.switches[k].subnet;
                self.phys_changed(&[s]);
            }
            Action::SmFail(subnet) => self.sm_fail(subnet),
            Action::MadLoss(rate, until) => self.loss_burst = Some((rate, until)),
            Action::DeviceFatal(h) => self.device_fatal(h),
            Action::BlackHole(k, turn) => {
                // Nothing physical changes: no port event, no trap 128, and a light
                // sweep finds every port and link as it was. Only routes through it die.
                self.fab.switches[k].black_hole = turn.on();
                self.fab_gen += 1;
                self.reeval_all();
            }
        }
    }

    /// The HCA of host `h` dies: its connections are lost, its SMs die with it, and its
    /// ports lose their links (the switch sees them go).
    fn device_fatal(&mut self, h: usize) {
        let lat = self.ev_latency();
        self.raise(h, lat, Input::DeviceFatal { device: 0 });
        for i in 0..self.conns.len() {
            if self.conns[i].qp.iter().any(|q| q.host == h) {
                self.lose(i, qp::Loss::DeviceFatal);
            }
        }
        self.hosts[h].dead = true;
        let mut subnets = Vec::new();
        for num in 1..=self.fab.ports_per_host() {
            if let Some(p) = self.fab.port_of(h, num) {
                self.fab.ports[p].admin_up = false;
                self.fab_gen += 1;
                subnets.push(self.fab.ports[p].subnet);
            }
        }
        self.host_sms_die(h);
        self.phys_changed(&subnets);
    }

    pub(super) fn note(&mut self, text: String) {
        if self.timeline.len() < 10_000 {
            self.timeline.push((self.now, text));
        }
    }

    /// Links changed in `subnets`: ports lose or gain their physical link (a host sees
    /// its own port go at once: PORT_ERR), the switches next to the change send trap
    /// 128 to their SM, and an SM whose own port came back sweeps.
    pub(super) fn phys_changed(&mut self, subnets: &[usize]) {
        let lat = self.ev_latency();
        let mut own_port_back = vec![false; self.sms.len()];
        for pid in 0..self.fab.num_ports() {
            let up = self.fab.port_phys_up(pid);
            let st = self.fab.ports[pid].state;
            if !up && st != PortState::Down {
                self.fab.ports[pid].state = PortState::Down;
                self.fab_gen += 1;
                if st == PortState::Active && !self.hosts[self.fab.ports[pid].host].dead {
                    let (h, key) = (self.fab.ports[pid].host, self.fab.ports[pid].key());
                    self.raise(
                        h,
                        lat,
                        Input::PortEvent {
                            port: key,
                            event: PortEvent::Down,
                        },
                    );
                }
            } else if up && st == PortState::Down {
                self.fab.ports[pid].state = PortState::Init;
                self.fab_gen += 1;
                let s = self.fab.ports[pid].subnet;
                if self.sms[s].master_port() == Some(pid) {
                    own_port_back[s] = true;
                }
            }
        }
        self.check_sms();
        for &s in subnets {
            if s < self.sms.len() {
                self.raise_trap(s);
            }
        }
        for (s, back) in own_port_back.into_iter().enumerate() {
            // OpenSM sweeps when its own port comes up (it sees the local port event).
            if back && self.sm_running(s) {
                let d = ms(self.p.trap_sweep_delay_ms);
                self.schedule_sweep(s, d);
            }
        }
        self.reeval_all();
    }

    /// The MAD loss probability now.
    pub(super) fn loss_rate(&self) -> f64 {
        match self.loss_burst {
            Some((r, until)) if self.now < until => r,
            _ => self.p.mad_loss,
        }
    }

    pub(super) fn mad_lost(&mut self) -> bool {
        let rate = self.loss_rate();
        rate > 0.0 && self.rng.chance(rate)
    }

    /// The same for an SM's own MADs, from the SMs' stream.
    pub(super) fn smp_lost(&mut self) -> bool {
        let rate = self.loss_rate();
        rate > 0.0 && self.rng_sm.chance(rate)
    }

    /// A UDP datagram of the RoCE peer channel from LID `slid` to `dlid`: its time on
    /// the wire when it has a route (no MAD loss).
    pub(super) fn datagram(&mut self, slid: u16, dlid: u16) -> Option<Time> {
        self.c.mads_sent += 1;
        let src = self.fab.lid_owner(slid)?;
        if self.hosts[self.fab.ports[src].host].dead {
            return None;
        }
        let hops = self.fab.route(slid, dlid)?;
        Some(us(u64::from(hops) * self.p.hop_latency_us))
    }

    /// A MAD from LID `slid` to `dlid`: its time on the wire when it arrives (the
    /// receiving agent's processing comes on top, in its queue).
    pub(super) fn mad(&mut self, slid: u16, dlid: u16) -> Option<Time> {
        self.c.mads_sent += 1;
        let src = self.fab.lid_owner(slid)?;
        if self.hosts[self.fab.ports[src].host].dead {
            return None;
        }
        let hops = self.fab.route(slid, dlid)?;
        if self.mad_lost() {
            return None;
        }
        Some(us(u64::from(hops) * self.p.hop_latency_us))
    }
}
