//! One table of a document at a time: its sub-tables by name, and its keys read into a
//! serde type with every failing key reported at its span and set aside (a table has
//! a handful of keys, so the rounds stay few and the work linear in the file).

use crate::Collector;
use serde::de::{DeserializeOwned, IntoDeserializer};
use std::ops::Range;
use toml_edit::{InlineTable, Item, Table, TableLike, Value};

/// A table of the document (`[x]`, `[[x]]` or inline) and where it is.
#[derive(Clone, Copy)]
pub struct Tab<'t> {
    t: &'t dyn TableLike,
    span: Option<(usize, usize)>,
}

impl std::fmt::Debug for Tab<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tab")
            .field("keys", &self.t.len())
            .field("span", &self.span)
            .finish()
    }
}

impl<'t> Tab<'t> {
    /// The item as a table, if it is one (`[x]`, `[[x]]`'s element, or inline).
    pub fn of(item: &'t Item) -> Option<Tab<'t>> {
        match item {
            Item::Table(t) => Some(Tab::table(t)),
            Item::Value(Value::InlineTable(t)) => Some(Tab::inline(t)),
            _ => None,
        }
    }

    /// A `[x]` table (or the document's root).
    pub fn table(t: &'t Table) -> Tab<'t> {
        Tab {
            t,
            span: t.span().map(|s| (s.start, s.end)),
        }
    }

    /// An inline `{ ... }` table.
    pub fn inline(t: &'t InlineTable) -> Tab<'t> {
        Tab {
            t,
            span: t.span().map(|s| (s.start, s.end)),
        }
    }

    /// Where the table is (its header for `[x]`).
    pub fn span(&self) -> Option<Range<usize>> {
        self.span.map(|(a, b)| a..b)
    }

    /// The item under `key`.
    pub fn get(&self, key: &str) -> Option<&'t Item> {
        self.t.get(key)
    }

    /// The table holds `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.t.contains_key(key)
    }

    /// The keys, in document order.
    pub fn keys(&self) -> impl Iterator<Item = &'t str> + 't {
        self.t.iter().map(|(k, _)| k)
    }

    /// Where `key` itself is written.
    pub fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.t.key(key).and_then(|k| k.span())
    }

    /// Where a key's value is (else the key, else the table).
    pub fn value_span(&self, key: &str) -> Option<Range<usize>> {
        self.t
            .get(key)
            .and_then(Item::span)
            .or_else(|| self.key_span(key))
            .or_else(|| self.span())
    }

    /// The sub-table under `key`, or a problem naming `name` when it is something else.
    pub fn table_at(&self, key: &str, name: &str, problems: &mut Collector<'_>) -> Option<Tab<'t>> {
        let item = self.t.get(key)?;
        let t = Tab::of(item);
        if t.is_none() {
            problems.push(
                item.span().or_else(|| self.key_span(key)),
                name,
                &format!("[{name}] must be a table, not {}", item.type_name()),
            );
        }
        t
    }

    /// The tables under `key`: `[[key]]` or `key = [{...}, ...]`, each with its name for
    /// messages (`{prefix}{key}[2]`, 1-based).
    pub fn tables(
        &self,
        key: &str,
        prefix: &str,
        problems: &mut Collector<'_>,
    ) -> Vec<(String, Tab<'t>)> {
        let name = |i: usize| format!("{prefix}{key}[{}]", i + 1);
        match self.t.get(key) {
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
                problems.push(
                    other.span().or_else(|| self.key_span(key)),
                    &format!("{prefix}{key}"),
                    &format!(
                        "{key} must be tables ([[{prefix}{key}]]), not {}",
                        other.type_name()
                    ),
                );
                Vec::new()
            }
        }
    }

    /// Deserialize the table, less the keys in `without` (sub-tables read on their
    /// own), as a `T`, reporting each key that fails (as `{name}.{key}`) and reading
    /// again without it. `None` when a required key failed or is missing (reported).
    pub fn read_as<T: DeserializeOwned>(
        &self,
        name: &str,
        without: &[&str],
        problems: &mut Collector<'_>,
    ) -> Option<T> {
        let mut table = self.entries(without);
        let mut removed: Vec<String> = Vec::new();
        let dot = if name.is_empty() { "" } else { "." };
        // Each round either succeeds or removes a key: at most keys + 1 rounds.
        for _ in 0..=table.len() {
            let value = Value::InlineTable(table.clone());
            let e = match T::deserialize(value.into_deserializer()) {
                Ok(t) => return Some(t),
                Err(e) => e,
            };
            let at = e.span();
            let message = e.message().trim_end();
            if let Some(unknown) = set_aside_unknown(&mut table, message) {
                // serde names one unknown key per reading: every key it does not know
                // is set aside at once, so that a table of n of them is read twice,
                // not n times.
                for (k, span, said) in unknown {
                    problems.push(span, &format!("{name}{dot}{k}"), &said);
                    removed.push(k);
                }
                continue;
            }
            let culprit = at.as_ref().and_then(|at| culprit(&table, at.start));
            match culprit {
                Some(k) => {
                    problems.push(at, &format!("{name}{dot}{k}"), message);
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
                    problems.push(at.or_else(|| self.span()), name, message);
                    return None;
                }
            }
        }
        None
    }

    /// The table's entries as an inline table, which serde reads; spans stay those of
    /// the document.
    fn entries(&self, without: &[&str]) -> InlineTable {
        let mut table = InlineTable::new();
        for (k, item) in self.t.iter() {
            if without.contains(&k) {
                continue;
            }
            let Some((key, _)) = self.t.get_key_value(k) else {
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
        table
    }
}

/// The key of `table` whose key or value holds byte `at`.
/// After serde's "unknown field `k`, expected one of `a`, `b`" (or "..., there are no
/// fields"): remove every key of `table` that is not among the fields named, and say
/// each as serde would; `None` when the message is no such error or names no key here.
#[allow(clippy::type_complexity)]
fn set_aside_unknown(
    table: &mut InlineTable,
    message: &str,
) -> Option<Vec<(String, Option<std::ops::Range<usize>>, String)>> {
    let rest = message.strip_prefix("unknown field `")?;
    let (_, after) = rest.split_once("`, ")?;
    let known: Vec<&str> = if after.starts_with("there are no fields") {
        Vec::new()
    } else {
        after
            .strip_prefix("expected ")?
            .split('`')
            .skip(1)
            .step_by(2)
            .collect()
    };
    let unknown: Vec<String> = table
        .iter()
        .map(|(k, _)| k.to_owned())
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    let said: Vec<_> = unknown
        .into_iter()
        .map(|k| {
            let span = table.key(&k).and_then(|key| key.span());
            let said = format!("unknown field `{k}`, {after}");
            (k, span, said)
        })
        .collect();
    // One pass (removing keys one by one would shift the rest each time).
    table.retain(|k, _| known.contains(&k));
    Some(said)
}

fn culprit(table: &InlineTable, at: usize) -> Option<String> {
    table.iter().find_map(|(k, v)| {
        let in_value = v.span().is_some_and(|s| s.contains(&at));
        let in_key = table
            .key(k)
            .and_then(|k| k.span())
            .is_some_and(|s| s.contains(&at));
        (in_value || in_key).then(|| k.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use crate::{parse, Collector, Tab};
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Two {
        a: u8,
        #[serde(default)]
        b: Option<String>,
    }

    #[test]
    fn every_bad_key_is_reported_and_the_rest_read() {
        let text = "[[t]]\na = 1\nb = 2\n[[t]]\nzz = 1\na = 300\nb = \"x\"\n[[t]]\nb = \"y\"\n";
        let mut c = Collector::new(text);
        let doc = parse(text, &mut c).expect("TOML");
        let root = Tab::table(doc.as_table());
        let read: Vec<Option<Two>> = root
            .tables("t", "", &mut c)
            .into_iter()
            .map(|(name, t)| t.read_as::<Two>(&name, &[], &mut c))
            .collect();
        assert_eq!(read, [Some(Two { a: 1, b: None }), None, None]);
        let p: Vec<String> = c.into_problems().iter().map(|p| p.to_string()).collect();
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(
            p[0].starts_with("line 3, column 5: t[1].b: invalid type"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("line 5, column 1: t[2].zz: unknown field"),
            "{p:?}"
        );
        assert!(p[2].starts_with("line 6, column 5: t[2].a:"), "{p:?}");
        assert!(
            p[3].starts_with("line 8, column 1: t[3]: missing field `a`"),
            "{p:?}"
        );
    }
}
