//! Building the fabric of a topology: ports, switches, links, subnets, GIDs and LIDs,
//! with every problem of the topology found (not only the first), each with the part
//! of the topology it is about, so that a scenario file's reader can point at its line.

use super::{
    port_guid, subnet_prefix, End, Fabric, FabricError, HostPort, Link, PortState, Routing, Switch,
    NO_ROUTE,
};
use crate::topology::{FatTree, Topology};
use apm_core::Gid;

/// The part of a [`Topology`] a problem is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The topology as a whole (its sizes, or links without switches).
    Topology,
    /// `switches[i]`.
    Switch(usize),
    /// `links[i]`, at one of its ends.
    LinkEnd(usize, LinkEnd),
    /// `links[i]` as a whole.
    Link(usize),
}

/// Which end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkEnd {
    /// The link's `a`.
    A,
    /// The link's `b`.
    B,
}

/// A problem of a topology and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyProblem {
    /// The part of the topology.
    pub part: Part,
    /// What is wrong.
    pub error: FabricError,
}

impl Fabric {
    /// Build the fabric of a topology (everything up, no LFTs yet); the first problem
    /// of the topology if it has any ([`Fabric::build_checked`] has them all).
    pub fn build(t: &Topology) -> Result<Fabric, FabricError> {
        Fabric::build_checked(t).map_err(|mut all| all.swap_remove(0).error)
    }

    /// Build the fabric of a topology, or say every problem it has: a switch or link
    /// that cannot be is left out and the rest built, so that the next one shows.
    pub fn build_checked(t: &Topology) -> Result<Fabric, Vec<TopologyProblem>> {
        let mut f = Fabric {
            ports: host_ports(t),
            switches: Vec::new(),
            links: Vec::new(),
            hosts: t.hosts,
            ports_per_host: t.ports,
            subnets: 0,
            lid_owner: Vec::new(),
            end_index: Vec::new(),
            routing: Routing::PathBits,
        };
        let mut problems = Vec::new();
        let mut fail = |part, error| problems.push(TopologyProblem { part, error });
        if let Some(ft) = &t.fat_tree {
            if !t.switches.is_empty() || !t.links.is_empty() {
                fail(Part::Topology, FabricError::FatTreeWithSwitches);
            } else if let Err(e) = f.build_fat_trees(ft, t.hosts) {
                fail(Part::Topology, e);
            }
        } else if t.switches.is_empty() {
            if !t.links.is_empty() {
                fail(Part::Topology, FabricError::LinksWithoutSwitches);
            }
            for r in 0..usize::from(t.ports) {
                let name = char::from(b'A' + r as u8).to_string();
                if let Err(e) = f.add_switch(name, r) {
                    fail(Part::Topology, e);
                }
                for h in 0..t.hosts {
                    let pid = f.pid(h, r as u8 + 1);
                    if let Err(e) = f.add_link(End::Port(pid), End::Switch(r)) {
                        fail(Part::Topology, e);
                    }
                }
            }
        } else {
            for (i, s) in t.switches.iter().enumerate() {
                if let Err(e) = f.add_switch(s.name.clone(), s.subnet) {
                    fail(Part::Switch(i), e);
                }
            }
            for (i, l) in t.links.iter().enumerate() {
                let a = f.end_by_name(&l.a);
                let b = f.end_by_name(&l.b);
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        if let Err(e) = f.add_link(a, b) {
                            fail(Part::Link(i), e);
                        }
                    }
                    (a, b) => {
                        for (end, r) in [(LinkEnd::A, a), (LinkEnd::B, b)] {
                            if let Err(e) = r {
                                fail(Part::LinkEnd(i, end), e);
                            }
                        }
                    }
                }
            }
        }
        if let Err(e) = f.address() {
            fail(Part::Topology, e);
        }
        if problems.is_empty() {
            Ok(f)
        } else {
            Err(problems)
        }
    }

    /// Subnets and GIDs from the cabling, LIDs, the LID owners and empty LFTs.
    fn address(&mut self) -> Result<(), FabricError> {
        let f = self;
        f.subnets = f.switches.iter().map(|s| s.subnet + 1).max().unwrap_or(1);
        for pid in 0..f.ports.len() {
            let subnet = f.ports[pid]
                .link
                .and_then(|l| match f.other_end(l, End::Port(pid)) {
                    End::Switch(s) => Some(f.switches[s].subnet),
                    End::Port(_) => None,
                })
                .unwrap_or(0);
            let p = &mut f.ports[pid];
            p.subnet = subnet;
            p.gid = Gid::from_parts(subnet_prefix(subnet), port_guid(p.host, p.num));
        }
        // LIDs: deterministic, aligned to 2^lmc as IBA requires, unique fabric-wide (each
        // subnet's SM could reuse numbers; unique ones make traces easier to read).
        let mut next: u32 = 1;
        for p in &mut f.ports {
            let span = 1u32 << p.lmc;
            next = next.div_ceil(span) * span;
            if next + span > 0xBFFF {
                return Err(FabricError::LidSpaceExhausted);
            }
            p.lid = next as u16;
            next += span;
        }
        f.lid_owner = vec![None; next as usize + 1];
        for (pid, p) in f.ports.iter().enumerate() {
            for lid in p.lids() {
                f.lid_owner[usize::from(lid)] = Some(pid);
            }
        }
        let nlids = f.lid_owner.len();
        for s in &mut f.switches {
            s.lft = vec![NO_ROUTE; nlids];
        }
        Ok(())
    }

    /// Every rail a fat tree of `ft`'s shape (see [`FatTree`]): its switches, each
    /// host's port to its leaf, the uplinks; routed as OpenSM's `ftree` routes it.
    fn build_fat_trees(&mut self, ft: &FatTree, hosts: usize) -> Result<(), FabricError> {
        ft.check(hosts)?;
        let shape = ft.shape(hosts);
        self.routing = Routing::FatTree;
        for r in 0..usize::from(self.ports_per_host) {
            let rail = char::from(b'A' + r as u8);
            let base = self.switches.len();
            for k in 0..shape.tiers.len() {
                self.add_switch(shape.name(rail, k), r)?;
            }
            for h in 0..hosts {
                let pid = self.pid(h, r as u8 + 1);
                let leaf = base + h / shape.hosts_per_leaf;
                self.add_link(End::Port(pid), End::Switch(leaf))?;
            }
            for &(lo, hi) in &shape.uplinks {
                self.add_link(End::Switch(base + lo), End::Switch(base + hi))?;
            }
        }
        Ok(())
    }

    fn add_switch(&mut self, name: String, subnet: usize) -> Result<(), FabricError> {
        // Generated names are distinct by construction; a scenario's are checked.
        if self.routing == Routing::PathBits && self.switches.iter().any(|s| s.name == name) {
            return Err(FabricError::SwitchDeclaredTwice(name));
        }
        if name.starts_with('h') && name[1..].chars().all(|c| c.is_ascii_digit() || c == ':') {
            return Err(FabricError::SwitchNamedLikeHost(name));
        }
        if name.is_empty() || name.contains(['-', ':']) {
            return Err(FabricError::BadSwitchName(name));
        }
        if subnet >= 64 {
            return Err(FabricError::SubnetOutOfRange { name, subnet });
        }
        self.switches.push(Switch {
            name,
            subnet,
            up: true,
            black_hole: false,
            links: Vec::new(),
            lft: Vec::new(),
        });
        Ok(())
    }

    /// Cable `a` to `b`, or say why not (and change nothing).
    fn add_link(&mut self, a: End, b: End) -> Result<(), FabricError> {
        for end in [a, b] {
            if let End::Port(p) = end {
                if self.ports[p].link.is_some() || a == b {
                    return Err(FabricError::CabledTwice(self.port_name(p)));
                }
            }
        }
        if let (End::Port(_), End::Port(_)) = (a, b) {
            return Err(FabricError::HostToHost);
        }
        if let (End::Switch(x), End::Switch(y)) = (a, b) {
            if self.switches[x].subnet != self.switches[y].subnet {
                return Err(FabricError::JoinsSubnets(
                    self.switches[x].name.clone(),
                    self.switches[y].name.clone(),
                ));
            }
        }
        // A switch's LFT names a link by its index in the switch's links, below NO_ROUTE
        // (room for two: a cable from a switch to itself is two of its ends).
        for end in [a, b] {
            if let End::Switch(s) = end {
                if self.switches[s].links.len() + 2 > usize::from(NO_ROUTE) {
                    return Err(FabricError::TooManyLinksOnSwitch(
                        self.switches[s].name.clone(),
                    ));
                }
            }
        }
        let id = self.links.len();
        let mut index = [0u16; 2];
        for (k, end) in [a, b].into_iter().enumerate() {
            match end {
                End::Port(p) => self.ports[p].link = Some(id),
                End::Switch(s) => {
                    let sw = &mut self.switches[s];
                    // Below NO_ROUTE, checked above.
                    index[k] = sw.links.len() as u16;
                    sw.links.push(id);
                }
            }
        }
        self.end_index.push(index);
        self.links.push(Link { a, b, intact: true });
        Ok(())
    }
}

impl Fabric {
    /// Per host port, the connected part of the cabling it is in (an index; ports of
    /// one part reach each other through intact links and switches, whatever is up).
    pub fn parts(&self) -> Vec<usize> {
        let n = self.ports.len();
        // Union-find over the ports, then the switches after them.
        let mut up: Vec<usize> = (0..n + self.switches.len()).collect();
        fn root(up: &mut [usize], mut x: usize) -> usize {
            while up[x] != x {
                up[x] = up[up[x]];
                x = up[x];
            }
            x
        }
        let node = |e: End| match e {
            End::Port(p) => p,
            End::Switch(s) => n + s,
        };
        for l in &self.links {
            let (a, b) = (root(&mut up, node(l.a)), root(&mut up, node(l.b)));
            up[a] = b;
        }
        (0..n).map(|p| root(&mut up, p)).collect()
    }
}

/// Every host's ports, uncabled.
fn host_ports(t: &Topology) -> Vec<HostPort> {
    let mut ports = Vec::with_capacity(t.hosts * usize::from(t.ports));
    for h in 0..t.hosts {
        for p in 1..=t.ports {
            ports.push(HostPort {
                host: h,
                num: p,
                subnet: 0,
                gid: Gid::default(),
                lid: 0,
                lmc: t.lmc,
                admin_up: true,
                link: None,
                state: PortState::Down,
            });
        }
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{LinkSpec, SwitchSpec};

    fn topology(switches: &[(&str, usize)], links: &[(&str, &str)]) -> Topology {
        Topology {
            hosts: 2,
            ports: 1,
            lmc: 0,
            switches: switches
                .iter()
                .map(|(n, s)| SwitchSpec {
                    name: (*n).into(),
                    subnet: *s,
                })
                .collect(),
            links: links
                .iter()
                .map(|(a, b)| LinkSpec {
                    a: (*a).into(),
                    b: (*b).into(),
                })
                .collect(),
            sm: Vec::new(),
            fat_tree: None,
        }
    }

    #[test]
    fn every_problem_of_a_topology_is_found_with_its_part() {
        let t = topology(
            &[("S", 0), ("T", 1), ("S", 0), ("a-b", 0)],
            &[
                ("S", "h0:1"),
                ("S", "T"),
                ("Q", "h9:1"),
                ("h0:1", "S"),
                ("h1:1", "S"),
            ],
        );
        let problems = Fabric::build_checked(&t).expect_err("broken");
        let got: Vec<(Part, String)> = problems
            .iter()
            .map(|p| (p.part, p.error.to_string()))
            .collect();
        assert_eq!(got.len(), 6, "{got:#?}");
        assert_eq!(
            got[0],
            (Part::Switch(2), "switch \"S\" is declared twice".into())
        );
        assert_eq!(got[1].0, Part::Switch(3));
        assert_eq!(
            got[2],
            (
                Part::Link(1),
                "link S-T joins two subnets (IB routers are not simulated)".into()
            )
        );
        assert_eq!(
            got[3],
            (
                Part::LinkEnd(2, LinkEnd::A),
                "switch \"Q\" does not exist".into()
            )
        );
        assert_eq!(got[4].0, Part::LinkEnd(2, LinkEnd::B));
        assert_eq!(got[5], (Part::Link(3), "port h0:1 is cabled twice".into()));
        // What could be built was: the last link stands.
        let ok = topology(&[("S", 0)], &[("S", "h0:1"), ("h1:1", "S")]);
        assert_eq!(Fabric::build(&ok).expect("valid").num_links(), 2);
    }
}
