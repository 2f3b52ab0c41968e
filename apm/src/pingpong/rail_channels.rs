//! apm's peer messages over the rails themselves, not the control address: on RoCE each
//! path's messages (its liveness probes above all, and the `Migrate` that asks the peer
//! to move there) leave from a socket bound to the path's local address and go to the
//! peer's address on the same rail, so they take the rail they speak for. A probe sent
//! over the control address (loopback, or a management network) says nothing about a
//! rail: a silent cut of the rail would never be seen by it.
//!
//! Both sides bind their rail sockets to the port of their control socket, which the
//! hello already advertises, so neither needs to say more. A rail whose address cannot
//! be bound (a wildcard control address holding the port on every address, say) keeps
//! using the control channel, and the start-up line says so.

use apm_agent::local::ip_of;
use apm_core::{Gid, InputSink, Path, PeerAddr, PeerChannel, PeerMsg, PortKey, ProviderError};
use async_trait::async_trait;
use cm_lap::udp::UdpPeerChannel;
use std::net::SocketAddr;

/// The control channel and one channel per rail, as one [`PeerChannel`].
pub(super) struct RailChannels {
    control: UdpPeerChannel,
    /// Per rail: the peer's GID on it and the channel bound to our address there.
    rails: Vec<(Gid, UdpPeerChannel)>,
}

impl RailChannels {
    /// `control` alone, plus a channel per path whose local address can be bound at our
    /// control port, sending to the peer's address on that path at `peer_port`. `auth`
    /// makes each rail channel authenticate as the control channel does. Returns the
    /// channels and a line per rail left on the control channel.
    pub(super) async fn bind(
        control: UdpPeerChannel,
        paths: &[Path],
        peer_port: u16,
        auth: impl Fn(UdpPeerChannel) -> UdpPeerChannel,
    ) -> (RailChannels, Vec<String>) {
        let port = control.local_addr().map(|a| a.port()).unwrap_or(0);
        let mut rails = Vec::new();
        let mut notes = Vec::new();
        for p in paths {
            let (Some(local), Some(remote)) = (ip_of(&p.sgid), ip_of(&p.dgid)) else {
                continue; // InfiniBand: no address of the rail's own.
            };
            if rails.iter().any(|(g, _)| *g == p.dgid) {
                continue;
            }
            match UdpPeerChannel::bind(SocketAddr::new(local, port), p.port).await {
                Ok(ch) => {
                    let ch = auth(ch);
                    ch.add_peer(p.dgid, SocketAddr::new(remote, peer_port));
                    rails.push((p.dgid, ch));
                }
                Err(e) => notes.push(format!(
                    "peer messages for {remote} go over the control address: binding {local}:{port}: {e}"
                )),
            }
        }
        (RailChannels { control, rails }, notes)
    }

    /// Each channel's authenticator (the control's first), for the report's counters.
    pub(super) fn authenticators(&self) -> Vec<std::sync::Arc<cm_lap::auth::Authenticator>> {
        std::iter::once(&self.control)
            .chain(self.rails.iter().map(|(_, c)| c))
            .map(UdpPeerChannel::authenticator)
            .collect()
    }
}

#[async_trait]
impl PeerChannel for RailChannels {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        self.control.start(sink.clone()).await?;
        for (_, ch) in &self.rails {
            ch.start(sink.clone()).await?;
        }
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        match self.rails.iter().find(|(g, _)| *g == to.gid) {
            Some((_, ch)) => ch.send(port, to, msg).await,
            None => self.control.send(port, to, msg).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apm_core::Input;
    use std::time::Duration;

    fn gid(ip: [u8; 4]) -> Gid {
        Gid(std::net::Ipv4Addr::from(ip).to_ipv6_mapped().octets())
    }

    /// One side's control channel on loopback, its port, and its path over `me`.
    async fn side(me: [u8; 4], peer: [u8; 4]) -> (UdpPeerChannel, u16, Path) {
        let port = PortKey::new(0, 1);
        let control = UdpPeerChannel::bind("127.0.0.1:0".parse().expect("addr"), port)
            .await
            .expect("bind control");
        let ctl_port = control.local_addr().expect("addr").port();
        (
            control,
            ctl_port,
            Path::roce(port, gid(me), gid(peer), 3, 14),
        )
    }

    #[tokio::test]
    async fn a_rails_messages_leave_from_its_address_and_reach_the_peers_rail_socket() {
        // Two "rails" on loopback addresses of their own (127.0.0.2 and 127.0.0.3).
        let (a, a_port, a_path) = side([127, 0, 0, 2], [127, 0, 0, 3]).await;
        let (b, b_port, b_path) = side([127, 0, 0, 3], [127, 0, 0, 2]).await;
        let (a, notes_a) = RailChannels::bind(a, &[a_path], b_port, |c| c).await;
        let (b, notes_b) = RailChannels::bind(b, &[b_path], a_port, |c| c).await;
        // Linux gives loopback all of 127.0.0.0/8: both bind.
        assert!(
            notes_a.is_empty() && notes_b.is_empty(),
            "{notes_a:?} {notes_b:?}"
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        b.start(tx).await.expect("start b");
        let msg = PeerMsg::Probe(probe(a_path));
        a.send(PortKey::new(0, 1), PeerAddr::far_end(&a_path), msg)
            .await
            .expect("send over the rail");
        let got = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("arrived")
            .expect("open");
        // B's control channel knows no peer: only its rail socket names the sender.
        match got {
            Input::PeerMessage { from, msg: m, .. } => {
                assert_eq!(
                    from.gid,
                    gid([127, 0, 0, 2]),
                    "named by the rail it came over"
                );
                assert_eq!(m, msg);
            }
            other => panic!("not a peer message: {other:?}"),
        }
    }

    fn probe(path: Path) -> apm_core::probe::Probe {
        apm_core::probe::Probe {
            state: apm_core::probe::SessionState::Down,
            diag: apm_core::probe::Diag::None,
            detect_mult: 3,
            my_disc: 1,
            your_disc: 0,
            tx_interval_us: 20_000,
            rx_interval_us: 20_000,
            ends: apm_core::probe::PathEnds {
                local: path.sgid,
                remote: path.dgid,
            },
            ports_down: apm_core::probe::PortsDown::default(),
        }
    }
}
