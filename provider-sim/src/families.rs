//! Scenario families: the kinds of fabric and fault schedule apm is compared on, each a
//! function of a seed, so that a claim is made over many schedules and never over one.
//!
//! Every family draws its connection placement and its faults from the seed. Two sizes:
//! [`Size::Small`] for the chaos campaign that CI runs (a few hosts, tens of
//! connections), [`Size::Full`] for `apm simulate --family`/`--sweep` (the sizes a
//! user's first try would have). The fabric constants are OpenSM's and the hardware's
//! defaults throughout; only the SM-failure family also tries a standby polling tuned
//! down, as sites that care about failover do.

use crate::config::{
    FabricParams, Fault, LinkSpec, Mode, RandomFaults, Scenario, SmSpec, SwitchSpec, Topology,
};
use crate::rng::Rng;

/// A family of scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// The built-in demonstration (rail A fails, an SM dies, rail A returns, a remote
    /// port flaps), connections placed by the seed.
    DualRail,
    /// Two rails of leaves and spines with LMC 2: spines, leaves and uplinks fail.
    LeafSpineLmc2,
    /// Random faults on the dual-rail fabric, LMC 0 (the only alternate is the other
    /// rail).
    RandomDualRailLmc0,
    /// Random faults on the dual-rail fabric, LMC 1.
    RandomDualRailLmc1,
    /// Random faults on leaf/spine rails.
    RandomLeafSpine,
    /// A rail or a port failing while 50% of MADs are lost.
    MadLoss50,
    /// The same at 90%.
    MadLoss90,
    /// SM failures: failover, the SM's own port or host dying, failures while no SM
    /// runs.
    SmFailures,
    /// Random faults with RoCE-style QPs (software migration).
    RandomRoce,
    /// Silent failures (black-holing switches, cuts between switches) among random
    /// faults, on rails of two switches joined by one cable.
    SilentSplitRail,
    /// The same with RoCE-style QPs: no SA, so a far end's port going down is silent
    /// too.
    SilentRoce,
}

/// How big the scenarios are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// A few hosts and tens of connections: the chaos campaign.
    Small,
    /// The sizes of the README's sweep.
    Full,
}

impl Family {
    /// Every family, in report order.
    pub const ALL: [Family; 11] = [
        Family::DualRail,
        Family::LeafSpineLmc2,
        Family::RandomDualRailLmc0,
        Family::RandomDualRailLmc1,
        Family::RandomLeafSpine,
        Family::MadLoss50,
        Family::MadLoss90,
        Family::SmFailures,
        Family::RandomRoce,
        Family::SilentSplitRail,
        Family::SilentRoce,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::DualRail => "dual-rail",
            Family::LeafSpineLmc2 => "leaf-spine-lmc2",
            Family::RandomDualRailLmc0 => "random-dual-rail-lmc0",
            Family::RandomDualRailLmc1 => "random-dual-rail-lmc1",
            Family::RandomLeafSpine => "random-leaf-spine",
            Family::MadLoss50 => "mad-loss-50",
            Family::MadLoss90 => "mad-loss-90",
            Family::SmFailures => "sm-failures",
            Family::RandomRoce => "random-roce",
            Family::SilentSplitRail => "silent-split-rail",
            Family::SilentRoce => "silent-roce",
        }
    }

    /// The family called `name`.
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// One line on what the family exercises.
    pub fn description(self) -> &'static str {
        match self {
            Family::DualRail => "the built-in demo, connections placed by the seed",
            Family::LeafSpineLmc2 => "leaf/spine rails, LMC 2: spines, leaves, uplinks fail",
            Family::RandomDualRailLmc0 => "random faults, dual rail, LMC 0",
            Family::RandomDualRailLmc1 => "random faults, dual rail, LMC 1",
            Family::RandomLeafSpine => "random faults, leaf/spine rails, LMC 1",
            Family::MadLoss50 => "a rail or port fails during 50% MAD loss",
            Family::MadLoss90 => "a rail or port fails during 90% MAD loss",
            Family::SmFailures => "SM failover, SM port/host death, failures with no SM",
            Family::RandomRoce => "random faults, RoCE-style software migration",
            Family::SilentSplitRail => {
                "black holes and inter-switch cuts among random faults, two-switch rails"
            }
            Family::SilentRoce => "the same on RoCE: no SA, a far end's port down is silent",
        }
    }

    /// The scenario of `seed`.
    pub fn scenario(self, seed: u64, size: Size) -> Scenario {
        let mut rng = Rng::new(seed).fork(0xfa11 + self as u64);
        let mut s = match self {
            Family::DualRail => Scenario::demo(),
            Family::LeafSpineLmc2 => leaf_spine_faults(&mut rng, size),
            Family::RandomDualRailLmc0 => random(dual_rail(size, 0), &mut rng),
            Family::RandomDualRailLmc1 => random(dual_rail(size, 1), &mut rng),
            Family::RandomLeafSpine => random(leaf_spine(size, 1), &mut rng),
            Family::SilentSplitRail => silent(split_rail(size), &mut rng),
            Family::SilentRoce => {
                let mut s = silent(split_rail(size), &mut rng);
                s.workload.mode = Mode::Software;
                s
            }
            Family::MadLoss50 => mad_loss(size, 0.5, &mut rng),
            Family::MadLoss90 => mad_loss(size, 0.9, &mut rng),
            Family::SmFailures => sm_failures(size, &mut rng),
            Family::RandomRoce => {
                let mut s = random(dual_rail(size, 0), &mut rng);
                s.workload.mode = Mode::Software;
                s
            }
        };
        s.name = format!("{} (seed {seed})", self.name());
        if size == Size::Small {
            s.topology.hosts = s.topology.hosts.min(SMALL_HOSTS);
            s.workload.connections = rng.range(12, 40) as usize;
            s.workload.message_interval_ms = 20;
        }
        s
    }
}

/// Hosts of a small dual-rail scenario (the built-in demo's faults name h3).
const SMALL_HOSTS: usize = 6;

fn dual_rail(size: Size, lmc: u8) -> Scenario {
    let mut s = Scenario {
        duration_ms: 8000,
        faults: Vec::new(),
        ..Scenario::default()
    };
    s.topology.hosts = match size {
        Size::Small => SMALL_HOSTS,
        Size::Full => 12,
    };
    s.topology.lmc = lmc;
    s.workload.connections = match size {
        Size::Small => 30,
        Size::Full => 800,
    };
    s
}

/// Two rails, each two leaves and two spines, hosts split between the leaves; SMs on
/// h0 (leaf 0) and the last host (leaf 1) of each rail.
fn leaf_spine(size: Size, lmc: u8) -> Scenario {
    let hosts = match size {
        Size::Small => 4,
        Size::Full => 8,
    };
    let mut t = Topology {
        hosts,
        ports: 2,
        lmc,
        switches: Vec::new(),
        links: Vec::new(),
        sm: Vec::new(),
        fat_tree: None,
    };
    for r in 0..2usize {
        let name = |k: &str, i: usize| format!("{k}{}{i}", char::from(b'A' + r as u8));
        for i in 0..2 {
            for k in ["L", "S"] {
                t.switches.push(SwitchSpec {
                    name: name(k, i),
                    subnet: r,
                });
            }
        }
        for h in 0..hosts {
            t.links.push(LinkSpec {
                a: format!("h{h}:{}", r + 1),
                b: name("L", h * 2 / hosts),
            });
        }
        for l in 0..2 {
            for sp in 0..2 {
                t.links.push(LinkSpec {
                    a: name("L", l),
                    b: name("S", sp),
                });
            }
        }
        t.sm.push(SmSpec {
            subnet: r,
            ports: vec![format!("h0:{}", r + 1), format!("h{}:{}", hosts - 1, r + 1)],
        });
    }
    let mut s = Scenario {
        duration_ms: 8000,
        topology: t,
        faults: Vec::new(),
        ..Scenario::default()
    };
    s.workload.connections = match size {
        Size::Small => 30,
        Size::Full => 500,
    };
    s
}

/// Add the random-faults generator: 8 faults between 0.3 and 4 s, outages up to 1.5 s.
fn random(mut s: Scenario, rng: &mut Rng) -> Scenario {
    s.random_faults = Some(RandomFaults {
        count: rng.range(4, 10) as u32,
        start_ms: 300,
        end_ms: 4000,
        max_outage_ms: 1500,
        device_fatal: rng.chance(0.2),
        silent: false,
    });
    s
}

/// Silent failures first: one to three black-holing switches or inter-switch cuts, each
/// back within 1.5 s; then, on half the seeds, random faults with silent ones among
/// them.
fn silent(mut s: Scenario, rng: &mut Rng) -> Scenario {
    let count = rng.range(1, 3);
    switch_and_cable_faults(&mut s, rng, count, |at_ms, switch, back| {
        [
            Fault::SwitchBlackHole {
                at_ms,
                switch: switch.clone(),
            },
            Fault::SwitchBlackHoleEnd {
                at_ms: back,
                switch,
            },
        ]
    });
    if rng.chance(0.5) {
        s = random(s, rng);
        if let Some(r) = s.random_faults.as_mut() {
            r.silent = true;
        }
    }
    s.faults.sort_by_key(Fault::at_ms);
    s
}

/// Two rails, each of two switches joined by one cable, the hosts split between them
/// (rail A: switches A0 and A1, rail B: B0 and B1); SMs on h0 (on A0/B0) and the last
/// host (on A1/B1). Cutting the cable between a rail's switches splits it: the master
/// SM's sweep drops the far half's ports (trap 65 to the subscribers it still reaches),
/// the far half hears nothing.
fn split_rail(size: Size) -> Scenario {
    let hosts = match size {
        Size::Small => SMALL_HOSTS,
        Size::Full => 12,
    };
    let mut t = Topology {
        hosts,
        ports: 2,
        lmc: 0,
        switches: Vec::new(),
        links: Vec::new(),
        sm: Vec::new(),
        fat_tree: None,
    };
    for r in 0..2usize {
        let name = |i: usize| format!("{}{i}", char::from(b'A' + r as u8));
        for i in 0..2 {
            t.switches.push(SwitchSpec {
                name: name(i),
                subnet: r,
            });
        }
        for h in 0..hosts {
            t.links.push(LinkSpec {
                a: format!("h{h}:{}", r + 1),
                b: name(h * 2 / hosts),
            });
        }
        t.links.push(LinkSpec {
            a: name(0),
            b: name(1),
        });
        t.sm.push(SmSpec {
            subnet: r,
            ports: vec![format!("h0:{}", r + 1), format!("h{}:{}", hosts - 1, r + 1)],
        });
    }
    let mut s = Scenario {
        duration_ms: 8000,
        topology: t,
        faults: Vec::new(),
        ..Scenario::default()
    };
    s.workload.connections = match size {
        Size::Small => 30,
        Size::Full => 800,
    };
    s
}

/// A leaf/spine fabric with LMC 2 whose spines, leaves and uplinks fail at times drawn
/// from the seed, each back within 1.5 s.
fn leaf_spine_faults(rng: &mut Rng, size: Size) -> Scenario {
    let mut s = leaf_spine(size, 2);
    let count = rng.range(2, 5);
    switch_and_cable_faults(&mut s, rng, count, |at_ms, switch, back| {
        [
            Fault::SwitchDown {
                at_ms,
                switch: switch.clone(),
            },
            Fault::SwitchUp {
                at_ms: back,
                switch,
            },
        ]
    });
    s
}

/// `count` faults at times drawn from the seed, each back within 1.5 s: on a coin toss,
/// a switch fault (`switch_fault(at, switch, back)` gives the fault and its end) or an
/// inter-switch cable down and up again.
fn switch_and_cable_faults(
    s: &mut Scenario,
    rng: &mut Rng,
    count: u64,
    switch_fault: impl Fn(u64, String, u64) -> [Fault; 2],
) {
    let switches: Vec<String> = s.topology.switches.iter().map(|x| x.name.clone()).collect();
    let cables: Vec<String> = s
        .topology
        .links
        .iter()
        .filter(|l| !l.a.starts_with('h'))
        .map(|l| format!("{}-{}", l.a, l.b))
        .collect();
    for _ in 0..count {
        let at = rng.range(300, 3500);
        let back = at + rng.range(50, 1500);
        if rng.chance(0.5) {
            let switch = switches[rng.below(switches.len() as u64) as usize].clone();
            s.faults.extend(switch_fault(at, switch, back));
        } else {
            let link = cables[rng.below(cables.len() as u64) as usize].clone();
            s.faults.push(Fault::LinkDown {
                at_ms: at,
                link: link.clone(),
            });
            s.faults.push(Fault::LinkUp { at_ms: back, link });
        }
    }
}

/// A dual-rail fabric where a rail's switch or a host port fails, and maybe returns,
/// inside a burst of `rate` MAD loss, with a few random faults besides.
fn mad_loss(size: Size, rate: f64, rng: &mut Rng) -> Scenario {
    let mut s = dual_rail(size, rng.below(2) as u8);
    let start = rng.range(300, 1500);
    let burst = rng.range(500, 3000);
    s.faults.push(Fault::MadLoss {
        at_ms: start,
        duration_ms: burst,
        rate,
    });
    let at = start + rng.range(0, burst / 2);
    let back = at + rng.range(100, 2000);
    if rng.chance(0.5) {
        let switch = if rng.chance(0.5) { "A" } else { "B" }.to_string();
        s.faults.push(Fault::SwitchDown {
            at_ms: at,
            switch: switch.clone(),
        });
        s.faults.push(Fault::SwitchUp {
            at_ms: back,
            switch,
        });
    } else {
        let port = format!(
            "h{}:{}",
            rng.below(s.topology.hosts as u64),
            rng.range(1, 2)
        );
        s.faults.push(Fault::PortDown {
            at_ms: at,
            port: port.clone(),
        });
        s.faults.push(Fault::PortUp { at_ms: back, port });
    }
    if rng.chance(0.5) {
        s = random(s, rng);
    }
    s
}

/// SM failures on the dual-rail fabric: the master SM process dies, its port goes
/// down, or its host dies (HCA fatal), sometimes both SMs of a rail so that later
/// failures happen with no SM at all, each followed by port or switch failures; half
/// the seeds with OpenSM's default standby polling, half with it tuned down.
fn sm_failures(size: Size, rng: &mut Rng) -> Scenario {
    let mut s = dual_rail(size, rng.below(2) as u8);
    let rail = rng.below(2) as usize;
    let port = rail + 1;
    let at = rng.range(200, 1500);
    match rng.below(4) {
        0 => s.faults.push(Fault::SmFailover {
            at_ms: at,
            subnet: rail,
        }),
        1 => {
            s.faults.push(Fault::PortDown {
                at_ms: at,
                port: format!("h0:{port}"),
            });
            s.faults.push(Fault::PortUp {
                at_ms: at + rng.range(100, 3000),
                port: format!("h0:{port}"),
            });
        }
        2 => s.faults.push(Fault::DeviceFatal {
            at_ms: at,
            host: "h0".into(),
        }),
        _ => {
            // Both SMs of the rail die: nothing sweeps that rail any more.
            s.faults.push(Fault::SmFailover {
                at_ms: at,
                subnet: rail,
            });
            s.faults.push(Fault::DeviceFatal {
                at_ms: at + rng.range(10, 500),
                host: "h1".into(),
            });
        }
    }
    for _ in 0..rng.range(1, 4) {
        let t = at + rng.range(50, 3000);
        let back = t + rng.range(50, 1500);
        let host = rng.range(2, s.topology.hosts as u64 - 1);
        let p = format!("h{host}:{}", rng.range(1, 2));
        if rng.chance(0.3) {
            let switch = if rng.chance(0.5) { "A" } else { "B" }.to_string();
            s.faults.push(Fault::SwitchDown {
                at_ms: t,
                switch: switch.clone(),
            });
            s.faults.push(Fault::SwitchUp {
                at_ms: back,
                switch,
            });
        } else {
            s.faults.push(Fault::PortDown {
                at_ms: t,
                port: p.clone(),
            });
            s.faults.push(Fault::PortUp {
                at_ms: back,
                port: p,
            });
        }
    }
    if rng.chance(0.5) {
        s.fabric = FabricParams {
            sminfo_polling_timeout_ms: 1000,
            polling_retry_number: 1,
            ..s.fabric
        };
    }
    s.faults.sort_by_key(Fault::at_ms);
    s
}
