//! `apm mad decode` / `apm mad encode`, run as the built binary.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn apm(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run apm");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("apm finishes")
}

fn ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = apm(args, stdin);
    assert!(
        out.status.success(),
        "apm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn err(args: &[&str]) -> String {
    let out = apm(args, None);
    assert!(!out.status.success(), "apm {args:?} should fail");
    assert_ne!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(hex: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["mad", "decode", "--json", hex], None)).expect("JSON")
}

#[test]
fn encode_lap_then_decode_layout_and_json() {
    let hex = ok(
        &[
            "mad",
            "encode",
            "lap",
            "local_comm_id=0x01020304",
            "alt_local_lid=0x12",
            "alt_remote_lid=34",
            "alt_sl=11",
            "alt_subnet_local=true",
            "alt_local_gid=fe80::2:c903:0:1",
            "alt_flow_label=0xABCDE",
        ],
        None,
    );
    // Hex with whitespace and newlines is accepted as one argument.
    let layout = ok(&["mad", "decode", &hex], None);
    assert!(layout.contains("Send(LAP)"), "{layout}");
    assert!(layout.contains("alt_local_lid"), "{layout}");
    assert!(layout.contains("0x0012 (18)"), "{layout}");
    assert!(layout.contains("fe80::2:c903:0:1"), "{layout}");
    let j = json(&hex);
    assert_eq!(j["mad_header"]["attribute_id"], 0x19);
    assert_eq!(j["mad_header"]["mgmt_class"], 7);
    assert_eq!(j["lap"]["alt_local_lid"], 0x12);
    assert_eq!(j["lap"]["alt_remote_lid"], 34);
    assert_eq!(j["lap"]["alt_sl"], 11);
    assert_eq!(j["lap"]["alt_subnet_local"], 1);
    assert_eq!(j["lap"]["alt_flow_label"], 0xABCDE);
    assert_eq!(j["lap"]["local_comm_id"], 0x0102_0304);
    // The wire bytes: LAP data starts at MAD byte 24.
    let bytes: Vec<u8> = hex
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    assert_eq!(bytes.len(), 256);
    assert_eq!(&bytes[24..28], &[1, 2, 3, 4]);
    assert_eq!(&bytes[44..48], &[0, 0x12, 0, 34]);
    assert_eq!(bytes[86], 0xB8);
}

#[test]
fn every_kind_round_trips_through_json() {
    for kind in [
        "inform-info",
        "report",
        "report-resp",
        "path-record-query",
        "class-port-info",
        "lap",
        "apr",
        "mra",
        "req",
        "vendor",
        "sminfo-get",
        "sminfo-resp",
    ] {
        let hex = ok(&["mad", "encode", kind], None);
        let j = ok(&["mad", "decode", "--json", &hex], None);
        let again = ok(&["mad", "encode", "--json", "-"], Some(&j));
        assert_eq!(again, hex, "{kind}: decode --json | encode --json -");
        let layout = ok(&["mad", "decode", "-"], Some(&hex));
        assert!(layout.contains("mad_header"), "{kind}: {layout}");
    }
}

#[test]
fn notice_trap_65_and_inform_info_fields() {
    let hex = ok(
        &[
            "mad",
            "encode",
            "report",
            "trap_number=65",
            "gid_addr=fe80::5",
            "transaction_id=0xABCDEF",
        ],
        None,
    );
    let j = json(&hex);
    assert_eq!(j["notice"]["trap_number"], 65);
    assert_eq!(j["notice"]["gid_addr"], "fe80::5");
    assert_eq!(j["mad_header"]["method"], 6);
    let summary = j["summary"].as_str().unwrap();
    assert!(summary.contains("GID out of service"), "{summary}");
    let hex = ok(
        &["mad", "encode", "inform-info", "trap_number=65", "qpn=1"],
        None,
    );
    let j = json(&hex);
    assert_eq!(j["inform_info"]["trap_number"], 65);
    assert_eq!(j["mad_header"]["attribute_id"], 3);
    assert_eq!(j["mad_header"]["method"], 2);
}

#[test]
fn apr_status_every_value_and_bad_one() {
    for status in 0..14 {
        let hex = ok(
            &["mad", "encode", "apr", &format!("ap_status={status}")],
            None,
        );
        assert_eq!(json(&hex)["apr"]["ap_status"], status);
    }
    let e = err(&["mad", "encode", "apr", "ap_status=14"]);
    assert!(e.contains("ap_status at byte 33"), "{e}");
    // A malformed MAD on input: APStatus 14 at byte 33.
    let hex = ok(&["mad", "encode", "apr"], None);
    let mut bytes: Vec<String> = hex.split_whitespace().map(String::from).collect();
    bytes[33] = "0e".into();
    let e = err(&["mad", "decode", &bytes.join("")]);
    assert!(e.contains("ap_status at byte 33"), "{e}");
    assert!(e.contains("0xe"), "{e}");
}

#[test]
fn malformed_input_errors_name_what_is_wrong() {
    let e = err(&["mad", "decode", "01 03 02"]);
    assert!(e.contains("256 bytes"), "{e}");
    let e = err(&["mad", "decode", "zz"]);
    assert!(e.contains("not hex"), "{e}");
    let mut bad = vec!["00"; 256];
    bad[0] = "02";
    let e = err(&["mad", "decode", &bad.join(" ")]);
    assert!(e.contains("base_version at byte 0"), "{e}");
    let e = err(&["mad", "encode", "lap", "alt_sl=16"]);
    assert!(e.contains("alt_sl"), "{e}");
    let e = err(&["mad", "encode", "lap", "no_such_field=1"]);
    assert!(e.contains("no field no_such_field"), "{e}");
    let e = err(&["mad", "encode", "nonsense"]);
    assert!(e.contains("unknown kind"), "{e}");
}

#[test]
fn header_changes_switch_the_layout() {
    // From a LAP to an APR by attribute ID alone, then an APR field.
    let hex = ok(
        &["mad", "encode", "lap", "attribute_id=0x1a", "ap_status=5"],
        None,
    );
    let j = json(&hex);
    assert_eq!(j["apr"]["ap_status"], 5);
    // A vendor MAD with an OUI.
    let hex = ok(
        &["mad", "encode", "vendor", "mgmt_class=0x4f", "oui=0x001405"],
        None,
    );
    let j = json(&hex);
    assert_eq!(j["vendor_header"]["oui"], 0x1405);
    assert_eq!(j["mad_header"]["mgmt_class"], 0x4F);
}

#[test]
fn req_with_an_alternate_path() {
    let hex = ok(
        &[
            "mad",
            "encode",
            "req",
            "alternate_local_port_lid=0x21",
            "alternate_flow_label=0x12345",
            "alternate_packet_rate=7",
            "sap_supported=1",
        ],
        None,
    );
    let j = json(&hex);
    assert_eq!(j["mad_header"]["attribute_id"], 0x10);
    assert_eq!(j["req"]["alternate_local_port_lid"], 0x21);
    assert_eq!(j["req"]["alternate_flow_label"], 0x12345);
    assert_eq!(j["req"]["alternate_packet_rate"], 7);
    assert_eq!(j["req"]["sap_supported"], 1);
}

/// Decode and encode are inverses on payloads decode can only show raw: an SMInfo
/// whose SMState is reserved (4..15) shows its 64 data bytes as `smp_data`, whatever
/// they hold; a vendor MAD its 216 data bytes.
#[test]
fn decode_then_encode_is_the_identity_on_raw_payloads() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (kind, payload) in [
        ("sminfo-get", 64..128),
        ("sminfo-resp", 64..128),
        ("sminfo-resp", 64..128),
        ("vendor", 40..256),
    ] {
        let hex = ok(&["mad", "encode", kind], None);
        let mut bytes: Vec<u8> = hex
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex"))
            .collect();
        for b in &mut bytes[payload] {
            *b = next() as u8;
        }
        if kind.starts_with("sminfo") {
            bytes[84] = (bytes[84] & 0xF0) | 0x0C; // SMState 12: reserved
        }
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let j = ok(&["mad", "decode", "--json", &hex], None);
        let again = ok(&["mad", "encode", "--json", "-"], Some(&j));
        assert_eq!(
            again.split_whitespace().collect::<String>(),
            hex,
            "{kind}: {j}"
        );
    }
}

fn hex_bytes(text: &str) -> Vec<u8> {
    let digits: String = text.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn decode_json_then_encode_json_gives_back_reserved_bits_too() {
    // Bytes no field holds, set: in a LAP's reserved word, an SMP's reserved header,
    // an APR's AdditionalInfo past its length, a PathRecord's reserved tail.
    for (kind, at, value) in [
        ("lap", 32, 0xa2u8),
        ("lap", 87, 0x06),
        ("sminfo-resp", 40, 0x5a),
        ("sminfo-get", 46, 0x01),
        ("apr", 60, 0x16),
        ("path-record-query", 120, 0x80),
    ] {
        let mut wire = hex_bytes(&ok(&["mad", "encode", kind], None));
        wire[at] |= value;
        let hex: String = wire.iter().map(|b| format!("{b:02x}")).collect();
        let doc = ok(&["mad", "decode", "--json", &hex], None);
        let v: serde_json::Value = serde_json::from_str(&doc).expect("JSON");
        assert!(
            v["reserved"][at.to_string()].is_string(),
            "{kind}: byte {at} not shown: {doc}"
        );
        let back = hex_bytes(&ok(&["mad", "encode", "--json", "-"], Some(&doc)));
        assert_eq!(back, wire, "{kind}: byte {at}");
        // The text view shows them too.
        let text = ok(&["mad", "decode", &hex], None);
        assert!(text.contains(&format!("byte {at} (mask")), "{kind}: {text}");
    }
    // Reserved bits are only those no field holds.
    let e = err(&["mad", "encode", "lap", "reserved.24=1"]);
    assert!(e.contains("that fields hold"), "{e}");
}
