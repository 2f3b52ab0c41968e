//! How the devices migrate (`fabric.migration`): under rdmavt a QP retries at its own
//! ACK timeout whatever path it runs on, under mlx5 at the path's own. A baseline that
//! loads its alternates two steps above the connection's timeout (`reload-boost`) gets
//! four times the retry budget on them under mlx5 and nothing more under rdmavt.

use provider_sim::config::Migration;
use provider_sim::{Fault, PolicyKind, RunConfig, RunReport, Scenario, Sim};

/// Two dual-rail hosts, steady traffic. Rail A's port on h0 dies for good at 1 s: the
/// HCA migrates to rail B after its retry budget (537 ms). Rail B's switch then dies at
/// 2 s for 1.2 s: longer than one budget at the connection's own timeout, shorter than
/// four.
fn scenario(migration: Migration) -> Scenario {
    let mut s = Scenario {
        duration_ms: 6000,
        faults: vec![
            Fault::PortDown {
                at_ms: 1000,
                port: "h0:1".into(),
            },
            Fault::SwitchDown {
                at_ms: 2000,
                switch: "B".into(),
            },
            Fault::SwitchUp {
                at_ms: 3200,
                switch: "B".into(),
            },
        ],
        ..Scenario::default()
    };
    s.topology.hosts = 2;
    s.topology.lmc = 0;
    s.workload.connections = 8;
    s.fabric.migration = migration;
    s
}

fn run(s: &Scenario, policy: PolicyKind) -> RunReport {
    let mut cfg = RunConfig::for_scenario(s, policy, 3);
    cfg.check = true;
    let r = Sim::new(s, cfg).expect("valid scenario").run();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    r
}

#[test]
fn mlx5_applies_the_alternates_timeout_and_rdmavt_does_not() {
    // The even connections start on rail A and migrate onto B, loaded at the boosted
    // timeout; the odd ones start on B at the connection's own and have only the dead
    // A to migrate to: lost either way.
    let rdmavt = run(&scenario(Migration::Rdmavt), PolicyKind::ReloadBoost);
    let mlx5 = run(&scenario(Migration::Mlx5), PolicyKind::ReloadBoost);
    assert_eq!(
        rdmavt.lost_ids,
        [0, 1, 2, 3, 4, 5, 6, 7],
        "one budget on B: 537 ms < 1.2 s"
    );
    assert_eq!(
        mlx5.lost_ids,
        [1, 3, 5, 7],
        "four budgets on B: 2.15 s > 1.2 s"
    );
    // Without the boost the two are the same.
    let plain = |m| run(&scenario(m), PolicyKind::ReloadLocal).lost;
    assert_eq!(plain(Migration::Rdmavt), plain(Migration::Mlx5));
}

#[test]
fn a_scenario_names_its_devices_migration() {
    let s = Scenario::from_toml("[fabric]\nmigration = \"mlx5\"\n").expect("parses");
    assert_eq!(s.fabric.migration, Migration::Mlx5);
    assert_eq!(Scenario::default().fabric.migration, Migration::Rdmavt);
    let e = Scenario::from_toml("[fabric]\nmigration = \"mlx4\"\n").unwrap_err();
    assert!(e.to_string().contains("fabric.migration"), "{e}");
}
