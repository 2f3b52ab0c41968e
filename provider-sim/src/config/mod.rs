//! Scenarios: the fabric, the workload and the faults, as users write them in TOML.
//!
//! Every key has a default (the built-in scenario is `Scenario::default()`), unknown keys
//! are errors, and every error names the line it comes from. See `scenarios/*.toml` in
//! this crate for documented examples. Nothing here runs anything: [`crate::Sim`] turns
//! a scenario into a simulation.
//!
//! `params.rs` holds the fabric's constants, `faults.rs` the faults and their resolution
//! against the fabric ([`Fault::target`]); the fabric's shape is [`crate::topology`].

mod faults;
mod params;
mod workload;

pub use crate::topology::{LinkSpec, SmSpec, SwitchSpec, Topology};
pub use faults::{Fault, RandomFaults, Target};
pub use params::FabricParams;
pub use workload::{Mode, Pattern, Workload};

use crate::fabric::Fabric;
use serde::{Deserialize, Serialize};

/// Every duration is kept in nanoseconds: cap it far below where that overflows (a
/// million seconds is eleven days of simulated time).
const MAX_MS: u64 = 1_000_000_000;

/// The most simulated time a scenario runs (one hour): far beyond any failover story,
/// and a bound on how long `apm simulate` works for one.
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// The most hosts a scenario has.
pub const MAX_HOSTS: usize = 4096;
/// The most switches a scenario declares.
pub const MAX_SWITCHES: usize = 4096;
/// The most links a scenario declares.
pub const MAX_LINKS: usize = 65_536;
/// The most subnet managers a scenario declares.
pub const MAX_SMS: usize = 1024;
/// The most connections a workload opens.
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// The most fabric changes the faults make once expanded (every flap's downs and ups,
/// the random faults at their largest), each an event kept from the start.
pub const MAX_FAULT_TRANSITIONS: u64 = 100_000;

/// Why a scenario file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// Not valid TOML, or a key/value of the wrong shape (the message has the line).
    #[error("{0}")]
    Parse(String),
    /// A value that cannot work, with the line it is on when known.
    #[error("{}{what}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Invalid {
        /// The offending line (1-based), if known.
        line: Option<usize>,
        /// What is wrong.
        what: String,
    },
}

fn invalid(what: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        line: None,
        what: what.into(),
    }
}

/// A whole scenario.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// A name for reports (a file without one is called "scenario").
    #[serde(default = "default_name")]
    pub name: String,
    /// Simulated time to run, in milliseconds.
    pub duration_ms: u64,
    /// The fabric's shape.
    pub topology: Topology,
    /// Timing and protocol constants of the fabric.
    pub fabric: FabricParams,
    /// The connections and their traffic.
    pub workload: Workload,
    /// Faults at fixed times, applied in time order. A file without any has none (it
    /// does not inherit the built-in demonstration's).
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Faults generated from the seed, added to `faults`.
    pub random_faults: Option<RandomFaults>,
    /// The engine policy apm runs with, as apm's configuration writes it (apm's
    /// defaults for what it leaves out: probes off, as on a real InfiniBand fabric).
    /// Without it, the simulator's policy ([`crate::controller::sim_policy`]).
    pub policy: Option<apm_core::Policy>,
    /// The policies `apm simulate` runs by default, by name (`apm`, `hw-only`,
    /// `reload-local`, `apm-wildcard`, `per-conn-sa`). Default: the first three.
    pub policies: Vec<String>,
}

fn default_name() -> String {
    "scenario".into()
}

impl Default for Scenario {
    /// The built-in demonstration: a dual-rail fabric of 16 hosts loses rail A's switch
    /// and gets it back, a remote port on rail B flaps (traps 65/64 reach the far ends),
    /// then rail B's master SM dies and its standby takes over.
    fn default() -> Scenario {
        Scenario {
            name: "dual-rail: rail A fails and returns, a remote port flaps, an SM fails over"
                .into(),
            duration_ms: 8000,
            topology: Topology::default(),
            // OpenSM's standby polling tuned down as a site that cares about failover
            // would: takeover 2-2.5 s after the master dies (50-60 s with the defaults).
            fabric: FabricParams {
                sminfo_polling_timeout_ms: 500,
                polling_retry_number: 2,
                ..FabricParams::default()
            },
            workload: Workload::default(),
            policy: None,
            policies: Vec::new(),
            faults: vec![
                Fault::SwitchDown {
                    at_ms: 500,
                    switch: "A".into(),
                },
                Fault::SwitchUp {
                    at_ms: 1500,
                    switch: "A".into(),
                },
                Fault::PortFlap {
                    at_ms: 2500,
                    port: "h3:2".into(),
                    down_ms: 600,
                    up_ms: 400,
                    count: 2,
                },
                Fault::SmFailover {
                    at_ms: 5000,
                    subnet: 1,
                },
            ],
            random_faults: None,
        }
    }
}

impl Scenario {
    /// Parse a scenario from TOML text. Errors name the line.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        if s.workload.connections_per_host.is_some() && gives_workload_connections(text) {
            return Err(ScenarioError::Invalid {
                line: key_line(text, "workload", "connections_per_host"),
                what: "workload: give connections or connections_per_host, not both".into(),
            });
        }
        if let Err(ScenarioError::Invalid { line: None, what }) = s.validate() {
            // Point at the line that holds the offending value when it can be found.
            let line = find_line(text, &what);
            return Err(ScenarioError::Invalid { line, what });
        }
        s.validate()?;
        Ok(s)
    }

    /// Check that names resolve and numbers are in range.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.validate_shape()?;
        self.validate_policies()?;
        self.validate_times()?;
        self.validate_fabric_params()?;
        // Names are resolved against the built fabric.
        let fabric = Fabric::build(&self.topology).map_err(|e| invalid(e.to_string()))?;
        self.validate_cabling(&fabric)?;
        for fault in &self.faults {
            fault.check(&fabric).map_err(invalid)?;
        }
        self.validate_random_faults()
    }

    /// What the fabric cannot mean: a host with no cabled port (nothing reaches it), an
    /// SM named on a subnet or a port that does not exist, or on a port of another
    /// subnet or without a cable (it would never run).
    fn validate_cabling(&self, fabric: &Fabric) -> Result<(), ScenarioError> {
        let uncabled: Vec<String> = (0..fabric.num_hosts())
            .filter(|&h| {
                (1..=fabric.ports_per_host())
                    .filter_map(|n| fabric.port_of(h, n))
                    .all(|p| fabric.ports[p].link.is_none())
            })
            .map(|h| format!("h{h}"))
            .collect();
        if !uncabled.is_empty() {
            let shown = uncabled
                .iter()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = uncabled.len().saturating_sub(8);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            return Err(invalid(format!(
                "topology.links: {} host(s) have no cabled port ({shown}{more}): cable \
                 each host to a switch",
                uncabled.len()
            )));
        }
        for sm in &self.topology.sm {
            if sm.subnet >= fabric.subnets() {
                return Err(invalid(format!(
                    "topology.sm: subnet {} does not exist (the fabric has {} subnet(s), \
                     0..{})",
                    sm.subnet,
                    fabric.subnets(),
                    fabric.subnets()
                )));
            }
            for name in &sm.ports {
                let p = fabric.port_by_name(name).map_err(|e| {
                    invalid(format!("{e}: an SM of subnet {} (topology.sm)", sm.subnet))
                })?;
                let port = &fabric.ports[p];
                if port.subnet != sm.subnet || port.link.is_none() {
                    return Err(invalid(format!(
                        "port \"{name}\" is not cabled into subnet {}: an SM of that subnet \
                         (topology.sm)",
                        sm.subnet
                    )));
                }
            }
        }
        Ok(())
    }

    /// The topology's and the workload's sizes.
    fn validate_shape(&self) -> Result<(), ScenarioError> {
        let t = &self.topology;
        if t.hosts < 2 {
            return Err(invalid(format!(
                "topology.hosts = {}: need at least 2 hosts",
                t.hosts
            )));
        }
        if t.hosts > MAX_HOSTS {
            return Err(invalid(format!(
                "topology.hosts = {}: at most {MAX_HOSTS} hosts",
                t.hosts
            )));
        }
        let counts = [
            (
                "topology.switches",
                t.switches.len(),
                MAX_SWITCHES,
                "switches",
            ),
            ("topology.links", t.links.len(), MAX_LINKS, "links"),
            ("topology.sm", t.sm.len(), MAX_SMS, "subnet managers"),
        ];
        for (key, n, max, what) in counts {
            if n > max {
                return Err(invalid(format!("{key}: {n} {what}, at most {max}")));
            }
        }
        if !(1..=2).contains(&t.ports) {
            return Err(invalid(format!(
                "topology.ports = {}: hosts have 1 or 2 ports",
                t.ports
            )));
        }
        if t.lmc > 2 {
            return Err(invalid(format!("topology.lmc = {}: use 0, 1 or 2", t.lmc)));
        }
        if self.workload.message_interval_ms == 0 {
            return Err(invalid(
                "workload.message_interval_ms = 0: must be at least 1",
            ));
        }
        let w = &self.workload;
        w.pattern.check(t.hosts).map_err(invalid)?;
        let n = w.count(t.hosts);
        if n > MAX_CONNECTIONS {
            return Err(invalid(match w.connections_per_host {
                Some(per_host) => format!(
                    "workload.connections_per_host = {per_host}: {n} connections, at most \
                     {MAX_CONNECTIONS}"
                ),
                None => format!("workload.connections = {n}: at most {MAX_CONNECTIONS}"),
            }));
        }
        self.validate_fat_tree()?;
        if self.duration_ms == 0 {
            return Err(invalid("duration_ms = 0: nothing to simulate"));
        }
        if self.duration_ms > MAX_DURATION_MS {
            return Err(invalid(format!(
                "duration_ms = {}: at most {MAX_DURATION_MS} ms (one hour of simulated time)",
                self.duration_ms
            )));
        }
        // Before anything is expanded: a flap's count can ask for billions of changes.
        let fixed = self.faults.iter().map(Fault::transitions);
        // A random fault is at most a flap of 3 (6 changes).
        let random = self
            .random_faults
            .as_ref()
            .map_or(0, |r| 6 * u64::from(r.count));
        let transitions = fixed.fold(random, u64::saturating_add);
        if transitions > MAX_FAULT_TRANSITIONS {
            return Err(invalid(format!(
                "faults: {transitions} port, link or switch changes once every flap and \
                 random fault is expanded, at most {MAX_FAULT_TRANSITIONS}"
            )));
        }
        Ok(())
    }

    /// The engine policy's ranges and the policies' names.
    fn validate_policies(&self) -> Result<(), ScenarioError> {
        if let Some(p) = &self.policy {
            p.validate()
                .map_err(|e| invalid(e.to_string().replace("policy setting `", "policy.")))?;
        }
        self.run_policies().map(|_| ())
    }

    /// The policies `policies` names, or apm and the two baselines.
    pub fn run_policies(&self) -> Result<Vec<crate::PolicyKind>, ScenarioError> {
        if self.policies.is_empty() {
            return Ok(crate::PolicyKind::ALL.to_vec());
        }
        let mut out = Vec::new();
        for name in &self.policies {
            let kind = crate::PolicyKind::from_name(name).ok_or_else(|| {
                let all: Vec<&str> = crate::PolicyKind::EVERY.iter().map(|k| k.name()).collect();
                invalid(format!(
                    "policies = \"{name}\": not a policy (use {})",
                    all.join(", ")
                ))
            })?;
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        Ok(out)
    }

    /// The engine policy apm runs with in this scenario.
    pub fn engine_policy(&self) -> apm_core::Policy {
        self.policy
            .clone()
            .unwrap_or_else(crate::controller::sim_policy)
    }

    /// A generated fat tree's shape, and its size against the limits, before it is
    /// built.
    fn validate_fat_tree(&self) -> Result<(), ScenarioError> {
        let t = &self.topology;
        let Some(ft) = &t.fat_tree else {
            return Ok(());
        };
        if !t.switches.is_empty() || !t.links.is_empty() {
            return Err(invalid(
                "topology.fat_tree is given with topology.switches or topology.links: use \
                 one or the other",
            ));
        }
        ft.check(t.hosts).map_err(invalid)?;
        let shape = ft.shape(t.hosts);
        let rails = usize::from(t.ports);
        let switches = shape.tiers.len() * rails;
        let links = (t.hosts + shape.uplinks.len()) * rails;
        if switches > MAX_SWITCHES || links > MAX_LINKS {
            return Err(invalid(format!(
                "topology.fat_tree.radix = {}: {switches} switches and {links} links for \
                 {} hosts on {rails} rail(s), at most {MAX_SWITCHES} switches and \
                 {MAX_LINKS} links",
                ft.radix, t.hosts
            )));
        }
        Ok(())
    }

    /// Every duration below [`MAX_MS`].
    fn validate_times(&self) -> Result<(), ScenarioError> {
        let f = &self.fabric;
        let times: [(&str, u64); 21] = [
            ("duration_ms", self.duration_ms),
            (
                "workload.message_interval_ms",
                self.workload.message_interval_ms,
            ),
            ("fabric.hop_latency_us", f.hop_latency_us),
            ("fabric.mad_processing_us", f.mad_processing_us),
            ("fabric.command_latency_us", f.command_latency_us),
            ("fabric.event_latency_us", f.event_latency_us),
            ("fabric.sweep_interval_ms", f.sweep_interval_ms),
            ("fabric.trap_sweep_delay_ms", f.trap_sweep_delay_ms),
            ("fabric.report_timeout_ms", f.report_timeout_ms),
            ("fabric.sm_failover_ms", f.sm_failover_ms.unwrap_or(0)),
            ("fabric.smp_rtt_us", f.smp_rtt_us),
            ("fabric.transaction_timeout_ms", f.transaction_timeout_ms),
            (
                "fabric.transaction_retries",
                u64::from(f.transaction_retries),
            ),
            (
                "fabric.sminfo_polling_timeout_ms",
                f.sminfo_polling_timeout_ms,
            ),
            (
                "fabric.polling_retry_number",
                u64::from(f.polling_retry_number),
            ),
            ("fabric.sa_fifo_timeout_ms", f.sa_fifo_timeout_ms),
            ("fabric.max_wire_smps", u64::from(f.max_wire_smps)),
            ("fabric.sa_timeout_ms", f.sa_timeout_ms),
            ("fabric.report_retries", u64::from(f.report_retries)),
            ("fabric.sa_tries", u64::from(f.sa_tries)),
            ("fabric.sa_rate_per_s", f.sa_rate_per_s),
        ];
        for (name, v) in times {
            if v > MAX_MS {
                return Err(invalid(format!("{name} = {v}: too large for a simulation")));
            }
        }
        for fault in &self.faults {
            if fault.end_ms() > MAX_MS {
                return Err(invalid(format!(
                    "a fault at {} ms ends after {MAX_MS} ms: too late for a simulation",
                    fault.at_ms()
                )));
            }
        }
        Ok(())
    }

    /// The fabric constants' ranges.
    fn validate_fabric_params(&self) -> Result<(), ScenarioError> {
        let f = &self.fabric;
        if f.ack_timeout > 31 || f.ack_timeout == 0 {
            return Err(invalid(format!(
                "fabric.ack_timeout = {}: use 1..=31",
                f.ack_timeout
            )));
        }
        if !(0.0..=1.0).contains(&f.mad_loss) {
            return Err(invalid(format!(
                "fabric.mad_loss = {}: a probability in 0..=1",
                f.mad_loss
            )));
        }
        let at_least_one: [(&str, u64); 7] = [
            ("fabric.sweep_interval_ms", f.sweep_interval_ms),
            ("fabric.sa_tries", u64::from(f.sa_tries)),
            ("fabric.report_timeout_ms", f.report_timeout_ms),
            ("fabric.sa_rate_per_s", f.sa_rate_per_s),
            ("fabric.max_wire_smps", u64::from(f.max_wire_smps)),
            ("fabric.transaction_timeout_ms", f.transaction_timeout_ms),
            (
                "fabric.sminfo_polling_timeout_ms",
                f.sminfo_polling_timeout_ms,
            ),
        ];
        for (name, v) in at_least_one {
            if v == 0 {
                return Err(invalid(format!("{name} = 0: must be at least 1")));
            }
        }
        if f.subnet_timeout > 31 {
            return Err(invalid(format!(
                "fabric.subnet_timeout = {}: use 0..=31",
                f.subnet_timeout
            )));
        }
        Ok(())
    }

    fn validate_random_faults(&self) -> Result<(), ScenarioError> {
        if let Some(r) = &self.random_faults {
            if r.end_ms < r.start_ms {
                return Err(invalid("random_faults.end_ms is before start_ms"));
            }
            if r.end_ms > MAX_MS || r.max_outage_ms > MAX_MS || r.count > 100_000 {
                return Err(invalid(
                    "random_faults: too many or too late for a simulation",
                ));
            }
        }
        Ok(())
    }

    /// Every fault to apply: the fixed ones and those generated from `seed`.
    pub fn all_faults(&self, seed: u64) -> Vec<Fault> {
        let mut faults = self.faults.clone();
        if let Some(r) = &self.random_faults {
            // Built from a sub-stream so the faults of a seed do not depend on anything
            // else the simulation draws.
            let fabric = match Fabric::build(&self.topology) {
                Ok(f) => f,
                Err(_) => return faults,
            };
            faults.extend(faults::generate_faults(&fabric, r, seed));
        }
        faults.sort_by_key(Fault::at_ms);
        faults
    }
}

/// True when the `[workload]` table of `text` sets `connections` (a valid document).
fn gives_workload_connections(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("workload")?.get("connections").cloned())
        .is_some()
}

/// The 1-based line that sets `key` in table `table` (`"topology.fat_tree"`), written
/// as its own `[table]` section, or inline in its parent's (`fat_tree = { key = .. }`,
/// or `fat_tree.key = ..`).
fn key_line(text: &str, table: &str, key: &str) -> Option<usize> {
    let header = |l: &str| {
        let l = l.trim();
        l.starts_with('[')
            .then(|| l.trim_matches(['[', ']']).trim().to_owned())
    };
    let sets = |l: &str, key: &str| {
        let l = l.trim_start();
        l.strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with(['=', '.']))
    };
    let mut section = String::new();
    let (parent, leaf) = table.rsplit_once('.').unwrap_or(("", table));
    let mut inline = None;
    for (i, l) in text.lines().enumerate() {
        if let Some(h) = header(l) {
            section = h;
            continue;
        }
        if l.trim_start().starts_with('#') {
            continue;
        }
        if section == table && sets(l, key) {
            return Some(i + 1);
        }
        if section == parent && sets(l, leaf) && inline.is_none() {
            inline = Some(i + 1);
        }
    }
    inline
}

/// The line of a `table.key = value: why` message's key, when the message has that
/// form and the key is in `text`.
fn dotted_key_line(text: &str, what: &str) -> Option<usize> {
    let (path, _) = what.split_once(" = ")?;
    if path.contains(' ') {
        return None;
    }
    let (table, key) = path.rsplit_once('.').unwrap_or(("", path));
    key_line(text, table, key)
}

/// The 1-based line of the first line of `text` that contains a quoted name or number
/// mentioned in `what` (best effort: validation works on parsed values); a
/// `table.key = value` message points at the line setting that key.
fn find_line(text: &str, what: &str) -> Option<usize> {
    if let Some(line) = dotted_key_line(text, what) {
        return Some(line);
    }
    let needles: Vec<&str> = what
        .split(['"', ' ', ':', ','])
        .filter(|w| w.len() >= 2 && !w.chars().all(|c| c.is_ascii_lowercase()))
        .collect();
    for needle in needles {
        if let Some((i, _)) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(needle) && !l.trim_start().starts_with('#'))
        {
            return Some(i + 1);
        }
    }
    // Fall back on a `key = value` from the message.
    let key = what.split([' ', '=']).next()?.rsplit('.').next()?;
    text.lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with(key))
        .map(|(i, _)| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_validates() {
        Scenario::default().validate().unwrap();
    }

    #[test]
    fn absurd_numbers_are_errors_not_overflows() {
        for text in [
            "duration_ms = 18446744073709551615\n",
            "[fabric]\nhop_latency_us = 18446744073709551615\n",
            "[[faults]]\nkind = \"port_flap\"\nat_ms = 1\nport = \"h1:1\"\ndown_ms = 18446744073709551615\nup_ms = 1\ncount = 9\n",
            "[random_faults]\nend_ms = 18446744073709551615\n",
        ] {
            assert!(Scenario::from_toml(text).is_err(), "{text}");
        }
    }

    #[test]
    fn counts_are_refused_before_anything_is_built_and_the_limit_is_named() {
        let flap = "[[faults]]\nkind = \"port_flap\"\nat_ms = 1\nport = \"h1:1\"\n\
                    down_ms = 1\nup_ms = 1\ncount = 4294967295\n";
        let mut switches = String::new();
        for i in 0..=MAX_SWITCHES {
            switches.push_str(&format!(
                "[[topology.switches]]\nname = \"S{i}\"\nsubnet = 0\n"
            ));
        }
        for (text, limit) in [
            (flap.to_owned(), MAX_FAULT_TRANSITIONS.to_string()),
            (switches, MAX_SWITCHES.to_string()),
            (
                "duration_ms = 3600001\n".to_owned(),
                MAX_DURATION_MS.to_string(),
            ),
            (
                "[workload]\nconnections = 1000001\n".to_owned(),
                MAX_CONNECTIONS.to_string(),
            ),
            (
                "[random_faults]\ncount = 20000\n".to_owned(),
                MAX_FAULT_TRANSITIONS.to_string(),
            ),
        ] {
            let e = Scenario::from_toml(&text)
                .expect_err("over a limit")
                .to_string();
            assert!(e.contains(&format!("at most {limit}")), "{e}");
        }
    }

    #[test]
    fn fabrics_that_cannot_mean_what_they_say_are_refused_at_their_line() {
        let sw =
            "[topology]\nhosts = 2\nports = 1\n[[topology.switches]]\nname = \"S\"\nsubnet = 0\n";
        // No cable at all: nothing reaches the hosts.
        let e = Scenario::from_toml(sw).unwrap_err().to_string();
        assert!(e.contains("2 host(s) have no cabled port (h0, h1)"), "{e}");
        let cabled = format!(
            "{sw}[[topology.links]]\na = \"S\"\nb = \"h0:1\"\n\
             [[topology.links]]\na = \"S\"\nb = \"h1:1\"\n"
        );
        Scenario::from_toml(&cabled).expect("cabled");
        for (sm, want, line) in [
            (
                "subnet = 0\nports = [\"h9:1\"]\n",
                "\"h9:1\" does not exist",
                15,
            ),
            (
                "subnet = 3\nports = [\"h0:1\"]\n",
                "subnet 3 does not exist",
                0,
            ),
        ] {
            let text = format!("{cabled}[[topology.sm]]\n{sm}");
            let e = Scenario::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            if line > 0 {
                assert!(e.starts_with(&format!("line {line}:")), "{e}");
            }
        }
    }

    #[test]
    fn fat_trees_and_patterns_are_checked_at_their_line() {
        let ft = "[topology]\nhosts = 64\n[topology.fat_tree]\nlevels = 3\nradix = 8\n";
        Scenario::from_toml(ft).expect("a 64-host tree of radix 8");
        for (text, want, line) in [
            (ft.replace("radix = 8", "radix = 7"), "even number", 5),
            (ft.replace("levels = 3", "levels = 4"), "use 2 or 3", 4),
            (
                ft.replace("levels = 3", "levels = 2"),
                "holds at most 32",
                5,
            ),
            (
                "[topology]\nhosts = 8\nfat_tree = { levels = 2, radix = 3 }\n".into(),
                "even number",
                3,
            ),
            (
                format!("{ft}[workload]\npattern = {{ kind = \"all_to_all\", group = 1 }}\n"),
                "a group has 2 to 64 hosts",
                7,
            ),
            (
                format!("{ft}[workload.pattern]\nkind = \"neighbours\"\nwidth = 3\n"),
                "an even number of neighbours",
                8,
            ),
            (
                format!("{ft}[workload]\nconnections_per_host = 20000\n"),
                "1280000 connections, at most 1000000",
                7,
            ),
            (
                format!("{ft}[workload]\nconnections = 5\nconnections_per_host = 2\n"),
                "not both",
                8,
            ),
            (
                format!("{ft}[[topology.switches]]\nname = \"X\"\nsubnet = 0\n"),
                "one or the other",
                0,
            ),
        ] {
            let e = Scenario::from_toml(&text).expect_err(&text).to_string();
            assert!(e.contains(want), "{e}");
            if line > 0 {
                assert!(e.starts_with(&format!("line {line}:")), "{text}\n{e}");
            }
        }
    }

    #[test]
    fn bad_toml_names_the_line() {
        let e = Scenario::from_toml("name = \"x\"\nduration_ms = \"long\"\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = Scenario::from_toml("[topology]\nhostz = 3\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let text = "[[faults]]\nkind = \"switch_down\"\nat_ms = 5\nswitch = \"Q\"\n";
        let e = Scenario::from_toml(text).unwrap_err();
        assert!(e.to_string().contains("line 4"), "{e}");
    }
}
