//! The fabric's shape as a scenario writes it: hosts, ports, LMC, switches, links and
//! where the SMs run. Plain data with defaults; [`crate::fabric::Fabric::build`] turns it
//! into the cabled fabric and rejects what cannot be built. Nothing here resolves a name.

use serde::{Deserialize, Serialize};

/// The fabric: hosts with HCA ports, switches, links.
///
/// Without `switches`/`links`, a rail fabric is generated: one switch per port number
/// (`A` for port 1, `B` for port 2), each its own subnet, every host's port `r` cabled
/// to switch `r`: the classic dual-rail layout where the two planes share nothing. With
/// `fat_tree`, each rail is a generated k-ary fat tree instead ([`FatTree`]).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Topology {
    /// Number of hosts, named `h0`, `h1`, ...
    pub hosts: usize,
    /// HCA ports per host (1 or 2); all on one HCA, so APM can move between them.
    pub ports: u8,
    /// LID mask control of every host port (0..=2): each port answers to 2^lmc LIDs.
    pub lmc: u8,
    /// Explicit switches (leave empty for the generated rails).
    pub switches: Vec<SwitchSpec>,
    /// Explicit links, `"h3:1"` for a host port or a switch name at each end.
    pub links: Vec<LinkSpec>,
    /// SM placement per subnet: master first, then standbys. Default: the subnet's port
    /// on `h0`, standby on `h1`.
    pub sm: Vec<SmSpec>,
    /// Generate every rail as a k-ary fat tree (instead of one switch per rail); not
    /// with explicit `switches`/`links`.
    pub fat_tree: Option<FatTree>,
}

impl Default for Topology {
    fn default() -> Topology {
        Topology {
            hosts: 16,
            ports: 2,
            lmc: 1,
            switches: Vec::new(),
            links: Vec::new(),
            sm: Vec::new(),
            fat_tree: None,
        }
    }
}

/// A k-ary fat tree per rail, the folded Clos of Al-Fares et al. (SIGCOMM 2008) that
/// large InfiniBand clusters are cabled as: switches of `radix` ports, each leaf with
/// `radix / 2` hosts below and `radix / 2` links up.
///
/// - Two levels: `radix / 2` spines, every leaf cabled to every spine; at most `radix`
///   leaves (a spine has one port per leaf), `radix^2 / 2` hosts.
/// - Three levels: pods of `radix / 2` leaves and `radix / 2` aggregation switches
///   (every leaf of a pod cabled to every aggregation switch of the pod), and
///   `(radix / 2)^2` core switches, aggregation switch `j` of every pod cabled to cores
///   `j * radix / 2 ..`; at most `radix` pods, `radix^3 / 4` hosts.
///
/// Hosts fill the leaves in order (host `h` on leaf `h / (radix / 2)`); only the leaves
/// and pods the hosts need are built, the spines or cores always. Switches are named
/// by rail and level: `A.L3` (leaf 3 of rail A), `A.S1` (spine), `A.G5` (aggregation),
/// `A.C17` (core). Each rail is routed as OpenSM's fat-tree routing engine (`ftree`)
/// routes one: shortest paths, a destination's traffic spread over the equal uplinks by
/// the destination (so one spine carries a share of every leaf's traffic, not all of
/// it), its LMC variants on different uplinks.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FatTree {
    /// 2 (leaf/spine) or 3 (leaf/aggregation/core).
    pub levels: u8,
    /// Ports per switch: even, 4 to 128 (real switches: 36, 40, 64).
    pub radix: u16,
}

/// Why a [`FatTree`] cannot be built; each is about one key of `topology.fat_tree`
/// ([`FatTreeError::key`]), which the message does not repeat.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FatTreeError {
    /// Not 2 or 3 levels.
    #[error("{0}: use 2 or 3")]
    Levels(u8),
    /// Not an even radix of 4 to 128.
    #[error("{0}: an even number of switch ports, 4 to 128")]
    Radix(u16),
    /// More hosts than the tree holds.
    #[error(
        "{}: {hosts} hosts, but a {}-level fat tree of radix {} holds at most {}",
        tree.radix, tree.levels, tree.radix, tree.capacity()
    )]
    TooManyHosts {
        /// The tree.
        tree: FatTree,
        /// The scenario's hosts.
        hosts: usize,
    },
}

impl FatTreeError {
    /// The key of `topology.fat_tree` the problem is about.
    pub fn key(&self) -> &'static str {
        match self {
            FatTreeError::Levels(_) => "levels",
            FatTreeError::Radix(_) | FatTreeError::TooManyHosts { .. } => "radix",
        }
    }
}

/// Which level of a fat tree a switch is on, and its name's letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Hosts below.
    Leaf,
    /// The top of a two-level tree.
    Spine,
    /// The middle of a three-level tree.
    Aggregation,
    /// The top of a three-level tree.
    Core,
}

impl Tier {
    fn letter(self) -> char {
        match self {
            Tier::Leaf => 'L',
            Tier::Spine => 'S',
            Tier::Aggregation => 'G',
            Tier::Core => 'C',
        }
    }
}

/// The switches and cables of one rail of a fat tree, by index: what
/// [`crate::fabric::Fabric::build`] builds, and what the scenario's validation counts
/// before anything is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatTreeShape {
    /// Each switch's level, in the order they are built (leaves, then the levels
    /// above, each in index order).
    pub tiers: Vec<(Tier, usize)>,
    /// Cables between two switches (indices into `tiers`), lower end first.
    pub uplinks: Vec<(usize, usize)>,
    /// Host `h`'s leaf is switch `h / hosts_per_leaf`.
    pub hosts_per_leaf: usize,
}

impl FatTree {
    /// The most hosts the tree holds.
    pub fn capacity(&self) -> usize {
        let k = usize::from(self.radix);
        match self.levels {
            2 => k * k / 2,
            _ => k * k * k / 4,
        }
    }

    /// Why the tree cannot be built for `hosts`, if it cannot.
    pub fn check(&self, hosts: usize) -> Result<(), FatTreeError> {
        if !(2..=3).contains(&self.levels) {
            return Err(FatTreeError::Levels(self.levels));
        }
        if self.radix % 2 != 0 || !(4..=128).contains(&self.radix) {
            return Err(FatTreeError::Radix(self.radix));
        }
        if hosts > self.capacity() {
            return Err(FatTreeError::TooManyHosts { tree: *self, hosts });
        }
        Ok(())
    }

    /// The rail's switches and uplinks for `hosts` (after [`FatTree::check`]).
    pub fn shape(&self, hosts: usize) -> FatTreeShape {
        let half = usize::from(self.radix / 2).max(1);
        let leaves = hosts.div_ceil(half).max(1);
        let mut tiers: Vec<(Tier, usize)> = (0..leaves).map(|i| (Tier::Leaf, i)).collect();
        let mut uplinks = Vec::new();
        if self.levels == 2 {
            for s in 0..half {
                tiers.push((Tier::Spine, s));
                let spine = tiers.len() - 1;
                uplinks.extend((0..leaves).map(|l| (l, spine)));
            }
            // Leaf-major order: each leaf's uplinks are its links after its hosts'.
            uplinks.sort_unstable();
            return FatTreeShape {
                tiers,
                uplinks,
                hosts_per_leaf: half,
            };
        }
        let pods = leaves.div_ceil(half);
        let agg0 = tiers.len();
        tiers.extend((0..pods * half).map(|i| (Tier::Aggregation, i)));
        let core0 = tiers.len();
        tiers.extend((0..half * half).map(|i| (Tier::Core, i)));
        for l in 0..leaves {
            let pod = l / half;
            uplinks.extend((0..half).map(|j| (l, agg0 + pod * half + j)));
        }
        for a in 0..pods * half {
            let j = a % half;
            uplinks.extend((0..half).map(|c| (agg0 + a, core0 + j * half + c)));
        }
        FatTreeShape {
            tiers,
            uplinks,
            hosts_per_leaf: half,
        }
    }
}

impl FatTreeShape {
    /// A switch's name on `rail` (`A`, `B`, ...).
    pub fn name(&self, rail: char, switch: usize) -> String {
        let (tier, i) = self.tiers[switch];
        format!("{rail}.{}{i}", tier.letter())
    }
}

/// An explicit switch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    /// Its name, used by links and faults.
    pub name: String,
    /// The subnet (rail) it belongs to, 0-based.
    pub subnet: usize,
}

/// An explicit link.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// One end: `"h3:1"` or a switch name.
    pub a: String,
    /// The other end.
    pub b: String,
}

/// Where a subnet's SMs run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SmSpec {
    /// The subnet.
    pub subnet: usize,
    /// Host ports running an SM, master first (`"h0:1"`).
    pub ports: Vec<String>,
}
