//! The configuration's reference, generated from its own schema: every table and key
//! of [`Config`] with its type, default and the doc comment of its Rust field
//! (`schemars` reads them at build time, and the defaults from the types' `Default`),
//! so that the manual page apm.toml(5) ([`man_page`]) and the commented default file
//! the package installs as /etc/apm/apm.toml ([`default_file`]) cannot drift from
//! what [`Config::parse`] accepts.

use super::Config;
use serde_json::{Map, Value};

/// One table of the configuration (`[sa]`, `[policy.probe]`, `[[device]]`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// Its dotted name (`policy.probe`).
    pub name: String,
    /// An array of tables (`[[device]]`), each given as often as needed.
    pub array: bool,
    /// What it is for.
    pub doc: String,
    /// Its keys.
    pub keys: Vec<Key>,
}

/// One key of a table.
#[derive(Clone, Debug, PartialEq)]
pub struct Key {
    /// Its name.
    pub name: String,
    /// Its type, in words (`integer`, `string`, `one of: ...`).
    pub kind: String,
    /// Its default as TOML text (`None`: unset unless given, or required).
    pub default: Option<String>,
    /// Whether a table without it is refused.
    pub required: bool,
    /// What it does (the field's doc comment).
    pub doc: String,
    /// For a key of a fixed set of words: each word and what it means.
    pub values: Vec<(String, String)>,
}

/// Every table of the configuration, in the order a file would have them.
pub fn tables() -> Vec<Table> {
    let schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for (name, prop) in properties(&schema) {
        collect(&defs, &name, prop, &mut out);
    }
    // The order of a file: devices, then the fabric, the transport, the engine, the agent.
    let rank = |t: &Table| {
        ["device", "sa", "lap", "policy", "sim", "agent"]
            .iter()
            .position(|n| t.name.split('.').next() == Some(n))
            .unwrap_or(usize::MAX)
    };
    out.sort_by_key(|t| (rank(t), t.name.clone()));
    out
}

/// `schema`'s properties, in name order.
fn properties(schema: &Value) -> Vec<(String, &Value)> {
    let mut v: Vec<(String, &Value)> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v)).collect())
        .unwrap_or_default();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The definition a property refers to (directly, as an option, or as its items).
fn target<'a>(defs: &'a Map<String, Value>, prop: &'a Value) -> Option<&'a Value> {
    let reference = prop
        .get("$ref")
        .or_else(|| prop.get("items").and_then(|i| i.get("$ref")))
        .or_else(|| {
            prop.get("anyOf")?
                .as_array()?
                .iter()
                .find_map(|v| v.get("$ref"))
        })?;
    defs.get(reference.as_str()?.strip_prefix("#/$defs/")?)
}

/// The table `name` (the property `prop`) and the tables under it.
fn collect(defs: &Map<String, Value>, name: &str, prop: &Value, out: &mut Vec<Table>) {
    let Some(def) = target(defs, prop).filter(|d| d.get("properties").is_some()) else {
        return;
    };
    let required: Vec<&str> = def
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut table = Table {
        name: name.to_owned(),
        array: prop.get("type").and_then(Value::as_str) == Some("array"),
        doc: text(prop.get("description").or_else(|| def.get("description"))),
        keys: Vec::new(),
    };
    // A table given as a whole (`[policy]`) has its keys' defaults on them; one given
    // with its parent (`[policy.probe]`) on the parent's property.
    let parent_default = prop.get("default");
    for (key, p) in properties(def) {
        let sub = target(defs, p);
        if sub.is_some_and(|d| d.get("properties").is_some()) {
            collect(defs, &format!("{name}.{key}"), p, out);
            continue;
        }
        let default = p
            .get("default")
            .or_else(|| parent_default.and_then(|d| d.get(&key)))
            .filter(|d| !d.is_null())
            .map(toml_text);
        table.keys.push(Key {
            kind: kind(p, sub),
            required: required.contains(&key.as_str()),
            doc: text(p.get("description")),
            values: sub.map(words).unwrap_or_default(),
            name: key,
            default,
        });
    }
    out.push(table);
}

/// A key's type in words.
fn kind(p: &Value, sub: Option<&Value>) -> String {
    if let Some(d) = sub.filter(|d| d.get("oneOf").is_some()) {
        let w: Vec<String> = words(d)
            .into_iter()
            .map(|(w, _)| format!("\"{w}\""))
            .collect();
        return format!("one of {}", w.join(", "));
    }
    let types: Vec<&str> = match p.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let t = types.into_iter().find(|t| *t != "null").unwrap_or("value");
    match (
        t,
        p.get("items")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str),
    ) {
        ("array", Some(item)) => format!("array of {item}s"),
        _ => t.to_owned(),
    }
}

/// The words of an enum definition, each with its meaning.
fn words(def: &Value) -> Vec<(String, String)> {
    def.get("oneOf")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| {
                    let w = v.get("const").or_else(|| v.get("enum")?.get(0))?;
                    Some((w.as_str()?.to_owned(), text(v.get("description"))))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A JSON default as TOML text.
fn toml_text(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_text).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// A doc comment as prose: lines of a paragraph joined, rustdoc's links unwrapped
/// (`[`Foo`]` to `Foo`).
fn text(v: Option<&Value>) -> String {
    let raw = v.and_then(Value::as_str).unwrap_or_default();
    let paragraphs: Vec<String> = raw
        .split("\n\n")
        .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
        .collect();
    let mut s = paragraphs.join("\n\n");
    // [`X`] and [`X`](path): the name alone.
    while let Some(start) = s.find("[`") {
        let Some(len) = s[start..].find("`]") else {
            break;
        };
        let end = start + len;
        let name = s[start + 1..end + 1].to_owned();
        let mut after = end + 2;
        if s[after..].starts_with('(') {
            if let Some(close) = s[after..].find(')') {
                after += close + 1;
            }
        }
        s.replace_range(start..after, &name);
    }
    s
}

/// The commented default configuration: every table and key with its doc, each key
/// at its default (or unset), all of it commented out, so that the file as installed
/// changes nothing and an operator uncomments what they change.
pub fn default_file() -> String {
    let mut f = String::from(
        "# apm's deployment configuration (apm.toml(5)), read by `apm agent --config` (the\n\
         # apm-agent service) and `apm run --config`. Every key is shown commented out at\n\
         # its default; uncomment what you change. `apm config check FILE` checks a file;\n\
         # the agent reads it again on SIGHUP (`systemctl reload apm-agent`).\n",
    );
    for t in tables() {
        f.push('\n');
        for line in wrap(&t.doc, 86) {
            f.push_str(&format!("# {line}\n"));
        }
        let header = if t.array {
            format!("[[{}]]", t.name)
        } else {
            format!("[{}]", t.name)
        };
        f.push_str(&format!("#{header}\n"));
        for k in &t.keys {
            for line in wrap(&k.doc, 84) {
                f.push_str(&format!("#   {line}\n"));
            }
            for (w, meaning) in &k.values {
                for (i, line) in wrap(&format!("\"{w}\": {meaning}"), 82).iter().enumerate() {
                    let lead = if i == 0 { "- " } else { "  " };
                    f.push_str(&format!("#   {lead}{line}\n"));
                }
            }
            match &k.default {
                Some(d) => f.push_str(&format!("#{} = {d}\n", k.name)),
                None if k.required => {
                    f.push_str(&format!("#{} = ({}, required)\n", k.name, k.kind))
                }
                None => f.push_str(&format!("#{} = ({}; unset by default)\n", k.name, k.kind)),
            }
        }
    }
    f
}

/// `text` in lines of at most `width` characters (a longer word stands alone).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, para) in text.split("\n\n").enumerate() {
        if i > 0 {
            lines.push(String::new());
        }
        let mut line = String::new();
        for word in para.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > width {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        if !line.is_empty() {
            lines.push(line);
        }
    }
    lines
}

/// Text for roff: backslashes and a leading dot or quote escaped, `code` in bold.
fn roff(text: &str) -> String {
    let mut s = text.replace('\\', "\\e").replace('-', "\\-");
    let mut bold = false;
    while let Some(i) = s.find('`') {
        s.replace_range(i..=i, if bold { "\\fR" } else { "\\fB" });
        bold = !bold;
    }
    if bold {
        s.push_str("\\fR");
    }
    s.lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The manual page apm.toml(5), in roff.
pub fn man_page(version: &str) -> String {
    let mut m = format!(
        ".TH APM.TOML 5 \"\" \"apm {version}\" \"File Formats\"\n\
         .SH NAME\napm.toml \\- apm's deployment configuration\n\
         .SH SYNOPSIS\n/etc/apm/apm.toml\n\
         .SH DESCRIPTION\n\
         A TOML file read by \\fBapm agent \\-\\-config\\fR (the apm\\-agent service), \
         \\fBapm run \\-\\-config\\fR and the library. Unknown tables and keys are errors; \
         every problem of a file is reported with its line, column and key \
         (\\fBapm config check\\fR \\fIFILE\\fR). The agent reads its file again on SIGHUP: \
         [agent] metrics and operator_group apply at once, any other change needs a \
         restart. This page is generated from the configuration's own definition: \
         each key's type, default and text are the program's.\n"
    );
    for t in tables() {
        let header = if t.array {
            format!("[[{}]]", t.name)
        } else {
            format!("[{}]", t.name)
        };
        m.push_str(&format!(".SH {}\n{}\n", roff(&header), roff(&t.doc)));
        for k in &t.keys {
            let default = match (&k.default, k.required) {
                (Some(d), _) => format!("default {d}"),
                (None, true) => "required".to_owned(),
                (None, false) => "unset by default".to_owned(),
            };
            m.push_str(&format!(
                ".TP\n\\fB{}\\fR ({}; {})\n{}\n",
                roff(&k.name),
                roff(&k.kind),
                roff(&default),
                roff(&k.doc).replace("\n\n", "\n.IP\n")
            ));
            for (w, meaning) in &k.values {
                m.push_str(&format!(
                    ".RS\n.TP\n\\fB\"{}\"\\fR\n{}\n.RE\n",
                    roff(w),
                    roff(meaning)
                ));
            }
        }
    }
    m.push_str(
        ".SH FILES\n/etc/apm/apm.toml, as installed: every key commented out at its default.\n\
         .SH SEE ALSO\n\\fBapm\\fR(8), \\fBapm\\-agent\\fR(8), \\fBapm\\-config\\fR(8)\n",
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_and_key_of_the_configuration_is_described() {
        let t = tables();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "device",
                "sa",
                "lap",
                "lap.peer",
                "policy",
                "policy.probe",
                "sim",
                "agent"
            ]
        );
        for table in &t {
            assert!(!table.doc.is_empty(), "[{}] has no text", table.name);
            for k in &table.keys {
                assert!(!k.doc.is_empty(), "{}.{} has no text", table.name, k.name);
            }
        }
        let policy = t.iter().find(|t| t.name == "policy").expect("policy");
        let boost = policy
            .keys
            .iter()
            .find(|k| k.name == "alternate_timeout_boost");
        assert_eq!(boost.and_then(|k| k.default.clone()), Some("2".to_owned()));
        let fast = policy
            .keys
            .iter()
            .find(|k| k.name == "fast_moves")
            .expect("fast_moves");
        assert_eq!(fast.default.as_deref(), Some("\"self_armed\""));
        assert_eq!(fast.values.len(), 3);
        assert!(!text(Some(&Value::from("see [`Foo`](x) and [`Bar`]"))).contains('['));
    }

    /// The installed file, each key's default uncommented, reads as the defaults.
    #[test]
    fn the_default_file_reads_as_the_defaults() {
        let file = default_file();
        let uncommented: String = file
            .lines()
            .filter_map(|l| {
                let l = l.strip_prefix('#')?;
                let table = l.starts_with('[') && !l.starts_with("[[");
                let set = l.contains(" = ") && !l.contains('(') && !l.starts_with(' ');
                (table || set).then(|| format!("{l}\n"))
            })
            .collect();
        let config: Config = toml::from_str(&uncommented).expect(&uncommented);
        assert_eq!(
            config.policy,
            Some(apm_core::Policy::default()),
            "{uncommented}"
        );
        assert!(config.sa.subscribe && config.sa.resolve_paths);
        // And the file itself, as installed, reads too (nothing in it is set).
        let _: Config = toml::from_str(&file).expect("the file as installed");
    }
}
