//! The library face: `apm::Apm` on the simulated fabric, its errors, and the examples
//! in `apm/examples/` run as programs.

use apm::apm_core::{FabricEventKind, NotificationKind, PortEvent, Time};
use apm::{Apm, Config, SimFabric, StartError};

fn config(text: &str) -> Config {
    Config::parse(text).unwrap_or_else(|e| panic!("{e:?}"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

#[test]
fn two_hosts_on_one_fabric_protect_migrate_and_rearm() {
    runtime().block_on(async {
        let scenario = apm::Scenario::demo();
        let fabric = SimFabric::new(&scenario, 3, &[0, 1]).expect("fabric");
        let mut apms = Vec::new();
        for h in ["h0", "h1"] {
            let c = config(&format!("[[device]]\nname = \"{h}\"\nprovider = \"sim\"\n"));
            apms.push(Apm::start_on(&c, &fabric).await.expect("started"));
        }
        let mut notes = apms[1].notifications();
        let mut events = apms[0].fabric_events();
        for (h, apm) in apms.iter().enumerate() {
            for spec in fabric.connections(h) {
                apm.protect(spec).await.expect("protected");
            }
        }
        fabric.run_until(Time::from_millis(3000)).await;
        let mut kinds = Vec::new();
        while let Ok(n) = notes.try_recv() {
            kinds.push(n.kind);
        }
        assert!(kinds
            .iter()
            .any(|k| matches!(k, NotificationKind::Protected { .. })));
        assert!(
            kinds
                .iter()
                .any(|k| matches!(k, NotificationKind::Migrated { .. })),
            "rail A's switch died at 0.5 s: {kinds:?}"
        );
        assert!(kinds
            .iter()
            .any(|k| matches!(k, NotificationKind::Rearmed { .. })));
        let mut port_events = Vec::new();
        while let Ok(ev) = events.try_recv() {
            if let FabricEventKind::Port { port, event } = ev.kind {
                port_events.push((port.port, event));
            }
        }
        assert!(
            port_events.contains(&(1, PortEvent::Down)),
            "{port_events:?}"
        );
        assert!(
            port_events.contains(&(1, PortEvent::Active)),
            "{port_events:?}"
        );

        // Unprotect, then a clean shutdown; calls after it say the manager stopped.
        let id = fabric.connections(0)[0].id;
        let apm0 = apms.remove(0);
        apm0.unprotect(id).await.expect("unprotected");
        assert!(apm0.status(id).await.expect("running").is_none());
        assert!(apm0.unprotect(id).await.is_err(), "not protected any more");
        let handle = apm0.handle().clone();
        apm0.shutdown().await.expect("clean stop");
        assert!(handle.stats().await.is_err());
        for a in apms {
            a.shutdown().await.expect("clean stop");
        }
    });
}

#[test]
fn deployments_that_cannot_be_built_say_why() {
    runtime().block_on(async {
        // Devices that exist nowhere: unavailable, with the reason (no RDMA stack here,
        // or no such device where there is one). Never a fake manager.
        let c = config("[[device]]\nname = \"hca_absent\"\nprovider = \"verbs\"\n");
        match Apm::start(&c).await {
            Err(StartError::Unavailable(why)) => assert!(
                why.to_string().contains("libibverbs") || why.to_string().contains("hca_absent"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        let c = config(
            "[[device]]\nname = \"rxe_absent\"\nprovider = \"rxe\"\n[lap]\nudp_listen = \"0.0.0.0:1\"\n",
        );
        match Apm::start(&c).await {
            Err(StartError::Unavailable(why)) => assert!(
                why.to_string().contains("libibverbs") || why.to_string().contains("rxe_absent"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        let c = config("[[device]]\nname = \"h99\"\nprovider = \"sim\"\n");
        let e = Apm::start(&c).await.expect_err("no such host");
        assert!(e.to_string().contains("h99"), "{e}");
        let c = config(
            "[[device]]\nname = \"h0\"\nprovider = \"sim\"\n[sim]\nscenario = \"/nonexistent.toml\"\n",
        );
        let e = Apm::start(&c).await.expect_err("no scenario file");
        assert!(e.to_string().contains("nonexistent"), "{e}");
        let c = config(
            "[[device]]\nname = \"h0\"\nprovider = \"sim\"\n[[device]]\nname = \"h1\"\nprovider = \"sim\"\n",
        );
        let e = Apm::start(&c).await.expect_err("one host per Apm");
        assert!(e.to_string().contains("one simulated device per Apm"), "{e}");
    });
}

#[test]
fn sim_config_errors_point_at_their_line() {
    let e = Config::parse("[[device]]\nname = \"node7\"\nprovider = \"sim\"\n").unwrap_err();
    assert!(e[0].to_string().starts_with("line 2"), "{e:?}");
    let e = Config::parse(
        "[[device]]\nname = \"h0\"\nprovider = \"sim\"\n[[device]]\nname = \"mlx5_0\"\nprovider = \"verbs\"\n",
    )
    .unwrap_err();
    assert!(
        e[0].to_string().starts_with("line 6") && e[0].message.contains("mixed"),
        "{e:?}"
    );
    let c = Config::parse("[[device]]\nname = \"h1\"\nprovider = \"sim\"\n[sim]\nseed = 9\n")
        .expect("valid");
    assert_eq!(c.sim.seed, Some(9));
}

/// The examples are built by `cargo test`; run them and check what they print.
#[test]
fn the_examples_run() {
    let exe = std::env::current_exe().expect("test binary");
    // target/<profile>/deps/lib_api-... -> target/<profile>/examples/
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("examples");
    for (name, expect) in [
        (
            "protect",
            ["protecting", "migrated", "rearmed", "shut down"].as_slice(),
        ),
        (
            "fabric_events",
            ["port 1 Down", "port 1 Active", "trap 65", "trap 64"].as_slice(),
        ),
    ] {
        let path = dir.join(name);
        let out = std::process::Command::new(&path)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e} (built by `cargo test`)", path.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for e in expect {
            assert!(stdout.contains(e), "{name} prints {e:?}:\n{stdout}");
        }
    }
}
