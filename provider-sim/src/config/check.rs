//! What a scenario cannot mean, every problem found (not only the first), each with
//! the key it is about ([`KeyPath`]), so that a file's reader can point at the line that
//! says it and a scenario built in code still names the setting. Limits come first:
//! nothing is built for a scenario over one (the fabric of 100,000 switches is not).

use super::{
    Fault, Scenario, MAX_CONNECTIONS, MAX_DURATION_MS, MAX_FAULT_TRANSITIONS, MAX_HOSTS, MAX_LINKS,
    MAX_MS, MAX_SMS, MAX_SWITCHES,
};
use crate::fabric::{Fabric, FabricError, LinkEnd, Part};
use toml_located::KeyPath;

/// One problem: the key it is about and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Issue {
    pub at: At,
    pub message: String,
}

/// What an [`Issue`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum At {
    /// A key outside the faults.
    Key(KeyPath),
    /// The `i`th fault of the scenario, one of its keys (`None`: the fault as a whole).
    Fault(usize, Option<&'static str>),
}

impl At {
    /// The key, the `i`th fault being the one `fault` names.
    pub fn key(&self, fault: impl Fn(usize) -> KeyPath) -> KeyPath {
        match self {
            At::Key(k) => k.clone(),
            At::Fault(i, None) => fault(*i),
            At::Fault(i, Some(k)) => fault(*i).key(k),
        }
    }
}

/// Which checks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checks {
    /// Every check.
    All,
    /// Not the ones that build the fabric and resolve names against it: the topology
    /// as read is incomplete (a switch that could not be read would show as missing).
    Values,
}

#[derive(Default)]
struct Found(Vec<Issue>);

impl Found {
    fn at(&mut self, key: KeyPath, message: impl Into<String>) {
        self.0.push(Issue {
            at: At::Key(key),
            message: message.into(),
        });
    }

    /// About fault `i`'s `key` (or the fault as a whole).
    fn fault(&mut self, i: usize, key: Option<&'static str>, message: impl Into<String>) {
        self.0.push(Issue {
            at: At::Fault(i, key),
            message: message.into(),
        });
    }
}

/// What a name in `policies` that is no policy gets.
pub(super) fn not_a_policy(name: &str) -> String {
    let all: Vec<&str> = crate::PolicyKind::EVERY.iter().map(|k| k.name()).collect();
    format!("\"{name}\" is not a policy (use {})", all.join(", "))
}

fn key(dotted: &str) -> KeyPath {
    let mut parts = dotted.split('.');
    let first = KeyPath::new(parts.next().unwrap_or_default());
    parts.fold(first, |p, k| p.key(k))
}

/// What a number counts, from its key's name (`_ms`, `_us`), for messages.
fn unit(name: &str) -> &'static str {
    if name.ends_with("_ms") {
        " ms"
    } else if name.ends_with("_us") {
        " us"
    } else {
        ""
    }
}

impl Scenario {
    /// Every problem of the scenario.
    pub(crate) fn issues(&self, checks: Checks) -> Vec<Issue> {
        let mut found = Found::default();
        self.check_sizes(&mut found);
        let sized = found.0.is_empty();
        self.check_times(&mut found);
        self.check_fabric_params(&mut found);
        self.check_random_faults(&mut found);
        self.check_bursts(&mut found);
        self.check_fault_values(&mut found);
        self.check_policies(&mut found);
        if sized && checks == Checks::All {
            self.check_names(&mut found);
        }
        found.0
    }

    /// The topology's and the workload's sizes, the faults once expanded.
    fn check_sizes(&self, found: &mut Found) {
        let t = &self.topology;
        let topo = KeyPath::new("topology");
        if t.hosts < 2 {
            found.at(
                topo.key("hosts"),
                format!("{} host(s): need at least 2", t.hosts),
            );
        }
        if t.hosts > MAX_HOSTS {
            found.at(
                topo.key("hosts"),
                format!("{} hosts: at most {MAX_HOSTS} hosts", t.hosts),
            );
        }
        for (k, n, max, what) in [
            ("switches", t.switches.len(), MAX_SWITCHES, "switches"),
            ("links", t.links.len(), MAX_LINKS, "links"),
            ("sm", t.sm.len(), MAX_SMS, "subnet managers"),
        ] {
            if n > max {
                found.at(topo.key(k), format!("{n} {what}, at most {max}"));
            }
        }
        if !(1..=2).contains(&t.ports) {
            found.at(
                topo.key("ports"),
                format!("{} ports: hosts have 1 or 2 ports", t.ports),
            );
        }
        if t.lmc > 2 {
            found.at(topo.key("lmc"), format!("{}: use 0, 1 or 2", t.lmc));
        }
        self.check_workload_size(found);
        self.check_fat_tree(found);
        if self.duration_ms == 0 {
            found.at(KeyPath::new("duration_ms"), "0 ms: nothing to simulate");
        }
        if self.duration_ms > MAX_DURATION_MS {
            found.at(
                KeyPath::new("duration_ms"),
                format!(
                    "{} ms: at most {MAX_DURATION_MS} ms (one hour of simulated time)",
                    self.duration_ms
                ),
            );
        }
        self.check_transitions(found);
    }

    /// The connection pattern against the hosts, and the connections it makes.
    fn check_workload_size(&self, found: &mut Found) {
        let w = &self.workload;
        let hosts = self.topology.hosts;
        if let Err(e) = w.pattern.check(hosts) {
            found.at(key("workload.pattern").key(e.key), e.message);
        }
        let n = w.count(hosts);
        if n > MAX_CONNECTIONS {
            match w.connections_per_host {
                Some(per_host) => found.at(
                    key("workload.connections_per_host"),
                    format!("{per_host} a host: {n} connections, at most {MAX_CONNECTIONS}"),
                ),
                None => found.at(
                    key("workload.connections"),
                    format!("{n} connections: at most {MAX_CONNECTIONS}"),
                ),
            }
        }
    }

    /// A generated fat tree's shape, and its size against the limits, before it is
    /// built.
    fn check_fat_tree(&self, found: &mut Found) {
        let t = &self.topology;
        let Some(ft) = &t.fat_tree else {
            return;
        };
        let at = key("topology.fat_tree");
        if !t.switches.is_empty() || !t.links.is_empty() {
            found.at(at, FabricError::FatTreeWithSwitches.to_string());
            return;
        }
        if let Err(e) = ft.check(t.hosts) {
            found.at(at.key(e.key()), e.to_string());
            return;
        }
        let shape = ft.shape(t.hosts);
        let rails = usize::from(t.ports);
        let switches = shape.tiers.len() * rails;
        let links = (t.hosts + shape.uplinks.len()) * rails;
        if switches > MAX_SWITCHES || links > MAX_LINKS {
            found.at(
                at.key("radix"),
                format!(
                    "{}: {switches} switches and {links} links for {} hosts on {rails} \
                     rail(s), at most {MAX_SWITCHES} switches and {MAX_LINKS} links",
                    ft.radix, t.hosts
                ),
            );
        }
    }

    /// The engine policy's ranges and the policies' names.
    fn check_policies(&self, found: &mut Found) {
        if let Some(p) = &self.policy {
            for e in p.problems() {
                match e {
                    apm_core::PolicyError::OutOfRange { field, value, why } => {
                        found.at(key(&format!("policy.{field}")), format!("{value}: {why}"));
                    }
                    e => found.at(KeyPath::new("policy"), e.to_string()),
                }
            }
        }
        let policies = KeyPath::new("policies");
        for (i, name) in self.policies.iter().enumerate() {
            if crate::PolicyKind::from_name(name).is_none() {
                found.at(policies.index(i), not_a_policy(name));
            }
        }
    }

    /// Before anything is expanded: a flap's count can ask for billions of changes.
    fn check_transitions(&self, found: &mut Found) {
        let mut fixed: u64 = 0;
        for (i, f) in self.faults.iter().enumerate() {
            let n = f.transitions();
            if n > MAX_FAULT_TRANSITIONS {
                found.fault(
                    i,
                    Some("count"),
                    format!(
                        "{n} port changes once expanded, at most {MAX_FAULT_TRANSITIONS} in a \
                         scenario"
                    ),
                );
                return;
            }
            fixed = fixed.saturating_add(n);
        }
        // A random fault is at most a flap of 3 (6 changes).
        let random = self
            .random_faults
            .as_ref()
            .map_or(0, |r| 6 * u64::from(r.count));
        let total = fixed.saturating_add(random);
        if total > MAX_FAULT_TRANSITIONS {
            let at = if random > 0 {
                key("random_faults.count")
            } else {
                KeyPath::new("faults")
            };
            found.at(
                at,
                format!(
                    "{total} port, link or switch changes once every flap and random fault \
                     is expanded ({fixed} fixed, up to {random} random), at most \
                     {MAX_FAULT_TRANSITIONS}"
                ),
            );
        }
    }

    /// Every duration below [`MAX_MS`], where nanoseconds would overflow.
    fn check_times(&self, found: &mut Found) {
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
            // duration_ms has its own, lower limit.
            if v > MAX_MS && name != "duration_ms" {
                let u = unit(name);
                found.at(
                    key(name),
                    format!("{v}{u}: too large for a simulation (at most {MAX_MS}{u})"),
                );
            }
        }
        for (i, fault) in self.faults.iter().enumerate() {
            if fault.end_ms() > MAX_MS {
                found.fault(
                    i,
                    None,
                    format!(
                        "this {} at {} ms ends after {MAX_MS} ms: too late for a simulation",
                        fault.kind_name(),
                        fault.at_ms()
                    ),
                );
            }
        }
    }

    /// The fabric constants' ranges.
    fn check_fabric_params(&self, found: &mut Found) {
        let f = &self.fabric;
        let fabric = KeyPath::new("fabric");
        if f.ack_timeout > 31 || f.ack_timeout == 0 {
            found.at(
                fabric.key("ack_timeout"),
                format!("{}: use 1..=31 (4.096 us x 2^t)", f.ack_timeout),
            );
        }
        if f.retry_cnt > 7 {
            found.at(
                fabric.key("retry_cnt"),
                format!("{}: use 0..=7 (a QP's retry count has 3 bits)", f.retry_cnt),
            );
        }
        if f.stall_timeouts == 0 || f.stall_timeouts > f.retry_cnt.saturating_add(1) {
            found.at(
                fabric.key("stall_timeouts"),
                format!(
                    "{}: use 1..={} (a QP stalls within its retry_cnt + 1 ACK timeouts)",
                    f.stall_timeouts,
                    f.retry_cnt.min(7) + 1
                ),
            );
        }
        if !(0.0..=1.0).contains(&f.mad_loss) {
            found.at(
                fabric.key("mad_loss"),
                format!("{}: a probability in 0..=1", f.mad_loss),
            );
        }
        let at_least_one: [(&str, u64); 7] = [
            ("sweep_interval_ms", f.sweep_interval_ms),
            ("sa_tries", u64::from(f.sa_tries)),
            ("report_timeout_ms", f.report_timeout_ms),
            ("sa_rate_per_s", f.sa_rate_per_s),
            ("max_wire_smps", u64::from(f.max_wire_smps)),
            ("transaction_timeout_ms", f.transaction_timeout_ms),
            ("sminfo_polling_timeout_ms", f.sminfo_polling_timeout_ms),
        ];
        for (name, v) in at_least_one {
            if v == 0 {
                found.at(
                    fabric.key(name),
                    format!("0{}: must be at least 1{}", unit(name), unit(name)),
                );
            }
        }
        if self.workload.message_interval_ms == 0 {
            found.at(
                key("workload.message_interval_ms"),
                "0 ms: must be at least 1 ms",
            );
        }
        if f.subnet_timeout > 31 {
            found.at(
                fabric.key("subnet_timeout"),
                format!("{}: use 0..=31 (4.096 us x 2^t)", f.subnet_timeout),
            );
        }
    }

    /// A burst and its gap last at least 1 ms each, and not beyond a simulation.
    fn check_bursts(&self, found: &mut Found) {
        let Some(b) = &self.workload.bursts else {
            return;
        };
        let bursts = KeyPath::new("workload").key("bursts");
        for (k, v) in [("on_ms", b.on_ms), ("off_ms", b.off_ms)] {
            if v == 0 {
                found.at(bursts.key(k), "0 ms: must be at least 1 ms");
            } else if v > MAX_MS {
                found.at(
                    bursts.key(k),
                    format!("{v} ms: too large for a simulation (at most {MAX_MS} ms)"),
                );
            }
        }
    }

    fn check_random_faults(&self, found: &mut Found) {
        let Some(r) = &self.random_faults else {
            return;
        };
        let rf = KeyPath::new("random_faults");
        if r.end_ms < r.start_ms {
            found.at(
                rf.key("end_ms"),
                format!("{} ms is before start_ms ({} ms)", r.end_ms, r.start_ms),
            );
        }
        for (k, v) in [("end_ms", r.end_ms), ("max_outage_ms", r.max_outage_ms)] {
            if v > MAX_MS {
                found.at(
                    rf.key(k),
                    format!("{v} ms: too late for a simulation (at most {MAX_MS} ms)"),
                );
            }
        }
    }

    /// What a fault's own values say, before any name is resolved.
    fn check_fault_values(&self, found: &mut Found) {
        for (i, f) in self.faults.iter().enumerate() {
            match f {
                Fault::PortFlap { count: 0, .. } => {
                    found.fault(i, Some("count"), "0 flaps: must be at least 1");
                }
                Fault::MadLoss { rate, .. } if !(0.0..=1.0).contains(rate) => {
                    found.fault(i, Some("rate"), format!("{rate}: a probability in 0..=1"));
                }
                _ => {}
            }
        }
    }

    /// The fabric built, its cabling and SMs, and every name the faults give.
    fn check_names(&self, found: &mut Found) {
        let fabric = match Fabric::build_checked(&self.topology) {
            Ok(f) => f,
            Err(problems) => {
                for p in problems {
                    // The key is said once: a fat tree's own error names it too.
                    let message = match &p.error {
                        FabricError::FatTree(e) => e.to_string(),
                        e => e.to_string(),
                    };
                    found.at(self.part_key(p.part, &p.error), message);
                }
                return;
            }
        };
        self.check_cabling(&fabric, found);
        for (i, f) in self.faults.iter().enumerate() {
            let at = Some(f.target_key().unwrap_or("kind"));
            match f {
                Fault::SmFailover { subnet, .. } if *subnet >= fabric.subnets() => found.fault(
                    i,
                    at,
                    format!(
                        "subnet {subnet} does not exist (the fabric has {}: 0..{})",
                        fabric.subnets(),
                        fabric.subnets()
                    ),
                ),
                _ => {
                    if let Err(e) = f.target(&fabric) {
                        found.fault(i, at, e.to_string());
                    }
                }
            }
        }
    }

    /// A connection's primary joins its hosts' ports of one number (its rail): the
    /// workload places connections between any two hosts, so every rail's cabled ports
    /// must reach each other, or the connections placed across the split never connect.
    fn check_rails(&self, fabric: &Fabric, found: &mut Found) {
        if self.workload.connections == 0 {
            return;
        }
        let parts = fabric.parts();
        for num in 1..=fabric.ports_per_host() {
            // Each part of the fabric the rail's cabled ports are in: its first host.
            let mut seen: Vec<(usize, usize)> = Vec::new();
            for h in 0..fabric.num_hosts() {
                let Some(p) = fabric
                    .port_of(h, num)
                    .filter(|&p| fabric.ports[p].link.is_some())
                else {
                    continue;
                };
                if !seen.iter().any(|(part, _)| *part == parts[p]) {
                    seen.push((parts[p], h));
                }
            }
            if let [(_, a), (_, b), ..] = seen[..] {
                found.at(
                    KeyPath::new("topology").key("links"),
                    format!(
                        "rail {num} is split: h{a}:{num} and h{b}:{num} reach no common \
                         switch ({} unconnected parts), so the workload's connections \
                         between them on rail {num} can never connect",
                        seen.len()
                    ),
                );
            }
        }
    }

    /// The key of the topology a problem of the fabric's build is about.
    fn part_key(&self, part: Part, error: &FabricError) -> KeyPath {
        let topo = KeyPath::new("topology");
        match part {
            Part::Topology => match error {
                FabricError::LinksWithoutSwitches => topo.key("links"),
                FabricError::FatTree(e) => topo.key("fat_tree").key(e.key()),
                _ if self.topology.fat_tree.is_some() => topo.key("fat_tree"),
                _ => topo.key("hosts"),
            },
            Part::Switch(i) => {
                let field = match error {
                    FabricError::SubnetOutOfRange { .. } => "subnet",
                    _ => "name",
                };
                topo.key("switches").index(i).key(field)
            }
            Part::LinkEnd(i, end) => {
                let field = if end == LinkEnd::A { "a" } else { "b" };
                topo.key("links").index(i).key(field)
            }
            Part::Link(i) => topo.key("links").index(i),
        }
    }

    /// What the fabric cannot mean: a host with no cabled port (nothing reaches it), an
    /// SM named on a subnet or a port that does not exist, or on a port of another
    /// subnet or without a cable (it would never run).
    fn check_cabling(&self, fabric: &Fabric, found: &mut Found) {
        let topo = KeyPath::new("topology");
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
            let more = match uncabled.len().saturating_sub(8) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            found.at(
                topo.key("links"),
                format!(
                    "{} host(s) have no cabled port ({shown}{more}): cable each host to a \
                     switch",
                    uncabled.len()
                ),
            );
        }
        self.check_rails(fabric, found);
        for (i, sm) in self.topology.sm.iter().enumerate() {
            let at = topo.key("sm").index(i);
            if sm.subnet >= fabric.subnets() {
                found.at(
                    at.key("subnet"),
                    format!(
                        "subnet {} does not exist (the fabric has {} subnet(s), 0..{})",
                        sm.subnet,
                        fabric.subnets(),
                        fabric.subnets()
                    ),
                );
                continue;
            }
            for (j, name) in sm.ports.iter().enumerate() {
                let at = at.key("ports").index(j);
                match fabric.port_by_name(name) {
                    Err(e) => found.at(at, format!("{e}: an SM of subnet {}", sm.subnet)),
                    Ok(p)
                        if fabric.ports[p].subnet != sm.subnet
                            || fabric.ports[p].link.is_none() =>
                    {
                        found.at(
                            at,
                            format!(
                                "port \"{name}\" is not cabled into subnet {}: an SM of that \
                                 subnet would never run",
                                sm.subnet
                            ),
                        )
                    }
                    Ok(_) => {}
                }
            }
        }
    }
}
