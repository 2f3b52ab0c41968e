//! The agent's InfiniBand side against a stand-in for the host's ports (the SA and the
//! MAD channels; the real ones run on the ibsim bed, `apm/tests/ibsim.rs`):
//!
//! - many processes asking the paths of many QPs to a few destinations cost the SA
//!   one query per (port, destination), answered to every asker, also to askers that
//!   came while the query was under way; a destination named by LID is looked up first;
//! - every process that subscribed gets every notice, and the requests that come while
//!   a port's subscription runs make it run once more, not once each;
//! - a process's peer message leaves through the InfiniBand port of its local address
//!   to the peer's LID, and a MAD from the peer's LID reaches the process whose
//!   connection names that LID.

use apm_agent::access::AgentSocket;
use apm_agent::client::AgentClient;
use apm_agent::host::Host;
use apm_agent::ib::{IbPort, InfiniBand};
use apm_agent::rdma_nl::QpRecord;
use apm_agent::server::{Agent, AgentConfig};
use apm_agent::wire::{FromAgent, Route};
use apm_core::{
    Gid, GidService, Input, InputSink, Lid, MigrateAck, Path, PeerAddr, PeerMsg, PortKey,
    ProviderError,
};
use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// This host: one HCA with two InfiniBand ports, each with one GID.
fn port_gid(port: u8) -> Gid {
    Gid::from_guid(0x0002_c903_0000_1000 + u64::from(port))
}

fn peer_gid(n: u64) -> Gid {
    Gid::from_guid(0x0002_c903_0000_2000 + n)
}

#[derive(Debug, Default)]
struct TestHost;

impl Host for TestHost {
    fn port_of(&self, gid: &Gid) -> Option<(String, u8)> {
        (1..=2u8)
            .find(|p| port_gid(*p) == *gid)
            .map(|p| ("mlx5_0".to_owned(), p))
    }

    fn device_addresses(&self, _gid: &Gid) -> Option<Vec<apm_agent::local::Addr>> {
        None
    }

    fn qp(&self, _gid: &Gid, _qpn: u32) -> Result<Option<QpRecord>, apm_agent::host::OwnerError> {
        Ok(Some(QpRecord {
            pid: Some(std::process::id()),
            remote_qpn: None,
        }))
    }
}

/// The stand-in: answers paths after a delay, counts queries, records sends, and lets
/// the test play notices and received MADs.
#[derive(Debug, Default)]
struct FakeIb {
    queries: AtomicU64,
    subscriptions: AtomicU64,
    sent: Mutex<Vec<(PortKey, PeerAddr, PeerMsg)>>,
    sink: Mutex<Option<InputSink>>,
}

#[async_trait]
impl InfiniBand for FakeIb {
    fn ports(&self) -> Vec<IbPort> {
        (1..=2)
            .map(|p| IbPort {
                key: PortKey::new(7, p),
                device: "mlx5_0".into(),
                port: p,
            })
            .collect()
    }

    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        *self.sink.lock().expect("lock") = Some(sink);
        Ok(())
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        // Long enough that the askers of one destination all come while it runs.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sgid = port_gid(port.port);
        Ok(vec![Path::ib(
            port,
            (Lid::from_wire(u16::from(port.port)), sgid),
            (Lid::from_wire(100), dgid),
            Path::MTU_2048,
            Path::ACK_TIMEOUT_67MS,
        )])
    }

    async fn gid_of_lid(&self, _port: PortKey, lid: Lid) -> Result<Option<Gid>, ProviderError> {
        self.queries.fetch_add(1, Ordering::SeqCst);
        Ok(Some(peer_gid(u64::from(lid.get()))))
    }

    async fn node_ports(
        &self,
        _port: PortKey,
        _lid: Lid,
    ) -> Result<Vec<(Gid, Lid, u8)>, ProviderError> {
        // The stand-in's peers have one port each: nothing more to ask.
        Ok(Vec::new())
    }

    async fn subscribe(&self, _port: PortKey) -> Result<(), ProviderError> {
        self.subscriptions.fetch_add(1, Ordering::SeqCst);
        // An SA takes a moment: the burst below comes while one runs.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        self.sent.lock().expect("lock").push((port, to, msg));
        Ok(())
    }

    fn sa_queries(&self) -> u64 {
        self.queries.load(Ordering::SeqCst)
    }
}

impl FakeIb {
    fn play(&self, input: Input) {
        let sink = self.sink.lock().expect("lock").clone().expect("started");
        sink.send(input).expect("agent listening");
    }
}

async fn agent(ib: Arc<FakeIb>, salt: u16) -> (tempfile::TempDir, AgentSocket) {
    // A port of each test's own (an agent takes its port and the next).
    let port = 20_000 + (std::process::id() % 5_000) as u16 * 4 + salt * 2;
    let dir = tempfile::tempdir().expect("dir");
    let config = AgentConfig {
        host: Arc::new(TestHost),
        infiniband: Some(ib),
        ..AgentConfig::new(port, Some(dir.path()))
    };
    let socket = config.socket.clone();
    let agent = Agent::bind(config).await.expect("agent");
    tokio::spawn(agent.run());
    (dir, socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_for_many_processes_and_qps_cost_one_query_per_destination() {
    let ib = Arc::new(FakeIb::default());
    let (_dir, socket) = agent(ib.clone(), 0).await;
    // 4 processes x 8 QPs each, to 3 destinations, from port 1; then the same from
    // port 2 to one destination; then one destination named by its LID.
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (tx, rx) = mpsc::unbounded_channel();
        clients.push((
            Arc::new(AgentClient::connect(&socket, tx).await.expect("client")),
            rx,
        ));
    }
    let mut asks = Vec::new();
    for (c, _) in &clients {
        for qp in 0..8u64 {
            let c = c.clone();
            asks.push(tokio::spawn(async move {
                c.paths(port_gid(1), Some(peer_gid(qp % 3)), None).await
            }));
        }
    }
    for a in asks {
        let answer = a.await.expect("joined").expect("paths");
        assert_eq!(answer.paths.len(), 1);
        assert_eq!(answer.paths[0].sgid, port_gid(1));
    }
    assert_eq!(ib.sa_queries(), 3, "32 askers, 3 destinations");
    let again = clients[0]
        .0
        .paths(port_gid(1), Some(peer_gid(0)), None)
        .await
        .expect("paths");
    assert_eq!(again.dgid, peer_gid(0));
    assert_eq!(ib.sa_queries(), 3, "answered from what the agent knows");
    clients[1]
        .0
        .paths(port_gid(2), Some(peer_gid(0)), None)
        .await
        .expect("paths");
    assert_eq!(ib.sa_queries(), 4, "another port is another question");
    let by_lid = clients[2]
        .0
        .paths(port_gid(1), None, Some(9))
        .await
        .expect("paths");
    assert_eq!(by_lid.dgid, peer_gid(9), "the LID's port GID, from the SA");
    // A port the agent does not serve: said, not hung.
    let e = clients[3]
        .0
        .paths(peer_gid(1), Some(peer_gid(0)), None)
        .await
        .expect_err("not a local port");
    assert!(e.to_string().contains("no InfiniBand port"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_reach_every_subscriber_and_subscriptions_coalesce() {
    let ib = Arc::new(FakeIb::default());
    let (_dir, socket) = agent(ib.clone(), 1).await;
    for _ in 0..100 {
        if ib.subscriptions.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        ib.subscriptions.load(Ordering::SeqCst),
        2,
        "one subscription per port at start"
    );
    // The start's subscriptions are done.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut rxs = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (tx, rx) = mpsc::unbounded_channel();
        clients.push(AgentClient::connect(&socket, tx).await.expect("client"));
        rxs.push(rx);
    }
    // A burst: every process after a CLIENT_REREGISTER.
    for c in &clients {
        c.subscribe(port_gid(1)).expect("subscribe");
    }
    for c in &clients {
        c.synced().await.expect("synced");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        ib.subscriptions.load(Ordering::SeqCst),
        4,
        "the burst: one subscription, and one more for the requests that came while it ran"
    );
    ib.play(Input::RemoteGid {
        gid: peer_gid(5),
        service: GidService::OutOfService,
    });
    for rx in &mut rxs {
        let got = tokio::time::timeout(Duration::from_secs(3), rx.recv())
            .await
            .expect("in time");
        assert_eq!(
            got,
            Some(FromAgent::RemoteGid {
                gid: peer_gid(5),
                service: GidService::OutOfService
            })
        );
    }
    // A request when none runs: a subscription of its own, at once.
    clients[0].subscribe(port_gid(1)).expect("subscribe");
    clients[0].synced().await.expect("synced");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(ib.subscriptions.load(Ordering::SeqCst), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_messages_travel_through_the_port_by_lid() {
    let ib = Arc::new(FakeIb::default());
    let (_dir, socket) = agent(ib.clone(), 2).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let c = AgentClient::connect(&socket, tx).await.expect("client");
    c.register(Route {
        local_qpn: 18,
        remote_qpn: 17,
        peer_gids: vec![peer_gid(1)],
        local_gids: vec![port_gid(2)],
        paths: vec![],
        peer_lids: vec![100],
    })
    .expect("register");
    let ack = PeerMsg::MigrateAck(MigrateAck {
        sender_comm_id: 18,
        receiver_comm_id: 17,
        ok: true,
    });
    let to = PeerAddr {
        gid: peer_gid(1),
        lid: Lid::from_wire(100),
    };
    c.send_to(port_gid(2), to, ack).expect("send");
    c.synced().await.expect("synced");
    let sent = ib.sent.lock().expect("lock").clone();
    assert_eq!(
        sent,
        vec![(PortKey::new(7, 2), to, ack)],
        "port 2, to LID 100"
    );
    // A MAD from LID 100 without a GRH (its GID unknown to the channel) is the
    // connection's.
    let back = PeerMsg::MigrateAck(MigrateAck {
        sender_comm_id: 17,
        receiver_comm_id: 18,
        ok: true,
    });
    ib.play(Input::PeerMessage {
        from: PeerAddr {
            gid: Gid::default(),
            lid: Lid::from_wire(100),
        },
        port: PortKey::new(7, 2),
        msg: back,
    });
    match tokio::time::timeout(Duration::from_secs(3), rx.recv()).await {
        Ok(Some(FromAgent::Peer { msg, .. })) => assert_eq!(msg, back),
        other => panic!("expected the peer's message, got {other:?}"),
    }
}
