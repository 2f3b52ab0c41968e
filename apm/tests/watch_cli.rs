//! `apm watch --sim` end to end from the command line: JSON lines, filters, `--exec`.

use std::process::Command;

fn apm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(args)
        .env("APM_LOG", "warn")
        .output()
        .expect("apm runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a serde_json::Value {
    v.get(k).unwrap_or_else(|| panic!("no {k:?} in {v}"))
}

#[test]
fn sim_json_lines_carry_the_port_read_back() {
    // The built-in dual-rail scenario: rail A's switch dies at 0.5 s and returns at
    // 2.5 s; h3's port 2 flaps at 3.5 s.
    let (ok, out, err) = apm(&["watch", "--sim", "--json", "--device", "h5"]);
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    assert!(!lines.is_empty(), "{err}");
    for l in &lines {
        assert_eq!(field(l, "device"), "h5", "{l}");
        assert_eq!(field(l, "source"), "sim");
        assert!(field(l, "time")
            .as_str()
            .is_some_and(|t| t.starts_with('+')));
    }
    let downs: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "event") == "port_down")
        .collect();
    let first = downs.first().expect("a port_down");
    assert_eq!(field(first, "port"), 1, "rail A first: {first}");
    assert_eq!(field(first, "state"), "down");
    assert!(field(first, "lid").as_u64().is_some_and(|l| l > 0));
    assert!((field(first, "elapsed_ms").as_f64().unwrap() - 500.0).abs() < 10.0);
    let actives: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "event") == "port_active")
        .collect();
    assert!(
        actives.iter().all(|l| field(l, "state") == "active"),
        "state read back after the event: {actives:?}"
    );
    // Traps 64/65 about h3's flapping port reach h5 through its SA subscription.
    assert!(
        lines
            .iter()
            .any(|l| field(l, "event") == "gid_out_of_service" && l["gid"].is_string()),
        "{out}"
    );
}

#[test]
fn filters_by_port_and_kind() {
    let (ok, out, err) = apm(&[
        "watch",
        "--sim",
        "--json",
        "--device",
        "h3",
        "--port",
        "2",
        "--event",
        "port-down,port_active",
    ]);
    assert!(ok, "{err}");
    let lines = json_lines(&out);
    let got: Vec<(String, u64)> = lines
        .iter()
        .map(|l| {
            (
                field(l, "event").as_str().unwrap().to_owned(),
                field(l, "port").as_u64().unwrap(),
            )
        })
        .collect();
    // h3 port 2 flaps once (down at 3.5 s ... up) and nothing else matches.
    assert!(
        got.iter().all(|(_, p)| *p == 2),
        "only port 2 passes: {got:?}"
    );
    assert!(
        got.iter()
            .all(|(e, _)| e == "port_down" || e == "port_active"),
        "{got:?}"
    );
    assert!(got.iter().any(|(e, _)| e == "port_down"), "{out}{err}");
    let (ok, out, _) = apm(&["watch", "--sim", "--json", "--count", "3"]);
    assert!(ok);
    assert_eq!(json_lines(&out).len(), 3, "--count stops the watch");
}

#[test]
fn exec_gets_the_event_in_its_environment() {
    let dir = std::env::temp_dir().join(format!("apm-watch-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("events");
    let cmd = format!(
        "echo \"$APM_EVENT|$APM_DEVICE|$APM_PORT|$APM_STATE|$APM_LID|$APM_LMC|$APM_GID|$APM_SOURCE\" >> '{}'",
        file.display()
    );
    let (ok, out, err) = apm(&[
        "watch",
        "--sim",
        "--device",
        "h5",
        "--event",
        "port_down",
        "--exec",
        &cmd,
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(
        rows.len(),
        out.lines().count(),
        "one command per printed event: {text}\n{out}"
    );
    let first = rows.first().expect("h5 port 1 goes down with rail A");
    assert_eq!(&first[..4], ["port_down", "h5", "1", "down"], "{text}");
    assert!(first[4].parse::<u16>().is_ok_and(|l| l > 0), "{text}");
    assert_eq!(first[5], "1", "lmc of the scenario");
    assert!(first[6].starts_with("fe80:"), "{text}");
    assert_eq!(first[7], "sim");
    // Human-readable lines by default.
    assert!(
        out.lines()
            .all(|l| l.contains(" h5 port ") && l.contains("port_down")),
        "{out}"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (ok, _, err) = apm(&["watch", "--sim", "--event", "port_up"]);
    assert!(!ok);
    assert!(err.contains("port_active"), "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--timeout=-1"]);
    assert!(!ok);
    assert!(err.contains("seconds"), "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--count", "0"]);
    assert!(!ok, "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--device", "h99"]);
    assert!(!ok);
    assert!(err.contains("h99"), "{err}");
    let (ok, _, err) = apm(&["watch", "--scenario", "x.toml"]);
    assert!(!ok);
    assert!(err.contains("--sim"), "{err}");
    let (ok, _, err) = apm(&["watch", "--sim", "--scenario", "/nonexistent.toml"]);
    assert!(!ok);
    assert!(err.contains("nonexistent"), "{err}");
}
