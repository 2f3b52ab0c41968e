//! Reading a scenario file so that every problem in it is found at the key or value it
//! is about: each table read alone through `toml-located` (a key of the wrong type is
//! reported at its line and set aside, its default taken), each `[[faults]]` table as
//! its [`FaultFields`] and then held against its kind, and the checks of
//! [`super::check`] located at the keys they name.

use super::check::Checks;
use super::faults::FaultFields;
use super::{Bursts, FabricParams, Fault, Pattern, RandomFaults, Scenario, Workload};
use crate::topology::{FatTree, LinkSpec, SmSpec, SwitchSpec, Topology};
use serde::de::DeserializeOwned;
use toml_located::{Collector, KeyPath, Problems, Tab};

/// The tables a scenario has besides its top-level keys.
const TABLES: [&str; 6] = [
    "topology",
    "fabric",
    "workload",
    "faults",
    "random_faults",
    "policy",
];

/// The scenario `text` describes, or every problem it has, each located.
pub(super) fn read(text: &str) -> Result<Scenario, Problems> {
    let mut problems = Collector::new(text);
    let Some(doc) = toml_located::parse(text, &mut problems) else {
        return Err(problems.into_problems());
    };
    let root = Tab::table(doc.as_table());
    // The top-level keys; a table the file leaves out keeps `Scenario::default()`'s
    // (OpenSM's constants, no faults, apm's policy), never the demonstration's.
    let mut s = root
        .read_as::<Scenario>("", &TABLES, &mut problems)
        .unwrap_or_default();
    let before = problems.len();
    if let Some(t) = root.table_at("topology", "topology", &mut problems) {
        s.topology = read_topology(t, &mut problems);
    }
    let checks = if problems.len() == before {
        Checks::All
    } else {
        Checks::Values
    };
    if let Some(f) = read_table::<FabricParams>(root, "fabric", &mut problems) {
        s.fabric = f;
    }
    if let Some(t) = root.table_at("workload", "workload", &mut problems) {
        s.workload = read_workload(t, &mut problems);
    }
    if let Some(r) = read_table::<RandomFaults>(root, "random_faults", &mut problems) {
        s.random_faults = Some(r);
    }
    // The policy's ranges are checked with the rest ([`super::check`]), at their keys.
    s.policy = read_table::<apm_core::Policy>(root, "policy", &mut problems);
    // Where each fault read is in the file (one that could not be read is left out).
    let mut written_as = Vec::new();
    for (i, (name, t)) in root
        .tables("faults", "", &mut problems)
        .into_iter()
        .enumerate()
    {
        if let Some(f) = read_fault(t, &name, &mut problems) {
            s.faults.push(f);
            written_as.push(i);
        }
    }
    let faults = KeyPath::new("faults");
    for issue in s.issues(checks) {
        let key = issue
            .at
            .key(|i| faults.index(written_as.get(i).copied().unwrap_or(i)));
        problems.push_at(root, &key, &issue.message);
    }
    if problems.is_empty() {
        Ok(s)
    } else {
        Err(problems.into_problems())
    }
}

/// The table `key` as a `T` (every key of which has a default), if the file has it.
fn read_table<T: DeserializeOwned>(
    root: Tab<'_>,
    key: &str,
    problems: &mut Collector<'_>,
) -> Option<T> {
    root.table_at(key, key, problems)?
        .read_as::<T>(key, &[], problems)
}

/// `[topology]` and its switches, links, SMs and fat tree, each table alone.
fn read_topology(t: Tab<'_>, problems: &mut Collector<'_>) -> Topology {
    let mut topo = t
        .read_as::<Topology>(
            "topology",
            &["switches", "links", "sm", "fat_tree"],
            problems,
        )
        .unwrap_or_default();
    topo.switches = read_each::<SwitchSpec>(t, "switches", problems);
    topo.links = read_each::<LinkSpec>(t, "links", problems);
    topo.sm = read_each::<SmSpec>(t, "sm", problems);
    topo.fat_tree = t
        .table_at("fat_tree", "topology.fat_tree", problems)
        .and_then(|f| f.read_as::<FatTree>("topology.fat_tree", &[], problems));
    topo
}

/// `[workload]`, its pattern and its bursts, each alone; `connections` and `connections_per_host`
/// say the same thing two ways, and a file gives one.
fn read_workload(t: Tab<'_>, problems: &mut Collector<'_>) -> Workload {
    let mut w = t
        .read_as::<Workload>("workload", &["pattern", "bursts"], problems)
        .unwrap_or_default();
    if let Some(p) = t.table_at("pattern", "workload.pattern", problems) {
        w.pattern = p
            .read_as::<Pattern>("workload.pattern", &[], problems)
            .unwrap_or_default();
    }
    if let Some(b) = t.table_at("bursts", "workload.bursts", problems) {
        w.bursts = b.read_as::<Bursts>("workload.bursts", &[], problems);
    }
    if t.contains("connections") && t.contains("connections_per_host") {
        problems.push(
            t.value_span("connections_per_host"),
            "workload.connections_per_host",
            "give connections or connections_per_host, not both",
        );
    }
    w
}

fn read_each<T: DeserializeOwned>(t: Tab<'_>, key: &str, problems: &mut Collector<'_>) -> Vec<T> {
    t.tables(key, "topology.", problems)
        .into_iter()
        .filter_map(|(name, t)| t.read_as::<T>(&name, &[], problems))
        .collect()
}

/// One `[[faults]]` table: its keys' types, then its keys against its kind.
fn read_fault(t: Tab<'_>, name: &str, problems: &mut Collector<'_>) -> Option<Fault> {
    let fields = t.read_as::<FaultFields>(name, &[], problems)?;
    match fields.into_fault() {
        Ok(f) => Some(f),
        Err(wrong) => {
            // A key of the wrong type was set aside, reported: it is not missing too.
            for w in wrong
                .into_iter()
                .filter(|w| w.written || !t.contains(w.key))
            {
                let (span, key) = if w.written {
                    (t.value_span(w.key), format!("{name}.{}", w.key))
                } else {
                    (t.span(), name.to_owned())
                };
                problems.push(span, &key, &w.message);
            }
            None
        }
    }
}
