//! The fabric's shape as a scenario writes it: hosts, ports, LMC, switches, links and
//! where the SMs run. Plain data with defaults; [`crate::fabric::Fabric::build`] turns it
//! into the cabled fabric and rejects what cannot be built. Nothing here resolves a name.

use serde::{Deserialize, Serialize};

/// The fabric: hosts with HCA ports, switches, links.
///
/// Without `switches`/`links`, a rail fabric is generated: one switch per port number
/// (`A` for port 1, `B` for port 2), each its own subnet, every host's port `r` cabled
/// to switch `r`: the classic dual-rail layout where the two planes share nothing.
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
        }
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
