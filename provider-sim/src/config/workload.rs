//! The connections a scenario opens: how many, between which hosts (the connection
//! pattern), their traffic and their migration mode. Plain data; placement is a pure
//! function of the pattern, the host count and the connection's index, except for the
//! random pattern, which draws from the run's seed (`crate::sim`).

use serde::{Deserialize, Serialize};

/// How paths change on the simulated QPs.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// InfiniBand hardware APM.
    Hardware,
    /// RoCE-style: no alternate in the QP, the engine moves the primary itself.
    Software,
}

/// The connections.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Number of RC connections (between random pairs of hosts unless `pattern` says
    /// otherwise).
    pub connections: usize,
    /// Instead of `connections`: this many connections opened by each host that opens
    /// any (every host, or every client of `hot_servers`).
    pub connections_per_host: Option<usize>,
    /// Which hosts talk to which. Default: random pairs.
    pub pattern: Pattern,
    /// Each side of each connection sends one numbered message this often (ms).
    pub message_interval_ms: u64,
    /// Hardware APM or software migration.
    pub mode: Mode,
    /// Traffic in bursts with idle gaps between them (`[workload.bursts]`). Default:
    /// steady traffic.
    pub bursts: Option<Bursts>,
    /// apm may post on the connections' QPs (they are apm's own, or the application
    /// lets it): its arming write (`CommandOp::ArmingWrite`) arms a QP in REARM within
    /// a round trip. Default false: the application's QPs, which only the
    /// application's traffic arms, as `apm run` and the library protect them.
    pub apm_may_post: bool,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            connections: 2000,
            connections_per_host: None,
            pattern: Pattern::Random,
            message_interval_ms: 10,
            mode: Mode::Hardware,
            bursts: None,
            apm_may_post: false,
        }
    }
}

/// Traffic that comes in bursts: from the start of the run, `on_ms` in which every
/// connection sends a message every `message_interval_ms`, then `off_ms` in which none
/// sends anything, and again; every connection at once, as the compute and exchange
/// phases of a bulk-synchronous job. An idle connection moves no packet: a QP waiting
/// in REARM for its peer's packets waits the gap out.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Bursts {
    /// How long each burst lasts (ms).
    pub on_ms: u64,
    /// The idle gap after it (ms).
    pub off_ms: u64,
}

impl Bursts {
    /// True when the connections send at `t_ns` (nanoseconds from the start).
    pub fn sending(&self, t_ns: u64) -> bool {
        let period = self.on_ms.saturating_add(self.off_ms).max(1) * 1_000_000;
        t_ns % period < self.on_ms * 1_000_000
    }
}

/// Which hosts a workload's connections join. Connection `i` of a pattern other than
/// `random` is opened by the `i mod n`-th of the `n` hosts that open connections, to
/// that host's `i / n`-th peer in the pattern's order (round robin over its peers).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Pattern {
    /// Uniformly random pairs of distinct hosts, drawn from the seed.
    #[default]
    Random,
    /// Jobs of `group` consecutive hosts, each talking to every other member of its
    /// group (an MPI job's all-to-all).
    AllToAll {
        /// Hosts per group (the last group may be smaller, but not a single host).
        group: usize,
    },
    /// Each host talks to its `width` nearest neighbours on a ring of the hosts, half
    /// on each side (a stencil code's halo exchange).
    Neighbours {
        /// Neighbours per host: even, at least 2.
        width: usize,
    },
    /// The first `servers` hosts serve (storage, parameter servers); every other host
    /// opens its connections to them.
    HotServers {
        /// Number of servers.
        servers: usize,
    },
}

impl Pattern {
    /// Why the pattern cannot place connections on `hosts`, if it cannot.
    pub fn check(&self, hosts: usize) -> Result<(), PatternError> {
        let bad = match *self {
            Pattern::AllToAll { group } if group < 2 || group > hosts => {
                format!("{group}: a group has 2 to {hosts} hosts")
            }
            Pattern::AllToAll { group } if hosts % group == 1 => {
                format!("{group}: {hosts} hosts leave one host alone in the last group")
            }
            Pattern::Neighbours { width } if width < 2 || width % 2 == 1 || width >= hosts => {
                format!(
                    "{width}: an even number of neighbours, 2 to {}",
                    hosts.saturating_sub(1) & !1
                )
            }
            Pattern::HotServers { servers } if servers == 0 || servers >= hosts => format!(
                "{servers}: 1 to {} servers (the other hosts are their clients)",
                hosts.saturating_sub(1)
            ),
            _ => return Ok(()),
        };
        Err(PatternError {
            key: self.key(),
            message: bad,
        })
    }

    /// The key of `workload.pattern` that sizes the pattern (`kind` for `random`).
    fn key(&self) -> &'static str {
        match self {
            Pattern::Random => "kind",
            Pattern::AllToAll { .. } => "group",
            Pattern::Neighbours { .. } => "width",
            Pattern::HotServers { .. } => "servers",
        }
    }

    /// The hosts that open connections, as a range.
    pub fn openers(&self, hosts: usize) -> std::ops::Range<usize> {
        match *self {
            Pattern::HotServers { servers } => servers.min(hosts)..hosts,
            _ => 0..hosts,
        }
    }

    /// The two hosts of connection `i` (opener first), for every pattern but
    /// `random`, on `hosts` hosts (after [`Pattern::check`]).
    pub fn place(&self, i: usize, hosts: usize) -> Option<(usize, usize)> {
        let openers = self.openers(hosts);
        let n = openers.len();
        if n == 0 {
            return None;
        }
        let a = openers.start + i % n;
        let j = i / n;
        let b = match *self {
            Pattern::Random => return None,
            Pattern::AllToAll { group } => {
                let first = a / group * group;
                let size = group.min(hosts - first);
                // The other members, in order starting after `a`.
                let k = j % (size - 1);
                first + (a - first + 1 + k) % size
            }
            Pattern::Neighbours { width } => {
                let d = j % width / 2 + 1;
                if j % 2 == 0 {
                    (a + d) % hosts
                } else {
                    (a + hosts - d) % hosts
                }
            }
            Pattern::HotServers { servers } => (a + j) % servers,
        };
        Some((a, b))
    }
}

/// Why a [`Pattern`] cannot place connections on a scenario's hosts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("workload.pattern.{key}: {message}")]
pub struct PatternError {
    /// The key of `workload.pattern` at fault.
    pub key: &'static str,
    /// What is wrong with its value (without the key).
    pub message: String,
}

impl Workload {
    /// The number of connections on `hosts` hosts.
    pub fn count(&self, hosts: usize) -> usize {
        match self.connections_per_host {
            Some(per_host) => per_host.saturating_mul(self.pattern.openers(hosts).len()),
            None => self.connections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_place_each_connection_between_two_distinct_hosts_of_the_pattern() {
        let hosts = 70;
        for p in [
            Pattern::AllToAll { group: 8 },
            Pattern::Neighbours { width: 4 },
            Pattern::HotServers { servers: 3 },
        ] {
            p.check(hosts).unwrap();
            for i in 0..2000 {
                let (a, b) = p.place(i, hosts).unwrap();
                assert!(a < hosts && b < hosts && a != b, "{p:?} {i}: {a} {b}");
                match p {
                    Pattern::AllToAll { group } => assert_eq!(a / group, b / group),
                    Pattern::Neighbours { width } => {
                        let d = (a + hosts - b) % hosts;
                        assert!(d <= width / 2 || hosts - d <= width / 2, "{a} {b}");
                    }
                    Pattern::HotServers { servers } => assert!(b < servers && a >= servers),
                    Pattern::Random => unreachable!(),
                }
            }
        }
        // Round robin: the first connections of a host go to distinct peers.
        let p = Pattern::AllToAll { group: 8 };
        let peers: std::collections::BTreeSet<usize> = (0..7)
            .map(|j| p.place(j * hosts, hosts).unwrap().1)
            .collect();
        assert_eq!(peers.len(), 7);
    }

    #[test]
    fn bursts_send_from_the_start_then_idle() {
        let b = Bursts {
            on_ms: 100,
            off_ms: 900,
        };
        let ms = |v: u64| v * 1_000_000;
        assert!(b.sending(0) && b.sending(ms(99)));
        assert!(!b.sending(ms(100)) && !b.sending(ms(999)));
        assert!(b.sending(ms(1000)) && !b.sending(ms(1100)));
    }

    #[test]
    fn impossible_patterns_are_refused() {
        for (p, hosts) in [
            (Pattern::AllToAll { group: 1 }, 8),
            (Pattern::AllToAll { group: 4 }, 9),
            (Pattern::Neighbours { width: 3 }, 8),
            (Pattern::Neighbours { width: 8 }, 8),
            (Pattern::HotServers { servers: 8 }, 8),
        ] {
            assert!(p.check(hosts).is_err(), "{p:?}");
        }
    }
}
