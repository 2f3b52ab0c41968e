//! Two apm-core engines coordinate a software path migration over the UDP channel on
//! loopback: one side's primary stalls, it moves, tells the peer with `Migrate`, and the
//! peer moves too; then both re-arm the old path as the alternate by LAP/APR. The QPs
//! are fakes that record what they were told (the real ones are in the VM suite).

use apm_core::{
    ConnId, ConnSpec, Gid, Input, InputSink, Lid, LinkLayer, Manager, MigState, MigrationMode,
    NotificationKind, Path, PortInfo, PortKey, ProviderError, QpControl, QpEvent, QpSnapshot, Qpn,
    Role, Stack, StaticPaths,
};
use async_trait::async_trait;
use cm_lap::udp::UdpPeerChannel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A QP that accepts software migrations and records them.
struct FakeQp {
    gids: Vec<Gid>,
    sink: Arc<Mutex<Option<InputSink>>>,
    moved_to: Arc<Mutex<Vec<Path>>>,
}

#[async_trait]
impl QpControl for FakeQp {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        let info = PortInfo {
            key: PortKey::new(0, 1),
            gids: self.gids.clone(),
            lid: Lid::from_wire(0),
            lmc: 0,
            active: true,
            link_layer: LinkLayer::Ethernet,
        };
        sink.send(Input::PortInfo(info)).expect("driver listens");
        *self.sink.lock().expect("not poisoned") = Some(sink);
        Ok(())
    }
    async fn load_alternate(&self, _: ConnId, _: Path) -> Result<(), ProviderError> {
        Err(ProviderError::Unsupported {
            provider: "fake".into(),
            operation: "hardware APM".into(),
        })
    }
    async fn set_rearm(&self, _: ConnId) -> Result<MigState, ProviderError> {
        Err(ProviderError::Unsupported {
            provider: "fake".into(),
            operation: "hardware APM".into(),
        })
    }
    async fn force_migrate(&self, _: ConnId) -> Result<(), ProviderError> {
        Err(ProviderError::Unsupported {
            provider: "fake".into(),
            operation: "hardware APM".into(),
        })
    }
    async fn software_migrate(&self, _: ConnId, path: Path) -> Result<(), ProviderError> {
        self.moved_to.lock().expect("not poisoned").push(path);
        Ok(())
    }
    async fn query_qp(&self, conn: ConnId) -> Result<QpSnapshot, ProviderError> {
        Err(ProviderError::UnknownConnection(conn))
    }
}

fn gid(s: &str) -> Gid {
    s.parse().expect("gid")
}

fn path(local: &str, remote: &str) -> Path {
    Path {
        port: PortKey::new(0, 1),
        slid: Lid::from_wire(0),
        dlid: Lid::from_wire(0),
        sgid: gid(local),
        dgid: gid(remote),
        sgid_index: 0,
        sl: 0,
        flow_label: 0,
        traffic_class: 0,
        hop_limit: 64,
        rate: 0,
        mtu: 3,
        pkey_index: 0,
        ack_timeout: 14,
    }
}

struct Node {
    handle: apm_core::ManagerHandle,
    sink: Arc<Mutex<Option<InputSink>>>,
    moved_to: Arc<Mutex<Vec<Path>>>,
}

async fn node(
    local: [&str; 2],
    remote: [&str; 2],
    udp: UdpPeerChannel,
    role: Role,
    // (local, remote): used as both the comm ids and the QPNs.
    ids: (u32, u32),
) -> Node {
    let sink = Arc::new(Mutex::new(None));
    let moved_to = Arc::new(Mutex::new(Vec::new()));
    let qp = FakeQp {
        gids: local.iter().map(|g| gid(g)).collect(),
        sink: sink.clone(),
        moved_to: moved_to.clone(),
    };
    let paths = vec![path(local[0], remote[0]), path(local[1], remote[1])];
    let provider = Stack::new(qp, udp, StaticPaths::new(paths.clone()));
    let (manager, handle) =
        Manager::new(Arc::new(provider), apm_core::Policy::default()).expect("policy");
    tokio::spawn(manager.run());
    tokio::time::sleep(Duration::from_millis(20)).await;
    handle
        .protect(ConnSpec {
            id: ConnId(1),
            role,
            mode: MigrationMode::Software,
            local_qpn: Qpn::new(ids.0).expect("qpn"),
            remote_qpn: Qpn::new(ids.1).expect("qpn"),
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            primary: paths[0],
            agreed_alternate: Some(paths[1]),
            candidates: vec![paths[1]],
        })
        .await
        .expect("protected");
    Node {
        handle,
        sink,
        moved_to,
    }
}

#[tokio::test]
async fn a_stalled_primary_moves_both_sides_over_udp() {
    let a_gids = ["::ffff:10.0.10.1", "::ffff:10.0.20.1"];
    let b_gids = ["::ffff:10.0.10.2", "::ffff:10.0.20.2"];
    let any = "127.0.0.1:0".parse().expect("addr");
    let ua = UdpPeerChannel::bind(any, PortKey::new(0, 1))
        .await
        .expect("bind");
    let ub = UdpPeerChannel::bind(any, PortKey::new(0, 1))
        .await
        .expect("bind");
    for g in b_gids {
        ua.add_peer(gid(g), ub.local_addr().expect("addr"));
    }
    for g in a_gids {
        ub.add_peer(gid(g), ua.local_addr().expect("addr"));
    }
    let a = node(a_gids, b_gids, ua, Role::Active, (0xA, 0xB)).await;
    let b = node(b_gids, a_gids, ub, Role::Passive, (0xB, 0xA)).await;
    let a_notes = a.handle.notifications();
    let b_notes = b.handle.notifications();

    // A's progress monitor says its primary stalled.
    let sink = a.sink.lock().expect("ok").clone().expect("started");
    sink.send(Input::QpEvent {
        conn: ConnId(1),
        event: QpEvent::PrimaryStalled,
    })
    .expect("driver listens");

    let migrated = |mut rx: tokio::sync::broadcast::Receiver<apm_core::Notification>| async move {
        tokio::time::timeout(Duration::from_secs(5), async move {
            loop {
                let n = rx.recv().await.expect("notifications");
                if let NotificationKind::Migrated { primary, .. } = n.kind {
                    return primary;
                }
            }
        })
        .await
        .expect("a migration within 5 s")
    };
    let (pa, pb) = tokio::join!(
        migrated(a_notes.resubscribe()),
        migrated(b_notes.resubscribe())
    );
    assert_eq!(pa, path(a_gids[1], b_gids[1]));
    assert_eq!(pb.sgid, gid(b_gids[1]));
    assert_eq!(pb.dgid, gid(a_gids[1]));
    assert_eq!(a.moved_to.lock().expect("ok").len(), 1, "A moved once");
    assert_eq!(b.moved_to.lock().expect("ok").len(), 1, "B moved once");

    // Both re-arm the old rail as the alternate (LAP/APR over the same channel).
    let status = |h: apm_core::ManagerHandle| async move {
        for _ in 0..400 {
            if let Ok(Some(s)) = h.status(ConnId(1)).await {
                if s.protection == apm_core::Protection::Armed {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("not re-armed within 8 s: {:?}", h.status(ConnId(1)).await);
    };
    let sa = status(a.handle.clone()).await;
    let sb = status(b.handle.clone()).await;
    assert_eq!(sa.alternate.map(|p| p.sgid), Some(gid(a_gids[0])));
    assert_eq!(sb.alternate.map(|p| p.sgid), Some(gid(b_gids[0])));
}
