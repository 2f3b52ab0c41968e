//! The unaffiliated event stream: port up/down, SM changes, and the SA's traps 64/65
//! about remote ports, as an application (or a subnet manager: docs/iba-facts.md §2)
//! would follow them. This is the stream `apm watch` prints.
//!
//! ```sh
//! cargo run -p apm --example fabric_events
//! ```

use apm::apm_core::FabricEventKind;
use apm::{Apm, Config};

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::parse("[[device]]\nname = \"h5\"\nprovider = \"sim\"\n")
        .map_err(|errors| format!("{errors:?}"))?;
    let apm = Apm::start(&config).await?;
    let fabric = apm
        .sim()
        .ok_or("a simulated deployment has its fabric")?
        .clone();
    let mut events = apm.fabric_events();

    let end = fabric.duration();
    let play = fabric.run_until(end);
    tokio::pin!(play);
    loop {
        tokio::select! {
            ev = events.recv() => {
                let ev = ev?;
                match ev.kind {
                    FabricEventKind::Port { port, event } => {
                        println!("{:>10} port {} {event:?}", ev.time.to_string(), port.port)
                    }
                    FabricEventKind::RemoteGid { gid, service } => println!(
                        "{:>10} remote {gid} {service} (trap {})",
                        ev.time.to_string(),
                        service.trap()
                    ),
                    FabricEventKind::DeviceFatal { .. } => {
                        println!("{:>10} device fatal", ev.time.to_string())
                    }
                    _ => {}
                }
            }
            () = &mut play => break,
        }
    }
    apm.shutdown().await?;
    Ok(())
}
