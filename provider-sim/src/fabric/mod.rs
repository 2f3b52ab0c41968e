//! The physical fabric: host ports, switches, links, LIDs and forwarding tables.
//!
//! This module knows what is cabled to what, what is up, and how a packet with a given
//! DLID travels (through the linear forwarding tables the SM last programmed). It knows
//! nothing about QPs or the SM's protocol: `crate::sim` drives it. Routing is faithful in
//! the one way that matters for APM: forwarding tables are only recomputed by an SM
//! sweep, so between a failure and the next sweep packets still head into the dead link.

mod build;
mod routing;

pub use build::{LinkEnd, Part, TopologyProblem};

use apm_core::{Gid, Lid, PortKey};

/// Why a topology cannot be built, or a name does not resolve against the fabric.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// Explicit links need explicit switches.
    #[error("topology.links given without topology.switches")]
    LinksWithoutSwitches,
    /// More LIDs than the unicast range holds.
    #[error("too many ports for the unicast LID space")]
    LidSpaceExhausted,
    /// Two switches with one name.
    #[error("switch \"{0}\" is declared twice")]
    SwitchDeclaredTwice(String),
    /// A switch named like a host port.
    #[error("switch \"{0}\": names like h3 are host ports; choose another name")]
    SwitchNamedLikeHost(String),
    /// A switch in a subnet out of range.
    #[error("switch \"{name}\": subnet {subnet} (use 0..63)")]
    SubnetOutOfRange {
        /// The switch.
        name: String,
        /// Its subnet.
        subnet: usize,
    },
    /// A host port with two links.
    #[error("port {0} is cabled twice")]
    CabledTwice(String),
    /// A link between two host ports.
    #[error("a link between two host ports needs a switch between them")]
    HostToHost,
    /// A link between switches of two subnets.
    #[error("link {0}-{1} joins two subnets (IB routers are not simulated)")]
    JoinsSubnets(String, String),
    /// Not written like a host port.
    #[error("\"{0}\" is not a host port (write it like \"h3:1\")")]
    NotAPortName(String),
    /// A host port beyond the fabric.
    #[error("port \"{name}\" does not exist ({hosts} hosts with {ports} ports)")]
    NoSuchPort {
        /// The name given.
        name: String,
        /// Hosts in the fabric.
        hosts: usize,
        /// Ports per host.
        ports: u8,
    },
    /// Not written like a host.
    #[error("\"{0}\" is not a host (write it like \"h3\")")]
    NotAHostName(String),
    /// A host beyond the fabric.
    #[error("host \"{0}\" does not exist")]
    NoSuchHost(String),
    /// No switch of that name.
    #[error("switch \"{0}\" does not exist")]
    NoSuchSwitch(String),
    /// No link between those ends.
    #[error("no link \"{0}\"")]
    NoSuchLink(String),
    /// Not written like a link.
    #[error("\"{0}\" is not a link (write it like \"h3:1-A\", \"A-B\" or \"h3:1\")")]
    NotALinkName(String),
    /// A switch name that would make link names ambiguous.
    #[error("switch \"{0}\": a switch name is not empty and has no '-' or ':' (links are named \"A-B\", ports \"h3:1\")")]
    BadSwitchName(String),
    /// A host port without a cable.
    #[error("port \"{0}\" has no link")]
    PortWithoutLink(String),
    /// A switch with more links than its forwarding table can name.
    #[error("switch \"{0}\" has more than 65,534 links")]
    TooManyLinksOnSwitch(String),
    /// A generated fat tree together with explicit switches or links.
    #[error(
        "topology.fat_tree is given with topology.switches or topology.links: use one or the other"
    )]
    FatTreeWithSwitches,
    /// A fat tree that cannot hold the hosts, or of an impossible shape.
    #[error("topology.fat_tree.{key}: {0}", key = .0.key())]
    FatTree(#[from] crate::topology::FatTreeError),
}

/// Index of a host port in [`Fabric::ports`].
pub type PortId = usize;
/// Index of a switch.
pub type SwitchId = usize;
/// Index of a link.
pub type LinkId = usize;

/// One end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// A host port.
    Port(PortId),
    /// A switch.
    Switch(SwitchId),
}

/// Logical state of a host port (IBA PortState, reduced to what software sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// No physical link.
    Down,
    /// Physical link up, waiting for the SM to activate it.
    Init,
    /// Active: traffic flows.
    Active,
}

/// A host's HCA port.
#[derive(Clone, Debug)]
pub struct HostPort {
    /// The host.
    pub host: usize,
    /// 1-based port number.
    pub num: u8,
    /// Its subnet (the subnet of the switch it is cabled to; 0 when uncabled).
    pub subnet: usize,
    /// Its GID (subnet prefix of its subnet + port GUID).
    pub gid: Gid,
    /// Base LID.
    pub lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Not failed (the fault injector's switch).
    pub admin_up: bool,
    /// The link cabled to it.
    pub link: Option<LinkId>,
    /// Logical state.
    pub state: PortState,
}

impl HostPort {
    /// The engine's key for this port (every host has one HCA, device 0).
    pub fn key(&self) -> PortKey {
        PortKey::new(0, self.num)
    }

    /// The port's LIDs, base first.
    pub fn lids(&self) -> impl Iterator<Item = u16> + '_ {
        (0..(1u16 << self.lmc)).map(move |b| self.lid + b)
    }
}

/// A switch.
#[derive(Clone, Debug)]
pub struct Switch {
    /// Name from the topology.
    pub name: String,
    /// Subnet.
    pub subnet: usize,
    /// Powered and working.
    pub up: bool,
    /// Powered, its links up, its management answering the SM, but dropping every
    /// packet it should forward (a corrupt forwarding table, a firmware fault).
    pub black_hole: bool,
    /// Links attached, in the order they were declared (ECMP choices index this).
    pub links: Vec<LinkId>,
    /// Linear forwarding table: DLID -> the index in `links` of the link it leaves by
    /// ([`NO_ROUTE`]: none), as last programmed by the SM. Two bytes an entry: a
    /// 4,096-host fabric has a few thousand switches of 8,000 LIDs each.
    lft: Vec<u16>,
}

/// An LFT entry with no route.
const NO_ROUTE: u16 = u16::MAX;

impl Switch {
    /// The link the forwarding table sends `dlid` out of.
    pub fn lft(&self, dlid: u16) -> Option<LinkId> {
        let i = *self.lft.get(usize::from(dlid))?;
        (i != NO_ROUTE).then(|| self.links[usize::from(i)])
    }
}

/// How the SM spreads a destination over equal-cost next hops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Routing {
    /// By the destination LID's path bits alone (OpenSM's min-hop on the explicit
    /// fabrics: a port's LMC variants take different routes).
    PathBits,
    /// By the destination host plus its path bits (OpenSM's fat-tree engine, `ftree`:
    /// every destination has its own uplink, so a spine carries a share of the
    /// traffic; a port's LMC variants still differ).
    FatTree,
}

/// A cable.
#[derive(Clone, Debug)]
pub struct Link {
    /// One end.
    pub a: End,
    /// The other end.
    pub b: End,
    /// Not cut.
    pub intact: bool,
}

/// The whole physical fabric.
#[derive(Clone, Debug)]
pub struct Fabric {
    /// Host ports, in (host, port) order.
    pub ports: Vec<HostPort>,
    /// Switches.
    pub switches: Vec<Switch>,
    /// Links.
    pub links: Vec<Link>,
    hosts: usize,
    ports_per_host: u8,
    subnets: usize,
    /// LID -> port owning it.
    lid_owner: Vec<Option<PortId>>,
    /// For each link, its index in each switch end's `links` (host ends: unused).
    end_index: Vec<[u16; 2]>,
    routing: Routing,
}

/// A subnet's GID prefix: fe80::/64 with the subnet number in the last 16 bits, so
/// the two rails of a dual-rail fabric have distinct prefixes as real deployments do.
pub(crate) fn subnet_prefix(subnet: usize) -> u64 {
    0xfe80_0000_0000_0000 | subnet as u64
}

/// The port GUID of host `h` port `p`.
pub fn port_guid(host: usize, port: u8) -> u64 {
    0x0002_c903_0000_0000 | ((host as u64) << 8) | u64::from(port)
}

impl Fabric {
    pub(crate) fn pid(&self, host: usize, port: u8) -> PortId {
        host * usize::from(self.ports_per_host) + usize::from(port) - 1
    }

    /// The port a `"h3:1"` name refers to.
    pub fn port_by_name(&self, name: &str) -> Result<PortId, FabricError> {
        let bad = || FabricError::NotAPortName(name.into());
        let rest = name.strip_prefix('h').ok_or_else(bad)?;
        let (h, p) = rest.split_once(':').ok_or_else(bad)?;
        let h: usize = h.parse().map_err(|_| bad())?;
        let p: u8 = p.parse().map_err(|_| bad())?;
        if h >= self.hosts || p == 0 || p > self.ports_per_host {
            return Err(FabricError::NoSuchPort {
                name: name.into(),
                hosts: self.hosts,
                ports: self.ports_per_host,
            });
        }
        Ok(self.pid(h, p))
    }

    /// The host a `"h3"` name refers to.
    pub fn host_by_name(&self, name: &str) -> Result<usize, FabricError> {
        let h: usize = name
            .strip_prefix('h')
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| FabricError::NotAHostName(name.into()))?;
        if h >= self.hosts {
            return Err(FabricError::NoSuchHost(name.into()));
        }
        Ok(h)
    }

    /// The switch called `name`.
    pub fn switch_by_name(&self, name: &str) -> Result<SwitchId, FabricError> {
        self.switches
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| FabricError::NoSuchSwitch(name.into()))
    }

    pub(crate) fn end_by_name(&self, name: &str) -> Result<End, FabricError> {
        if name.contains(':') {
            self.port_by_name(name).map(End::Port)
        } else {
            self.switch_by_name(name).map(End::Switch)
        }
    }

    /// The link a `"h3:1-A"` / `"A-B"` / `"h3:1"` name refers to.
    pub fn link_by_name(&self, name: &str) -> Result<LinkId, FabricError> {
        if let Some((a, b)) = name.split_once('-') {
            if a.is_empty() || b.is_empty() || b.contains('-') {
                return Err(FabricError::NotALinkName(name.into()));
            }
            let (a, b) = (self.end_by_name(a)?, self.end_by_name(b)?);
            return self
                .links
                .iter()
                .position(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a))
                .ok_or_else(|| FabricError::NoSuchLink(name.into()));
        }
        let p = self.port_by_name(name)?;
        self.ports[p]
            .link
            .ok_or_else(|| FabricError::PortWithoutLink(name.into()))
    }

    /// `"h3:1"`.
    pub fn port_name(&self, p: PortId) -> String {
        format!("h{}:{}", self.ports[p].host, self.ports[p].num)
    }

    fn end_name(&self, e: End) -> String {
        match e {
            End::Port(p) => self.port_name(p),
            End::Switch(s) => self.switches[s].name.clone(),
        }
    }

    /// `"h3:1-A"`.
    pub fn link_name(&self, l: LinkId) -> String {
        format!(
            "{}-{}",
            self.end_name(self.links[l].a),
            self.end_name(self.links[l].b)
        )
    }

    /// A switch's name.
    pub fn switch_name(&self, s: SwitchId) -> String {
        self.switches[s].name.clone()
    }

    /// Number of subnets.
    pub fn subnets(&self) -> usize {
        self.subnets
    }

    /// Number of hosts.
    pub fn num_hosts(&self) -> usize {
        self.hosts
    }

    /// Ports per host.
    pub fn ports_per_host(&self) -> u8 {
        self.ports_per_host
    }

    /// Number of host ports.
    pub fn num_ports(&self) -> usize {
        self.ports.len()
    }

    /// Number of links.
    pub fn num_links(&self) -> usize {
        self.links.len()
    }

    /// Number of switches.
    pub fn num_switches(&self) -> usize {
        self.switches.len()
    }

    /// The port of host `h` numbered `num`, if it exists.
    pub fn port_of(&self, host: usize, num: u8) -> Option<PortId> {
        (host < self.hosts && num >= 1 && num <= self.ports_per_host).then(|| self.pid(host, num))
    }

    /// The number of LIDs the forwarding tables cover (the highest assigned LID + 1).
    pub fn lid_space(&self) -> usize {
        self.lid_owner.len()
    }

    /// The subnet a link belongs to (that of the switch at either end).
    pub fn link_subnet(&self, l: LinkId) -> Option<usize> {
        let link = &self.links[l];
        [link.a, link.b].into_iter().find_map(|e| match e {
            End::Switch(s) => Some(self.switches[s].subnet),
            End::Port(_) => None,
        })
    }

    /// The port owning `lid`.
    pub fn lid_owner(&self, lid: u16) -> Option<PortId> {
        self.lid_owner.get(usize::from(lid)).copied().flatten()
    }

    /// The port whose GID is `gid`.
    pub fn port_by_gid(&self, gid: &Gid) -> Option<PortId> {
        let guid = gid.guid();
        let host = ((guid >> 8) & 0xFFFF) as usize;
        let num = (guid & 0xFF) as u8;
        let p = self.port_of(host, num)?;
        (self.ports[p].gid == *gid).then_some(p)
    }

    /// The end of `link` that is not `this`.
    pub fn other_end(&self, link: LinkId, this: End) -> End {
        let l = &self.links[link];
        if l.a == this {
            l.b
        } else {
            l.a
        }
    }

    fn end_alive(&self, e: End) -> bool {
        match e {
            End::Port(p) => self.ports[p].admin_up,
            End::Switch(s) => self.switches[s].up,
        }
    }

    /// The link carries light: intact and both ends alive.
    pub fn link_up(&self, l: LinkId) -> bool {
        let link = &self.links[l];
        link.intact && self.end_alive(link.a) && self.end_alive(link.b)
    }

    /// The port has a physical link.
    pub fn port_phys_up(&self, p: PortId) -> bool {
        self.ports[p].link.is_some_and(|l| self.link_up(l))
    }

    /// A path record from port `src` (LID variant `sbits`) to port `dst` (`dbits`), as
    /// the engine wants it: written from `src`'s side.
    pub fn path(
        &self,
        src: PortId,
        sbits: u16,
        dst: PortId,
        dbits: u16,
        ack_timeout: u8,
    ) -> apm_core::Path {
        let s = &self.ports[src];
        let d = &self.ports[dst];
        apm_core::Path::ib(
            s.key(),
            (Lid::from_wire(s.lid + sbits), s.gid),
            (Lid::from_wire(d.lid + dbits), d.gid),
            apm_core::Path::MTU_2048,
            ack_timeout,
        )
    }

    /// Every path between two ports (all LID variant pairs), base LIDs first, as an SA
    /// answers a PathRecord GetTable.
    pub fn all_paths(&self, src: PortId, dst: PortId, ack_timeout: u8) -> Vec<apm_core::Path> {
        let mut out = Vec::new();
        if self.ports[src].subnet != self.ports[dst].subnet {
            return out;
        }
        for sb in 0..(1u16 << self.ports[src].lmc) {
            for db in 0..(1u16 << self.ports[dst].lmc) {
                out.push(self.path(src, sb, dst, db, ack_timeout));
            }
        }
        out
    }
}
