//! Scenario families: the kinds of fabric, fault schedule and traffic apm is judged on,
//! each a function of a seed, so that a claim is made over many schedules and never
//! over one.
//!
//! Every family draws its connection placement and its faults from the seed, and
//! states what it holds fixed ([`Settings`]: the link layer, how the devices migrate,
//! the standby SM's polling, whether apm probes, the traffic), which every scenario it
//! draws carries. Two sizes: [`Size::Small`] for the chaos campaign (a few hosts, tens
//! of connections), [`Size::Full`] for `apm simulate --family`/`--sweep` (the sizes a
//! user's first try would have). The fabric constants are OpenSM's and the hardware's
//! defaults unless the settings say otherwise; apm runs with its deployed defaults
//! (probes off) unless the family turns probes on. `draw.rs` holds the shapes and the
//! fault schedules.

mod draw;

use crate::config::{FabricParams, Migration, Mode, Scenario};
use crate::rng::Rng;
use draw::SMALL_HOSTS;

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
    /// runs; OpenSM's own standby polling.
    SmFailures,
    /// Random faults with RoCE-style QPs (software migration).
    RandomRoce,
    /// Silent failures (black-holing switches, cuts between switches) among random
    /// faults, on rails of two switches joined by one cable; probes on.
    SilentSplitRail,
    /// The same with RoCE-style QPs: no SA, so a far end's port going down is silent
    /// too.
    SilentRoce,
    /// Random faults on the dual-rail fabric, one message every 100 ms.
    Random100ms,
    /// The same at one message a second.
    Random1s,
    /// The same with traffic in bursts and idle gaps of seconds.
    RandomBursts,
    /// Random faults whose outages last up to 10 s.
    LongOutages,
    /// Ports and rails flapping with downs just under and over the retry budget.
    FlapsAtBudget,
    /// A short failure on one rail, then the other rail dies soon after it returns.
    SecondFailure,
    /// [`Family::SmFailures`] with the standby's polling tuned down.
    SmFailuresTuned,
    /// A failure during MAD loss of 10% to 90% with probes on (on InfiniBand they
    /// ride MADs).
    ProbesMadLoss,
    /// Random faults on devices that apply the alternate's own ACK timeout (mlx5).
    RandomMlx5,
    /// Random faults on mlx5 devices, the QPs apm's own (it may post its arming
    /// write).
    ApmQpsRandom,
    /// [`Family::SecondFailure`] on mlx5 devices, the QPs apm's own.
    ApmQpsSecondFailure,
}

/// How big the scenarios are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// A few hosts and tens of connections: the chaos campaign.
    Small,
    /// The sizes of the sweep.
    Full,
}

/// The link layer a family's QPs run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// InfiniBand, hardware APM, an SA.
    InfiniBand,
    /// RoCE: software migration, no SA.
    Roce,
}

/// The standby SM's polling of a family's fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Polling {
    /// OpenSM's defaults (`sminfo_polling_timeout` 10 s, `polling_retry_number` 4: a
    /// takeover 50 to 60 s after the master dies).
    OpenSm,
    /// Tuned down (500 ms, 2: 2 to 2.5 s).
    Tuned,
}

/// A family's traffic: each side of each connection sends one message...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// ...every 10 ms (20 ms in the small scenarios).
    Dense,
    /// ...every this many ms.
    Every(u64),
    /// ...every 10, 100 or 1000 ms, drawn from the seed.
    Drawn,
    /// ...every 10 ms in bursts of 0.1 to 1 s, with idle gaps of 0.5 to 5 s between
    /// them, drawn from the seed.
    Bursts,
}

/// What a family holds fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The link layer.
    pub link: Link,
    /// How the devices migrate (InfiniBand).
    pub migration: Migration,
    /// The standby SM's polling.
    pub polling: Polling,
    /// apm probes every path (on InfiniBand over MADs); apm's default has them off.
    pub probes: bool,
    /// apm may post on the QPs (its own, or the application lets it): its arming
    /// write arms a QP after a move. Otherwise the application's QPs, which only its
    /// traffic arms.
    pub apm_qps: bool,
    /// The traffic.
    pub traffic: Traffic,
}

impl Settings {
    /// InfiniBand, rdmavt, OpenSM's polling, probes off, dense traffic.
    const IB: Settings = Settings {
        link: Link::InfiniBand,
        migration: Migration::Rdmavt,
        polling: Polling::OpenSm,
        probes: false,
        apm_qps: false,
        traffic: Traffic::Dense,
    };

    /// The settings as the sweep prints them.
    pub fn describe(&self) -> String {
        let link = match self.link {
            Link::InfiniBand => format!("IB {}", self.migration.name()),
            Link::Roce => "RoCE".into(),
        };
        let polling = match (self.link, self.polling) {
            (Link::Roce, Polling::OpenSm) => "no SA, SM polling 10 s x 4",
            (Link::Roce, Polling::Tuned) => "no SA, SM polling 0.5 s x 2",
            (_, Polling::OpenSm) => "SM polling 10 s x 4",
            (_, Polling::Tuned) => "SM polling 0.5 s x 2",
        };
        let probes = if self.probes {
            "probes on"
        } else {
            "probes off"
        };
        let qps = if self.apm_qps {
            "apm's QPs"
        } else {
            "app's QPs"
        };
        let traffic = match self.traffic {
            Traffic::Dense => "10 ms".into(),
            Traffic::Every(ms) if ms >= 1000 => format!("{} s", ms / 1000),
            Traffic::Every(ms) => format!("{ms} ms"),
            Traffic::Drawn => "10/100/1000 ms".into(),
            Traffic::Bursts => "bursts".into(),
        };
        format!("{link}, {qps}, {polling}, {probes}, {traffic}")
    }
}

impl Family {
    /// Every family, in report order.
    pub const ALL: [Family; 22] = [
        Family::DualRail,
        Family::LeafSpineLmc2,
        Family::RandomDualRailLmc0,
        Family::RandomDualRailLmc1,
        Family::Random100ms,
        Family::Random1s,
        Family::RandomBursts,
        Family::RandomLeafSpine,
        Family::RandomMlx5,
        Family::LongOutages,
        Family::FlapsAtBudget,
        Family::SecondFailure,
        Family::MadLoss50,
        Family::MadLoss90,
        Family::ProbesMadLoss,
        Family::SmFailures,
        Family::SmFailuresTuned,
        Family::RandomRoce,
        Family::SilentSplitRail,
        Family::SilentRoce,
        Family::ApmQpsRandom,
        Family::ApmQpsSecondFailure,
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
            Family::Random100ms => "random-100ms",
            Family::Random1s => "random-1s",
            Family::RandomBursts => "random-bursts",
            Family::LongOutages => "long-outages",
            Family::FlapsAtBudget => "flaps-at-budget",
            Family::SecondFailure => "second-failure",
            Family::SmFailuresTuned => "sm-failures-tuned",
            Family::ProbesMadLoss => "probes-mad-loss",
            Family::RandomMlx5 => "random-mlx5",
            Family::ApmQpsRandom => "apm-qps-random",
            Family::ApmQpsSecondFailure => "apm-qps-second-failure",
        }
    }

    /// The family called `name`.
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// One line on what the family's faults are.
    pub fn description(self) -> &'static str {
        match self {
            Family::DualRail => "the built-in demo, connections placed by the seed",
            Family::LeafSpineLmc2 => "leaf/spine rails, LMC 2: spines, leaves, uplinks fail",
            Family::RandomDualRailLmc0 => "random faults, dual rail, LMC 0",
            Family::RandomDualRailLmc1 => "random faults, dual rail, LMC 1",
            Family::RandomLeafSpine => "random faults, leaf/spine rails, LMC 1",
            Family::MadLoss50 => "a rail or port fails during 50% MAD loss",
            Family::MadLoss90 => "a rail or port fails during 90% MAD loss",
            Family::SmFailures | Family::SmFailuresTuned => {
                "SM failover, SM port/host death, failures with no SM"
            }
            Family::RandomRoce => "random faults, dual rail, software migration",
            Family::SilentSplitRail => {
                "black holes and inter-switch cuts among random faults, two-switch rails"
            }
            Family::SilentRoce => "the same on RoCE: no SA, a far end's port down is silent",
            Family::Random100ms | Family::Random1s | Family::RandomBursts => {
                "random faults, dual rail, LMC 0 or 1"
            }
            Family::RandomMlx5 | Family::ApmQpsRandom => "random faults, dual rail, LMC 0 or 1",
            Family::LongOutages => "random faults with outages up to 10 s, both rails at once",
            Family::FlapsAtBudget => "ports and rails flap, downs 80-120% of the retry budget",
            Family::SecondFailure | Family::ApmQpsSecondFailure => {
                "ports of one rail down under the budget, then the other rail dies"
            }
            Family::ProbesMadLoss => "a rail or port fails during 10-90% MAD loss",
        }
    }

    /// What the family holds fixed.
    pub fn settings(self) -> Settings {
        let ib = Settings::IB;
        let traffic = |traffic| Settings { traffic, ..ib };
        match self {
            Family::DualRail | Family::SmFailuresTuned => Settings {
                polling: Polling::Tuned,
                ..ib
            },
            Family::LeafSpineLmc2
            | Family::RandomDualRailLmc0
            | Family::RandomDualRailLmc1
            | Family::RandomLeafSpine
            | Family::MadLoss50
            | Family::MadLoss90
            | Family::SmFailures => ib,
            Family::Random100ms => traffic(Traffic::Every(100)),
            Family::Random1s => traffic(Traffic::Every(1000)),
            Family::RandomBursts => traffic(Traffic::Bursts),
            Family::LongOutages | Family::FlapsAtBudget | Family::SecondFailure => {
                traffic(Traffic::Drawn)
            }
            Family::RandomMlx5 => Settings {
                migration: Migration::Mlx5,
                traffic: Traffic::Drawn,
                ..ib
            },
            Family::ApmQpsRandom | Family::ApmQpsSecondFailure => Settings {
                migration: Migration::Mlx5,
                apm_qps: true,
                traffic: Traffic::Drawn,
                ..ib
            },
            Family::ProbesMadLoss | Family::SilentSplitRail => Settings { probes: true, ..ib },
            Family::RandomRoce => Settings {
                link: Link::Roce,
                traffic: Traffic::Drawn,
                ..ib
            },
            Family::SilentRoce => Settings {
                link: Link::Roce,
                probes: true,
                ..ib
            },
        }
    }

    /// The salt of the family's random stream: fixed per family, so that adding a
    /// family never changes another's scenarios.
    fn salt(self) -> u64 {
        0xfa11
            + match self {
                Family::DualRail => 0,
                Family::LeafSpineLmc2 => 1,
                Family::RandomDualRailLmc0 => 2,
                Family::RandomDualRailLmc1 => 3,
                Family::RandomLeafSpine => 4,
                Family::MadLoss50 => 5,
                Family::MadLoss90 => 6,
                Family::SmFailures => 7,
                Family::RandomRoce => 8,
                Family::SilentSplitRail => 9,
                Family::SilentRoce => 10,
                Family::Random100ms => 11,
                Family::Random1s => 12,
                Family::RandomBursts => 13,
                Family::LongOutages => 14,
                Family::FlapsAtBudget => 15,
                Family::SecondFailure => 16,
                Family::SmFailuresTuned => 17,
                Family::ProbesMadLoss => 18,
                Family::RandomMlx5 => 19,
                Family::ApmQpsRandom => 20,
                Family::ApmQpsSecondFailure => 21,
            }
    }

    /// The scenario of `seed`.
    pub fn scenario(self, seed: u64, size: Size) -> Scenario {
        let mut rng = Rng::new(seed).fork(self.salt());
        let mut s = match self {
            Family::DualRail => Scenario::demo(),
            Family::LeafSpineLmc2 => draw::leaf_spine_faults(&mut rng, size),
            Family::RandomDualRailLmc0 => draw::random(draw::dual_rail(size, 0), &mut rng),
            Family::RandomDualRailLmc1 => draw::random(draw::dual_rail(size, 1), &mut rng),
            Family::Random100ms
            | Family::Random1s
            | Family::RandomBursts
            | Family::RandomMlx5
            | Family::ApmQpsRandom
            | Family::RandomRoce => {
                let lmc = if self == Family::RandomRoce {
                    0
                } else {
                    rng.below(2) as u8
                };
                draw::random(draw::dual_rail(size, lmc), &mut rng)
            }
            Family::RandomLeafSpine => draw::random(draw::leaf_spine(size, 1), &mut rng),
            Family::SilentSplitRail | Family::SilentRoce => {
                draw::silent(draw::split_rail(size), &mut rng)
            }
            Family::MadLoss50 => draw::mad_loss(size, 0.5, &mut rng),
            Family::MadLoss90 => draw::mad_loss(size, 0.9, &mut rng),
            Family::ProbesMadLoss => draw::probes_mad_loss(size, &mut rng),
            Family::SmFailures | Family::SmFailuresTuned => draw::sm_failures(size, &mut rng),
            Family::LongOutages => draw::long_outages(size, &mut rng),
            Family::FlapsAtBudget => draw::flaps_at_budget(size, &mut rng),
            Family::SecondFailure | Family::ApmQpsSecondFailure => {
                draw::second_failure(size, &mut rng)
            }
        };
        s.name = format!("{} (seed {seed})", self.name());
        if size == Size::Small {
            s.topology.hosts = s.topology.hosts.min(SMALL_HOSTS);
            s.workload.connections = rng.range(12, 40) as usize;
        }
        self.apply(&mut s, seed, size);
        s
    }

    /// Give `s` the family's settings, its traffic drawn from its own stream.
    fn apply(self, s: &mut Scenario, seed: u64, size: Size) {
        let set = self.settings();
        let mut rng = Rng::new(seed).fork(self.salt() ^ 0x7aff1c);
        s.workload.mode = match set.link {
            Link::InfiniBand => Mode::Hardware,
            Link::Roce => Mode::Software,
        };
        s.fabric.migration = set.migration;
        s.workload.apm_may_post = set.apm_qps;
        let (timeout, retries) = match set.polling {
            Polling::OpenSm => {
                let opensm = FabricParams::default();
                (
                    opensm.sminfo_polling_timeout_ms,
                    opensm.polling_retry_number,
                )
            }
            Polling::Tuned => draw::TUNED_POLLING,
        };
        s.fabric.sminfo_polling_timeout_ms = timeout;
        s.fabric.polling_retry_number = retries;
        let mut policy = apm_core::Policy::default();
        if set.probes {
            policy.probe.enabled = true;
            policy.probe.infiniband = true;
        }
        s.policy = Some(policy);
        s.workload.message_interval_ms = match (set.traffic, size) {
            (Traffic::Dense | Traffic::Bursts, Size::Full) => 10,
            (Traffic::Dense | Traffic::Bursts, Size::Small) => 20,
            (Traffic::Every(ms), _) => ms,
            (Traffic::Drawn, _) => [10, 100, 1000][rng.below(3) as usize],
        };
        if set.traffic == Traffic::Bursts {
            s.workload.bursts = Some(draw::bursts(&mut rng));
        }
        // Long enough after the last fault for every loss to happen: two retry
        // budgets at the longest timeout a QP may run at, and a message interval.
        let last = s.last_fault_end_ms(seed);
        let budget = (u64::from(s.fabric.retry_cnt) + 1)
            * (4096u64 << s.fabric.ack_timeout.saturating_add(2).min(31))
            / 1_000_000;
        s.duration_ms = s
            .duration_ms
            .max(last + 2 * budget + s.workload.message_interval_ms + 500);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_carries_its_family_settings_and_validates() {
        for family in Family::ALL {
            let set = family.settings();
            for seed in 0..20 {
                for size in [Size::Small, Size::Full] {
                    let s = family.scenario(seed, size);
                    s.validate()
                        .unwrap_or_else(|e| panic!("{} seed {seed}: {e}", family.name()));
                    let ib = s.workload.mode == Mode::Hardware;
                    assert_eq!(ib, set.link == Link::InfiniBand, "{}", family.name());
                    assert_eq!(s.fabric.migration, set.migration, "{}", family.name());
                    assert_eq!(s.workload.apm_may_post, set.apm_qps, "{}", family.name());
                    let tuned = s.fabric.sminfo_polling_timeout_ms == 500;
                    assert_eq!(tuned, set.polling == Polling::Tuned, "{}", family.name());
                    let policy = s.engine_policy();
                    assert_eq!(policy.probe.enabled, set.probes, "{}", family.name());
                    assert_eq!(policy.probe.infiniband, set.probes, "{}", family.name());
                    let interval = s.workload.message_interval_ms;
                    match set.traffic {
                        Traffic::Dense => assert!(interval == 10 || interval == 20),
                        Traffic::Every(ms) => assert_eq!(interval, ms),
                        Traffic::Drawn => assert!([10, 100, 1000].contains(&interval)),
                        Traffic::Bursts => assert!(s.workload.bursts.is_some()),
                    }
                    assert_eq!(s.workload.bursts.is_some(), set.traffic == Traffic::Bursts);
                    let last = s.all_faults(seed).iter().map(|f| f.end_ms()).max();
                    assert!(last.unwrap_or(0) < s.duration_ms, "{}", family.name());
                }
            }
        }
    }

    #[test]
    fn the_families_vary_what_matters() {
        let sets: Vec<Settings> = Family::ALL.iter().map(|f| f.settings()).collect();
        assert!(Family::ALL.len() >= 12);
        for traffic in [
            Traffic::Dense,
            Traffic::Every(100),
            Traffic::Every(1000),
            Traffic::Bursts,
        ] {
            assert!(sets.iter().any(|s| s.traffic == traffic), "{traffic:?}");
        }
        assert!(sets.iter().any(|s| s.polling == Polling::OpenSm));
        assert!(sets.iter().any(|s| s.polling == Polling::Tuned));
        assert!(sets.iter().any(|s| s.migration == Migration::Mlx5));
        assert!(sets.iter().any(|s| s.link == Link::Roce));
        assert!(sets.iter().any(|s| s.apm_qps) && sets.iter().any(|s| !s.apm_qps));
        assert!(sets.iter().any(|s| s.link == Link::InfiniBand && !s.probes));
        // Outages of up to 10 s, and flaps on both sides of the retry budget.
        let long = Family::LongOutages.scenario(1, Size::Full).random_faults;
        assert_eq!(long.map(|r| r.max_outage_ms), Some(10_000));
        let mut downs = Vec::new();
        for seed in 0..50 {
            let faults = Family::FlapsAtBudget.scenario(seed, Size::Full).faults;
            for (i, f) in faults.iter().enumerate() {
                if let crate::Fault::PortDown { at_ms, port } = f {
                    let up = faults[i..].iter().find_map(|g| match g {
                        crate::Fault::PortUp { at_ms: b, port: q } if q == port => Some(*b),
                        _ => None,
                    });
                    downs.extend(up.map(|b| b - at_ms));
                }
            }
        }
        assert!(downs.iter().any(|&d| d < 537) && downs.iter().any(|&d| d > 537));
    }

    #[test]
    fn a_family_seed_is_one_scenario() {
        for family in Family::ALL {
            assert_eq!(
                family.scenario(7, Size::Full),
                family.scenario(7, Size::Full)
            );
            assert_eq!(Family::from_name(family.name()), Some(family));
        }
    }
}
