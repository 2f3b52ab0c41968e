//! Replay one chaos seed with logs, to see why it fails:
//! `RUST_LOG=apm_core=debug,provider_sim=debug cargo run -p provider-sim --example chaos_seed -- 42`
//! Prints the scenario's faults, the connections left unprotected at the end with both
//! engines' view of them, the fabric timeline and the invariant violations. Log lines
//! carry the virtual time and the host (`sim{t=..}:host{h=..}`).

use provider_sim::{chaos, PolicyKind, RunConfig, Sim};

fn main() {
    let Some(seed) = std::env::args().nth(1).and_then(|s| s.parse::<u64>().ok()) else {
        eprintln!("usage: chaos_seed SEED");
        std::process::exit(2);
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let s = chaos::scenario_for(seed);
    let t = &s.topology;
    println!(
        "{} hosts x {} port(s), LMC {}, {} explicit switches, {} connections ({:?}), {} ms",
        t.hosts,
        t.ports,
        t.lmc,
        t.switches.len(),
        s.workload.connections,
        s.workload.mode,
        s.duration_ms
    );
    for f in s.all_faults(seed) {
        println!("  {f:?}");
    }
    let mut cfg = RunConfig::new(PolicyKind::Apm, seed);
    cfg.engine_policy = chaos::chaos_policy(&s);
    cfg.check = true;
    // APM_TRACE_CONN=i logs every change of that connection's QPs.
    cfg.trace_conn = std::env::var("APM_TRACE_CONN")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut sim = match Sim::new(&s, cfg) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    while sim.step() {}
    for i in sim.unarmed_with_healthy_alternate() {
        let Some((a, b)) = sim.conn_hosts(i) else {
            continue;
        };
        println!(
            "conn{i} h{a}->h{b} ports {:?} mig {:?} state {:?}",
            sim.conn_ports(i),
            sim.conn_mig(i),
            sim.conn_state(i)
        );
        for h in [a, b] {
            if let Some(e) = sim.controller(h).engine() {
                println!("   h{h}: {:?}", e.connection(apm_core::ConnId(i as u64)));
            }
        }
    }
    let r = sim.finish();
    for (t, x) in &r.timeline {
        println!("{t:9.1} {x}");
    }
    println!("violations: {:?}", r.violations);
}
