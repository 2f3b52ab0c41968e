//! Reading the configuration TOML so that every problem in it is found, each at the
//! key or value it is about: each table is read alone through `toml-located`, which
//! reports a key that fails and sets it aside before the table is read again. This
//! module knows the shape of the file, not what the values mean: the semantic checks
//! are [`super::Config::check`]'s.

use super::{AgentSection, Config, DeviceConfig, LapConfig, SaConfig, SimConfig, UdpPeer};
use apm_core::Policy;
use toml_located::{Collector, Tab};

/// The top-level tables a configuration has.
const TOP: [&str; 6] = ["device", "sa", "lap", "policy", "sim", "agent"];

/// Read `text` into a [`Config`] with every problem of shape or type in `errors`. A
/// syntax error stops the reading (nothing after it can be trusted).
/// Also says whether the file declares devices (whether or not they could be read).
pub(super) fn read(text: &str, errors: &mut Collector<'_>) -> Option<(Config, bool)> {
    let doc = toml_located::parse(text, errors)?;
    let root = Tab::table(doc.as_table());
    for key in root.keys() {
        if !TOP.contains(&key) {
            errors.push(
                root.key_span(key),
                key,
                "unknown table or key; a configuration has [[device]], [sa], [lap], [policy], \
                 [sim] and [agent]",
            );
        }
    }
    let declared = root.contains("device");
    let devices = root
        .tables("device", "", errors)
        .into_iter()
        .filter_map(|(key, t)| t.read_as::<DeviceConfig>(&key, &[], errors))
        .collect();
    let sa = root
        .table_at("sa", "sa", errors)
        .and_then(|t| t.read_as::<SaConfig>("sa", &[], errors))
        .unwrap_or_default();
    let sim = root
        .table_at("sim", "sim", errors)
        .and_then(|t| t.read_as::<SimConfig>("sim", &[], errors))
        .unwrap_or_default();
    let lap = read_lap(root, errors);
    let agent = root
        .table_at("agent", "agent", errors)
        .and_then(|t| t.read_as::<AgentSection>("agent", &[], errors))
        .unwrap_or_default();
    let policy = root
        .table_at("policy", "policy", errors)
        .and_then(|t| read_policy(t, errors));
    let config = Config {
        devices,
        sa,
        lap,
        policy,
        sim,
        agent,
    };
    Some((config, declared))
}

/// `[lap]` and its `[[lap.peer]]` tables, each peer read alone.
fn read_lap(root: Tab<'_>, errors: &mut Collector<'_>) -> LapConfig {
    let Some(table) = root.table_at("lap", "lap", errors) else {
        return LapConfig::default();
    };
    let peers: Vec<UdpPeer> = table
        .tables("peer", "lap.", errors)
        .into_iter()
        .filter_map(|(key, t)| t.read_as::<UdpPeer>(&key, &[], errors))
        .collect();
    let mut lap = table
        .read_as::<LapConfig>("lap", &["peer"], errors)
        .unwrap_or_default();
    lap.peers = peers;
    lap
}

/// `[policy]`: its types, then `Policy::validate` again and again, each problem at the
/// key it names (the key then takes its default, so that the next one shows).
fn read_policy(table: Tab<'_>, errors: &mut Collector<'_>) -> Option<Policy> {
    let read = table.read_as::<Policy>("policy", &[], errors)?;
    let mut policy = read.clone();
    let defaults = serde_json::to_value(Policy::default()).ok()?;
    let mut seen = Vec::new();
    while let Err(e) = policy.validate() {
        let apm_core::PolicyError::OutOfRange { field, .. } = &e else {
            errors.push(table.span(), "policy", &e.to_string());
            break;
        };
        let key = format!("policy.{field}");
        errors.push(table.value_span(field), &key, &e.to_string());
        if seen.contains(field) {
            break;
        }
        seen.push(field);
        let mut v = serde_json::to_value(&policy).ok()?;
        v[*field] = defaults[*field].clone();
        policy = serde_json::from_value(v).ok()?;
    }
    Some(read)
}
