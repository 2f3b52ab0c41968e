//! `apm simulate` from the outside: the JSON document has exactly the fields,
//! the same seed gives the same bytes, bad input gives a clear error, the SVG is written.

use std::process::Command;

fn apm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(args)
        .output()
        .expect("the apm binary runs")
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn json_has_exactly_the_fields_and_is_deterministic() {
    let args = ["simulate", "--json", "--connections", "300", "--seed", "4"];
    let out = apm(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = apm(&args);
    assert_eq!(out.stdout, again.stdout, "same seed, same bytes");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(keys(&doc), ["judgement", "policies", "scenario", "seed"]);
    assert_eq!(keys(&doc["judgement"]), ["against", "fails"]);
    assert_eq!(doc["judgement"]["fails"], false);
    for against in doc["judgement"]["against"].as_array().unwrap() {
        assert_eq!(
            keys(against),
            [
                "apm_lost",
                "apm_lost_more",
                "baseline",
                "baseline_lost",
                "fails",
                "judged",
                "lost_by_apm_kept_by_baseline",
                "outage_losses_apm_kept"
            ]
        );
    }
    assert_eq!(doc["seed"], 4);
    assert_eq!(
        keys(&doc["policies"]),
        [
            "apm",
            "hw-only",
            "port-err-move",
            "reload-boost",
            "reload-local"
        ]
    );
    for (name, p) in doc["policies"].as_object().unwrap() {
        assert_eq!(
            keys(p),
            [
                "armed_at_end",
                "armed_disjoint_at_end",
                "armed_disjoint_ms_total",
                "armed_shared_port_ms_total",
                "connections",
                "failovers",
                "failure_events",
                "false_failovers",
                "lost",
                "lost_after_total_outage",
                "lost_ids",
                "lost_in_rearm_window",
                "lost_in_total_outage",
                "lost_ms_total",
                "mads_sent",
                "messages_duplicated",
                "messages_lost",
                "messages_offered",
                "probes_per_host_per_s",
                "probes_sent",
                "restore_disjoint_ms",
                "restore_ms",
                "sa_queries",
                "unprotected_ms_total"
            ],
            "{name}"
        );
        assert_eq!(keys(&p["restore_ms"]), ["max", "p50", "p99"], "{name}");
        assert_eq!(
            keys(&p["restore_disjoint_ms"]),
            ["max", "p50", "p99"],
            "{name}"
        );
        assert_eq!(p["connections"], 300, "{name}");
        let events = p["failure_events"].as_array().unwrap();
        assert_eq!(events[0]["event"], "start", "{name}");
        assert_eq!(
            keys(&events[0]),
            [
                "at_ms",
                "event",
                "last_rearm_ms",
                "peak_sa_queue",
                "reports",
                "sa_dropped",
                "sa_mads_in",
                "sa_mads_out",
                "sa_request_timeouts",
                "sa_requests",
                "sa_requests_per_host",
                "sa_requests_per_host_max",
                "sweep_smps"
            ],
            "{name}"
        );
    }
    // The point of the default scenario: apm loses nothing, hw-only does.
    assert_eq!(doc["policies"]["apm"]["lost"], 0);
    assert_eq!(doc["policies"]["apm"]["messages_lost"], 0);
    assert!(doc["policies"]["hw-only"]["lost"].as_u64().unwrap() > 0);
}

#[test]
fn no_restore_is_null_not_zero() {
    let dir = std::env::temp_dir().join(format!("apm-sim-quiet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("quiet.toml");
    std::fs::write(&file, "duration_ms = 200\n[workload]\nconnections = 10\n").unwrap();
    let out = apm(&["simulate", "--json", "--scenario", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["policies"]["apm"]["restore_ms"]["p99"].is_null());
    let table = apm(&["simulate", "--scenario", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("n/a"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_family_seed_replays_and_a_small_sweep_prints_every_family() {
    let out = apm(&[
        "simulate",
        "--family",
        "random-dual-rail-lmc1",
        "--small",
        "--seed",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["scenario"].as_str().unwrap().contains("seed 3"));
    let sweep = apm(&["simulate", "--sweep", "2", "--small"]);
    assert!(
        sweep.status.success(),
        "{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    let text = String::from_utf8_lossy(&sweep.stdout);
    for family in provider_sim::Family::ALL {
        assert!(text.contains(family.name()), "{text}");
    }
    let bad = apm(&["simulate", "--family", "nope"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("random-dual-rail-lmc0"));
}

#[test]
fn table_svg_and_scenario_file() {
    let dir = std::env::temp_dir().join(format!("apm-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("plot.svg");
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../provider-sim/scenarios/roce.toml"
    );
    let out = apm(&[
        "simulate",
        "--scenario",
        scenario,
        "--connections",
        "100",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("connections lost"), "{text}");
    assert!(text.contains("timeline"), "{text}");
    assert!(
        text.contains("what each failure event cost the SMs and SAs"),
        "{text}"
    );
    assert!(
        out.stderr.is_empty(),
        "no progress bar when stderr is not a terminal"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("polygon") && plot.trim_end().ends_with("</svg>")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_scenario_file_names_the_line() {
    let dir = std::env::temp_dir().join(format!("apm-sim-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.toml");
    std::fs::write(
        &f,
        "name = \"x\"\n[[faults]]\nkind = \"switch_down\"\nat_ms = 1\nswitch = \"Z\"\n",
    )
    .unwrap();
    let out = apm(&["simulate", "--scenario", f.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 5") && err.contains("\"Z\""), "{err}");
    let out = apm(&["simulate", "--hosts", "2"]);
    assert!(!out.status.success(), "the default faults name h3");
    std::fs::remove_dir_all(&dir).unwrap();
}
