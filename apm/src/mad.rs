//! `apm mad`: decode and encode management datagrams, for people debugging a fabric
//! and for tests that craft traffic.
//!
//! Both directions go through ib-mad: `decode` prints [`ib_mad::fields::describe`]'s
//! view of the typed decode; `encode` writes field values at the positions that view
//! gives and re-decodes after each write, so anything it prints decodes again and a
//! malformed value is refused with the field and offset that ib-mad names. This module
//! keeps no layout of its own. Bits no field covers that are not zero are shown and
//! written back by byte (`reserved.rs`), so that decode and encode are each other's
//! inverse on any MAD decode accepts.

mod reserved;

use crate::out::{out, outln};
use anyhow::{bail, Context, Result};
use apm::input::{self, MAD_HEX_LIMIT, MAD_JSON_LIMIT};
use ib_mad::cm::{ApStatus, Apr, CmBody, CmMad, Lap, Mra, Req};
use ib_mad::fields::{self, Field, FieldValue};
use ib_mad::sa::{ClassPortInfo, InformInfo, Notice, NoticeDetails, PathRecord, SaMad, SaPayload};
use ib_mad::smp::{SmInfo, Smp};
use ib_mad::types::{Gid, Lid, Oui, Timeout, U15, U24, U7};
use ib_mad::vendor::VendorMad;
use ib_mad::{AttributeId, Mad, Method, MgmtClass, MAD_SIZE};
use serde_json::{Map, Value};

/// `apm mad` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum MadCommand {
    /// Decode a MAD given as hex and print its fields (offset, bits, name, value).
    Decode(DecodeArgs),
    /// Build a MAD from a kind, FIELD=VALUE pairs and/or JSON; print it as hex.
    Encode(EncodeArgs),
}

/// Arguments of `apm mad decode`.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// The MAD as hex: 256 bytes; whitespace, ':' and a 0x prefix are allowed, several
    /// arguments are joined; `-` reads the hex from standard input.
    #[arg(required = true, value_name = "HEX")]
    hex: Vec<String>,
    /// Print a JSON object (sections of IBA field names in snake_case) instead.
    #[arg(long)]
    json: bool,
}

/// Arguments of `apm mad encode`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
KIND starts from a typical MAD: inform-info (SA Set InformInfo, trap 64), report \
(SA Report Notice trap 64), report-resp, path-record-query (SA GetTable PathRecord), \
class-port-info (SA Get), lap, apr, mra, req (CM Send), vendor (class 0x30 Send), \
sminfo-get (directed-route SubnGet SMInfo), sminfo-resp (its NOT_ACTIVE answer).

FIELD=VALUE sets a field by the name `apm mad decode` prints (SECTION.FIELD when a \
name occurs twice). Values: decimal or 0x-hex numbers, true/false, GIDs as IPv6 text, \
byte strings as hex. Setting mgmt_class, attribute_id, rmpp_type or trap_number \
changes which fields exist; later fields are matched against the new layout.

Examples:
  apm mad encode lap local_comm_id=7 alt_local_lid=0x12 alt_sl=3
  apm mad encode apr ap_status=7
  apm mad decode --json $(apm mad encode report trap_number=65) | apm mad encode --json -")]
pub struct EncodeArgs {
    /// A kind to start from (see below), then FIELD=VALUE assignments.
    #[arg(value_name = "KIND|FIELD=VALUE")]
    args: Vec<String>,
    /// A JSON object as `apm mad decode --json` prints it (or `-` for standard input);
    /// applied before the FIELD=VALUE assignments.
    #[arg(long, value_name = "JSON")]
    json: Option<String>,
}

/// Run an `apm mad` subcommand.
pub fn run(cmd: MadCommand) -> Result<()> {
    match cmd {
        MadCommand::Decode(args) => decode(args),
        MadCommand::Encode(args) => encode(args),
    }
}

/// Parse hex with any whitespace, ':' or '-' separators and optional 0x prefixes.
fn parse_hex(text: &str) -> Result<Vec<u8>> {
    let mut digits = String::with_capacity(text.len());
    for word in text.split(|c: char| c.is_whitespace() || c == ':' || c == '-' || c == ',') {
        let w = word
            .strip_prefix("0x")
            .or_else(|| word.strip_prefix("0X"))
            .unwrap_or(word);
        digits.push_str(w);
    }
    if let Some((i, c)) = digits.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        bail!("not hex: {c:?} at hex digit {i}");
    }
    if digits.len() % 2 != 0 {
        bail!("odd number of hex digits ({})", digits.len());
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).context("hex byte"))
        .collect()
}

fn decode(args: DecodeArgs) -> Result<()> {
    let text = if args.hex.len() == 1 && args.hex[0] == "-" {
        input::read_stdin(MAD_HEX_LIMIT, "a MAD in hex")?
    } else {
        args.hex.join(" ")
    };
    let bytes = parse_hex(&text)?;
    let mad = Mad::decode(&bytes).context("malformed MAD")?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&to_json(&mad, &bytes))?)?;
    } else {
        out!("{}", layout(&mad, &bytes))?;
    }
    Ok(())
}

/// A one-line summary: class, method(attribute), and what matters most.
fn summary(mad: &Mad) -> String {
    let h = mad.header();
    let class = h.mgmt_class.name().unwrap_or("class");
    let method = h
        .method
        .name()
        .map(str::to_string)
        .unwrap_or_else(|| format!("method {}", h.method));
    let attr = fields::attribute_name(h.mgmt_class, h.attribute_id.0)
        .map(str::to_string)
        .unwrap_or_else(|| format!("attribute {}", h.attribute_id));
    let mut s = format!(
        "{class} ({}) {method}({attr}) TID {:#018x}",
        h.mgmt_class, h.transaction_id
    );
    match mad {
        Mad::Sa(m) => {
            if let SaPayload::Notice(n) = &m.payload {
                s.push_str(&format!(" trap {}", n.trap_number()));
                if let Some(name) = fields::trap_name(n.trap_number()).filter(|_| n.is_generic()) {
                    s.push_str(&format!(" ({name})"));
                }
            }
            if m.rmpp.is_active() {
                s.push_str(&format!(
                    " RMPP {:?} segment {}",
                    m.rmpp.rmpp_type, m.rmpp.data1
                ));
            }
        }
        Mad::Cm(CmMad {
            body: CmBody::Apr(a),
            ..
        }) => s.push_str(&format!(
            " APStatus {} ({})",
            a.ap_status.code(),
            a.ap_status.description()
        )),
        Mad::Vendor(v) => s.push_str(&format!(" OUI {}", v.oui)),
        _ => {}
    }
    if h.status != 0 && !matches!(mad, Mad::Smp(_)) {
        s.push_str(&format!(" status {:#06x}", h.status));
    }
    s
}

fn show_value(f: &Field) -> String {
    match &f.value {
        FieldValue::Uint(v) => {
            let digits = (f.bits as usize).div_ceil(4);
            let mut s = if f.bits == 1 {
                v.to_string()
            } else if *v < 10 && f.meaning.is_none() {
                format!("{v}")
            } else {
                format!("{v:#0w$x} ({v})", w = digits + 2)
            };
            if let Some(m) = &f.meaning {
                if !m.is_empty() {
                    s.push_str(&format!(" {m}"));
                }
            }
            s
        }
        FieldValue::Gid(g) => g.to_string(),
        FieldValue::Bytes(b) => {
            if b.iter().all(|x| *x == 0) {
                format!("all zero ({} bytes)", b.len())
            } else {
                let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
                let lines: Vec<String> = hex.chunks(32).map(|c| c.join("")).collect();
                lines.join(&format!("\n{:46}", ""))
            }
        }
    }
}

fn layout(mad: &Mad, wire: &[u8]) -> String {
    let mut out = format!("{}\n", summary(mad));
    out.push_str(&format!(
        "{:>6} {:>5}  {:<32} value\n",
        "byte", "bits", "field"
    ));
    let mut section = "";
    let described = fields::describe(mad);
    for f in described.iter().cloned() {
        if f.section != section {
            section = f.section;
            out.push_str(&format!("{section}\n"));
        }
        let pos = if f.bit == 0 {
            format!("{}", f.offset)
        } else {
            format!("{}.{}", f.offset, f.bit)
        };
        out.push_str(&format!(
            "{pos:>6} {:>5}  {:<32} {}\n",
            f.bits,
            f.name,
            show_value(&f)
        ));
    }
    let reserved = reserved::find(wire, &described);
    if !reserved.is_empty() {
        out.push_str(&format!(
            "{} (bits no field holds, not zero)\n",
            reserved::SECTION
        ));
        for (at, bits, mask) in reserved {
            let name = format!("byte {at} (mask {mask:#04x})");
            out.push_str(&format!(
                "{at:>6} {:>5}  {name:<32} {bits:#04x}\n",
                mask.count_ones()
            ));
        }
    }
    out
}

fn to_json(mad: &Mad, wire: &[u8]) -> Value {
    let mut root = Map::new();
    root.insert("summary".into(), Value::String(summary(mad)));
    let described = fields::describe(mad);
    let reserved: Map<String, Value> = reserved::find(wire, &described)
        .into_iter()
        .map(|(at, bits, _)| (at.to_string(), Value::String(format!("{bits:#04x}"))))
        .collect();
    if !reserved.is_empty() {
        root.insert(reserved::SECTION.into(), Value::Object(reserved));
    }
    for f in described {
        let section = root
            .entry(f.section)
            .or_insert_with(|| Value::Object(Map::new()));
        let value = match &f.value {
            FieldValue::Uint(v) => Value::from(*v),
            FieldValue::Gid(g) => Value::String(g.to_string()),
            FieldValue::Bytes(b) => Value::String(b.iter().map(|x| format!("{x:02x}")).collect()),
        };
        if let Value::Object(m) = section {
            m.insert(f.name.to_string(), value);
        }
    }
    Value::Object(root)
}

/// A starting MAD for `apm mad encode KIND`.
fn preset(kind: &str) -> Option<Mad> {
    let notice = Notice {
        notice_type: U7::from_masked(4),
        producer_type: U24::from_masked(4),
        issuer_lid: Lid(1),
        toggle: false,
        count: U15::ZERO,
        details: NoticeDetails::GidInService(Gid::default()),
        issuer_gid: Gid::default(),
    };
    let report = SaMad::new(Method::REPORT, 1, SaPayload::Notice(notice));
    let mut sminfo_get = [0u8; MAD_SIZE];
    sminfo_get[..8].copy_from_slice(&[1, 0x81, 1, Method::GET.0, 0, 0, 1, 1]);
    sminfo_get[16..18].copy_from_slice(&AttributeId::SM_INFO.0.to_be_bytes());
    let smp_get = Smp::decode(&sminfo_get).ok()?;
    Some(match kind {
        "inform-info" => Mad::Sa(SaMad::set_inform_info(
            1,
            InformInfo::subscribe_trap(64, true),
        )),
        "report" => Mad::Sa(report),
        "report-resp" => Mad::Sa(report.report_response()),
        "path-record-query" => Mad::Sa(SaMad::path_record_query(1, PathRecord::default(), 0)),
        "class-port-info" => Mad::Sa(SaMad::new(
            Method::GET,
            1,
            SaPayload::ClassPortInfo(ClassPortInfo::default()),
        )),
        "lap" => Mad::Cm(CmMad::new(1, CmBody::Lap(Lap::default()))),
        "apr" => Mad::Cm(CmMad::new(
            1,
            CmBody::Apr(Apr::answer(0, 0, ApStatus::Success)),
        )),
        "req" => {
            let mut raw = [0u8; ib_mad::cm::CM_DATA_SIZE];
            ib_mad::Attribute::encode(&Req::default(), &mut raw);
            let mut m = CmMad::new(1, CmBody::Other(Box::new(raw)));
            m.header.attribute_id = AttributeId::CM_REQ;
            Mad::Cm(m)
        }
        "mra" => Mad::Cm(CmMad::new(
            1,
            CmBody::Mra(Mra::for_lap(0, 0, Timeout::ZERO)),
        )),
        "vendor" => Mad::Vendor(
            VendorMad::new(
                MgmtClass(0x30),
                1,
                Method::SEND,
                1,
                AttributeId(0),
                Oui(U24::ZERO),
            )
            .ok()?,
        ),
        "sminfo-get" => Mad::Smp(smp_get),
        "sminfo-resp" => Mad::Smp(smp_get.response(U15::ZERO, SmInfo::not_active(0).to_smp_data())),
        _ => return None,
    })
}

const KINDS: &str = "inform-info, report, report-resp, path-record-query, class-port-info, \
                     lap, apr, mra, req, vendor, sminfo-get, sminfo-resp";

/// One field assignment: optional section, name, value.
#[derive(Debug)]
struct Assign {
    section: Option<String>,
    name: String,
    value: Value,
}

fn parse_assign(arg: &str) -> Result<Assign> {
    let (key, value) = arg
        .split_once('=')
        .with_context(|| format!("{arg:?} is neither a KIND ({KINDS}) nor FIELD=VALUE"))?;
    let (section, name) = match key.split_once('.') {
        Some((s, n)) => (Some(s.to_string()), n.to_string()),
        None => (None, key.to_string()),
    };
    Ok(Assign {
        section,
        name,
        value: Value::String(value.to_string()),
    })
}

fn json_assigns(v: &Value) -> Result<Vec<Assign>> {
    let Value::Object(root) = v else {
        bail!("the JSON must be an object like `apm mad decode --json` prints");
    };
    let mut out = Vec::new();
    for (section, fields) in root {
        match fields {
            Value::Object(m) => {
                for (name, value) in m {
                    out.push(Assign {
                        section: Some(section.clone()),
                        name: name.clone(),
                        value: value.clone(),
                    });
                }
            }
            // `summary` and other annotations are output only.
            _ if section == "summary" => {}
            other => out.push(Assign {
                section: None,
                name: section.clone(),
                value: other.clone(),
            }),
        }
    }
    Ok(out)
}

/// Turn a JSON or command-line value into the kind of value `field` holds.
fn field_value(field: &Field, v: &Value) -> Result<FieldValue> {
    let text = match v {
        Value::Bool(b) => return Ok(FieldValue::Uint(u64::from(*b))),
        Value::Number(n) => {
            let n = n
                .as_u64()
                .with_context(|| format!("{}: {n} is not a non-negative integer", field.name))?;
            return match field.value {
                FieldValue::Uint(_) => Ok(FieldValue::Uint(n)),
                _ => bail!(
                    "{}: expects {} bytes, not a number",
                    field.name,
                    field.bits / 8
                ),
            };
        }
        Value::String(s) => s.trim().to_string(),
        other => bail!("{}: unsupported value {other}", field.name),
    };
    match field.value {
        FieldValue::Uint(_) => {
            let n = match text.as_str() {
                "true" => 1,
                "false" => 0,
                t => match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(h) => u64::from_str_radix(&h.replace('_', ""), 16),
                    None => t.replace('_', "").parse(),
                }
                .with_context(|| format!("{}: {t:?} is not a number", field.name))?,
            };
            Ok(FieldValue::Uint(n))
        }
        FieldValue::Gid(_) => {
            if let Ok(g) = text.parse::<Gid>() {
                return Ok(FieldValue::Gid(g));
            }
            let b = parse_hex(&text)
                .ok()
                .filter(|b| b.len() == 16)
                .with_context(|| format!("{}: {text:?} is not a GID", field.name))?;
            let mut g = [0u8; 16];
            g.copy_from_slice(&b);
            Ok(FieldValue::Gid(Gid(g)))
        }
        FieldValue::Bytes(_) => {
            let bytes = parse_hex(&text).with_context(|| format!("{}: not hex", field.name))?;
            let room = field.bits as usize / 8;
            if bytes.len() > room {
                // In bytes, as the user wrote them (the wire layer counts bits).
                bail!(
                    "{}: {} bytes given, the field holds {room} bytes",
                    field.name,
                    bytes.len()
                );
            }
            Ok(FieldValue::Bytes(bytes))
        }
    }
}

/// Where `apm mad decode` shows a payload it could not decode, by field name: each
/// is that payload's raw bytes, to the end of the MAD.
fn raw_offset(name: &str) -> Option<usize> {
    Some(match name {
        "smp_data" => 64,
        "sa_data" => 56,
        "cm_data" | "data" => 24,
        "vendor_data" => 40,
        _ => return None,
    })
}

/// Write a raw payload assignment (hex) at its offset.
fn write_raw(wire: &mut [u8; MAD_SIZE], a: &Assign) -> Result<()> {
    let at = raw_offset(&a.name).unwrap_or(MAD_SIZE);
    let text = match &a.value {
        Value::String(s) => s.as_str(),
        other => bail!("{}: expects hex bytes, not {other}", a.name),
    };
    let bytes = parse_hex(text).with_context(|| format!("{}: not hex", a.name))?;
    let room = MAD_SIZE.saturating_sub(at);
    if bytes.len() > room {
        bail!(
            "{}: {} bytes given, the payload at byte {at} holds {room} bytes",
            a.name,
            bytes.len()
        );
    }
    wire[at..at + bytes.len()].copy_from_slice(&bytes);
    Mad::decode(wire).with_context(|| format!("after setting {}", a.name))?;
    Ok(())
}

/// The order assignments are applied in: fields that decide the layout first.
fn priority(a: &Assign) -> u8 {
    match a.name.as_str() {
        "mgmt_class" | "class_version" | "base_version" => 0,
        "method" | "attribute_id" | "status" | "d" => 1,
        "rmpp_type" | "rmpp_flags" | "trap_number" | "is_generic" | "additional_info_length" => 2,
        _ => 3,
    }
}

fn encode(args: EncodeArgs) -> Result<()> {
    let mut rest = args.args.as_slice();
    let mut wire = [0u8; MAD_SIZE];
    wire[0] = 1;
    if let Some(first) = rest.first().filter(|a| !a.contains('=')) {
        let mad =
            preset(first).with_context(|| format!("unknown kind {first:?}; kinds: {KINDS}"))?;
        wire = mad.encode();
        rest = &rest[1..];
    }
    let mut pending: Vec<Assign> = Vec::new();
    if let Some(j) = &args.json {
        let text = if j == "-" {
            input::read_stdin(MAD_JSON_LIMIT, "a JSON MAD")?
        } else {
            j.clone()
        };
        let v: Value = serde_json::from_str(&text).context("--json is not valid JSON")?;
        pending.extend(json_assigns(&v)?);
    }
    for a in rest {
        pending.push(parse_assign(a)?);
    }
    pending.sort_by_key(priority);
    // Apply one assignment at a time, re-reading the layout after each: a header field
    // can change which fields exist and where.
    loop {
        let mad = Mad::decode(&wire).context("the MAD built so far does not decode")?;
        let layout = fields::describe(&mad);
        let found = pending.iter().enumerate().find_map(|(i, a)| {
            layout
                .iter()
                .find(|f| f.name == a.name && a.section.as_deref().is_none_or(|s| s == f.section))
                .map(|f| (i, f.clone()))
        });
        let Some((i, field)) = found else {
            // A payload `decode` showed raw (an SMInfo whose SMState is reserved, an SA
            // attribute that does not decode): the layout built so far shows the same
            // bytes as fields, so write the raw bytes where decode found them.
            match pending.iter().position(|a| raw_offset(&a.name).is_some()) {
                Some(i) => {
                    let a = pending.remove(i);
                    write_raw(&mut wire, &a)?;
                    continue;
                }
                None => break,
            }
        };
        let a = pending.remove(i);
        let value = field_value(&field, &a.value)?;
        if value == field.value {
            continue;
        }
        fields::write_field(&mut wire, &field, &value)
            .with_context(|| format!("{} at byte {}", field.name, field.offset))?;
        Mad::decode(&wire).with_context(|| format!("after setting {}", field.name))?;
    }
    // The bits no field holds, last: against the layout every field made.
    let (bits, rest): (Vec<Assign>, Vec<Assign>) = pending
        .into_iter()
        .partition(|a| a.section.as_deref() == Some(reserved::SECTION));
    let pending = rest;
    if !bits.is_empty() {
        let layout = fields::describe(&Mad::decode(&wire)?);
        for a in bits {
            let value = match &a.value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            reserved::write(&mut wire, &layout, &a.name, &value)?;
        }
        Mad::decode(&wire).context("after setting the reserved bits")?;
    }
    if !pending.is_empty() {
        let names: Vec<String> = pending
            .iter()
            .map(|a| match &a.section {
                Some(s) => format!("{s}.{}", a.name),
                None => a.name.clone(),
            })
            .collect();
        let mad = Mad::decode(&wire)?;
        let known: Vec<&str> = fields::describe(&mad).iter().map(|f| f.name).collect();
        bail!(
            "no field {} in this MAD ({}); its fields: {}",
            names.join(", "),
            summary(&mad),
            known.join(" ")
        );
    }
    for line in wire.chunks(16) {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        outln!("{}", hex.join(" "))?;
    }
    Ok(())
}
