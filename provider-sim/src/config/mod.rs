//! Scenarios: the fabric, the workload and the faults, as users write them in TOML.
//!
//! Every key has a default (`Scenario::default()`: OpenSM's and the hardware's constants,
//! no faults; the built-in demonstration is `Scenario::demo()`), unknown keys
//! are errors, and every problem of a file is reported, each with the line and column
//! of the key or value it is about and the key. See `scenarios/*.toml` in this crate for
//! documented examples. Nothing here runs anything: [`crate::Sim`] turns a scenario into
//! a simulation.
//!
//! `params.rs` holds the fabric's constants, `faults.rs` the faults and their resolution
//! against the fabric ([`Fault::target`]); the fabric's shape is [`crate::topology`].
//! `read.rs` reads a file table by table, `check.rs` finds what a scenario cannot mean.

mod check;
mod faults;
mod params;
mod read;
mod workload;

pub use crate::topology::{LinkSpec, SmSpec, SwitchSpec, Topology};
pub use faults::{Fault, RandomFaults, Target};
pub use params::{FabricParams, Migration};
pub use workload::{Bursts, Mode, Pattern, Workload};

use crate::fabric::Fabric;
use serde::{Deserialize, Serialize};
pub use toml_located::{Problem, Problems};

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

/// Why a scenario is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// Every problem found, in file order, one a line: each names its key and, for a
    /// file, its line and column.
    #[error("{0}")]
    Invalid(Problems),
}

impl ScenarioError {
    /// The problems.
    pub fn problems(&self) -> &Problems {
        match self {
            ScenarioError::Invalid(p) => p,
        }
    }

    /// The problems, owned.
    pub fn into_problems(self) -> Problems {
        match self {
            ScenarioError::Invalid(p) => p,
        }
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
    /// defaults for what it leaves out: probes off, as deployed). Without it, apm's
    /// defaults.
    pub policy: Option<apm_core::Policy>,
    /// The policies `apm simulate` runs by default, by name (`apm`, `hw-only`,
    /// `reload-local`, `reload-boost`, `port-err-move`, `apm-wildcard`, `per-conn-sa`).
    /// Default: apm and the four baselines.
    pub policies: Vec<String>,
}

fn default_name() -> String {
    "scenario".into()
}

impl Default for Scenario {
    /// What a scenario file that sets nothing describes: the default topology (16
    /// dual-rail hosts, one switch per rail), the fabric constants at OpenSM's and the
    /// hardware's own defaults ([`FabricParams::default`], the standby SM's polling
    /// included), the default workload, no faults, apm's own policy.
    fn default() -> Scenario {
        Scenario {
            name: default_name(),
            duration_ms: 8000,
            topology: Topology::default(),
            fabric: FabricParams::default(),
            workload: Workload::default(),
            faults: Vec::new(),
            random_faults: None,
            policy: None,
            policies: Vec::new(),
        }
    }
}

impl Scenario {
    /// The built-in demonstration (`scenarios/dual-rail.toml`): a dual-rail fabric of
    /// 16 hosts loses rail A's switch and gets it back, a remote port on rail B flaps
    /// (traps 65/64 reach the far ends), then rail B's master SM dies and its standby
    /// takes over, polled as a site that cares about failover tunes it.
    pub fn demo() -> Scenario {
        Scenario {
            name: "dual-rail: rail A fails and returns, a remote port flaps, an SM fails over"
                .into(),
            // OpenSM's standby polling tuned down (`sminfo_polling_timeout` 500 ms,
            // `polling_retry_number` 2): takeover 2-2.5 s after the master dies, where
            // OpenSM's defaults take 50-60 s.
            fabric: FabricParams {
                sminfo_polling_timeout_ms: 500,
                polling_retry_number: 2,
                ..FabricParams::default()
            },
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
            ..Scenario::default()
        }
    }

    /// Parse a scenario from TOML text: the scenario, or every problem it has, each
    /// with its line, column and key.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        read::read(text).map_err(ScenarioError::Invalid)
    }

    /// Check that names resolve and numbers are in range: every problem, each naming
    /// its key (no line: a scenario built in code has none).
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let faults = toml_located::KeyPath::new("faults");
        let problems: Vec<Problem> = self
            .issues(check::Checks::All)
            .into_iter()
            .map(|i| Problem {
                line: 0,
                column: 0,
                key: i.at.key(|n| faults.index(n)).to_string(),
                message: i.message,
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ScenarioError::Invalid(problems.into()))
        }
    }

    /// The policies `policies` names, each once, or apm and the baselines.
    pub fn run_policies(&self) -> Result<Vec<crate::PolicyKind>, ScenarioError> {
        if self.policies.is_empty() {
            return Ok(crate::PolicyKind::ALL.to_vec());
        }
        let mut out = Vec::new();
        for (i, name) in self.policies.iter().enumerate() {
            let Some(kind) = crate::PolicyKind::from_name(name) else {
                let problem = Problem {
                    line: 0,
                    column: 0,
                    key: toml_located::KeyPath::new("policies").index(i).to_string(),
                    message: check::not_a_policy(name),
                };
                return Err(ScenarioError::Invalid(vec![problem].into()));
            };
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        Ok(out)
    }

    /// The engine policy apm runs with in this scenario: its `[policy]`, or apm's own
    /// defaults (probes off, as deployed).
    pub fn engine_policy(&self) -> apm_core::Policy {
        self.policy.clone().unwrap_or_default()
    }

    /// When the last fault of `seed`'s schedule ends (ms; 0 without any).
    pub fn last_fault_end_ms(&self, seed: u64) -> u64 {
        self.all_faults(seed)
            .iter()
            .map(Fault::end_ms)
            .max()
            .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every problem of `text`, one string each (`line L, column C: key: message`).
    fn problems(text: &str) -> Vec<String> {
        match Scenario::from_toml(text) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems().iter().map(|p| p.to_string()).collect(),
        }
    }

    /// The one problem of `text`, which must start with `at` and contain `what`.
    fn one(text: &str, at: &str, what: &str) {
        let p = problems(text);
        assert!(
            p.len() == 1 && p[0].starts_with(at) && p[0].contains(what),
            "want {at:?} ... {what:?}, got {p:#?}"
        );
    }

    #[test]
    fn default_and_demo_validate_and_only_the_demo_tunes_the_polling() {
        Scenario::default().validate().unwrap();
        Scenario::demo().validate().unwrap();
        // A file that says nothing gets OpenSM's own polling, not the demo's.
        let plain = Scenario::from_toml("[workload]\nconnections = 4\n").unwrap();
        assert_eq!(plain.fabric, FabricParams::default());
        assert_eq!(plain.fabric.sminfo_polling_timeout_ms, 10_000);
        assert_eq!(plain.fabric.polling_retry_number, 4);
        assert!(plain.faults.is_empty() && plain.policy.is_none());
        assert!(!plain.engine_policy().probe.enabled, "apm's own defaults");
        assert_eq!(Scenario::demo().fabric.sminfo_polling_timeout_ms, 500);
    }

    #[test]
    fn absurd_numbers_are_errors_not_overflows() {
        for text in [
            "duration_ms = 18446744073709551615\n",
            "[fabric]\nhop_latency_us = 18446744073709551615\n",
            "[[faults]]\nkind = \"port_flap\"\nat_ms = 1\nport = \"h1:1\"\ndown_ms = 18446744073709551615\nup_ms = 1\ncount = 9\n",
            "[random_faults]\nend_ms = 18446744073709551615\n",
            "[fabric]\nretry_cnt = 4294967295\n",
            "[fabric]\nstall_timeouts = 0\n",
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
        for (text, key, limit) in [
            (flap.to_owned(), "faults[1].count", MAX_FAULT_TRANSITIONS),
            (switches, "topology.switches", MAX_SWITCHES as u64),
            (
                "duration_ms = 3600001\n".to_owned(),
                "duration_ms",
                MAX_DURATION_MS,
            ),
            (
                "[workload]\nconnections = 1000001\n".to_owned(),
                "workload.connections",
                MAX_CONNECTIONS as u64,
            ),
            (
                "[random_faults]\ncount = 20000\n".to_owned(),
                "random_faults.count",
                MAX_FAULT_TRANSITIONS,
            ),
        ] {
            let p = problems(&text);
            assert!(
                p.iter()
                    .any(|p| p.contains(&format!("{key}: "))
                        && p.contains(&format!("at most {limit}"))),
                "{key}: {p:?}"
            );
        }
    }

    #[test]
    fn fabrics_that_cannot_mean_what_they_say_are_refused_at_their_line() {
        let sw =
            "[topology]\nhosts = 2\nports = 1\n[[topology.switches]]\nname = \"S\"\nsubnet = 0\n";
        // No cable at all: nothing reaches the hosts.
        one(
            sw,
            "line 1, column 1: topology.links:",
            "2 host(s) have no cabled port (h0, h1)",
        );
        let cabled = format!(
            "{sw}[[topology.links]]\na = \"S\"\nb = \"h0:1\"\n\
             [[topology.links]]\na = \"S\"\nb = \"h1:1\"\n"
        );
        Scenario::from_toml(&cabled).expect("cabled");
        let sm = |rest: &str| format!("{cabled}[[topology.sm]]\n{rest}");
        one(
            &sm("subnet = 0\nports = [\"h0:1\",\n  \"h9:1\"]\n"),
            "line 16, column 3: topology.sm[1].ports[2]:",
            "\"h9:1\" does not exist",
        );
        one(
            &sm("ports = [\"h0:1\"]\nsubnet = 3\n"),
            "line 15, column 10: topology.sm[1].subnet:",
            "subnet 3 does not exist",
        );
    }

    #[test]
    fn a_rail_split_in_two_is_refused_its_connections_could_never_connect() {
        let split = "[topology]\nhosts = 2\nports = 1\n\
                     [[topology.switches]]\nname = \"S\"\nsubnet = 0\n\
                     [[topology.switches]]\nname = \"T\"\nsubnet = 1\n\
                     [[topology.links]]\na = \"S\"\nb = \"h0:1\"\n\
                     [[topology.links]]\na = \"T\"\nb = \"h1:1\"\n";
        one(
            split,
            "line 10, column 1: topology.links:",
            "rail 1 is split: h0:1 and h1:1 reach no common switch (2 unconnected parts)",
        );
        // The same subnet, two switches with no cable between them: split too.
        one(
            &split.replace("subnet = 1", "subnet = 0"),
            "line 10, column 1: topology.links:",
            "rail 1 is split",
        );
        // Cabled together: one rail.
        let joined = format!(
            "{}[[topology.links]]\na = \"S\"\nb = \"T\"\n",
            split.replace("subnet = 1", "subnet = 0")
        );
        assert_eq!(problems(&joined), Vec::<String>::new());
    }

    #[test]
    fn fat_trees_and_patterns_are_checked_at_their_line_and_key() {
        let ft = "[topology]\nhosts = 64\n[topology.fat_tree]\nlevels = 3\nradix = 8\n";
        Scenario::from_toml(ft).expect("a 64-host tree of radix 8");
        for (text, at, what) in [
            (
                ft.replace("radix = 8", "radix = 7"),
                "line 5, column 9: topology.fat_tree.radix:",
                "7: an even number",
            ),
            (
                ft.replace("levels = 3", "levels = 4"),
                "line 4, column 10: topology.fat_tree.levels:",
                "4: use 2 or 3",
            ),
            (
                ft.replace("levels = 3", "levels = 2"),
                "line 5, column 9: topology.fat_tree.radix:",
                "holds at most 32",
            ),
            (
                ft.replace("radix = 8", "radix = \"eight\""),
                "line 5, column 9: topology.fat_tree.radix:",
                "invalid type",
            ),
            (
                ft.replace("radix = 8", "radix = 8\nradixx = 8"),
                "line 6, column 1: topology.fat_tree.radixx:",
                "unknown field",
            ),
            (
                "[topology]\nhosts = 8\nfat_tree = { levels = 2, radix = 3 }\n".into(),
                "line 3, column 34: topology.fat_tree.radix:",
                "even number",
            ),
            (
                format!("{ft}[workload]\npattern = {{ kind = \"all_to_all\", group = 1 }}\n"),
                "line 7, column 42: workload.pattern.group:",
                "1: a group has 2 to 64 hosts",
            ),
            (
                format!("{ft}[workload.pattern]\nkind = \"neighbours\"\nwidth = 3\n"),
                "line 8, column 9: workload.pattern.width:",
                "3: an even number of neighbours",
            ),
            (
                format!("{ft}[workload.pattern]\nkind = \"neighbors\"\n"),
                "line 7, column 8: workload.pattern.kind:",
                "unknown variant",
            ),
            (
                format!("{ft}[workload]\nconnections_per_host = 20000\n"),
                "line 7, column 24: workload.connections_per_host:",
                "1280000 connections, at most 1000000",
            ),
            (
                format!("{ft}[workload]\nconnections = 5\nconnections_per_host = 2\n"),
                "line 8, column 24: workload.connections_per_host:",
                "not both",
            ),
            (
                format!("{ft}[[topology.switches]]\nname = \"X\"\nsubnet = 0\n"),
                "line 3, column 1: topology.fat_tree:",
                "one or the other",
            ),
        ] {
            one(&text, at, what);
        }
        // Too big for the limits, found before anything is built.
        one(
            "[topology]\nhosts = 4096\nports = 2\nfat_tree = { levels = 3, radix = 128 }\n",
            "line 4, column 34: topology.fat_tree.radix:",
            "at most 4096 switches",
        );
    }

    #[test]
    fn bad_toml_names_the_line() {
        one(
            "name = \"x\"\nduration_ms = \"long\"\n",
            "line 2, column 15: duration_ms:",
            "invalid type",
        );
        one(
            "[topology]\nhostz = 3\n",
            "line 2, column 1: topology.hostz:",
            "unknown field",
        );
        one(
            "[[faults]]\nkind = \"switch_down\"\nat_ms = 5\nswitch = \"Q\"\n",
            "line 4, column 10: faults[1].switch:",
            "switch \"Q\" does not exist",
        );
        one("a = = 1\n", "line 1, column 5:", "");
    }

    /// The head of a file: problems below are on the lines their comments say.
    const HEAD: &str =
        "# 1\nname = \"lines\"  # 2\nduration_ms = 4000  # 3\n[topology]  # 4\nhosts = 4  # 5\n";

    #[test]
    fn a_problem_is_at_the_line_of_its_key_not_at_a_line_that_looks_alike() {
        // The same port on line 8; the flap's count on line 16 is the problem.
        let text = format!(
            "{HEAD}[[faults]]  # 6\nkind = \"port_down\"  # 7\nport = \"h3:2\"  # 8\n\
             at_ms = 100  # 9\n[[faults]]  # 10\nkind = \"port_flap\"  # 11\n\
             port = \"h3:2\"  # 12\nat_ms = 200  # 13\ndown_ms = 1  # 14\nup_ms = 1  # 15\n\
             count = 2000000  # 16\n"
        );
        one(
            &text,
            "line 16, column 9: faults[2].count:",
            "at most 100000",
        );
        one(
            &format!("{HEAD}[fabric]  # 6\nack_timeout = 40  # 7\n"),
            "line 7, column 15: fabric.ack_timeout:",
            "40: use 1..=31",
        );
        one(
            &format!("{HEAD}[fabric]  # 6\nack_timeout = 14  # 7\nretry_cnt = 99  # 8\n"),
            "line 8, column 13: fabric.retry_cnt:",
            "use 0..=7",
        );
        one(
            &format!(
                "{HEAD}[random_faults]  # 6\ncount = 3  # 7\nmax_outage_ms = 99999999999  # 8\n"
            ),
            "line 8, column 17: random_faults.max_outage_ms:",
            "too late",
        );
    }

    #[test]
    fn a_fault_table_names_the_key_at_fault() {
        let fault =
            |rest: &str| format!("{HEAD}[[faults]]  # 6\nkind = \"switch_down\"  # 7\n{rest}");
        one(
            &fault("switch = \"A\"  # 8\nat_ms = \"soon\"  # 9\n"),
            "line 9, column 9: faults[1].at_ms:",
            "invalid type: string \"soon\"",
        );
        one(
            &fault("switch = \"A\"  # 8\nat_ms = 5  # 9\nporrt = \"h1:1\"  # 10\n"),
            "line 10, column 1: faults[1].porrt:",
            "unknown field `porrt`",
        );
        one(
            &fault("switch = \"A\"  # 8\nat_ms = 5  # 9\nport = \"h1:1\"  # 10\n"),
            "line 10, column 8: faults[1].port:",
            "a switch_down fault has no `port` (its keys: kind, at_ms, switch)",
        );
        one(
            &fault("at_ms = 5  # 8\n"),
            "line 6, column 1: faults[1]:",
            "a switch_down fault needs `switch`",
        );
        one(
            &format!("{HEAD}[[faults]]  # 6\nkind = \"switch_dwn\"  # 7\n"),
            "line 7, column 8: faults[1].kind:",
            "unknown variant",
        );
        one(
            &format!(
                "{HEAD}[[faults]]  # 6\nkind = \"link_down\"\nat_ms = 5\nlink = \"---\"  # 9\n"
            ),
            "line 9, column 8: faults[1].link:",
            "\"---\" is not a link",
        );
        one(
            &format!(
                "{HEAD}[[faults]]  # 6\nkind = \"device_fatal\"\nat_ms = 5\nhost = \"x\"  # 9\n"
            ),
            "line 9, column 8: faults[1].host:",
            "\"x\" is not a host",
        );
    }

    #[test]
    fn topology_problems_are_at_the_switch_or_link_that_says_them() {
        let text = format!(
            "{HEAD}ports = 2  # 6\n[[topology.switches]]  # 7\nname = \"S\"  # 8\n\
             subnet = 0  # 9\n[[topology.switches]]  # 10\nsubnet = 0  # 11\nname = \"S\"  # 12\n\
             [[topology.switches]]  # 13\nname = \"T\"  # 14\nsubnet = 1  # 15\n\
             [[topology.links]]  # 16\na = \"S\"  # 17\nb = \"T\"  # 18\n"
        );
        let p = problems(&text);
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(
            p[0].starts_with("line 12, column 8: topology.switches[2].name:")
                && p[0].contains("declared twice"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("line 16, column 1: topology.links[1]:")
                && p[1].contains("joins two subnets"),
            "{p:?}"
        );
    }

    #[test]
    fn every_problem_of_a_file_is_reported() {
        let text = format!(
            "{HEAD}[fabric]  # 6\nack_timeout = 40  # 7\nmad_loss = 2.0  # 8\n\
             [[faults]]  # 9\nkind = \"switch_down\"  # 10\nat_ms = 5  # 11\nswitch = \"Q\"  # 12\n\
             [[faults]]  # 13\nkind = \"port_down\"  # 14\nat_ms = \"x\"  # 15\nport = \"h0:1\"\n\
             [[faults]]  # 17\nkind = \"port_down\"  # 18\nat_ms = 5\nport = \"h0:9\"  # 20\n\
             [workload]  # 21\nmessage_interval_ms = 0  # 22\n"
        );
        let p = problems(&text);
        let want = [
            "line 7, column 15: fabric.ack_timeout:",
            "line 8, column 12: fabric.mad_loss:",
            "line 12, column 10: faults[1].switch:",
            "line 15, column 9: faults[2].at_ms:",
            "line 20, column 8: faults[3].port:",
            "line 22, column 23: workload.message_interval_ms:",
        ];
        assert_eq!(p.len(), want.len(), "{p:#?}");
        for (w, p) in want.iter().zip(&p) {
            assert!(p.starts_with(w), "{p} / {w}");
        }
    }

    #[test]
    fn a_scenario_built_in_code_names_its_keys() {
        let mut s = Scenario::demo();
        s.topology.hosts = 1;
        s.fabric.retry_cnt = 9;
        let e = s.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "topology.hosts: 1 host(s): need at least 2\n\
             fabric.retry_cnt: 9: use 0..=7 (a QP's retry count has 3 bits)"
        );
    }

    #[test]
    fn twenty_thousand_bad_faults_are_all_reported_quickly() {
        let text: String = (0..20_000)
            .map(|i| {
                format!("[[faults]]\nkind = \"switch_down\"\nat_ms = {i}\nswitch = \"Q{i}\"\n")
            })
            .collect();
        // Every one is found; the first 200 are listed and the rest counted.
        let p = problems(&text);
        assert_eq!(p.len(), 201);
        assert!(
            p[199].starts_with("line 800, column 10: faults[200].switch:"),
            "{}",
            p[199]
        );
        assert!(p[200].contains("19800 more problems"), "{}", p[200]);
    }
}
