//! [`ProbeDriver`]: a [`Prober`] beside an engine, as the [`crate::Manager`] runs it.
//! It takes the inputs the engine would see (probes that arrived, local port events),
//! follows the paths the engine's connections use, and turns the prober's outputs into
//! peer sends and engine inputs. Sans-IO like the rest of this crate.

use super::{PathEnds, ProbeOutput, ProbePolicy, Prober};
use crate::io::{Input, PeerMsg, PortEvent};
use crate::types::{Gid, Lid, LinkLayer, PeerAddr, PortKey, Time};
use std::collections::{BTreeMap, BTreeSet};

/// What the driver asks of the Manager.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeAction {
    /// Send a probe to the peer over the path's local port.
    Send {
        /// The local port to send from.
        port: PortKey,
        /// The peer's port.
        to: PeerAddr,
        /// The probe.
        msg: PeerMsg,
    },
    /// Hand this to the engine ([`Input::PathDown`] or [`Input::PathUp`]).
    Engine(Input),
}

/// The prober and what it needs to know about this host's ports and paths.
#[derive(Debug)]
pub struct ProbeDriver {
    prober: Prober,
    /// Watched paths, with the local port and the peer's LID to reach them by.
    paths: BTreeMap<PathEnds, (PortKey, Lid)>,
    /// This host's GIDs, by port.
    port_gids: BTreeMap<PortKey, Vec<Gid>>,
    /// This host's InfiniBand ports (probed only with `ProbePolicy::infiniband`).
    ib_ports: BTreeSet<PortKey>,
    probe_infiniband: bool,
}

impl ProbeDriver {
    /// A driver for `policy`, or `None` when probes are off.
    pub fn new(policy: &ProbePolicy, seed: u64) -> Option<ProbeDriver> {
        policy.enabled.then(|| ProbeDriver {
            prober: Prober::new(policy.clone(), seed),
            paths: BTreeMap::new(),
            port_gids: BTreeMap::new(),
            ib_ports: BTreeSet::new(),
            probe_infiniband: policy.infiniband,
        })
    }

    /// The prober (for its sessions and counters).
    pub fn prober(&self) -> &Prober {
        &self.prober
    }

    /// The prober, for a caller that parks its sessions (the simulator).
    pub fn prober_mut(&mut self) -> &mut Prober {
        &mut self.prober
    }

    /// Look at an input before the engine does. Returns the input back unless it was a
    /// probe, which is the driver's alone.
    pub fn on_input(&mut self, now: Time, input: Input) -> Option<Input> {
        match &input {
            Input::PeerMessage {
                msg: PeerMsg::Probe(p),
                ..
            } => {
                self.prober.receive(now, p);
                return None;
            }
            Input::PortInfo(info) => {
                self.port_gids.insert(info.key, info.gids.clone());
                if info.link_layer == LinkLayer::InfiniBand {
                    self.ib_ports.insert(info.key);
                } else {
                    self.ib_ports.remove(&info.key);
                }
            }
            Input::PortEvent { port, event } => {
                let up = match event {
                    PortEvent::Active => true,
                    PortEvent::Down => false,
                    _ => return Some(input),
                };
                for gid in self.port_gids.get(port).cloned().unwrap_or_default() {
                    self.prober.local_port(now, gid, up);
                }
            }
            _ => {}
        }
        Some(input)
    }

    /// Watch exactly `paths` (from [`crate::Engine::probe_paths`]), leaving out
    /// InfiniBand ones unless the policy asks for them.
    pub fn follow(&mut self, now: Time, mut paths: BTreeMap<PathEnds, (PortKey, Lid)>) {
        if !self.probe_infiniband {
            paths.retain(|_, (port, _)| !self.ib_ports.contains(port));
        }
        self.prober.follow(now, &paths.keys().copied().collect());
        self.paths = paths;
    }

    /// When [`ProbeDriver::poll`] has work next.
    pub fn next_deadline(&self) -> Option<Time> {
        self.prober.next_deadline()
    }

    /// Run the prober's timers due at `now` and return everything it asks for.
    pub fn poll(&mut self, now: Time) -> Vec<ProbeAction> {
        self.prober.poll_timers(now);
        let mut out = Vec::new();
        while let Some(o) = self.prober.poll_output() {
            match o {
                ProbeOutput::Send { ends, probe } => {
                    let Some((port, lid)) = self.paths.get(&ends) else {
                        continue;
                    };
                    out.push(ProbeAction::Send {
                        port: *port,
                        to: PeerAddr {
                            gid: ends.remote,
                            lid: *lid,
                        },
                        msg: PeerMsg::Probe(probe),
                    });
                }
                ProbeOutput::Down { ends, kind } => {
                    out.push(ProbeAction::Engine(Input::PathDown { ends, kind }));
                }
                // Every Up, the first too: a path unwatched while down (no connection
                // used it for a while) comes back as a new session, whose first Up is
                // the only news that it works again. The engine ignores an Up for a
                // path it does not hold dead.
                ProbeOutput::Up {
                    ends,
                    held_until: None,
                    ..
                } => {
                    out.push(ProbeAction::Engine(Input::PathUp { ends }));
                }
                ProbeOutput::Up {
                    ends,
                    held_until: Some(until),
                    ..
                } => {
                    out.push(ProbeAction::Engine(Input::PathHeld { ends, until }));
                }
            }
        }
        out
    }
}
