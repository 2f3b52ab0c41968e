//! TOML read so that every problem in a file is found, each at the key or value it is
//! about, with its line, column and dotted key: the deployment configuration (`apm`)
//! and the simulator's scenarios (`provider-sim`) both read their files through it.
//!
//! serde stops at the first error and loses the place of errors inside some types, so
//! a reader here takes a document apart table by table ([`Tab`]), reads each table alone
//! ([`Tab::read_as`]: a key that fails is reported at its span and set aside before
//! the table is read again) and reports semantic problems found later at the key they
//! name ([`KeyPath`], resolved against the document). [`Collector`] turns byte offsets
//! into lines and columns in time linear in the file, whatever the number of problems.
//! This crate knows no file's shape: its callers do.
#![forbid(unsafe_code)]

mod path;
mod shape;
mod table;

pub use path::KeyPath;
pub use table::Tab;

use serde::Serialize;
use std::ops::Range;
use toml_edit::ImDocument;

/// The longest echo of the user's text inside one message (characters): a 5 MB value
/// must not come back as a 5 MB message.
const ECHO_MAX: usize = 200;

/// The most values (keys, array elements, tables) a document may hold: far above any
/// configuration or scenario (a thousand `[[lap.peer]]` tables are a few thousand),
/// small enough that the parsed document stays within tens of MiB. A 16 MiB file of
/// `[1,1,1,...]` would otherwise take gigabytes to parse (every element a node).
pub const MAX_VALUES: usize = 200_000;

/// The most problems listed; the rest are counted in one last line.
pub const MAX_LISTED: usize = 200;

/// One problem of a file, located.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// 1-based line (0 when the problem has no place: an empty file, a value built in
    /// code rather than read).
    pub line: usize,
    /// 1-based column (characters).
    pub column: usize,
    /// The key it is about, dotted (`lap.vendor_class`, `device[2].name`,
    /// `faults[3].port`); empty for the file as a whole or a syntax error.
    pub key: String,
    /// What is wrong, and what to do about it.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line != 0 {
            write!(f, "line {}, column {}: ", self.line, self.column)?;
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Problem {}

/// Every problem found in a file, in file order. Prints one per line; indexes and
/// iterates as a slice of [`Problem`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Problems(Vec<Problem>);

impl Problems {
    /// The problems, in file order.
    pub fn into_vec(self) -> Vec<Problem> {
        self.0
    }
}

impl From<Vec<Problem>> for Problems {
    fn from(problems: Vec<Problem>) -> Problems {
        Problems(problems)
    }
}

impl std::ops::Deref for Problems {
    type Target = [Problem];
    fn deref(&self) -> &[Problem] {
        &self.0
    }
}

impl IntoIterator for Problems {
    type Item = Problem;
    type IntoIter = std::vec::IntoIter<Problem>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Problems {
    type Item = &'a Problem;
    type IntoIter = std::slice::Iter<'a, Problem>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// `text` cut to at most `max` characters, with what was left out said at the end.
pub fn truncate_echo(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => text.into(),
        Some((cut, _)) => format!("{}... ({} more bytes)", &text[..cut], text.len() - cut).into(),
    }
}

/// Byte offset -> (line, column), 1-based, in O(log lines) plus the characters between
/// the offset and the previous lookup on the same line (lookups mostly go forward).
#[derive(Debug)]
struct Locator<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
    /// The last lookup: offset, line index, column (characters).
    last: (usize, usize, usize),
}

impl<'a> Locator<'a> {
    fn new(text: &'a str) -> Locator<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Locator {
            text,
            line_starts,
            last: (0, 0, 0),
        }
    }

    fn at(&mut self, offset: usize) -> (usize, usize) {
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

/// The problems of one text found so far, located as they are pushed.
#[derive(Debug)]
pub struct Collector<'a> {
    locator: Locator<'a>,
    list: Vec<Problem>,
}

impl<'a> Collector<'a> {
    /// Collect the problems of `text` (the text every span pushed refers to).
    pub fn new(text: &'a str) -> Collector<'a> {
        Collector {
            locator: Locator::new(text),
            list: Vec::new(),
        }
    }

    /// A problem at `span` (none: the file as a whole) about `key` (dotted, may be
    /// empty). A long message (one quoting a huge value) is cut.
    pub fn push(&mut self, span: Option<Range<usize>>, key: &str, message: &str) {
        let (line, column) = span.map_or((0, 0), |s| self.locator.at(s.start));
        self.list.push(Problem {
            line,
            column,
            key: key.to_owned(),
            message: truncate_echo(message, ECHO_MAX).into_owned(),
        });
    }

    /// A problem about the key `path` names, at its value in `root`'s document (or at
    /// the nearest table that holds it, when the key is not written: a default).
    pub fn push_at(&mut self, root: Tab<'_>, path: &KeyPath, message: &str) {
        self.push(path.locate(root), &path.to_string(), message);
    }

    /// Nothing found so far.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// How many problems were found so far.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// The problems, in file order (whichever check found them), at most
    /// [`MAX_LISTED`] with a last one that counts the rest.
    pub fn into_problems(self) -> Problems {
        let mut list = self.list;
        list.sort_by_key(|e| (e.line, e.column));
        if list.len() > MAX_LISTED {
            let more = list.len() - MAX_LISTED;
            list.truncate(MAX_LISTED);
            list.push(Problem {
                line: 0,
                column: 0,
                key: String::new(),
                message: format!(
                    "... and {more} more problems (the first {MAX_LISTED} are listed)"
                ),
            });
        }
        Problems(list)
    }
}

/// Parse `text` as a TOML document; a syntax error is pushed (nothing after it can be
/// trusted) and gives `None`.
pub fn parse<'t>(text: &'t str, problems: &mut Collector<'_>) -> Option<ImDocument<&'t str>> {
    if let Some(at) = shape::past_values(text, MAX_VALUES) {
        problems.push(
            Some(at..at),
            "",
            &format!(
                "more than {MAX_VALUES} values (keys, array elements, tables): no \
                 configuration or scenario needs that many; nothing of the file is read"
            ),
        );
        return None;
    }
    match ImDocument::parse(text) {
        Ok(d) => Some(d),
        Err(e) => {
            problems.push(e.span(), "", e.message().trim_end());
            None
        }
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

    #[test]
    fn problems_come_out_in_file_order_and_long_ones_cut() {
        let text = "a = 1\nb = 2\n";
        let mut c = Collector::new(text);
        c.push(Some(6..7), "b", "second");
        c.push(Some(0..1), "a", &"x".repeat(1000));
        c.push(None, "", "the file");
        let p = c.into_problems();
        assert_eq!(p[0].to_string(), "the file");
        assert!(p[1].to_string().starts_with("line 1, column 1: a: xxx"));
        assert!(
            p[1].message.ends_with("(800 more bytes)"),
            "{}",
            p[1].message
        );
        assert_eq!(p[2].to_string(), "line 2, column 1: b: second");
    }

    #[test]
    fn long_echoes_are_cut() {
        assert_eq!(truncate_echo("short", 10), "short");
        let long = "é".repeat(100);
        let cut = truncate_echo(&long, 10);
        assert!(cut.starts_with(&"é".repeat(10)), "{cut}");
        assert!(cut.ends_with("(180 more bytes)"), "{cut}");
    }
}
