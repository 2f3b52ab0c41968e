//! Faults: the fixed ones a scenario lists and those drawn from a seed, and the one
//! place their names are resolved against the fabric ([`Fault::target`]), for the
//! scenario's validation and for the simulation's fault schedule alike.

use crate::fabric::{End, Fabric, FabricError, LinkId, PortId, SwitchId};
use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// A fault at a fixed time. Ports are `"h3:2"`, switches by name, links by their two
/// ends `"h3:2-B"` (or by one host port: its only link). Read through a flat table of
/// every kind's keys, so that a problem names its key.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", try_from = "FaultFields")]
pub enum Fault {
    /// A host port goes down (HCA port failure, cable pulled at the host).
    PortDown {
        /// When.
        at_ms: u64,
        /// Which port.
        port: String,
    },
    /// A host port comes back.
    PortUp {
        /// When.
        at_ms: u64,
        /// Which port.
        port: String,
    },
    /// A port flaps: down for `down_ms`, up for `up_ms`, `count` times.
    PortFlap {
        /// When the first down happens.
        at_ms: u64,
        /// Which port.
        port: String,
        /// Down time of each flap.
        down_ms: u64,
        /// Up time between flaps.
        up_ms: u64,
        /// Number of flaps.
        count: u32,
    },
    /// A link is cut.
    LinkDown {
        /// When.
        at_ms: u64,
        /// Which link.
        link: String,
    },
    /// A cut link is restored.
    LinkUp {
        /// When.
        at_ms: u64,
        /// Which link.
        link: String,
    },
    /// A whole switch fails (with one switch per rail: the rail).
    SwitchDown {
        /// When.
        at_ms: u64,
        /// Which switch.
        switch: String,
    },
    /// A failed switch returns.
    SwitchUp {
        /// When.
        at_ms: u64,
        /// Which switch.
        switch: String,
    },
    /// The master SM process of a subnet dies (for the rest of the run); a standby takes
    /// over when its polls of the master have failed (`fabric.sminfo_polling_timeout_ms`,
    /// `polling_retry_number`).
    SmFailover {
        /// When.
        at_ms: u64,
        /// Which subnet.
        subnet: usize,
    },
    /// Every MAD is lost with probability `rate` for `duration_ms`.
    MadLoss {
        /// When.
        at_ms: u64,
        /// How long.
        duration_ms: u64,
        /// Loss probability.
        rate: f64,
    },
    /// A host's HCA dies (`DEVICE_FATAL`): its connections are lost.
    DeviceFatal {
        /// When.
        at_ms: u64,
        /// Which host (`"h3"`).
        host: String,
    },
    /// A switch starts dropping everything it should forward while its ports stay up
    /// and its management still answers the SM: no port event, no trap, no sweep. Only
    /// the transport's retries and liveness probes can find it.
    SwitchBlackHole {
        /// When.
        at_ms: u64,
        /// Which switch.
        switch: String,
    },
    /// A black-holing switch forwards again.
    SwitchBlackHoleEnd {
        /// When.
        at_ms: u64,
        /// Which switch.
        switch: String,
    },
}

/// The kinds of [`Fault`], as a `[[faults]]` table's `kind` names them.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FaultKind {
    PortDown,
    PortUp,
    PortFlap,
    LinkDown,
    LinkUp,
    SwitchDown,
    SwitchUp,
    SmFailover,
    MadLoss,
    DeviceFatal,
    SwitchBlackHole,
    SwitchBlackHoleEnd,
}

/// A `[[faults]]` table as written: its kind and every key any kind has, each of its
/// own type, so that a type error is found at its key; [`FaultFields::into_fault`]
/// then holds the keys against the kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FaultFields {
    kind: FaultKind,
    at_ms: Option<u64>,
    port: Option<String>,
    down_ms: Option<u64>,
    up_ms: Option<u64>,
    count: Option<u32>,
    link: Option<String>,
    switch: Option<String>,
    subnet: Option<usize>,
    duration_ms: Option<u64>,
    rate: Option<f64>,
    host: Option<String>,
}

/// A key of a `[[faults]]` table that its kind does not have, or one it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FaultKeyProblem {
    /// The key.
    pub key: &'static str,
    /// Written in the table (it is at fault), or missing (the table is).
    pub written: bool,
    /// What is wrong.
    pub message: String,
}

impl FaultFields {
    /// The keys written, each with whether it is.
    fn written(&self) -> [(&'static str, bool); 11] {
        [
            ("at_ms", self.at_ms.is_some()),
            ("port", self.port.is_some()),
            ("down_ms", self.down_ms.is_some()),
            ("up_ms", self.up_ms.is_some()),
            ("count", self.count.is_some()),
            ("link", self.link.is_some()),
            ("switch", self.switch.is_some()),
            ("subnet", self.subnet.is_some()),
            ("duration_ms", self.duration_ms.is_some()),
            ("rate", self.rate.is_some()),
            ("host", self.host.is_some()),
        ]
    }

    /// The fault the table describes, or every key it lacks or should not have.
    pub(crate) fn into_fault(self) -> Result<Fault, Vec<FaultKeyProblem>> {
        let kind = self.kind;
        let written = self.written();
        let mut used: Vec<&'static str> = Vec::new();
        let mut missing: Vec<&'static str> = Vec::new();
        // Each key the kind has, taken (a missing one noted, its value a stand-in).
        macro_rules! take {
            ($f:ident) => {{
                used.push(stringify!($f));
                self.$f.clone().unwrap_or_else(|| {
                    missing.push(stringify!($f));
                    Default::default()
                })
            }};
        }
        let at_ms = take!(at_ms);
        let fault = match kind {
            FaultKind::PortDown => Fault::PortDown {
                at_ms,
                port: take!(port),
            },
            FaultKind::PortUp => Fault::PortUp {
                at_ms,
                port: take!(port),
            },
            FaultKind::PortFlap => Fault::PortFlap {
                at_ms,
                port: take!(port),
                down_ms: take!(down_ms),
                up_ms: take!(up_ms),
                count: take!(count),
            },
            FaultKind::LinkDown => Fault::LinkDown {
                at_ms,
                link: take!(link),
            },
            FaultKind::LinkUp => Fault::LinkUp {
                at_ms,
                link: take!(link),
            },
            FaultKind::SwitchDown => Fault::SwitchDown {
                at_ms,
                switch: take!(switch),
            },
            FaultKind::SwitchUp => Fault::SwitchUp {
                at_ms,
                switch: take!(switch),
            },
            FaultKind::SwitchBlackHole => Fault::SwitchBlackHole {
                at_ms,
                switch: take!(switch),
            },
            FaultKind::SwitchBlackHoleEnd => Fault::SwitchBlackHoleEnd {
                at_ms,
                switch: take!(switch),
            },
            FaultKind::SmFailover => Fault::SmFailover {
                at_ms,
                subnet: take!(subnet),
            },
            FaultKind::MadLoss => Fault::MadLoss {
                at_ms,
                duration_ms: take!(duration_ms),
                rate: take!(rate),
            },
            FaultKind::DeviceFatal => Fault::DeviceFatal {
                at_ms,
                host: take!(host),
            },
        };
        let name = fault.kind_name();
        let keys = used.join(", ");
        let mut problems: Vec<FaultKeyProblem> = written
            .iter()
            .filter(|(k, w)| *w && !used.contains(k))
            .map(|(k, _)| FaultKeyProblem {
                key: k,
                written: true,
                message: format!("a {name} fault has no `{k}` (its keys: kind, {keys})"),
            })
            .collect();
        problems.extend(missing.into_iter().map(|k| FaultKeyProblem {
            key: k,
            written: false,
            message: format!("a {name} fault needs `{k}` (its keys: kind, {keys})"),
        }));
        if problems.is_empty() {
            Ok(fault)
        } else {
            Err(problems)
        }
    }
}

impl TryFrom<FaultFields> for Fault {
    type Error = String;
    fn try_from(f: FaultFields) -> Result<Fault, String> {
        f.into_fault().map_err(|ps| {
            ps.into_iter()
                .map(|p| p.message)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

impl Fault {
    /// The kind, as a `[[faults]]` table names it.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Fault::PortDown { .. } => "port_down",
            Fault::PortUp { .. } => "port_up",
            Fault::PortFlap { .. } => "port_flap",
            Fault::LinkDown { .. } => "link_down",
            Fault::LinkUp { .. } => "link_up",
            Fault::SwitchDown { .. } => "switch_down",
            Fault::SwitchUp { .. } => "switch_up",
            Fault::SmFailover { .. } => "sm_failover",
            Fault::MadLoss { .. } => "mad_loss",
            Fault::DeviceFatal { .. } => "device_fatal",
            Fault::SwitchBlackHole { .. } => "switch_black_hole",
            Fault::SwitchBlackHoleEnd { .. } => "switch_black_hole_end",
        }
    }

    /// The key that names what the fault acts on (`port`, `link`, `switch`, `host`,
    /// `subnet`), none for `mad_loss`.
    pub fn target_key(&self) -> Option<&'static str> {
        Some(match self {
            Fault::PortDown { .. } | Fault::PortUp { .. } | Fault::PortFlap { .. } => "port",
            Fault::LinkDown { .. } | Fault::LinkUp { .. } => "link",
            Fault::SwitchDown { .. }
            | Fault::SwitchUp { .. }
            | Fault::SwitchBlackHole { .. }
            | Fault::SwitchBlackHoleEnd { .. } => "switch",
            Fault::SmFailover { .. } => "subnet",
            Fault::DeviceFatal { .. } => "host",
            Fault::MadLoss { .. } => return None,
        })
    }

    /// When the fault (first) happens.
    pub fn at_ms(&self) -> u64 {
        match self {
            Fault::PortDown { at_ms, .. }
            | Fault::PortUp { at_ms, .. }
            | Fault::PortFlap { at_ms, .. }
            | Fault::LinkDown { at_ms, .. }
            | Fault::LinkUp { at_ms, .. }
            | Fault::SwitchDown { at_ms, .. }
            | Fault::SwitchUp { at_ms, .. }
            | Fault::SmFailover { at_ms, .. }
            | Fault::MadLoss { at_ms, .. }
            | Fault::DeviceFatal { at_ms, .. }
            | Fault::SwitchBlackHole { at_ms, .. }
            | Fault::SwitchBlackHoleEnd { at_ms, .. } => *at_ms,
        }
    }

    /// How many changes of the fabric the fault makes once expanded (a flap of `count`
    /// is `2 * count` port changes; a loss burst starts and ends).
    pub fn transitions(&self) -> u64 {
        match self {
            Fault::PortFlap { count, .. } => 2 * u64::from(*count),
            Fault::MadLoss { .. } => 2,
            _ => 1,
        }
    }

    /// When the fault's last effect happens (the end of a flap or loss burst).
    pub fn end_ms(&self) -> u64 {
        match self {
            Fault::PortFlap {
                at_ms,
                down_ms,
                up_ms,
                count,
                ..
            } => at_ms
                .saturating_add(u64::from(*count).saturating_mul(*down_ms))
                .saturating_add(u64::from(count.saturating_sub(1)).saturating_mul(*up_ms)),
            Fault::MadLoss {
                at_ms, duration_ms, ..
            } => at_ms.saturating_add(*duration_ms),
            f => f.at_ms(),
        }
    }
}

/// Faults generated from the seed: `count` faults between `start_ms` and `end_ms`, each
/// undone (port up, link restored, switch back) within `max_outage_ms`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RandomFaults {
    /// Number of faults.
    pub count: u32,
    /// Earliest fault.
    pub start_ms: u64,
    /// Latest fault (every outage ends by then too).
    pub end_ms: u64,
    /// Longest outage.
    pub max_outage_ms: u64,
    /// Include `device_fatal` faults (they lose connections by design).
    pub device_fatal: bool,
    /// Include silent failures: black-holing switches and cuts of inter-switch links
    /// (nothing reports them to the hosts at once). Default false.
    pub silent: bool,
}

impl Default for RandomFaults {
    fn default() -> RandomFaults {
        RandomFaults {
            count: 6,
            start_ms: 300,
            end_ms: 3000,
            max_outage_ms: 1500,
            device_fatal: false,
            silent: false,
        }
    }
}

/// What a fault acts on, its name resolved against the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A host port (`port_down`, `port_up`, `port_flap`).
    Port(PortId),
    /// A link (`link_down`, `link_up`).
    Link(LinkId),
    /// A switch (`switch_down`, `switch_up`, `switch_black_hole`, `switch_black_hole_end`).
    Switch(SwitchId),
    /// A host (`device_fatal`).
    Host(usize),
    /// A subnet's SM (`sm_failover`), checked against the fabric's subnets when the
    /// scenario is validated.
    Subnet(usize),
    /// The whole fabric (`mad_loss`).
    Fabric,
}

impl Fault {
    /// Resolve the name the fault gives against `fabric`.
    pub fn target(&self, fabric: &Fabric) -> Result<Target, FabricError> {
        Ok(match self {
            Fault::PortDown { port, .. }
            | Fault::PortUp { port, .. }
            | Fault::PortFlap { port, .. } => Target::Port(fabric.port_by_name(port)?),
            Fault::LinkDown { link, .. } | Fault::LinkUp { link, .. } => {
                Target::Link(fabric.link_by_name(link)?)
            }
            Fault::SwitchDown { switch, .. }
            | Fault::SwitchUp { switch, .. }
            | Fault::SwitchBlackHole { switch, .. }
            | Fault::SwitchBlackHoleEnd { switch, .. } => {
                Target::Switch(fabric.switch_by_name(switch)?)
            }
            Fault::DeviceFatal { host, .. } => Target::Host(fabric.host_by_name(host)?),
            Fault::SmFailover { subnet, .. } => Target::Subnet(*subnet),
            Fault::MadLoss { .. } => Target::Fabric,
        })
    }
}

/// Random faults over the fabric's ports, links, switches and SMs, each undone later.
pub(super) fn generate_faults(fabric: &Fabric, r: &RandomFaults, seed: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed).fork(0xfa17);
    let mut out = Vec::new();
    let span = r.end_ms.saturating_sub(r.start_ms).max(1);
    for _ in 0..r.count {
        let at = r.start_ms + rng.below(span);
        let outage = rng.range(20, r.max_outage_ms.max(20));
        let back = (at + outage).min(r.end_ms.max(at + 1));
        // Silent kinds on half the draws, from their own stream: the other draws are
        // those of a schedule without them.
        if r.silent && rng.chance(0.5) {
            out.extend(silent_fault(fabric, &mut rng, at, back));
            continue;
        }
        let kinds = if r.device_fatal { 7 } else { 6 };
        match rng.below(kinds) {
            0 | 1 => {
                let port = fabric.port_name(rng.below(fabric.num_ports() as u64) as usize);
                out.push(Fault::PortDown {
                    at_ms: at,
                    port: port.clone(),
                });
                out.push(Fault::PortUp { at_ms: back, port });
            }
            2 => {
                let port = fabric.port_name(rng.below(fabric.num_ports() as u64) as usize);
                let down = rng.range(10, 400);
                let up = rng.range(10, 400);
                let count = rng.range(2, 4) as u32;
                out.push(Fault::PortFlap {
                    at_ms: at,
                    port,
                    down_ms: down,
                    up_ms: up,
                    count,
                });
            }
            3 if fabric.num_links() > 0 => {
                let link = fabric.link_name(rng.below(fabric.num_links() as u64) as usize);
                out.push(Fault::LinkDown {
                    at_ms: at,
                    link: link.clone(),
                });
                out.push(Fault::LinkUp { at_ms: back, link });
            }
            4 if fabric.num_switches() > 0 => {
                let switch = fabric.switch_name(rng.below(fabric.num_switches() as u64) as usize);
                out.push(Fault::SwitchDown {
                    at_ms: at,
                    switch: switch.clone(),
                });
                out.push(Fault::SwitchUp {
                    at_ms: back,
                    switch,
                });
            }
            5 => {
                if rng.chance(0.5) {
                    out.push(Fault::SmFailover {
                        at_ms: at,
                        subnet: rng.below(fabric.subnets() as u64) as usize,
                    });
                } else {
                    out.push(Fault::MadLoss {
                        at_ms: at,
                        duration_ms: outage,
                        rate: [0.1, 0.5, 1.0][rng.below(3) as usize],
                    });
                }
            }
            6 => out.push(Fault::DeviceFatal {
                at_ms: at,
                host: format!("h{}", rng.below(fabric.num_hosts() as u64)),
            }),
            // A link or switch fault drawn for a fabric without any: nothing to break.
            _ => {}
        }
    }
    out
}

/// One silent failure and its end: a switch black-holes, or an inter-switch link is cut
/// (a host-port link when the fabric has none between switches).
fn silent_fault(fabric: &Fabric, rng: &mut Rng, at: u64, back: u64) -> Vec<Fault> {
    let isls: Vec<usize> = (0..fabric.num_links())
        .filter(|&l| {
            let link = &fabric.links[l];
            matches!((link.a, link.b), (End::Switch(_), End::Switch(_)))
        })
        .collect();
    if fabric.num_switches() > 0 && (isls.is_empty() || rng.chance(0.5)) {
        let switch = fabric.switch_name(rng.below(fabric.num_switches() as u64) as usize);
        return vec![
            Fault::SwitchBlackHole {
                at_ms: at,
                switch: switch.clone(),
            },
            Fault::SwitchBlackHoleEnd {
                at_ms: back,
                switch,
            },
        ];
    }
    let Some(&l) = isls.get(rng.below(isls.len().max(1) as u64) as usize) else {
        return Vec::new();
    };
    let link = fabric.link_name(l);
    vec![
        Fault::LinkDown {
            at_ms: at,
            link: link.clone(),
        },
        Fault::LinkUp { at_ms: back, link },
    ]
}
