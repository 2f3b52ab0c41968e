//! The engine's peer facet ([`apm_core::PeerChannel`]) over the umad transport: the
//! engine's LAP/APR/MRA become CM messages on the wire and back, and on a vendor
//! channel its Migrate/MigrateAck (a hardware-APM engine asks its peer to move before it
//! forces a migration) become apm's own attributes ([`crate::apm_msg`]). The CM class
//! has no room for those: a send of one is refused.
//!
//! The engine checks that a message comes from the connection's peer by the sender's
//! GID. A MAD without a GRH carries only the source LID (set by the fabric, not by the
//! sender's payload), so the channel asks a [`SourceGid`] which port GID owns that LID
//! (the SA, [`umad_sa::SaClient`], in production) and drops messages from LIDs nobody
//! owns. It never answers a LAP itself: the engine decides, this only carries.

use crate::answer_tids::AnswerTids;
use crate::umad_transport::{CmChannel, Incoming, TransportError, UmadCmTransport};
use apm_core::{
    Apr, Gid, Input, InputSink, Lap, Lid, Mra, Operation, Path, PeerAddr, PeerChannel, PeerMsg,
    PortKey, ProviderError, Qpn, Reason,
};
use async_trait::async_trait;
use ib_mad::cm::{self, CmBody};
use ib_mad::types as wire;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tracing::{debug, warn};
use umad::Dest;

/// Who owns a LID: the GID of the port that answers to it.
#[async_trait]
pub trait SourceGid: Send + Sync + 'static {
    /// The GID of the port with `lid` (any LID of its LMC range), if known.
    async fn gid_of(&self, lid: u16) -> Option<Gid>;
}

/// A fixed table (tests, static fabrics).
#[async_trait]
impl SourceGid for BTreeMap<u16, Gid> {
    async fn gid_of(&self, lid: u16) -> Option<Gid> {
        self.get(&lid).copied()
    }
}

/// The SA knows every port's LIDs: one PathRecord query per new LID, then cached.
#[derive(Debug)]
pub struct SaSourceGid {
    sa: umad_sa::SaClient,
    cache: Mutex<BTreeMap<u16, Gid>>,
}

impl SaSourceGid {
    /// Resolve source LIDs through `sa`.
    pub fn new(sa: umad_sa::SaClient) -> SaSourceGid {
        SaSourceGid {
            sa,
            cache: Mutex::new(BTreeMap::new()),
        }
    }
}

#[async_trait]
impl SourceGid for SaSourceGid {
    async fn gid_of(&self, lid: u16) -> Option<Gid> {
        // A poisoned cache still holds valid entries.
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lid)
            .copied();
        if cached.is_some() {
            return cached;
        }
        match self.sa.gid_of_lid(lid).await {
            Ok(Some(g)) => {
                let g = Gid(g.0);
                self.cache
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(lid, g);
                Some(g)
            }
            Ok(None) => None,
            Err(e) => {
                warn!(lid, error = %e, "cannot resolve a source LID");
                None
            }
        }
    }
}

/// Remembers the TID of the last LAP from each sender comm ID, so that the APR or MRA
/// answering it carries the same TID (as the CM protocol has it).
/// The engine's peer channel on one local port.
pub struct UmadPeerChannel {
    transport: UmadCmTransport,
    port: PortKey,
    incoming: Mutex<Option<mpsc::UnboundedReceiver<Incoming>>>,
    sources: Arc<dyn SourceGid>,
    routes: BTreeMap<[u8; 16], u16>,
    /// Other local ports whose messages this transport carries.
    carried: std::collections::BTreeSet<PortKey>,
    lap_tids: AnswerTids,
}

impl std::fmt::Debug for UmadPeerChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmadPeerChannel")
            .field("channel", &self.transport.channel())
            .field("port", &self.port)
            .field("routes", &self.routes.len())
            .finish()
    }
}

impl UmadPeerChannel {
    /// The channel for `port` (the engine's key of the transport's local port), with
    /// the messages of `incoming` (from [`UmadCmTransport::new`]) and `sources` to name
    /// their senders.
    pub fn new(
        transport: UmadCmTransport,
        incoming: mpsc::UnboundedReceiver<Incoming>,
        port: PortKey,
        sources: Arc<dyn SourceGid>,
    ) -> UmadPeerChannel {
        UmadPeerChannel {
            transport,
            port,
            incoming: Mutex::new(Some(incoming)),
            sources,
            routes: BTreeMap::new(),
            carried: std::collections::BTreeSet::new(),
            lap_tids: AnswerTids::default(),
        }
    }

    /// Send messages for the peer port `gid` to `lid` instead of the LID the engine
    /// names. For fabrics where a node's MADs are handled on one port only (the ibsim
    /// bed: only port 1 of a node hosts a client); a kernel answers on every port.
    pub fn route(mut self, gid: Gid, lid: u16) -> UmadPeerChannel {
        self.routes.insert(gid.0, lid);
        self
    }

    /// Also carry the messages the engine sends from `port`, another local port of the
    /// node, through this transport's port. For fabrics where only one port of a node
    /// hosts a MAD client (the ibsim bed); what arrives is still reported as arriving
    /// on this channel's own port.
    pub fn carry_for(mut self, port: PortKey) -> UmadPeerChannel {
        self.carried.insert(port);
        self
    }

    fn refused(&self, why: Reason) -> ProviderError {
        ProviderError::refused(Operation::SendPeer, why)
    }
}

#[async_trait]
impl PeerChannel for UmadPeerChannel {
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        let rx = self
            .incoming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(mut rx) = rx else {
            return Err(ProviderError::Unsupported {
                provider: "cm-lap",
                operation: Operation::Start,
                why: Some(Reason::Because("started twice")),
            });
        };
        let port = self.port;
        let sources = Arc::clone(&self.sources);
        let tids = self.lap_tids.clone();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let msg = match &m.body {
                    CmBody::Other(d) => crate::apm_msg::decode_attribute(m.attribute, &d[..], port),
                    body => to_peer_msg(body, port),
                };
                let Some(msg) = msg else {
                    debug!("CM message the engine does not take: dropped");
                    continue;
                };
                let Some(gid) = sources.gid_of(m.from.lid).await else {
                    warn!(
                        lid = m.from.lid,
                        "peer message from an unknown LID: dropped"
                    );
                    continue;
                };
                tids.record(&msg, m.tid);
                let from = PeerAddr {
                    gid,
                    lid: Lid::from_wire(m.from.lid),
                };
                if sink.send(Input::PeerMessage { from, port, msg }).is_err() {
                    break;
                }
            }
        });
        Ok(())
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        if port != self.port && !self.carried.contains(&port) {
            return Err(self.refused(Reason::NotOurPort(port)));
        }
        // An answer reuses its LAP's TID; a LAP (and a resent one) gets a fresh one.
        let tid = self
            .lap_tids
            .for_answer(&msg)
            .unwrap_or_else(|| self.transport.next_tid());
        let dlid = self.routes.get(&to.gid.0).copied().unwrap_or(to.lid.get());
        let sent = match (&msg, self.transport.channel()) {
            (PeerMsg::Migrate(_) | PeerMsg::MigrateAck(_), CmChannel::Vendor { class, oui }) => {
                let mad = crate::apm_msg::encode(class, oui, tid, &msg)
                    .map_err(|e| self.refused(crate::apm_msg::encode_reason(&e)))?;
                self.transport.send_mad(Dest::gsi(dlid, 0), &mad)
            }
            (PeerMsg::Migrate(_) | PeerMsg::MigrateAck(_), CmChannel::CmClass) => {
                return Err(self.refused(Reason::Because(
                    "the CM class has no attribute for apm's Migrate (the probe before a \
                     forced migration): use a vendor class",
                )))
            }
            _ => {
                let body = from_peer_msg(&msg).map_err(|e| self.refused(transport_reason(&e)))?;
                self.transport.send(Dest::gsi(dlid, 0), tid, &body)
            }
        };
        sent.map_err(|e| ProviderError::io(Operation::SendPeer, transport_reason(&e)))
    }
}

/// Why the umad CM transport failed, as a [`Reason`].
fn transport_reason(e: &TransportError) -> Reason {
    match e {
        TransportError::Umad(e) => umad_sa::umad_reason(e),
        TransportError::Encode(_) => Reason::Because("a value does not fit its field"),
        _ => Reason::Because("only LAP, APR and MRA go through the CM class"),
    }
}

/// The engine's view of a received LAP, APR or MRA (`None` for anything else or for
/// values the engine's types cannot hold).
pub fn to_peer_msg(body: &CmBody, port: PortKey) -> Option<PeerMsg> {
    Some(match body {
        CmBody::Lap(l) => PeerMsg::Lap(Lap {
            sender_comm_id: l.local_comm_id,
            receiver_comm_id: l.remote_comm_id,
            receiver_qpn: Qpn::new(l.remote_qpn.get())?,
            // From the sender's point of view; the engine turns it into ours.
            alt: Path {
                port,
                slid: Lid::from_wire(l.alt_local_lid.0),
                dlid: Lid::from_wire(l.alt_remote_lid.0),
                sgid: Gid(l.alt_local_gid.0),
                dgid: Gid(l.alt_remote_gid.0),
                sgid_index: 0,
                sl: l.alt_sl.get(),
                flow_label: l.alt_flow_label.get(),
                traffic_class: l.alt_traffic_class,
                hop_limit: l.alt_hop_limit,
                rate: l.alt_packet_rate.get(),
                // Not in a LAP: the engine uses the primary's.
                mtu: 0,
                pkey_index: 0,
                ack_timeout: l.alt_local_ack_timeout.get(),
            },
        }),
        CmBody::Apr(a) => PeerMsg::Apr(Apr {
            sender_comm_id: a.local_comm_id,
            receiver_comm_id: a.remote_comm_id,
            status: a.ap_status,
        }),
        CmBody::Mra(m) => PeerMsg::Mra(Mra {
            sender_comm_id: m.local_comm_id,
            receiver_comm_id: m.remote_comm_id,
            service_timeout: m.service_timeout.get(),
        }),
        CmBody::Other(_) => return None,
    })
}

/// The CM message for an engine message. Migrate and MigrateAck are no CM messages
/// ([`crate::apm_msg`] encodes them).
pub fn from_peer_msg(msg: &PeerMsg) -> Result<CmBody, TransportError> {
    let bad = |what: &str| TransportError::Encode(format!("{what} out of range"));
    Ok(match msg {
        PeerMsg::Lap(l) => {
            let a = &l.alt;
            CmBody::Lap(cm::Lap {
                local_comm_id: l.sender_comm_id,
                remote_comm_id: l.receiver_comm_id,
                remote_qpn: wire::Qpn::new(l.receiver_qpn.get()).map_err(|_| bad("QPN"))?,
                // 4.096 us * 2^20 (~4 s): how long the sender waits for the APR at most.
                remote_cm_response_timeout: wire::Timeout::new(20).map_err(|_| bad("timeout"))?,
                alt_local_lid: wire::Lid(a.slid.get()),
                alt_remote_lid: wire::Lid(a.dlid.get()),
                alt_local_gid: wire::Gid(a.sgid.0),
                alt_remote_gid: wire::Gid(a.dgid.0),
                alt_flow_label: wire::FlowLabel::new(a.flow_label)
                    .map_err(|_| bad("flow label"))?,
                alt_traffic_class: a.traffic_class,
                alt_hop_limit: a.hop_limit,
                alt_packet_rate: wire::U6::new(a.rate).map_err(|_| bad("packet rate"))?,
                alt_sl: wire::Sl::new(a.sl).map_err(|_| bad("SL"))?,
                // Hop limit 0/1 keeps the path inside the subnet.
                alt_subnet_local: a.hop_limit <= 1,
                alt_local_ack_timeout: wire::Timeout::new(a.ack_timeout)
                    .map_err(|_| bad("ACK timeout"))?,
                ..cm::Lap::default()
            })
        }
        PeerMsg::Apr(a) => CmBody::Apr(cm::Apr::answer(
            a.sender_comm_id,
            a.receiver_comm_id,
            a.status,
        )),
        PeerMsg::Mra(m) => CmBody::Mra(cm::Mra::for_lap(
            m.sender_comm_id,
            m.receiver_comm_id,
            wire::Timeout::new(m.service_timeout).map_err(|_| bad("service timeout"))?,
        )),
        _ => return Err(TransportError::Unsupported),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> Path {
        Path {
            sl: 3,
            flow_label: 0x12345,
            traffic_class: 7,
            hop_limit: 1,
            rate: 3,
            // Not in a LAP: what the receiver decodes.
            ..Path::ib(
                PortKey::new(0, 1),
                (Lid::from_wire(8), Gid::from_guid(0x100004)),
                (Lid::from_wire(15), Gid::from_guid(0x100008)),
                0,
                Path::ACK_TIMEOUT_67MS,
            )
        }
    }

    #[test]
    fn engine_messages_survive_the_wire() {
        let key = PortKey::new(0, 1);
        let msgs = [
            PeerMsg::Lap(Lap {
                sender_comm_id: 0x100,
                receiver_comm_id: 0x200,
                receiver_qpn: Qpn::new(0x00AB_CDEF).unwrap(),
                alt: path(),
            }),
            PeerMsg::Apr(Apr {
                sender_comm_id: 0x200,
                receiver_comm_id: 0x100,
                status: apm_core::ApStatus::InvalidLid,
            }),
            PeerMsg::Mra(Mra {
                sender_comm_id: 0x200,
                receiver_comm_id: 0x100,
                service_timeout: 17,
            }),
        ];
        for m in msgs {
            let body = from_peer_msg(&m).unwrap();
            let wire =
                crate::umad_transport::encode(crate::umad_transport::CmChannel::CmClass, 1, &body)
                    .unwrap();
            let back =
                crate::umad_transport::decode(crate::umad_transport::CmChannel::CmClass, &wire)
                    .unwrap();
            assert_eq!(to_peer_msg(&back, key), Some(m));
        }
    }

    #[test]
    fn out_of_range_values_refused_not_truncated() {
        let mut p = path();
        p.flow_label = 0x10_0000; // 21 bits
        let lap = PeerMsg::Lap(Lap {
            sender_comm_id: 1,
            receiver_comm_id: 2,
            receiver_qpn: Qpn::new(1).unwrap(),
            alt: p,
        });
        assert!(from_peer_msg(&lap).is_err());
    }
}
