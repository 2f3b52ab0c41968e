//! The dotted name of a key (`faults[3].port`, `topology.sm[1].ports[2]`) and where it
//! is written in a document: how a check that works on values read earlier reports a
//! problem at the line that says it.

use crate::Tab;
use std::ops::Range;
use toml_edit::{Item, Value};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    /// 0-based; shown 1-based.
    Index(usize),
}

/// A key in a document, from the root: table keys and array indexes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct KeyPath(Vec<Seg>);

impl KeyPath {
    /// The top-level `key`.
    pub fn new(key: &str) -> KeyPath {
        KeyPath(vec![Seg::Key(key.to_owned())])
    }

    /// `self.key`.
    pub fn key(&self, key: &str) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_owned()));
        p
    }

    /// `self[index]` (0-based, printed 1-based as the files' readers count).
    pub fn index(&self, index: usize) -> KeyPath {
        let mut p = self.clone();
        p.0.push(Seg::Index(index));
        p
    }

    /// Where the key is written under `root`: its value, else the key, else the
    /// nearest enclosing table or element that is written (a key left to its default
    /// is about the table that would hold it).
    pub fn locate(&self, root: Tab<'_>) -> Option<Range<usize>> {
        let mut table = root;
        let mut best = root.span();
        let mut segs = self.0.iter().peekable();
        while let Some(seg) = segs.next() {
            let Seg::Key(k) = seg else {
                return best;
            };
            let Some(item) = table.get(k) else {
                return best;
            };
            best = table.value_span(k).or(best);
            // The element an index names, in an array of tables or of values.
            let mut item = Some(item);
            let mut value: Option<&Value> = item.and_then(Item::as_value);
            while let Some(Seg::Index(i)) = segs.peek() {
                segs.next();
                match (item, value) {
                    (Some(Item::ArrayOfTables(a)), _) => {
                        let Some(t) = a.get(*i) else {
                            return best;
                        };
                        best = t.span().or(best);
                        item = None;
                        value = None;
                        table = Tab::table(t);
                        continue;
                    }
                    (_, Some(Value::Array(a))) => {
                        let Some(v) = a.get(*i) else {
                            return best;
                        };
                        best = v.span().or(best);
                        item = None;
                        value = Some(v);
                    }
                    _ => return best,
                }
            }
            match (item, value) {
                (Some(i), _) => match Tab::of(i) {
                    Some(t) => table = t,
                    None if segs.peek().is_some() => return best,
                    None => {}
                },
                (None, Some(Value::InlineTable(t))) => table = Tab::inline(t),
                (None, Some(_)) if segs.peek().is_some() => return best,
                _ => {}
            }
        }
        best
    }
}

impl std::fmt::Display for KeyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{}]", n + 1)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, Collector};

    #[test]
    fn a_path_finds_its_line_or_the_table_that_would_hold_it() {
        let text =
            "top = 1\n[fabric]\nack = 40\n[[faults]]\nport = \"a\"\n[[faults]]\nport = \"b\"\n\
                    [[sm]]\nports = [\"x\",\n  \"y\"]\n[inl]\nt = { u = 3 }\n";
        let mut c = Collector::new(text);
        let doc = parse(text, &mut c).expect("TOML");
        let root = Tab::table(doc.as_table());
        let line = |p: &KeyPath| {
            let span = p.locate(root).expect("somewhere");
            text[..span.start].matches('\n').count() + 1
        };
        let faults = KeyPath::new("faults");
        assert_eq!(line(&KeyPath::new("top")), 1);
        assert_eq!(line(&KeyPath::new("fabric").key("ack")), 3);
        assert_eq!(line(&KeyPath::new("fabric").key("unset")), 2, "its table");
        assert_eq!(line(&faults.index(1).key("port")), 7);
        assert_eq!(line(&faults.index(1).key("at_ms")), 6, "the element");
        assert_eq!(
            line(&faults.index(5).key("port")),
            4,
            "past the end: the array"
        );
        assert_eq!(line(&KeyPath::new("sm").index(0).key("ports").index(1)), 10);
        assert_eq!(line(&KeyPath::new("inl").key("t").key("u")), 12);
        assert_eq!(faults.index(1).key("port").to_string(), "faults[2].port");
        assert_eq!(KeyPath::new("missing").locate(root), root.span());
    }
}
