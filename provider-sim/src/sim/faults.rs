//! Faults: applying the schedule to the fabric, trap 128 and MAD loss.

use super::*;

impl Sim {
    // ------------------------------------------------------------------ faults

    pub(super) fn action(&mut self, idx: usize) {
        let (_, act, text) = self.actions[idx].clone();
        self.note(text);
        match act {
            Action::PortAdmin(p, up) => {
                self.fab.ports[p].admin_up = up;
                self.phys_changed();
            }
            Action::Link(l, up) => {
                self.fab.links[l].intact = up;
                self.phys_changed();
            }
            Action::Switch(s, up) => {
                self.fab.switches[s].up = up;
                self.phys_changed();
            }
            Action::SmFail(subnet) => self.sm_fail(subnet),
            Action::MadLoss(rate, until) => self.loss_burst = Some((rate, until)),
            Action::DeviceFatal(h) => {
                let lat = self.ev_latency();
                self.raise(h, lat, Input::DeviceFatal { device: 0 });
                for i in 0..self.conns.len() {
                    if self.conns[i].qp.iter().any(|q| q.host == h) {
                        self.lose(i, true);
                    }
                }
            }
        }
    }

    pub(super) fn note(&mut self, text: String) {
        if self.timeline.len() < 10_000 {
            self.timeline.push((self.now, text));
        }
    }

    /// Links changed: ports lose or gain their physical link; the switches next to the
    /// change send trap 128 and the SM sweeps (or, when its own port came back, it
    /// notices that and sweeps).
    pub(super) fn phys_changed(&mut self) {
        let lat = self.ev_latency();
        let mut touched = vec![false; self.sms.len()];
        for pid in 0..self.fab.num_ports() {
            let up = self.fab.port_phys_up(pid);
            let st = self.fab.ports[pid].state;
            let subnet = self.fab.ports[pid].subnet;
            if !up && st != PortState::Down {
                self.fab.ports[pid].state = PortState::Down;
                touched[subnet] = true;
                if st == PortState::Active {
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
                touched[subnet] = true;
            }
        }
        // Switch-to-switch links changing do not touch a host port but still trap.
        touched.iter_mut().for_each(|t| *t = true);
        for (s, t) in touched.into_iter().enumerate() {
            let reachable = self.sms[s]
                .master_port()
                .is_some_and(|m| self.fab.port_phys_up(m));
            if t && reachable {
                let d = ms(self.p.trap_sweep_delay_ms);
                self.schedule_sweep(s, d);
            }
        }
        self.reeval_all();
    }

    pub(super) fn schedule_sweep(&mut self, s: usize, delay: Time) {
        let at = after(self.now, delay);
        if self.sms[s].sweep_at.is_none_or(|t| t > at) {
            self.sms[s].sweep_at = Some(at);
            self.push(at, Ev::Sweep { subnet: s });
        }
    }

    pub(super) fn mad_lost(&mut self) -> bool {
        let rate = match self.loss_burst {
            Some((r, until)) if self.now < until => r,
            _ => self.p.mad_loss,
        };
        self.rng.chance(rate)
    }

    /// A MAD from LID `slid` to `dlid`: its one-way latency when it arrives.
    pub(super) fn mad(&mut self, slid: u16, dlid: u16) -> Option<Time> {
        self.c.mads_sent += 1;
        let hops = self.fab.route(slid, dlid)?;
        if self.mad_lost() {
            return None;
        }
        Some(us(
            u64::from(hops) * self.p.hop_latency_us + self.p.mad_processing_us
        ))
    }

}
