//! The engine's peer facet ([`apm_core::PeerChannel`]) over UDP, for RoCE.
//!
//! RoCE has no usable CM path for LAP/APR (the kernel drops them) and no SA, so apm's
//! peer messages travel as UDP datagrams, one 256-byte vendor MAD each (inside an
//! authenticated envelope when the deployment has a key: [`crate::auth`])
//! ([`crate::apm_msg`]: LAP, APR and MRA in cm-lap's vendor class layout, plus apm's own
//! Migrate/MigrateAck attributes). Each node listens on one configured address and port.
//!
//! **Addressing.** The engine names peers by GID. A GID maps to a UDP address by, in
//! order: (1) a static table ([`UdpPeerChannel::add_peer`]: GID -> address, for
//! management networks or when both nodes share one host); (2) when enabled with
//! [`UdpPeerChannel::derive_port`], the GID itself: RoCE v2 GIDs are IP-derived, so
//! `::ffff:a.b.c.d` is sent to `a.b.c.d:<port>` and a global IPv6 GID to
//! `[gid]:<port>`. IPv6 link-local GIDs (`fe80::/64`) need an interface scope that a
//! GID does not carry: list them in the static table.
//!
//! **Who sent it.** The sender's GID is never taken from the payload: it is the GID the
//! datagram's source address maps to — the first GID listed for that address in the
//! static table, else (with derivation on) the address itself as a RoCE GID. Datagrams
//! from addresses that map to no GID are dropped, and so is anything that is not exactly
//! one well-formed MAD of our class and OUI (with a debug log, never a panic). The
//! engine then checks that GID against the connection's peer.
//!
//! **Authentication.** With a key ([`UdpPeerChannel::with_auth`]), every datagram
//! carries a MAC over all of it and a sequence number ([`crate::auth`] has the layout):
//! a datagram without a valid MAC, under another key, replayed or stale is counted
//! ([`UdpPeerChannel::auth_counters`]) and dropped here, before it is decoded, so the
//! engine never sees it and no QP is touched. Without a key the channel sends and
//! accepts the unauthenticated version only, as before.
//!
//! UDP may lose or reorder datagrams: the engine retransmits LAP and Migrate until
//! answered, and this channel adds nothing of its own (the replay window accepts a
//! late datagram within 64 of the newest).

use crate::answer_tids::AnswerTids;
use crate::apm_msg;
use crate::auth::{self, Authenticator, CounterValues, Mode};
use crate::umad_transport::DEFAULT_VENDOR_CLASS;
use apm_core::{
    Gid, Input, InputSink, Lid, Operation, PeerAddr, PeerChannel, PeerMsg, PortKey, ProviderError,
    Reason,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::net::UdpSocket;
use tracing::debug;

/// The OUI apm's UDP datagrams carry unless configured otherwise: a locally administered
/// value (the U/L bit of the first octet set), since UDP needs no registered one.
pub const UDP_DEFAULT_OUI: [u8; 3] = [0x02, 0x41, 0x50];

/// GID <-> UDP address mapping (see the module docs).
#[derive(Debug, Default)]
struct PeerMap {
    to_addr: BTreeMap<Gid, SocketAddr>,
    /// First GID registered per address: the sender name of its datagrams.
    to_gid: BTreeMap<SocketAddr, Gid>,
    derive_port: Option<u16>,
}

impl PeerMap {
    fn addr_of(&self, gid: &Gid) -> Option<SocketAddr> {
        if let Some(a) = self.to_addr.get(gid) {
            return Some(*a);
        }
        let port = self.derive_port?;
        let v6 = Ipv6Addr::from(gid.0);
        if let Some(v4) = v6.to_ipv4_mapped() {
            return Some(SocketAddr::new(IpAddr::V4(v4), port));
        }
        // Link-local needs a scope the GID does not carry; unspecified is nobody.
        let link_local = gid.0[0] == 0xfe && gid.0[1] & 0xc0 == 0x80;
        (!link_local && !v6.is_unspecified()).then_some(SocketAddr::new(IpAddr::V6(v6), port))
    }

    fn gid_of(&self, from: &SocketAddr) -> Option<Gid> {
        let canonical = SocketAddr::new(from.ip().to_canonical(), from.port());
        if let Some(g) = self.to_gid.get(&canonical) {
            return Some(*g);
        }
        self.derive_port?;
        Some(Gid(match canonical.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        }))
    }
}

/// Remembers the TID of the last LAP per sender comm id, so that its APR or MRA carries
/// the same TID (as the CM protocol has it).
/// apm's peer channel over UDP on one local (RoCE) port.
pub struct UdpPeerChannel {
    socket: Arc<UdpSocket>,
    port: PortKey,
    class: u8,
    oui: [u8; 3],
    peers: Arc<Mutex<PeerMap>>,
    lap_tids: AnswerTids,
    next_tid: AtomicU64,
    auth: Arc<Authenticator>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for UdpPeerChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpPeerChannel")
            .field("local", &self.socket.local_addr().ok())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for UdpPeerChannel {
    fn drop(&mut self) {
        if let Some(t) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            t.abort();
        }
    }
}

impl UdpPeerChannel {
    /// Listen on `addr` (port 0 picks a free one: see [`UdpPeerChannel::local_addr`]) for
    /// the engine's local port `port`, with the default vendor class and OUI.
    pub async fn bind(addr: SocketAddr, port: PortKey) -> std::io::Result<UdpPeerChannel> {
        let socket = UdpSocket::bind(addr).await?;
        let local = socket.local_addr()?.to_string();
        let auth = Authenticator::new(Mode::Off, Authenticator::fresh_sender_id(local.as_bytes()));
        Ok(UdpPeerChannel {
            socket: Arc::new(socket),
            port,
            class: DEFAULT_VENDOR_CLASS,
            oui: UDP_DEFAULT_OUI,
            peers: Arc::new(Mutex::new(PeerMap::default())),
            lap_tids: AnswerTids::default(),
            next_tid: AtomicU64::new(1),
            auth: Arc::new(auth),
            task: Mutex::new(None),
        })
    }

    /// Use another vendor class (0x30-0x4F) and OUI; both ends must agree.
    pub fn with_class(mut self, class: u8, oui: [u8; 3]) -> UdpPeerChannel {
        self.class = class;
        self.oui = oui;
        self
    }

    /// Authenticate datagrams as `mode` says (before [`PeerChannel::start`]); `max_skew`
    /// bounds the difference between the peers' clocks (see [`crate::auth`]).
    pub fn with_auth(mut self, mode: Mode, max_skew: std::time::Duration) -> UdpPeerChannel {
        let local = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let id = Authenticator::fresh_sender_id(local.as_bytes());
        self.auth = Arc::new(Authenticator::new(mode, id).with_max_skew(max_skew));
        self
    }

    /// Authenticate with an authenticator shared with other channels (before
    /// [`PeerChannel::start`]): one replay window per sender across all of them, so a
    /// datagram one channel accepted is a replay on every other (an agent's channels,
    /// one per rail, take a capture replayed to another rail for what it is).
    pub fn with_authenticator(mut self, auth: Arc<Authenticator>) -> UdpPeerChannel {
        self.auth = auth;
        self
    }

    /// Datagrams accepted and dropped by the authentication so far.
    pub fn auth_counters(&self) -> CounterValues {
        self.auth.counters().get()
    }

    /// The authenticator itself, whose counters stay readable after the channel has
    /// been handed to a provider stack.
    pub fn authenticator(&self) -> Arc<Authenticator> {
        self.auth.clone()
    }

    /// The address actually listened on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Send messages for `gid` to `addr`, and name datagrams from `addr` by the first GID
    /// registered for it. May be called while running (peers learnt at connect time).
    pub fn add_peer(&self, gid: Gid, addr: SocketAddr) {
        let addr = SocketAddr::new(addr.ip().to_canonical(), addr.port());
        let mut m = self.lock_peers();
        m.to_addr.insert(gid, addr);
        m.to_gid.entry(addr).or_insert(gid);
    }

    /// Also map GIDs to addresses by their IP (`::ffff:a.b.c.d` -> `a.b.c.d:port`), and
    /// name senders by their source IP, when no static entry matches.
    pub fn derive_port(&self, port: u16) {
        self.lock_peers().derive_port = Some(port);
    }

    fn lock_peers(&self) -> std::sync::MutexGuard<'_, PeerMap> {
        // Single inserts only: a poisoned map is still consistent.
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl PeerChannel for UdpPeerChannel {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        let socket = self.socket.clone();
        let peers = self.peers.clone();
        let lap_tids = self.lap_tids.clone();
        let auth = self.auth.clone();
        let (class, oui, port) = (self.class, self.oui, self.port);
        let warned = AtomicU8::new(0);
        let task = tokio::spawn(async move {
            // One byte more than the largest datagram, so an oversized one is seen as such.
            let mut buf = vec![0u8; auth::DATAGRAM_LEN + 1];
            loop {
                let (len, from) = match socket.recv_from(&mut buf).await {
                    Ok(r) => r,
                    Err(e) => {
                        // ICMP port unreachable from an earlier send shows up here on
                        // Linux: not fatal for a datagram socket.
                        debug!(error = %e, "udp receive error");
                        continue;
                    }
                };
                let Some(gid) = peers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .gid_of(&from)
                else {
                    debug!(%from, "datagram from an address with no GID: dropped");
                    continue;
                };
                let mad = match auth.open(buf.get(..len).unwrap_or_default(), auth::wall_clock_ns())
                {
                    Ok(mad) => mad,
                    Err(why) => {
                        auth::report_drop(&warned, why, from, len);
                        continue;
                    }
                };
                let Some((tid, msg)) = apm_msg::decode(class, oui, port, &mad) else {
                    debug!(%from, len, "malformed or foreign datagram: dropped");
                    continue;
                };
                lap_tids.record(&msg, tid);
                debug!(%from, %gid, ?msg, "peer message");
                let from = PeerAddr {
                    gid,
                    lid: Lid::from_wire(0),
                };
                if sink.send(Input::PeerMessage { from, port, msg }).is_err() {
                    return;
                }
            }
        });
        if let Some(old) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(task)
        {
            old.abort();
        }
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        let refused = |why: Reason| ProviderError::refused(Operation::SendPeer, why);
        if port != self.port {
            return Err(refused(Reason::NotOurPort(port)));
        }
        let Some(addr) = self.lock_peers().addr_of(&to.gid) else {
            return Err(refused(Reason::NoRouteTo(to.gid)));
        };
        let tid = self
            .lap_tids
            .for_answer(&msg)
            .unwrap_or_else(|| self.next_tid.fetch_add(1, Ordering::Relaxed));
        let mad = apm_msg::encode(self.class, self.oui, tid, &msg)
            .map_err(|e| refused(apm_msg::encode_reason(&e)))?;
        let wire = self.auth.seal(&mad, auth::wall_clock_ns());
        self.socket
            .send_to(&wire, addr)
            .await
            .map_err(|e| ProviderError::io(Operation::SendPeer, Reason::of_io(&e)))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apm_core::{Migrate, MigrateAck, Path};
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn gid(s: &str) -> Gid {
        s.parse().expect("gid")
    }

    fn path() -> Path {
        Path::roce(
            PortKey::new(0, 1),
            gid("::ffff:10.0.20.1"),
            gid("::ffff:10.0.20.2"),
            Path::MTU_1024,
            Path::ACK_TIMEOUT_67MS,
        )
    }

    async fn node() -> (UdpPeerChannel, mpsc::UnboundedReceiver<Input>) {
        let ch = UdpPeerChannel::bind("127.0.0.1:0".parse().expect("addr"), PortKey::new(0, 1))
            .await
            .expect("bind");
        let (tx, rx) = mpsc::unbounded_channel();
        ch.start(tx).await.expect("start");
        (ch, rx)
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<Input>) -> Option<Input> {
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn static_map_names_the_sender_by_its_address() {
        let (a, _arx) = node().await;
        let (b, mut brx) = node().await;
        let a_gids = [gid("::ffff:10.0.10.1"), gid("::ffff:10.0.20.1")];
        let b_gid = gid("::ffff:10.0.20.2");
        for g in a_gids {
            b.add_peer(g, a.local_addr().expect("addr"));
        }
        a.add_peer(b_gid, b.local_addr().expect("addr"));
        // The payload claims to come from 10.0.20.1; the sender is named by its address.
        let msg = PeerMsg::Migrate(Migrate {
            sender_comm_id: 1,
            receiver_comm_id: 2,
            path: path(),
            intent: apm_core::MigrateIntent::Moved,
        });
        let to = PeerAddr {
            gid: b_gid,
            lid: Lid::from_wire(0),
        };
        a.send(PortKey::new(0, 1), to, msg).await.expect("send");
        match next(&mut brx).await {
            Some(Input::PeerMessage {
                from,
                port,
                msg: got,
            }) => {
                assert_eq!(from.gid, a_gids[0], "first GID listed for the address");
                assert_eq!(port, PortKey::new(0, 1));
                assert_eq!(got, msg);
            }
            other => panic!("expected a peer message, got {other:?}"),
        }
        // Unknown destination GID: refused, not sent anywhere.
        let stranger = PeerAddr {
            gid: gid("::ffff:10.9.9.9"),
            lid: Lid::from_wire(0),
        };
        assert!(a.send(PortKey::new(0, 1), stranger, msg).await.is_err());
        assert!(a.send(PortKey::new(0, 2), to, msg).await.is_err());
    }

    #[tokio::test]
    async fn malformed_and_unknown_datagrams_are_dropped() {
        let (b, mut brx) = node().await;
        let baddr = b.local_addr().expect("addr");
        let raw = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let ack = PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: 2,
            receiver_comm_id: 1,
            ok: true,
        });
        let good = apm_msg::encode(DEFAULT_VENDOR_CLASS, UDP_DEFAULT_OUI, 9, &ack).expect("enc");
        // From an address nobody registered (and no derivation): dropped.
        let stranger = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        stranger.send_to(&good, baddr).await.expect("send");
        b.add_peer(gid("::ffff:10.0.10.1"), raw.local_addr().expect("raw addr"));
        let mut garbage = good;
        garbage[0] = 9; // base version
        let mut long = good.to_vec();
        long.push(0);
        for d in [&b""[..], &[1, 2, 3], &garbage[..], &good[..200], &long[..]] {
            raw.send_to(d, baddr).await.expect("send");
        }
        // The channel survived all that: a good datagram still arrives, and is the first.
        raw.send_to(&good, baddr).await.expect("send");
        match next(&mut brx).await {
            Some(Input::PeerMessage { from, msg, .. }) => {
                assert_eq!(from.gid, gid("::ffff:10.0.10.1"));
                assert_eq!(msg, ack);
            }
            other => panic!("expected the good datagram, got {other:?}"),
        }
        assert!(brx.try_recv().is_err());
    }

    #[tokio::test]
    async fn derived_mapping_uses_the_ip_in_the_gid() {
        let (a, _arx) = node().await;
        let (b, mut brx) = node().await;
        let bport = b.local_addr().expect("addr").port();
        a.derive_port(bport);
        b.derive_port(a.local_addr().expect("addr").port());
        let to = PeerAddr {
            gid: gid("::ffff:127.0.0.1"),
            lid: Lid::from_wire(0),
        };
        let ack = PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: 2,
            receiver_comm_id: 1,
            ok: false,
        });
        a.send(PortKey::new(0, 1), to, ack).await.expect("send");
        match next(&mut brx).await {
            Some(Input::PeerMessage { from, msg, .. }) => {
                assert_eq!(from.gid, gid("::ffff:127.0.0.1"));
                assert_eq!(msg, ack);
            }
            other => panic!("expected a peer message, got {other:?}"),
        }
        let map = a.lock_peers();
        assert_eq!(
            map.addr_of(&gid("fe80::1")),
            None,
            "link-local needs the table"
        );
        assert_eq!(
            map.addr_of(&gid("2001:db8::7")),
            Some(SocketAddr::new("2001:db8::7".parse().expect("ip"), bport))
        );
    }

    #[tokio::test]
    async fn apr_answers_with_its_laps_tid() {
        use apm_core::{ApStatus, Apr, Lap, Qpn};
        let (a, mut arx) = node().await;
        let (b, mut brx) = node().await;
        let (ga, gb) = (gid("::ffff:10.0.10.1"), gid("::ffff:10.0.10.2"));
        a.add_peer(gb, b.local_addr().expect("addr"));
        b.add_peer(ga, a.local_addr().expect("addr"));
        let lap = PeerMsg::Lap(Lap {
            sender_comm_id: 11,
            receiver_comm_id: 22,
            receiver_qpn: Qpn::new(5).expect("qpn"),
            alt: Path { mtu: 0, ..path() },
        });
        let (pa, pb) = (
            PeerAddr {
                gid: ga,
                lid: Lid::from_wire(0),
            },
            PeerAddr {
                gid: gb,
                lid: Lid::from_wire(0),
            },
        );
        a.send(PortKey::new(0, 1), pb, lap).await.expect("send");
        assert!(matches!(
            next(&mut brx).await,
            Some(Input::PeerMessage { .. })
        ));
        let apr = PeerMsg::Apr(Apr {
            sender_comm_id: 22,
            receiver_comm_id: 11,
            status: ApStatus::Success,
        });
        b.send(PortKey::new(0, 1), pa, apr).await.expect("send");
        match next(&mut arx).await {
            Some(Input::PeerMessage { msg, .. }) => assert_eq!(msg, apr),
            other => panic!("expected the APR, got {other:?}"),
        }
        assert_eq!(b.lap_tids.get(11), Some(1));
    }
}
