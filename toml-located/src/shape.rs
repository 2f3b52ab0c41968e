//! How many values a TOML text holds, counted before it is parsed: one pass over the
//! bytes that knows strings and comments and nothing else, so that a file whose parse
//! would take gigabytes (millions of array elements) is refused in milliseconds.
//!
//! A value is counted at each `=` (a key), `,` (an element or inline key after the
//! first), `[` (an array or table) and `{` outside strings and comments: an upper bound
//! of the document's nodes, close enough to refuse what no real file has.

/// Where the text passes `max` values (a byte offset), if it does.
pub(crate) fn past_values(text: &str, max: usize) -> Option<usize> {
    let b = text.as_bytes();
    let mut count = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'#' => {
                i = skip_to(b, i, b"\n");
                continue;
            }
            b'"' if b[i..].starts_with(b"\"\"\"") => {
                i = skip_string(b, i + 3, b"\"\"\"", true);
                continue;
            }
            b'\'' if b[i..].starts_with(b"'''") => {
                i = skip_string(b, i + 3, b"'''", false);
                continue;
            }
            b'"' => {
                i = skip_string(b, i + 1, b"\"", true);
                continue;
            }
            b'\'' => {
                i = skip_string(b, i + 1, b"'", false);
                continue;
            }
            b'=' | b',' | b'[' | b'{' => {
                count += 1;
                if count > max {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index after the next `end` from `from` (or the text's end).
fn skip_to(b: &[u8], from: usize, end: &[u8]) -> usize {
    let mut i = from;
    while i < b.len() {
        if b[i..].starts_with(end) {
            return i + end.len();
        }
        i += 1;
    }
    b.len()
}

/// The index after a string's closing `end`, from just inside its opening; a
/// backslash escapes the next byte in basic strings.
fn skip_string(b: &[u8], from: usize, end: &[u8], escapes: bool) -> usize {
    let mut i = from;
    while i < b.len() {
        if escapes && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i..].starts_with(end) {
            return i + end.len();
        }
        i += 1;
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_outside_strings_and_comments() {
        assert_eq!(past_values("a = [1, 2, 3]\n", 10), None);
        // a: '=', '[', ',', ',' -> 4 values
        assert_eq!(past_values("a = [1, 2, 3]\n", 3), Some(9));
        let quiet = "s = \"a,b,[c]={d}\" # ,,,,,\nt = '''x,,,\ny''' \nu = \"\\\",,\"\n";
        assert_eq!(
            past_values(quiet, 3),
            None,
            "strings and comments count nothing"
        );
        let many = format!("x = [{}1]", "1,".repeat(1000));
        assert!(past_values(&many, 500).is_some());
        assert_eq!(past_values("\"unterminated ,,,,", 1), None);
    }
}
