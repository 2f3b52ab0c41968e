//! Parking the probe sessions of healthy paths (`sim/parked.rs`) changes what a run
//! costs, never what it finds: against the same run carrying every probe packet
//! (`RunConfig::probe_packets`), every figure of the report is the same, probes and
//! MADs counted included; only the events processed (and their digest) differ.
//!
//! To the digit where the hosts' agents take no time per MAD: parking leaves the agent's
//! queue out (an elided probe takes none of its time), so with a processing time a
//! verdict may move by the queue's wait at that instant. Those runs are compared on
//! their verdict-driven figures within a stated bound instead.

use provider_sim::families::{Family, Size};
use provider_sim::{PolicyKind, RunConfig, RunReport, Scenario, Sim};

/// Every family's small scenario for `seed`, with probes on every path (InfiniBand
/// ones too) whatever the family says.
fn probed(family: Family, seed: u64, mad_processing_us: u64) -> (Scenario, RunConfig) {
    let mut s = family.scenario(seed, Size::Small);
    s.fabric.mad_processing_us = mad_processing_us;
    let mut cfg = RunConfig::for_scenario(&s, PolicyKind::Apm, seed);
    cfg.engine_policy.probe.enabled = true;
    cfg.engine_policy.probe.infiniband = true;
    cfg.check = true;
    (s, cfg)
}

fn run(s: &Scenario, cfg: &RunConfig, probe_packets: bool) -> RunReport {
    let cfg = RunConfig {
        probe_packets,
        ..cfg.clone()
    };
    let r = Sim::new(s, cfg).expect("the scenario runs").run();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    r
}

/// The figures in which two reports differ, but for what parking is meant to change
/// (the events processed and their digest), each with both values.
fn differences(x: &RunReport, y: &RunReport) -> Vec<String> {
    let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (
        serde_json::to_value(x).expect("a report serialises"),
        serde_json::to_value(y).expect("a report serialises"),
    ) else {
        panic!("a report is an object");
    };
    let mut out: Vec<String> = a
        .iter()
        .filter(|(k, v)| !["events", "digest"].contains(&k.as_str()) && b.get(*k) != Some(v))
        .map(|(k, v)| {
            let short = |v: &serde_json::Value| v.to_string().chars().take(200).collect::<String>();
            format!(
                "{k}: {} against {}",
                short(v),
                b.get(k).map_or(String::new(), short)
            )
        })
        .collect();
    if x.restore_samples_ns != y.restore_samples_ns {
        out.push("restore samples".into());
    }
    out
}

#[test]
fn parked_sessions_give_every_figure_that_carrying_each_probe_gives() {
    let mut parked_events = 0;
    let mut packet_events = 0;
    for family in Family::ALL {
        for seed in 1..=3 {
            let (s, cfg) = probed(family, seed, 0);
            let packets = run(&s, &cfg, true);
            let parked = run(&s, &cfg, false);
            assert!(packets.probes_sent > 0, "{}: no probe", family.name());
            let diff = differences(&parked, &packets);
            assert!(
                diff.is_empty(),
                "{} seed {seed}, parked against every packet:\n{}",
                family.name(),
                diff.join("\n")
            );
            parked_events += parked.events;
            packet_events += packets.events;
        }
    }
    assert!(
        parked_events < packet_events,
        "parking carries fewer events: {parked_events} against {packet_events}"
    );
}
