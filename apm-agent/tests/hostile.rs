//! The agent against a hostile local user and a hostile host on the rail.
//!
//! The local-user cases run a client as another user: this test binary itself, copied
//! where that user can run it and started again as `nobody` with the role it is to play
//! in the environment ([`ROLE`]); the role's test prints what the agent answered, and
//! the test that started it judges. They need root (to start a process as another
//! user) and say so when skipped.
//!
//! - through a socket of mode 0666, `nobody` can reach the agent but neither report a
//!   rail down, nor watch, nor claim a QP of another process (root's or any), nor have
//!   a message of a connection it did not register sealed and sent, nor a probe;
//! - through a socket of mode 0660 (the default's shape), it cannot even connect;
//! - a client will not talk to an agent in a directory others can write;
//! - a sealed datagram captured on one rail is refused when replayed on another rail of
//!   the same agent (over real UDP on two loopback addresses).

use apm_agent::access::AgentSocket;
use apm_agent::client::{AgentClient, AgentWatch};
use apm_agent::host::LoopbackHost;
use apm_agent::rdma_nl::QpRecord;
use apm_agent::server::{Agent, AgentConfig};
use apm_agent::wire::{FromAgent, Route};
use apm_agent::AgentError;
use apm_core::{Gid, MigrateAck, PeerMsg};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The role a re-started test binary plays (and the socket it plays it against).
const ROLE: &str = "APM_HOSTILE_ROLE";
const SOCKET: &str = "APM_HOSTILE_SOCKET";
const PORT: &str = "APM_HOSTILE_PORT";

/// The unprivileged user the cases run as.
const NOBODY: u32 = 65_534;

fn gid(ip: &str) -> Gid {
    apm_agent::local::gid_of(ip.parse().expect("ip"))
}

fn ack(from_qpn: u32, to_qpn: u32) -> PeerMsg {
    PeerMsg::MigrateAck(MigrateAck {
        sender_comm_id: from_qpn,
        receiver_comm_id: to_qpn,
        ok: true,
    })
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Run this test binary's `role` test as `nobody` against the agent at `socket`: what
/// it printed, one outcome a line.
fn as_nobody(role: &str, socket: &AgentSocket) -> Vec<String> {
    // Copied where `nobody` can run it: the build tree may be under a private home.
    let dir = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = dir.path().join("hostile");
    std::fs::copy(std::env::current_exe().expect("exe"), &exe).expect("copy");
    let out = std::process::Command::new(&exe)
        .args([
            "--exact",
            "play_a_role",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, role)
        .env(SOCKET, socket.path())
        .env(PORT, socket.port().to_string())
        .current_dir(dir.path())
        .uid(NOBODY)
        // std drops root's supplementary groups when it sets the uid.
        .gid(NOBODY)
        .output()
        .expect("run as nobody");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the role failed: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The harness may print its own words before a line of the role's on the same line.
    text.lines()
        .filter_map(|l| l.split_once("OUTCOME ").map(|(_, o)| o.to_owned()))
        .collect()
}

/// The role's entry point: does nothing unless started by [`as_nobody`].
#[test]
fn play_a_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = std::path::PathBuf::from(std::env::var_os(SOCKET).expect("socket"));
    let port: u16 = std::env::var(PORT).expect("port").parse().expect("port");
    let socket = AgentSocket::in_dir(path.parent().expect("dir"), port);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        match role.as_str() {
            "connect" => {
                let (tx, _rx) = mpsc::unbounded_channel();
                let outcome = match AgentClient::connect(&socket, tx).await {
                    Ok(_) => "connected".to_owned(),
                    Err(AgentError::NotAllowed(_)) => "not allowed".to_owned(),
                    Err(e) => format!("error {e}"),
                };
                println!("OUTCOME connect: {outcome}");
            }
            "hostile" => hostile_client(&socket).await,
            other => panic!("no role {other}"),
        }
    });
}

/// Whether the agent refused the last request (the client is synced with it first).
async fn refused(client: &AgentClient, rx: &mut mpsc::UnboundedReceiver<FromAgent>) -> String {
    client.synced().await.expect("synced");
    let mut outcome = "done".to_owned();
    while let Ok(m) = rx.try_recv() {
        if let FromAgent::Refused { .. } = m {
            outcome = "refused".into();
        }
    }
    outcome
}

/// Everything an unprivileged client might try.
async fn hostile_client(socket: &AgentSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let client = AgentClient::connect(socket, tx).await.expect("connected");
    let (ga, gb) = (gid("127.0.0.21"), gid("127.0.0.22"));
    client.rail_down(gb).expect("rail down");
    println!("OUTCOME rail_down: {}", refused(&client, &mut rx).await);
    let watch = match AgentWatch::attach(socket).await {
        Err(AgentError::Refused(_)) => "refused".to_owned(),
        Ok(_) => "watching".to_owned(),
        Err(e) => format!("error {e}"),
    };
    println!("OUTCOME watch: {watch}");
    let route = |qpn: u32, remote: u32| Route {
        local_qpn: qpn,
        remote_qpn: remote,
        peer_gids: vec![gb],
        local_gids: vec![ga],
        paths: vec![(ga, gb)],
        peer_lids: Vec::new(),
    };
    // QP 77 is pid 1's; QP 18 is the process that runs the agent's (root's).
    client.register(route(77, 78)).expect("register");
    println!(
        "OUTCOME register_other: {}",
        refused(&client, &mut rx).await
    );
    client.register(route(18, 17)).expect("register");
    println!(
        "OUTCOME register_roots: {}",
        refused(&client, &mut rx).await
    );
    client.send(ga, gb, ack(18, 17)).expect("send");
    println!(
        "OUTCOME send_unregistered: {}",
        refused(&client, &mut rx).await
    );
    let probe = PeerMsg::Probe(apm_core::probe::Probe {
        state: apm_core::probe::SessionState::Up,
        diag: apm_core::probe::Diag::None,
        detect_mult: 3,
        my_disc: 1,
        your_disc: 1,
        tx_interval_us: 15_000,
        rx_interval_us: 15_000,
        ends: apm_core::probe::PathEnds {
            local: ga,
            remote: gb,
        },
        ports_down: Default::default(),
    });
    client.send(ga, gb, probe).expect("send");
    println!("OUTCOME send_probe: {}", refused(&client, &mut rx).await);
    // Nothing of root's connection came this way.
    println!(
        "OUTCOME root_messages_seen: {}",
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|m| matches!(m, FromAgent::Peer { .. }))
            .count()
    );
}

/// An agent on loopback in a fresh directory `nobody` may enter, its socket `mode`.
async fn agent_for_others(
    mode: u32,
    port: u16,
) -> (
    tempfile::TempDir,
    AgentSocket,
    tokio::task::JoinHandle<Result<(), AgentError>>,
) {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let host = LoopbackHost::default().with_qp(
        77,
        Some(QpRecord {
            pid: Some(1),
            remote_qpn: Some(78),
        }),
    );
    let mut config = AgentConfig {
        host: Arc::new(host),
        ..AgentConfig::new(port, Some(dir.path()))
    };
    config.perms.group = None;
    config.perms.mode = mode;
    let socket = config.socket.clone();
    let agent = Agent::bind(config).await.expect("agent");
    (dir, socket, tokio::spawn(agent.run()))
}

fn test_port(salt: u32) -> u16 {
    20_000 + ((std::process::id() + salt) % 20_000) as u16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprivileged_user_can_neither_move_watch_claim_nor_forge() {
    if !is_root() {
        eprintln!("skipped: starting a client as another user needs root");
        return;
    }
    let port = test_port(101);
    let (_dir, socket, served) = agent_for_others(0o666, port).await;
    // Root's own connection on the agent, whose messages nobody else may take.
    let (tx, mut root_rx) = mpsc::unbounded_channel();
    let root = AgentClient::connect(&socket, tx).await.expect("root");
    let (ga, gb) = (gid("127.0.0.21"), gid("127.0.0.22"));
    root.register(Route {
        local_qpn: 18,
        remote_qpn: 17,
        peer_gids: vec![gb],
        local_gids: vec![ga],
        paths: vec![],
        peer_lids: Vec::new(),
    })
    .expect("register");
    root.synced().await.expect("synced");
    let socket2 = socket.clone();
    let outcomes = tokio::task::spawn_blocking(move || as_nobody("hostile", &socket2))
        .await
        .expect("joined");
    for want in [
        "rail_down: refused",
        "watch: refused",
        "register_other: refused",
        "register_roots: refused",
        "send_unregistered: refused",
        "send_probe: refused",
        "root_messages_seen: 0",
    ] {
        assert!(outcomes.iter().any(|o| o == want), "{want}: {outcomes:?}");
    }
    // Root heard no rail-down of nobody's.
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(m) = root_rx.try_recv() {
        assert!(!matches!(m, FromAgent::RailDown { .. }), "{m:?}");
    }
    served.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_of_the_default_mode_keeps_other_users_out() {
    if !is_root() {
        eprintln!("skipped: starting a client as another user needs root");
        return;
    }
    let port = test_port(211);
    let (_dir, socket, served) = agent_for_others(0o660, port).await;
    let meta = std::fs::symlink_metadata(socket.path()).expect("socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let outcomes = tokio::task::spawn_blocking(move || as_nobody("connect", &socket))
        .await
        .expect("joined");
    assert_eq!(outcomes, ["connect: not allowed"]);
    served.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_does_not_trust_a_directory_others_can_write() {
    let port = test_port(307);
    let (dir, socket, served) = agent_for_others(0o600, port).await;
    // Someone made the directory writable by all: anybody could have put a socket
    // there.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (tx, _rx) = mpsc::unbounded_channel();
    match AgentClient::connect(&socket, tx).await {
        Err(AgentError::Untrusted(e)) => {
            assert!(
                e.to_string().contains("writable by its group or others"),
                "{e}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The agent it would have reached runs as this user: trusted once the directory is
    // sound again.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (tx, _rx) = mpsc::unbounded_channel();
    AgentClient::connect(&socket, tx).await.expect("trusted");
    assert!(socket.trusts(0) && socket.trusts(nix::unistd::geteuid().as_raw()));
    assert!(!socket.clone().trust_uid(None).trusts(NOBODY) || is_root_nobody());
    served.abort();
}

/// Whether this test itself runs as `nobody` (then `nobody` is trusted as itself).
fn is_root_nobody() -> bool {
    nix::unistd::geteuid().as_raw() == NOBODY
}

/// A datagram sealed under `key`, as a peer's agent sends one (a capture).
fn sealed(key: &cm_lap::auth::Key, msg: &PeerMsg) -> Vec<u8> {
    let mad = cm_lap::apm_msg::encode(
        cm_lap::umad_transport::DEFAULT_VENDOR_CLASS,
        cm_lap::udp::UDP_DEFAULT_OUI,
        99,
        msg,
    )
    .expect("encode");
    let auth = cm_lap::auth::Authenticator::new(cm_lap::auth::Mode::Require(key.clone()), 0x5eed);
    auth.seal(&mad, cm_lap::auth::wall_clock_ns())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_replayed_on_another_rail_is_refused() {
    let port = test_port(401);
    let dir = tempfile::tempdir().expect("dir");
    let key = cm_lap::auth::Key::new(&[9; 32]).expect("key");
    let socket = AgentSocket::in_dir(dir.path(), port);
    let agent = Agent::bind(AgentConfig {
        peer_auth: cm_lap::auth::Mode::Require(key.clone()),
        host: Arc::new(LoopbackHost::default()),
        ..AgentConfig::new(port, Some(dir.path()))
    })
    .await
    .expect("agent");
    let served = tokio::spawn(agent.run());
    // One connection with two rails: the agent listens on both of its addresses.
    let (rail_a, rail_b, peer) = (gid("127.0.0.31"), gid("127.0.0.32"), gid("127.0.0.33"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let client = AgentClient::connect(&socket, tx).await.expect("client");
    client
        .register(Route {
            local_qpn: 18,
            remote_qpn: 17,
            peer_gids: vec![peer],
            local_gids: vec![rail_a, rail_b],
            paths: vec![],
            peer_lids: Vec::new(),
        })
        .expect("register");
    client.synced().await.expect("synced");
    let capture = sealed(&key, &ack(17, 18));
    let wire = tokio::net::UdpSocket::bind("127.0.0.33:0")
        .await
        .expect("bind");
    let arrives = |rx: &mut mpsc::UnboundedReceiver<FromAgent>| {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|m| matches!(m, FromAgent::Peer { .. }))
            .count()
    };
    wire.send_to(&capture, format!("127.0.0.31:{port}"))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(arrives(&mut rx), 1, "the capture itself, on rail A");
    for rail in ["127.0.0.32", "127.0.0.31"] {
        wire.send_to(&capture, format!("{rail}:{port}"))
            .await
            .expect("send");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        arrives(&mut rx),
        0,
        "replayed on rail B, then on rail A: both refused"
    );
    served.abort();
}
