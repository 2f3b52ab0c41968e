//! Two apm-core engines coordinate a software path migration over the UDP channel on
//! loopback: one side's primary stalls, it moves, tells the peer with `Migrate`, and the
//! peer moves too; then both re-arm the old path as the alternate by LAP/APR. The QPs
//! are fakes that record what they were told (the real ones are in the VM suite).

use apm_core::{
    ConnId, ConnSpec, Gid, Input, InputSink, Lid, LinkLayer, Manager, MigState, MigrationMode,
    NotificationKind, Operation, Path, PortInfo, PortKey, ProviderError, QpControl, QpEvent,
    QpSnapshot, Qpn, Role, Stack, StaticPaths,
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
        Err(ProviderError::unsupported("fake", Operation::LoadAlternate))
    }
    async fn set_rearm(&self, _: ConnId) -> Result<MigState, ProviderError> {
        Err(ProviderError::unsupported("fake", Operation::SetRearm))
    }
    async fn force_migrate(&self, _: ConnId) -> Result<(), ProviderError> {
        Err(ProviderError::unsupported("fake", Operation::ForceMigrate))
    }
    async fn software_migrate(
        &self,
        _: ConnId,
        path: Path,
        _: apm_core::PeerMove,
    ) -> Result<(), ProviderError> {
        self.moved_to.lock().expect("not poisoned").push(path);
        Ok(())
    }
    async fn peer_there(&self, _: ConnId, _: Path) -> Result<(), ProviderError> {
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
    Path::roce(
        PortKey::new(0, 1),
        gid(local),
        gid(remote),
        Path::MTU_1024,
        Path::ACK_TIMEOUT_67MS,
    )
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
    // The manager serves requests only once it has taken the ports the QP facet reported
    // at start: an answer means it is ready.
    handle.stats().await.expect("the manager runs");
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
    stalled_primary(|| cm_lap::auth::Mode::Off).await;
}

#[tokio::test]
async fn the_same_with_authenticated_datagrams() {
    let key = cm_lap::auth::Key::new(&[42; 32]).expect("key");
    stalled_primary(|| cm_lap::auth::Mode::Require(key.clone())).await;
}

async fn stalled_primary(mode: impl Fn() -> cm_lap::auth::Mode) {
    let a_gids = ["::ffff:10.0.10.1", "::ffff:10.0.20.1"];
    let b_gids = ["::ffff:10.0.10.2", "::ffff:10.0.20.2"];
    let any = "127.0.0.1:0".parse().expect("addr");
    let skew = cm_lap::auth::DEFAULT_MAX_SKEW;
    let ua = UdpPeerChannel::bind(any, PortKey::new(0, 1))
        .await
        .expect("bind")
        .with_auth(mode(), skew);
    let ub = UdpPeerChannel::bind(any, PortKey::new(0, 1))
        .await
        .expect("bind")
        .with_auth(mode(), skew);
    let (auth_a, auth_b) = (ua.authenticator(), ub.authenticator());
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

    // Both re-arm the old rail as the alternate (LAP/APR over the same channel): each
    // side says so with `Rearmed`.
    let rearmed =
        |h: apm_core::ManagerHandle,
         mut rx: tokio::sync::broadcast::Receiver<apm_core::Notification>| async move {
            let armed = tokio::time::timeout(Duration::from_secs(8), async {
                loop {
                    if let Ok(Some(s)) = h.status(ConnId(1)).await {
                        if s.protection == apm_core::Protection::Armed {
                            return s;
                        }
                    }
                    // Not armed yet: the next notification is the next change to look at.
                    let _ = rx.recv().await;
                }
            })
            .await;
            match armed {
                Ok(s) => s,
                Err(_) => panic!("not re-armed within 8 s: {:?}", h.status(ConnId(1)).await),
            }
        };
    let (sa, sb) = tokio::join!(
        rearmed(a.handle.clone(), a_notes),
        rearmed(b.handle.clone(), b_notes)
    );
    assert_eq!(sa.alternate.map(|p| p.sgid), Some(gid(a_gids[0])));
    assert_eq!(sb.alternate.map(|p| p.sgid), Some(gid(b_gids[0])));
    // Arming needs no message; the side that moved on its peer's word then says so until
    // the peer confirms, so each channel carries at least two datagrams in all: wait
    // until they are counted (bounded), then check that every one was accepted.
    let _ = tokio::time::timeout(Duration::from_secs(8), async {
        for a in [&auth_a, &auth_b] {
            a.counters().until(|c| c.accepted >= 2).await;
        }
    })
    .await;
    for c in [auth_a.counters().get(), auth_b.counters().get()] {
        assert!(c.accepted >= 2, "{c:?}");
        assert_eq!(
            c.accepted,
            c.accepted + c.bad_tag + c.replayed + c.malformed,
            "{c:?}"
        );
    }
}

/// What an attacker at the peer's address achieves against node A, whose channel runs
/// in `mode`: each datagram is sent, then A's fake QP is asked whether it moved.
mod hostile {
    use super::*;
    use cm_lap::apm_msg;
    use cm_lap::auth::{self, Authenticator, Key, Mode};
    use cm_lap::udp::UDP_DEFAULT_OUI;
    use cm_lap::umad_transport::DEFAULT_VENDOR_CLASS;

    const A: [&str; 2] = ["::ffff:10.0.10.1", "::ffff:10.0.20.1"];
    const B: [&str; 2] = ["::ffff:10.0.10.2", "::ffff:10.0.20.2"];

    fn key(b: u8) -> Key {
        Key::new(&[b; 32]).expect("key")
    }

    /// B's Migrate to rail 20: what would move A's QP if A believed it.
    fn migrate() -> [u8; 256] {
        let msg = apm_core::PeerMsg::Migrate(apm_core::Migrate {
            sender_comm_id: 0xB,
            receiver_comm_id: 0xA,
            path: path(B[1], A[1]),
            intent: apm_core::MigrateIntent::Moved,
        });
        apm_msg::encode(DEFAULT_VENDOR_CLASS, UDP_DEFAULT_OUI, 77, &msg).expect("encode")
    }

    /// Node A with its channel in `mode`, and the attacker's socket, which A takes for
    /// B (a forged source address).
    async fn target(mode: Mode) -> (Node, Arc<Authenticator>, tokio::net::UdpSocket) {
        let any = "127.0.0.1:0".parse().expect("addr");
        let evil = tokio::net::UdpSocket::bind(any).await.expect("bind");
        let ua = UdpPeerChannel::bind(any, PortKey::new(0, 1))
            .await
            .expect("bind")
            .with_auth(mode, auth::DEFAULT_MAX_SKEW);
        for g in B {
            ua.add_peer(gid(g), evil.local_addr().expect("addr"));
        }
        let a_auth = ua.authenticator();
        let target = ua.local_addr().expect("addr");
        evil.connect(target).await.expect("connect");
        let a = node(A, B, ua, Role::Active, (0xA, 0xB)).await;
        (a, a_auth, evil)
    }

    /// Send `datagram` and wait until A has dealt with it: its channel counts every
    /// datagram (accepted or dropped, with the reason), and one accepted reaches the
    /// engine, whose move ends in a `Migrated` notification. Then how often A moved.
    async fn moves_after(
        a: &Node,
        auth: &Authenticator,
        evil: &tokio::net::UdpSocket,
        datagram: &[u8],
    ) -> usize {
        let judged = |c: auth::CounterValues| {
            c.accepted
                + c.unauthenticated
                + c.bad_tag
                + c.other_key
                + c.replayed
                + c.stale
                + c.malformed
        };
        let before = auth.counters().get();
        let mut notes = a.handle.notifications();
        evil.send(datagram).await.expect("send");
        tokio::time::timeout(Duration::from_secs(5), async {
            // The receive task counts as it reads: wait for the count.
            let now = auth.counters().until(|c| judged(*c) > judged(before)).await;
            if now.accepted > before.accepted {
                loop {
                    let n = notes.recv().await.expect("notifications");
                    if matches!(n.kind, NotificationKind::Migrated { .. }) {
                        break;
                    }
                }
            }
        })
        .await
        .expect("A dealt with the datagram within 5 s");
        a.moved_to.lock().expect("ok").len()
    }

    #[tokio::test]
    async fn without_a_key_a_forged_migrate_moves_the_qp() {
        // The control: what authentication prevents.
        let (a, a_auth, evil) = target(Mode::Off).await;
        assert_eq!(moves_after(&a, &a_auth, &evil, &migrate()).await, 1);
    }

    #[tokio::test]
    async fn forged_truncated_and_replayed_datagrams_never_reach_the_engine() {
        let (a, counters, evil) = target(Mode::Require(key(7))).await;
        let now = auth::wall_clock_ns();
        // Unauthenticated, under another key, a stolen KeyID, truncated, bit-flipped.
        let outsider = Authenticator::new(Mode::Require(key(9)), 5);
        let mut stolen_id = outsider.seal(&migrate(), now);
        stolen_id[4..8].copy_from_slice(&key(7).id());
        let b = Authenticator::new(Mode::Require(key(7)), 6);
        let genuine = b.seal(&migrate(), now);
        let mut flipped = genuine.clone();
        flipped[24 + 60] ^= 0x10;
        let old_b = Authenticator::new(Mode::Require(key(7)), 7);
        let stale = old_b.seal(&migrate(), now - 3600 * 1_000_000_000);
        for (what, d) in [
            ("unauthenticated", migrate().to_vec()),
            ("other key", outsider.seal(&migrate(), now)),
            ("stolen key id", stolen_id),
            ("truncated", genuine[..genuine.len() - 1].to_vec()),
            ("truncated to the MAD", genuine[..256].to_vec()),
            ("bit-flipped", flipped),
            ("an hour old", stale),
        ] {
            assert_eq!(
                moves_after(&a, &counters, &evil, &d).await,
                0,
                "{what} moved the QP"
            );
        }
        let c = counters.counters().get();
        assert_eq!(
            (
                c.unauthenticated,
                c.other_key,
                c.bad_tag,
                c.malformed,
                c.stale,
                c.accepted
            ),
            (1, 1, 2, 2, 1, 0),
            "{c:?}"
        );
        // The genuine datagram moves it, once; its replay is dropped before the engine.
        assert_eq!(moves_after(&a, &counters, &evil, &genuine).await, 1);
        assert_eq!(moves_after(&a, &counters, &evil, &genuine).await, 1);
        let c = counters.counters().get();
        assert_eq!((c.accepted, c.replayed), (1, 1), "{c:?}");
    }
}
