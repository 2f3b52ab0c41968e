//! The scenario families' shapes and fault schedules, each drawn from the family's own
//! random stream: the fabrics (dual rail, leaf/spine rails, rails split in two), the
//! kinds of failure schedule, the traffic.

use super::Size;
use crate::config::{
    Bursts, Fault, LinkSpec, RandomFaults, Scenario, SmSpec, SwitchSpec, Topology,
};
use crate::rng::Rng;

/// Hosts of a small dual-rail scenario (the built-in demo's faults name h3).
pub(super) const SMALL_HOSTS: usize = 6;

pub(super) fn dual_rail(size: Size, lmc: u8) -> Scenario {
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
pub(super) fn leaf_spine(size: Size, lmc: u8) -> Scenario {
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
pub(super) fn random(mut s: Scenario, rng: &mut Rng) -> Scenario {
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
pub(super) fn silent(mut s: Scenario, rng: &mut Rng) -> Scenario {
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
pub(super) fn split_rail(size: Size) -> Scenario {
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
pub(super) fn leaf_spine_faults(rng: &mut Rng, size: Size) -> Scenario {
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
pub(super) fn mad_loss(size: Size, rate: f64, rng: &mut Rng) -> Scenario {
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
/// failures happen with no SM at all, each followed by port or switch failures (the
/// standby's polling is the family's).
pub(super) fn sm_failures(size: Size, rng: &mut Rng) -> Scenario {
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
    s.faults.sort_by_key(Fault::at_ms);
    s
}

/// Random faults with outages of up to 10 s on the dual-rail fabric (both rails may be
/// down at once, for seconds), over 14 s.
pub(super) fn long_outages(size: Size, rng: &mut Rng) -> Scenario {
    let mut s = dual_rail(size, rng.below(2) as u8);
    s.random_faults = Some(RandomFaults {
        count: rng.range(3, 6) as u32,
        start_ms: 300,
        end_ms: 14_000,
        max_outage_ms: 10_000,
        device_fatal: false,
        silent: false,
    });
    s
}

/// The retry budget of `s`'s QPs: `(retry_cnt + 1)` ACK timeouts, in ms.
fn retry_budget_ms(s: &Scenario) -> u64 {
    let f = &s.fabric;
    (u64::from(f.retry_cnt) + 1) * f.ack_timeout_ns() / 1_000_000
}

/// Ports and rails that flap with downs just under and just over the QPs' retry
/// budget (80% to 120% of it): whether the HCA migrates, and whether a move pays,
/// is decided by a few milliseconds. One to three flapping elements (a host port, or a
/// rail's switch), two to four flaps each.
pub(super) fn flaps_at_budget(size: Size, rng: &mut Rng) -> Scenario {
    let mut s = dual_rail(size, rng.below(2) as u8);
    let budget = retry_budget_ms(&s);
    for _ in 0..rng.range(1, 3) {
        let mut at = rng.range(300, 3000);
        let up_ms = rng.range(100, 1500);
        let switch = rng.chance(0.3).then(|| ["A", "B"][rng.below(2) as usize]);
        let port = format!(
            "h{}:{}",
            rng.below(s.topology.hosts as u64),
            rng.range(1, 2)
        );
        for _ in 0..rng.range(2, 4) {
            let down_ms = budget * rng.range(800, 1200) / 1000;
            match switch {
                Some(sw) => {
                    s.faults.push(Fault::SwitchDown {
                        at_ms: at,
                        switch: sw.into(),
                    });
                    s.faults.push(Fault::SwitchUp {
                        at_ms: at + down_ms,
                        switch: sw.into(),
                    });
                }
                None => {
                    s.faults.push(Fault::PortDown {
                        at_ms: at,
                        port: port.clone(),
                    });
                    s.faults.push(Fault::PortUp {
                        at_ms: at + down_ms,
                        port: port.clone(),
                    });
                }
            }
            at += down_ms + up_ms;
        }
    }
    s.faults.sort_by_key(Fault::at_ms);
    s
}

/// A first failure shorter than the retry budget on one rail, then the other rail
/// dying soon after it returns: some hosts' ports on rail A (or B) go down for 100 to
/// 500 ms, and 0 to 1 s after they return the other rail's switch (or some hosts' ports
/// on it) dies for 0.3 to 3 s. A policy that moved off the first rail is on the second
/// when it dies; one that waited the first failure out never left.
pub(super) fn second_failure(size: Size, rng: &mut Rng) -> Scenario {
    let mut s = dual_rail(size, rng.below(2) as u8);
    let hosts = s.topology.hosts as u64;
    let first = rng.range(1, 2);
    let second = 3 - first;
    let t0 = rng.range(1500, 2500);
    let back = t0 + rng.range(100, 500);
    let count = rng.range(1, hosts / 3);
    ports_down(&mut s, rng, first, (t0, back), count);
    let t1 = back + rng.range(0, 1000);
    let end = t1 + rng.range(300, 3000);
    if rng.chance(0.5) {
        let switch = if second == 1 { "A" } else { "B" };
        s.faults.push(Fault::SwitchDown {
            at_ms: t1,
            switch: switch.into(),
        });
        s.faults.push(Fault::SwitchUp {
            at_ms: end,
            switch: switch.into(),
        });
    } else {
        let count = rng.range(1, hosts / 2);
        ports_down(&mut s, rng, second, (t1, end), count);
    }
    s.faults.sort_by_key(Fault::at_ms);
    s
}

/// `count` consecutive hosts' ports on `rail` (from one drawn at random) down over
/// `(from, until)` ms.
fn ports_down(s: &mut Scenario, rng: &mut Rng, rail: u64, (from, until): (u64, u64), count: u64) {
    let hosts = s.topology.hosts as u64;
    let start = rng.below(hosts);
    for k in 0..count {
        let port = format!("h{}:{rail}", (start + k) % hosts);
        s.faults.push(Fault::PortDown {
            at_ms: from,
            port: port.clone(),
        });
        s.faults.push(Fault::PortUp { at_ms: until, port });
    }
}

/// A rail or a port fails, and maybe returns, inside a burst of MAD loss of 10% to
/// 90% (MAD loss alone on a third of the seeds): with probes on, InfiniBand's ride
/// MADs and die with them.
pub(super) fn probes_mad_loss(size: Size, rng: &mut Rng) -> Scenario {
    let rate = [0.1, 0.3, 0.5, 0.7, 0.9][rng.below(5) as usize];
    let mut s = mad_loss(size, rate, rng);
    if rng.chance(1.0 / 3.0) {
        s.faults.retain(|f| matches!(f, Fault::MadLoss { .. }));
        s.random_faults = None;
    }
    s
}

/// Bursts of traffic every 10 ms lasting 100 ms to 1 s, with idle gaps of 0.5 to 5 s.
pub(super) fn bursts(rng: &mut Rng) -> Bursts {
    Bursts {
        on_ms: rng.range(100, 1000),
        off_ms: rng.range(500, 5000),
    }
}

/// The OpenSM standby polling a site that cares about failover tunes down
/// (`sminfo_polling_timeout` 500 ms, `polling_retry_number` 2: a takeover 2 to 2.5 s
/// after the master dies).
pub(super) const TUNED_POLLING: (u64, u32) = (500, 2);
