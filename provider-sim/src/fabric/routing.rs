//! Routing over the cabled fabric: how a packet follows the forwarding tables, what
//! the SM's directed-route discovery reaches, and how a sweep programs the tables.

use super::*;

impl Fabric {
    /// Follow the forwarding tables from `slid` to `dlid`: the number of links crossed
    /// when the packet gets there, `None` when it is dropped on the way (a dead link, a
    /// table with no entry, a black-holing switch). The SM's directed-route SMPs never
    /// come here ([`Fabric::discover`]): a black hole answers them.
    pub fn route(&self, slid: u16, dlid: u16) -> Option<u32> {
        let src = self.lid_owner(slid)?;
        let dst = self.lid_owner(dlid)?;
        if self.ports[src].state != PortState::Active || self.ports[dst].state != PortState::Active
        {
            return None;
        }
        if self.ports[src].subnet != self.ports[dst].subnet {
            return None;
        }
        let first = self.ports[src].link?;
        if !self.link_up(first) {
            return None;
        }
        let mut at = self.other_end(first, End::Port(src));
        let mut hops = 1;
        loop {
            match at {
                End::Port(p) => return (p == dst).then_some(hops),
                End::Switch(s) => {
                    if self.switches[s].black_hole {
                        return None;
                    }
                    let l = self.switches[s].lft(dlid)?;
                    if !self.link_up(l) || hops > 32 {
                        return None;
                    }
                    at = self.other_end(l, End::Switch(s));
                    hops += 1;
                }
            }
        }
    }

    /// Ports and switches of `subnet` reachable from `from` over live links, as the SM's
    /// directed-route discovery would find them.
    pub fn discover(&self, from: PortId) -> (Vec<bool>, Vec<bool>) {
        let mut ports = vec![false; self.ports.len()];
        let mut switches = vec![false; self.switches.len()];
        if !self.port_phys_up(from) {
            ports[from] = self.ports[from].admin_up;
            return (ports, switches);
        }
        ports[from] = true;
        let mut stack = vec![End::Port(from)];
        while let Some(e) = stack.pop() {
            let links: Vec<LinkId> = match e {
                End::Port(p) => self.ports[p].link.into_iter().collect(),
                End::Switch(s) => self.switches[s].links.clone(),
            };
            for l in links {
                if !self.link_up(l) {
                    continue;
                }
                match self.other_end(l, e) {
                    End::Port(p) if !ports[p] => {
                        ports[p] = true;
                        stack.push(End::Port(p));
                    }
                    End::Switch(s) if !switches[s] => {
                        switches[s] = true;
                        stack.push(End::Switch(s));
                    }
                    _ => {}
                }
            }
        }
        (ports, switches)
    }

    /// Program the forwarding tables of the discovered switches: shortest paths over
    /// live links, equal-cost choices spread by the DLID's path bits (so the LMC variants
    /// of a port take different routes where the fabric has more than one) and, on a
    /// fat tree, by the destination host.
    ///
    /// Destinations are taken by edge switch: every port on one switch has the same
    /// distances and the same equal-cost next hops, so one breadth-first search per
    /// edge switch serves them all (a 4,096-host rail has 256 leaves).
    pub fn program_lfts(&mut self, ports: &[bool], switches: &[bool]) {
        let ns = self.switches.len();
        for (sw, reached) in self.switches.iter_mut().zip(switches) {
            if *reached {
                sw.lft.iter_mut().for_each(|e| *e = NO_ROUTE);
            }
        }
        let mut by_edge: Vec<Vec<PortId>> = vec![Vec::new(); ns];
        for (dst, reached) in ports.iter().enumerate() {
            if !reached {
                continue;
            }
            let Some(first) = self.ports[dst].link else {
                continue;
            };
            if !self.link_up(first) {
                continue;
            }
            if let End::Switch(edge) = self.other_end(first, End::Port(dst)) {
                by_edge[edge].push(dst);
            }
        }
        let mut dist = vec![u32::MAX; ns];
        let mut next: Vec<u16> = Vec::new();
        for (edge, dsts) in by_edge.iter().enumerate() {
            if dsts.is_empty() {
                continue;
            }
            self.distances_from(edge, &mut dist);
            for s in 0..ns {
                if !switches[s] || dist[s] == u32::MAX {
                    continue;
                }
                if s == edge {
                    for &dst in dsts {
                        let Some(first) = self.ports[dst].link else {
                            continue;
                        };
                        let at = self.end_index_at(first, s);
                        for lid in self.ports[dst].lids() {
                            self.switches[s].lft[usize::from(lid)] = at;
                        }
                    }
                    continue;
                }
                next.clear();
                for (k, &l) in self.switches[s].links.iter().enumerate() {
                    let down = self.link_up(l)
                        && matches!(self.other_end(l, End::Switch(s)),
                            End::Switch(n) if dist[n] + 1 == dist[s]);
                    if down {
                        next.push(k as u16);
                    }
                }
                if next.is_empty() {
                    continue;
                }
                for &dst in dsts {
                    let (base, host) = (self.ports[dst].lid, self.ports[dst].host);
                    for lid in self.ports[dst].lids() {
                        let bits = usize::from(lid - base);
                        let spread = match self.routing {
                            Routing::PathBits => bits,
                            Routing::FatTree => host + bits,
                        };
                        self.switches[s].lft[usize::from(lid)] = next[spread % next.len()];
                    }
                }
            }
        }
    }

    /// Breadth-first hop counts from switch `from` over live links between switches
    /// (`u32::MAX`: unreachable), into `dist`.
    fn distances_from(&self, from: SwitchId, dist: &mut [u32]) {
        dist.iter_mut().for_each(|d| *d = u32::MAX);
        dist[from] = 0;
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(s) = queue.pop_front() {
            for &l in &self.switches[s].links {
                if !self.link_up(l) {
                    continue;
                }
                if let End::Switch(n) = self.other_end(l, End::Switch(s)) {
                    if dist[n] == u32::MAX {
                        dist[n] = dist[s] + 1;
                        queue.push_back(n);
                    }
                }
            }
        }
    }

    /// The index of link `l` in switch `s`'s `links` (`s` is one of its ends).
    fn end_index_at(&self, l: LinkId, s: SwitchId) -> u16 {
        let k = usize::from(self.links[l].a != End::Switch(s));
        self.end_index[l][k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{FatTree, Topology};

    /// A fabric with every port active and the tables programmed.
    fn swept(t: &Topology) -> Fabric {
        let mut f = Fabric::build(t).expect("fabric");
        for p in &mut f.ports {
            p.state = PortState::Active;
        }
        let (ports, switches) = (vec![true; f.num_ports()], vec![true; f.num_switches()]);
        f.program_lfts(&ports, &switches);
        f
    }

    fn tree(hosts: usize, levels: u8, radix: u16) -> Topology {
        Topology {
            hosts,
            ports: 2,
            lmc: 1,
            fat_tree: Some(FatTree { levels, radix }),
            ..Topology::default()
        }
    }

    #[test]
    fn fat_trees_have_their_shape_and_route_every_pair_within_a_rail() {
        // 2 levels, radix 8: 4 hosts a leaf, 5 leaves for 20 hosts, 4 spines.
        let f = swept(&tree(20, 2, 8));
        assert_eq!(f.num_switches(), 2 * (5 + 4));
        assert_eq!(f.num_links(), 2 * (20 + 5 * 4));
        assert_eq!(f.switch_by_name("B.S3"), Ok(17));
        // 3 levels, radix 8: 4 hosts a leaf, 16 leaves, 4 pods of 4 aggregation
        // switches, 16 cores.
        let f3 = swept(&tree(64, 3, 8));
        assert_eq!(f3.num_switches(), 2 * (16 + 16 + 16));
        assert_eq!(f3.num_links(), 2 * (64 + 16 * 4 + 16 * 4));
        for f in [&f, &f3] {
            for a in 0..f.num_ports() {
                for b in (0..f.num_ports()).filter(|&b| b != a) {
                    let same_rail = f.ports[a].subnet == f.ports[b].subnet;
                    for (sb, db) in [(0, 0), (1, 1)] {
                        let hops = f.route(f.ports[a].lid + sb, f.ports[b].lid + db);
                        assert_eq!(hops.is_some(), same_rail, "{a} -> {b}");
                    }
                }
            }
        }
        // Leaf to leaf across pods: host, leaf, aggregation, core, aggregation, leaf,
        // host: 6 links.
        let (a, b) = (f3.port_of(0, 1).unwrap(), f3.port_of(63, 1).unwrap());
        assert_eq!(f3.route(f3.ports[a].lid, f3.ports[b].lid), Some(6));
    }

    #[test]
    fn a_fat_tree_spreads_destinations_over_the_uplinks() {
        let f = swept(&tree(64, 3, 8));
        let leaf = f.switch_by_name("A.L0").unwrap();
        let mut uplinks = std::collections::BTreeSet::new();
        for h in 4..8 {
            let p = f.port_of(h, 1).unwrap();
            uplinks.insert(f.switches[leaf].lft(f.ports[p].lid));
            // Its LMC variant leaves by another uplink.
            assert_ne!(
                f.switches[leaf].lft(f.ports[p].lid),
                f.switches[leaf].lft(f.ports[p].lid + 1)
            );
        }
        assert_eq!(uplinks.len(), 4, "four destinations, four uplinks");
    }

    #[test]
    fn a_dead_leaf_breaks_only_its_own_hosts_routes() {
        let mut f = swept(&tree(64, 3, 8));
        let leaf = f.switch_by_name("A.L1").unwrap();
        f.switches[leaf].up = false;
        for a in 0..64 {
            for b in 0..64 {
                if a == b {
                    continue;
                }
                let (pa, pb) = (f.port_of(a, 1).unwrap(), f.port_of(b, 1).unwrap());
                let ok = f.route(f.ports[pa].lid, f.ports[pb].lid).is_some();
                assert_eq!(ok, a / 4 != 1 && b / 4 != 1, "h{a} -> h{b}");
            }
        }
    }
}
