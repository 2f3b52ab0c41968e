//! Protect an application's connections and follow what happens to them.
//!
//! Host h2 of the built-in dual-rail scenario runs apm through the library: it protects
//! the connections the scenario's workload opened there, then rail A's switch dies
//! (0.5 s), rail B's SM fails over (1.5 s) and rail A returns (2.5 s). Every
//! notification is printed; at the end one connection is unprotected and apm shuts
//! down cleanly.
//!
//! ```sh
//! cargo run -p apm --example protect
//! ```
//!
//! The simulation follows tokio's clock: the paused clock plays 3 s of fabric time in a
//! moment. A real application uses a normal runtime and its own connection info.

use apm::apm_core::NotificationKind;
use apm::{Apm, Config};
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::parse(
        r#"
[[device]]
name = "h2"          # a host of the simulated fabric
provider = "sim"

[sim]
seed = 7

[policy]
lap_timeout_ms = 100
"#,
    )
    .map_err(|errors| format!("{errors:?}"))?;

    let apm = Apm::start(&config).await?;
    let fabric = apm
        .sim()
        .ok_or("a simulated deployment has its fabric")?
        .clone();
    let mut notes = apm.notifications();

    let conns = fabric.connections(2);
    for spec in &conns {
        apm.protect(spec.clone()).await?;
    }
    println!("protecting {} connections of h2", conns.len());

    // Let the fabric play while notifications arrive.
    let play = fabric.run_until(apm::apm_core::Time::from_millis(3000));
    tokio::pin!(play);
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    loop {
        tokio::select! {
            n = notes.recv() => {
                let n = n?;
                let kind = match &n.kind {
                    NotificationKind::Protected { .. } => "protected",
                    NotificationKind::Rearmed { .. } => "rearmed",
                    NotificationKind::Migrated { .. } => "migrated",
                    NotificationKind::Unprotected { .. } => "unprotected",
                    NotificationKind::Lost { .. } => "lost",
                    _ => "other",
                };
                *counts.entry(kind).or_default() += 1;
                // The first three connections' stories; the rest in the summary.
                if conns.iter().take(3).any(|c| c.id == n.conn) {
                    println!("{:>10} {} {kind}", n.time.to_string(), n.conn);
                }
            }
            () = &mut play => break,
        }
    }
    println!("summary: {counts:?}");

    if let Some(first) = conns.first() {
        apm.unprotect(first.id).await?;
        let status = apm.status(first.id).await?;
        println!("{} unprotected; status now {status:?}", first.id);
    }
    fabric.run_for(Duration::from_millis(1)).await;
    apm.shutdown().await?;
    println!("shut down");
    Ok(())
}
