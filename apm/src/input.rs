//! Reading what a user hands apm (configuration and scenario files, MADs and JSON on
//! standard input) with a size limit enforced while reading, before any parsing starts.
//!
//! Every reader of the command line and the library goes through here, so that an
//! endless input (`/dev/zero`, a FIFO that never closes) costs at most its limit in
//! memory and the error names the limit. This module never interprets what it reads
//! beyond checking that it is UTF-8 text.

use std::io::Read;
use std::path::Path;

/// The largest deployment configuration read: far above any real one (a thousand
/// `[[lap.peer]]` tables are ~100 KiB), small enough to parse in moments.
pub const CONFIG_LIMIT: u64 = 16 << 20;
/// The largest scenario file read.
pub const SCENARIO_LIMIT: u64 = 16 << 20;
/// The largest MAD in hex read from standard input: a MAD is 256 bytes, ~800 characters
/// of hex with separators; this leaves room for comments and generous spacing.
pub const MAD_HEX_LIMIT: u64 = 64 << 10;
/// The largest JSON document `apm mad encode --json -` reads (`apm mad decode --json`
/// prints ~10 KiB for a MAD).
pub const MAD_JSON_LIMIT: u64 = 1 << 20;

/// Why an input could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The operating system refused (missing file, permissions, a directory, ...).
    #[error("cannot read {what}: {source}")]
    Io {
        /// The file or "standard input".
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// More than the limit: nothing of it is parsed.
    #[error("{what} is larger than the {} limit for {kind}", size(*limit))]
    TooLarge {
        /// The file or "standard input".
        what: String,
        /// What it was read as ("a configuration file", ...).
        kind: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// Not UTF-8.
    #[error("{what} is not UTF-8 text (invalid byte at offset {offset})")]
    NotText {
        /// The file or "standard input".
        what: String,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
}

/// A byte count as people write it (`16 MiB`, `64 KiB`, `100 bytes`).
pub fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// Read all of `reader` as text, refusing it once it passes `limit` bytes (reading
/// stops there: an endless reader costs `limit` bytes, no more).
pub fn read_limited(
    reader: impl Read,
    limit: u64,
    what: &str,
    kind: &'static str,
) -> Result<String, InputError> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| InputError::Io {
            what: what.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            what: what.to_owned(),
            kind,
            limit,
        });
    }
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        what: what.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Read the file at `path` as text of at most `limit` bytes.
pub fn read_file(path: &Path, limit: u64, kind: &'static str) -> Result<String, InputError> {
    let what = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| InputError::Io {
        what: what.clone(),
        source,
    })?;
    read_limited(file, limit, &what, kind)
}

/// Read standard input as text of at most `limit` bytes.
pub fn read_stdin(limit: u64, kind: &'static str) -> Result<String, InputError> {
    read_limited(std::io::stdin().lock(), limit, "standard input", kind)
}

/// `text` cut to at most `max` characters, with what was left out said at the end: an
/// error that quotes its input (a 5 MB line of TOML) must not print all of it.
pub use toml_located::truncate_echo;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_reader_stops_at_the_limit() {
        let err = read_limited(std::io::repeat(b'0'), 1000, "zeros", "a test input")
            .expect_err("too large");
        assert_eq!(
            err.to_string(),
            "zeros is larger than the 1000 bytes limit for a test input"
        );
        assert_eq!(size(16 << 20), "16 MiB");
        assert_eq!(size(64 << 10), "64 KiB");
    }

    #[test]
    fn text_at_the_limit_reads_and_bad_utf8_is_located() {
        let ok = read_limited(&b"abc"[..], 3, "x", "t").expect("fits");
        assert_eq!(ok, "abc");
        let err = read_limited(&b"ab\xffc"[..], 10, "x", "t").expect_err("not text");
        assert!(err.to_string().contains("offset 2"), "{err}");
    }
}
