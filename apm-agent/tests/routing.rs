//! The agent on loopback: two "processes" exchange peer messages through it by their
//! QP numbers and addresses, a second connection with the same QP numbers on other
//! addresses stays apart, a rail-down verdict reaches every process, the agent's
//! probes tell every process when a path stops answering and when it is back, a
//! watcher sees every verdict with its kind without keeping the agent alive, and with a
//! key the agent's channels seal what they send and drop what a stranger forges.

use apm_agent::access::AgentSocket;
use apm_agent::client::{AgentClient, AgentWatch};
use apm_agent::host::LoopbackHost;
use apm_agent::server::{Agent, AgentConfig, StartError};
use apm_agent::wire::{FromAgent, Route};
use apm_agent::AgentError;
use apm_core::probe::{FailureKind, PathEnds, PathVerdict, ProbePolicy, SessionState};
use apm_core::{Gid, MigrateAck, PeerMsg};
use cm_lap::auth::Mode;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// An agent of `port` on loopback with its socket in `dir`, every other setting at its
/// default.
fn config(port: u16, dir: &Path) -> AgentConfig {
    AgentConfig {
        host: Arc::new(LoopbackHost::default()),
        ..AgentConfig::new(port, Some(dir))
    }
}

fn gid(ip: &str) -> Gid {
    apm_agent::local::gid_of(ip.parse().expect("ip"))
}

async fn next(rx: &mut mpsc::UnboundedReceiver<FromAgent>) -> Option<FromAgent> {
    tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .ok()
        .flatten()
}

/// An agent on `port` that probes (the default policy otherwise), serving in the
/// background and exiting 2 s after its last process left.
async fn probing_agent(port: u16, dir: &Path) -> tokio::task::JoinHandle<Result<(), AgentError>> {
    let agent = Agent::bind(AgentConfig {
        idle_exit: Some(Duration::from_secs(2)),
        probe: ProbePolicy {
            enabled: true,
            ..Default::default()
        },
        ..config(port, dir)
    })
    .await
    .expect("agent");
    tokio::spawn(agent.run())
}

/// One end of a connection whose only path is `(local, remote)`. One agent plays both
/// hosts of such a path: each end's probes reach the other's session through the same
/// prober.
fn one_path(local: Gid, remote: Gid, local_qpn: u32, remote_qpn: u32) -> Route {
    Route {
        local_qpn,
        remote_qpn,
        peer_gids: vec![remote],
        local_gids: vec![local],
        paths: vec![(local, remote)],
        peer_lids: Vec::new(),
    }
}

fn ack(from_qpn: u32, to_qpn: u32) -> PeerMsg {
    PeerMsg::MigrateAck(MigrateAck {
        sender_comm_id: from_qpn,
        receiver_comm_id: to_qpn,
        ok: true,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_reach_the_process_of_their_connection() {
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let dir = tempfile::tempdir().expect("dir");
    let socket = AgentSocket::in_dir(dir.path(), port);
    let agent = Agent::bind(AgentConfig {
        idle_exit: Some(Duration::from_secs(2)),
        ..config(port, dir.path())
    })
    .await
    .expect("agent");
    assert!(matches!(
        Agent::bind(config(port, dir.path())).await,
        Err(StartError::AlreadyRunning(_))
    ));
    let served = tokio::spawn(agent.run());

    let (a_tx, mut a_rx) = mpsc::unbounded_channel();
    let (b_tx, mut b_rx) = mpsc::unbounded_channel();
    let (c_tx, mut c_rx) = mpsc::unbounded_channel();
    let a = AgentClient::connect(&socket, a_tx).await.expect("a");
    let b = AgentClient::connect(&socket, b_tx).await.expect("b");
    let c = AgentClient::connect(&socket, c_tx).await.expect("c");
    let (ga, gb, gc) = (gid("127.0.0.1"), gid("127.0.0.2"), gid("127.0.0.3"));
    a.register(Route {
        local_qpn: 17,
        remote_qpn: 18,
        peer_gids: vec![gb, gc],
        local_gids: vec![ga],
        paths: vec![],
        peer_lids: Vec::new(),
    })
    .expect("register a");
    b.register(Route {
        local_qpn: 18,
        remote_qpn: 17,
        peer_gids: vec![ga],
        local_gids: vec![gb],
        paths: vec![],
        peer_lids: Vec::new(),
    })
    .expect("register b");
    // Same QP numbers, other addresses (another device pair): must stay apart.
    c.register(Route {
        local_qpn: 18,
        remote_qpn: 17,
        peer_gids: vec![gid("127.0.0.9")],
        local_gids: vec![gc],
        paths: vec![],
        peer_lids: Vec::new(),
    })
    .expect("register c");
    // Each registration listens on its addresses once the agent has handled it.
    for client in [&a, &b, &c] {
        client
            .synced()
            .await
            .expect("the agent handled the registrations");
    }

    a.send(ga, gb, ack(17, 18)).expect("send");
    match next(&mut b_rx).await {
        Some(FromAgent::Peer { from, msg }) => {
            assert_eq!(from.gid, ga, "named by the source address");
            assert_eq!(msg, ack(17, 18));
        }
        other => panic!("b expected the message, got {other:?}"),
    }
    b.send(gb, ga, ack(18, 17)).expect("send back");
    assert!(matches!(
        next(&mut a_rx).await,
        Some(FromAgent::Peer { .. })
    ));
    // To c's address but from an address c does not know: b's connection (the QP
    // numbers and the sender are b's), whichever local address it arrived on.
    a.send(ga, gc, ack(17, 18)).expect("send");
    match next(&mut b_rx).await {
        Some(FromAgent::Peer { msg, .. }) => assert_eq!(msg, ack(17, 18)),
        other => panic!("b expected its message, got {other:?}"),
    }
    // A message that arrives before its connection is registered is handed over at
    // registration (the two ends register at different moments). The agent routes
    // what arrives on one address in order: once b has the message sent after it, the
    // early one has been held.
    a.register(Route {
        local_qpn: 17,
        remote_qpn: 19,
        peer_gids: vec![gb],
        local_gids: vec![ga],
        paths: vec![],
        peer_lids: Vec::new(),
    })
    .expect("register a's second connection");
    a.send(ga, gb, ack(17, 19)).expect("send early");
    a.send(ga, gb, ack(17, 18)).expect("send after it");
    match next(&mut b_rx).await {
        Some(FromAgent::Peer { msg, .. }) => assert_eq!(msg, ack(17, 18)),
        other => panic!("b expected the message sent after the early one, got {other:?}"),
    }
    b.register(Route {
        local_qpn: 19,
        remote_qpn: 17,
        peer_gids: vec![ga],
        local_gids: vec![gb],
        paths: vec![],
        peer_lids: Vec::new(),
    })
    .expect("register late");
    match next(&mut b_rx).await {
        Some(FromAgent::Peer { msg, .. }) => assert_eq!(msg, ack(17, 19)),
        other => panic!("b expected the held message, got {other:?}"),
    }
    a.rail_down(gb).expect("rail down");
    for rx in [&mut a_rx, &mut b_rx, &mut c_rx] {
        assert_eq!(next(rx).await, Some(FromAgent::RailDown { gid: gb }));
    }
    // The agent exits once every process has gone and the idle time passed.
    drop((a, b, c));
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("agent exits when idle")
        .expect("join")
        .expect("clean exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_stops_answering_probes_is_reported_down_then_back() {
    let port = 20_000 + ((std::process::id() + 7919) % 20_000) as u16;
    let dir = tempfile::tempdir().expect("dir");
    let socket = AgentSocket::in_dir(dir.path(), port);
    let served = probing_agent(port, dir.path()).await;
    let (a_tx, mut a_rx) = mpsc::unbounded_channel();
    let (b_tx, _b_rx) = mpsc::unbounded_channel();
    let a = AgentClient::connect(&socket, a_tx).await.expect("a");
    let b = AgentClient::connect(&socket, b_tx).await.expect("b");
    let (ga, gb) = (gid("127.0.0.4"), gid("127.0.0.5"));
    a.register(one_path(ga, gb, 1, 2)).expect("register a");
    b.register(one_path(gb, ga, 2, 1)).expect("register b");
    // Each end's session comes up, and each process hears of its own paths only (the
    // other's are not its business): a hears ga -> gb.
    match next(&mut a_rx).await {
        Some(FromAgent::Path {
            ends,
            verdict: PathVerdict::Up,
        }) => assert_eq!((ends.local, ends.remote), (ga, gb)),
        other => panic!("a expected its session's first Up, got {other:?}"),
    }
    // b's end stops probing (its connection is gone): a's session times out in about
    // 3 x 15 ms (the default), a fabric failure (both addresses are up).
    b.unregister(2, 1).expect("unregister b");
    let t0 = tokio::time::Instant::now();
    match next(&mut a_rx).await {
        Some(FromAgent::Path {
            ends,
            verdict: PathVerdict::Down { kind },
        }) => {
            assert_eq!((ends.local, ends.remote), (ga, gb));
            assert_eq!(kind, FailureKind::Fabric);
        }
        other => panic!("a expected a path down, got {other:?}"),
    }
    // A loaded machine may be slow; the bound is only that it is not a retry budget.
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    b.register(one_path(gb, ga, 2, 1))
        .expect("register b again");
    let back = FromAgent::Path {
        ends: PathEnds {
            local: ga,
            remote: gb,
        },
        verdict: PathVerdict::Up,
    };
    let mut seen = Vec::new();
    while !seen.contains(&back) && seen.len() < 3 {
        seen.push(next(&mut a_rx).await.expect("a verdict"));
    }
    assert!(seen.contains(&back), "a expected its path back: {seen:?}");
    drop((a, b));
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("agent exits when idle")
        .expect("join")
        .expect("clean exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_every_verdict_with_its_kind_and_keeps_no_agent_alive() {
    let port = 20_000 + ((std::process::id() + 15_013) % 20_000) as u16;
    let dir = tempfile::tempdir().expect("dir");
    let socket = AgentSocket::in_dir(dir.path(), port);
    // No agent yet: a clear error, not a hang.
    match AgentWatch::attach(&socket).await {
        Err(AgentError::NotRunning(path)) => {
            assert!(path.display().to_string().contains(&port.to_string()))
        }
        other => panic!("expected NotRunning, got {other:?}"),
    }
    let served = probing_agent(port, dir.path()).await;
    let mut watch = AgentWatch::attach(&socket).await.expect("attached");
    assert!(watch.probing);
    assert!(watch.sessions.is_empty(), "{:?}", watch.sessions);
    let (a_tx, _a_rx) = mpsc::unbounded_channel();
    let (b_tx, _b_rx) = mpsc::unbounded_channel();
    let a = AgentClient::connect(&socket, a_tx).await.expect("a");
    let b = AgentClient::connect(&socket, b_tx).await.expect("b");
    let (ga, gb) = (gid("127.0.0.6"), gid("127.0.0.7"));
    a.register(one_path(ga, gb, 1, 2)).expect("register a");
    b.register(one_path(gb, ga, 2, 1)).expect("register b");
    let ab = PathEnds {
        local: ga,
        remote: gb,
    };
    // Both ends' sessions come up: the watcher hears each once.
    let mut ups = Vec::new();
    while ups.len() < 2 {
        match next(&mut watch.events).await {
            Some(FromAgent::Path {
                ends,
                verdict: PathVerdict::Up,
            }) => ups.push(ends),
            other => panic!("expected the sessions' first Up, got {other:?}"),
        }
    }
    ups.sort();
    let mut want = vec![ab, ab.reversed()];
    want.sort();
    assert_eq!(ups, want);
    // b's end goes silent: a fabric failure, both addresses being up.
    b.unregister(2, 1).expect("unregister b");
    assert_eq!(
        next(&mut watch.events).await,
        Some(FromAgent::Path {
            ends: ab,
            verdict: PathVerdict::Down {
                kind: FailureKind::Fabric
            },
        })
    );
    // An operator's verdict reaches watchers too.
    a.rail_down(gb).expect("rail down");
    assert_eq!(
        next(&mut watch.events).await,
        Some(FromAgent::RailDown { gid: gb })
    );
    // A watcher attaching now is told what is probed and how it stands.
    let late = AgentWatch::attach(&socket).await.expect("attached");
    assert_eq!(late.sessions, [(ab, SessionState::Down)]);
    // The processes leave: the agent exits when idle, watchers attached or not.
    drop((a, b));
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("agent exits when idle, watchers attached")
        .expect("join")
        .expect("clean exit");
    drop((watch, late));
}

/// A datagram as anyone on the rail can send it: a bare MAD, no MAC.
fn forged(msg: &PeerMsg) -> [u8; 256] {
    cm_lap::apm_msg::encode(
        cm_lap::umad_transport::DEFAULT_VENDOR_CLASS,
        cm_lap::udp::UDP_DEFAULT_OUI,
        99,
        msg,
    )
    .expect("encode")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_only_sealed_datagrams_reach_a_process() {
    for (i, (mode, forged_arrives)) in [
        (Mode::Off, true),
        (
            Mode::Require(cm_lap::auth::Key::new(&[7; 32]).expect("key")),
            false,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        // Ports of their own: an agent's hello socket outlives it in this process.
        let port = 20_000 + ((std::process::id() + 4409 + 2 * i as u32) % 20_000) as u16;
        let dir = tempfile::tempdir().expect("dir");
        let socket = AgentSocket::in_dir(dir.path(), port);
        let agent = Agent::bind(AgentConfig {
            idle_exit: Some(Duration::from_secs(1)),
            peer_auth: mode,
            ..config(port, dir.path())
        })
        .await
        .expect("agent");
        let served = tokio::spawn(agent.run());
        let (a_tx, _a_rx) = mpsc::unbounded_channel();
        let (b_tx, mut b_rx) = mpsc::unbounded_channel();
        let a = AgentClient::connect(&socket, a_tx).await.expect("a");
        let b = AgentClient::connect(&socket, b_tx).await.expect("b");
        let (ga, gb) = (gid("127.0.0.6"), gid("127.0.0.7"));
        let route = |local, remote, lq, rq| Route {
            local_qpn: lq,
            remote_qpn: rq,
            peer_gids: vec![remote],
            local_gids: vec![local],
            paths: vec![],
            peer_lids: Vec::new(),
        };
        a.register(route(ga, gb, 17, 18)).expect("register a");
        b.register(route(gb, ga, 18, 17)).expect("register b");
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Through the agent: sealed (with a key) and opened at b's channel.
        a.send(ga, gb, ack(17, 18)).expect("send");
        assert!(
            matches!(next(&mut b_rx).await, Some(FromAgent::Peer { .. })),
            "the agent's own datagram"
        );
        // A stranger's on a's address: the right comm ids, no MAC.
        let evil = tokio::net::UdpSocket::bind("127.0.0.6:0")
            .await
            .expect("bind");
        let to = format!("127.0.0.7:{port}");
        evil.send_to(&forged(&ack(17, 18)), &to)
            .await
            .expect("send");
        let got = tokio::time::timeout(Duration::from_millis(500), b_rx.recv()).await;
        assert_eq!(
            matches!(got, Ok(Some(FromAgent::Peer { .. }))),
            forged_arrives,
            "{got:?}"
        );
        drop((a, b));
        let _ = tokio::time::timeout(Duration::from_secs(10), served).await;
    }
}
