//! Compare apm with the baselines on one seed of a scenario family, and trace one
//! connection to see why it was lost:
//! `cargo run -p provider-sim --example compare_seed -- FAMILY|FILE.toml SEED [small|full] [CONN]`
//! With CONN, the runs of apm and of the baselines log every change of that
//! connection's QPs (and apm's engine logs, `RUST_LOG=provider_sim=debug,apm_core=debug`)
//! to stderr, with
//! the virtual time and the host on each line.

use provider_sim::{compare, Family, PolicyKind, RunConfig, Sim, Size};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let file = args
        .first()
        .filter(|f| f.ends_with(".toml"))
        .map(|f| std::fs::read_to_string(f).expect("a readable scenario file"));
    let family = args.first().and_then(|f| Family::from_name(f));
    let (Some(seed), true) = (
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
        family.is_some() || file.is_some(),
    ) else {
        eprintln!("usage: compare_seed FAMILY|FILE.toml SEED [small|full] [CONN]");
        std::process::exit(2);
    };
    let size = match args.get(2).map(String::as_str) {
        Some("full") => Size::Full,
        _ => Size::Small,
    };
    let conn = args.get(3).and_then(|c| c.parse::<usize>().ok());
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "provider_sim::trace=info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .without_time()
        .init();
    let s = match (&file, family) {
        (Some(text), _) => provider_sim::Scenario::from_toml(text).expect("a valid scenario"),
        (None, Some(f)) => f.scenario(seed, size),
        (None, None) => unreachable!("checked above"),
    };
    println!(
        "{}: {} hosts, {} connections",
        s.name, s.topology.hosts, s.workload.connections
    );
    for f in s.all_faults(seed) {
        println!("  {f:?}");
    }
    let mut reports = Vec::new();
    for kind in PolicyKind::ALL {
        let mut cfg = RunConfig::for_scenario(&s, kind, seed);
        cfg.check = true;
        cfg.trace_conn = conn;
        if conn.is_some() {
            eprintln!("===== {}", kind.name());
        }
        let r = Sim::new(&s, cfg).expect("a valid scenario").run();
        println!("{:>13}: lost {:3} {:?}", r.policy, r.lost, r.lost_ids);
        for v in &r.violations {
            println!("    violation: {v}");
        }
        reports.push(r);
    }
    for against in compare::judge(&reports) {
        let mark = match (against.judged, against.fails) {
            (true, true) => "FAILS",
            (false, true) => "worse",
            (_, false) => "ok",
        };
        println!("{mark}: {}", against.line(usize::MAX));
    }
    if let Some(r) = reports.first() {
        for (t, what) in &r.timeline {
            println!("{t:>9.1} ms  {what}");
        }
    }
}
