//! Reading the configuration TOML so that every problem in it is found, each at the
//! key or value it is about: serde stops at the first error, so each table is read
//! alone, and a key that fails is reported and set aside before the table is read
//! again (a table has a handful of keys, so the work stays linear in the file's size).
//! Also the line index that turns byte offsets into lines and columns in constant
//! time per error. This module knows the shape of the file, not what the values mean:
//! the semantic checks are [`super::Config::check`]'s.

use super::{Config, ConfigError, DeviceConfig, LapConfig, SaConfig, SimConfig, UdpPeer};
use crate::input::truncate_echo;
use apm_core::Policy;
use serde::de::{DeserializeOwned, IntoDeserializer};
use std::ops::Range;
use toml_edit::{ImDocument, Item, Table, TableLike, Value};

/// The longest echo of the user's text inside one message (characters).
const ECHO_MAX: usize = 200;

/// The top-level tables a configuration has.
const TOP: [&str; 5] = ["device", "sa", "lap", "policy", "sim"];

/// A table of the document (`[x]`, `[[x]]` or inline) and where it is.
#[derive(Clone, Copy)]
struct Tab<'t> {
    t: &'t dyn TableLike,
    span: Option<(usize, usize)>,
}

impl<'t> Tab<'t> {
    fn of(item: &'t Item) -> Option<Tab<'t>> {
        match item {
            Item::Table(t) => Some(Tab::table(t)),
            Item::Value(Value::InlineTable(t)) => Some(Tab::inline(t)),
            _ => None,
        }
    }

    fn table(t: &'t Table) -> Tab<'t> {
        Tab {
            t,
            span: t.span().map(|s| (s.start, s.end)),
        }
    }

    fn inline(t: &'t toml_edit::InlineTable) -> Tab<'t> {
        Tab {
            t,
            span: t.span().map(|s| (s.start, s.end)),
        }
    }

    fn span(&self) -> Option<Range<usize>> {
        self.span.map(|(a, b)| a..b)
    }

    fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.t.key(key).and_then(|k| k.span())
    }

    /// Where a key's value is (else the key, else the table).
    fn value_span(&self, key: &str) -> Option<Range<usize>> {
        self.t
            .get(key)
            .and_then(Item::span)
            .or_else(|| self.key_span(key))
            .or_else(|| self.span())
    }
}

/// Byte offset -> (line, column), 1-based, in O(log lines) plus the characters between
/// the offset and the previous lookup on the same line (lookups mostly go forward).
#[derive(Debug)]
pub(super) struct Locator<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
    /// The last lookup: offset, line index, column (characters).
    last: (usize, usize, usize),
}

impl<'a> Locator<'a> {
    pub(super) fn new(text: &'a str) -> Locator<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Locator {
            text,
            line_starts,
            last: (0, 0, 0),
        }
    }

    pub(super) fn at(&mut self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|s| *s <= offset) - 1;
        let (from, col0) = match self.last {
            (o, l, c) if l == line && o <= offset => (o, c),
            _ => (self.line_starts[line], 0),
        };
        let column = col0 + self.text[from..offset].chars().count();
        self.last = (offset, line, column);
        (line + 1, column + 1)
    }
}

/// The problems found so far, located.
#[derive(Debug)]
pub(super) struct Errors<'a> {
    locator: Locator<'a>,
    pub(super) list: Vec<ConfigError>,
}

impl<'a> Errors<'a> {
    pub(super) fn new(text: &'a str) -> Errors<'a> {
        Errors {
            locator: Locator::new(text),
            list: Vec::new(),
        }
    }

    /// A problem at `span` (none: the file as a whole) about `key` (dotted, may be
    /// empty).
    pub(super) fn push(&mut self, span: Option<Range<usize>>, key: &str, message: &str) {
        let (line, column) = span.map_or((0, 0), |s| self.locator.at(s.start));
        self.list.push(ConfigError {
            line,
            column,
            key: key.to_owned(),
            message: truncate_echo(message, ECHO_MAX).into_owned(),
        });
    }
}

/// Read `text` into a [`Config`] with every problem of shape or type in `errors`. A
/// syntax error stops the reading (nothing after it can be trusted).
/// Also says whether the file declares devices (whether or not they could be read).
pub(super) fn read(text: &str, errors: &mut Errors<'_>) -> Option<(Config, bool)> {
    let doc = match ImDocument::parse(text) {
        Ok(d) => d,
        Err(e) => {
            errors.push(e.span(), "", e.message().trim_end());
            return None;
        }
    };
    let root = Tab::table(doc.as_table());
    for (key, _) in root.t.iter() {
        if !TOP.contains(&key) {
            errors.push(
                root.key_span(key),
                key,
                "unknown table or key; a configuration has [[device]], [sa], [lap], [policy] \
                 and [sim]",
            );
        }
    }
    let declared = root.t.contains_key("device");
    let devices = tables(root, "device", errors)
        .into_iter()
        .filter_map(|(key, t)| table_as::<DeviceConfig>(t, &key, errors))
        .collect();
    let sa = root
        .t
        .get("sa")
        .and_then(|i| item_table(i, "sa", errors))
        .and_then(|t| table_as::<SaConfig>(t, "sa", errors))
        .unwrap_or_default();
    let sim = root
        .t
        .get("sim")
        .and_then(|i| item_table(i, "sim", errors))
        .and_then(|t| table_as::<SimConfig>(t, "sim", errors))
        .unwrap_or_default();
    let lap = read_lap(root, errors);
    let policy = root
        .t
        .get("policy")
        .and_then(|i| item_table(i, "policy", errors))
        .and_then(|t| read_policy(t, errors));
    let config = Config {
        devices,
        sa,
        lap,
        policy,
        sim,
    };
    Some((config, declared))
}

/// `[lap]` and its `[[lap.peer]]` tables, each peer read alone.
fn read_lap(root: Tab<'_>, errors: &mut Errors<'_>) -> LapConfig {
    let Some(table) = root.t.get("lap").and_then(|i| item_table(i, "lap", errors)) else {
        return LapConfig::default();
    };
    let peers: Vec<UdpPeer> = tables(table, "peer", errors)
        .into_iter()
        .map(|(key, t)| (format!("lap.{key}"), t))
        .filter_map(|(key, t)| table_as::<UdpPeer>(t, &key, errors))
        .collect();
    let without_peers = Owned::from_table_like(table).without("peer");
    let mut lap = without_peers
        .read_as::<LapConfig>("lap", errors)
        .unwrap_or_default();
    lap.peers = peers;
    lap
}

/// `[policy]`: its types, then `Policy::validate` again and again, each problem at the
/// key it names (the key then takes its default, so that the next one shows).
fn read_policy(table: Tab<'_>, errors: &mut Errors<'_>) -> Option<Policy> {
    let read = table_as::<Policy>(table, "policy", errors)?;
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

/// The tables of `key` in `parent`: `[[key]]` or `key = [{...}, ...]`, each with its
/// name for messages (`device[2]`).
fn tables<'t>(parent: Tab<'t>, key: &str, errors: &mut Errors<'_>) -> Vec<(String, Tab<'t>)> {
    let name = |i: usize| format!("{key}[{}]", i + 1);
    match parent.t.get(key) {
        None => Vec::new(),
        Some(Item::ArrayOfTables(a)) => a
            .iter()
            .enumerate()
            .map(|(i, t)| (name(i), Tab::table(t)))
            .collect(),
        Some(Item::Value(Value::Array(a))) if a.iter().all(Value::is_inline_table) => a
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((name(i), Tab::inline(v.as_inline_table()?))))
            .collect(),
        Some(other) => {
            errors.push(
                other.span().or_else(|| parent.key_span(key)),
                key,
                &format!(
                    "{key} must be tables ([[{key}]]), not {}",
                    other.type_name()
                ),
            );
            Vec::new()
        }
    }
}

/// `item` as a table, or an error naming `key`.
fn item_table<'t>(item: &'t Item, key: &str, errors: &mut Errors<'_>) -> Option<Tab<'t>> {
    let t = Tab::of(item);
    if t.is_none() {
        errors.push(
            item.span(),
            key,
            &format!("[{key}] must be a table, not {}", item.type_name()),
        );
    }
    t
}

/// Deserialize `table` as a `T` (one of the config's table types), reporting each key
/// that fails and reading again without it.
fn table_as<T: DeserializeOwned>(table: Tab<'_>, name: &str, errors: &mut Errors<'_>) -> Option<T> {
    Owned::from_table_like(table).read_as(name, errors)
}

/// A table's entries as an inline table, which serde reads; spans stay those of the
/// document.
struct Owned {
    table: toml_edit::InlineTable,
    span: Option<Range<usize>>,
}

impl Owned {
    fn from_table_like(tab: Tab<'_>) -> Owned {
        let mut table = toml_edit::InlineTable::new();
        for (k, item) in tab.t.iter() {
            let Some((key, _)) = tab.t.get_key_value(k) else {
                continue;
            };
            let value = match item.clone() {
                Item::Value(v) => v,
                Item::Table(t) => Value::InlineTable(t.into_inline_table()),
                Item::ArrayOfTables(a) => Value::Array(a.into_array()),
                Item::None => continue,
            };
            // The document's own key (with its span): serde's "unknown field" points
            // at it.
            table.insert_formatted(key, value);
        }
        Owned {
            table,
            span: tab.span(),
        }
    }

    fn without(mut self, key: &str) -> Owned {
        self.table.remove(key);
        self
    }

    fn read_as<T: DeserializeOwned>(self, name: &str, errors: &mut Errors<'_>) -> Option<T> {
        let Owned { mut table, span } = self;
        let mut removed: Vec<String> = Vec::new();
        // Each round either succeeds or removes a key: at most keys + 1 rounds.
        for _ in 0..=table.len() {
            let value = Value::InlineTable(table.clone());
            let e = match T::deserialize(value.into_deserializer()) {
                Ok(t) => return Some(t),
                Err(e) => e,
            };
            let at = e.span();
            let culprit = at.as_ref().and_then(|at| {
                table.iter().find_map(|(k, v)| {
                    let in_value = v.span().is_some_and(|s| s.contains(&at.start));
                    let in_key = table
                        .key(k)
                        .and_then(|k| k.span())
                        .is_some_and(|s| s.contains(&at.start));
                    (in_value || in_key).then(|| k.to_owned())
                })
            });
            let message = e.message().trim_end();
            match culprit {
                Some(k) => {
                    errors.push(at, &format!("{name}.{k}"), message);
                    table.remove(&k);
                    removed.push(k);
                }
                // A required key set aside above: already reported.
                None if removed
                    .iter()
                    .any(|k| message == format!("missing field `{k}`")) =>
                {
                    return None;
                }
                None => {
                    // A missing field, or something about the table as a whole: at
                    // its header.
                    errors.push(at.or_else(|| span.clone()), name, message);
                    return None;
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locator_counts_lines_and_characters() {
        let text = "ab\né€x\n\nz";
        let mut l = Locator::new(text);
        assert_eq!(l.at(0), (1, 1));
        assert_eq!(l.at(3), (2, 1));
        assert_eq!(l.at(text.find('x').expect("x")), (2, 3));
        assert_eq!(l.at(text.find('z').expect("z")), (4, 1));
        assert_eq!(l.at(1), (1, 2), "backwards works too");
        assert_eq!(l.at(text.len() + 10), (4, 2), "past the end: the end");
    }
}
