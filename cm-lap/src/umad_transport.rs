//! LAP/APR/MRA over libibumad: the MAD transport of the exchange, on a [`umad::Port`].
//!
//! Two channels, chosen by configuration ([`CmChannel`]):
//! - **CM class 0x07** (version 2, method Send): the IBA's own. Usable only where no
//!   kernel CM owns the class for the port — the simulated fabric. On a stock Linux
//!   kernel ib_cm holds class 0x07 and no longer sends or answers LAP/APR (docs/iba-facts.md §4),
//!   so a LAP sent there reaches a consumer that ignores it.
//! - **A vendor class with an OUI** (0x30-0x4F, registered with `umad_register_oui`):
//!   free for user space on stock kernels. The CM message rides in the 216 vendor data
//!   bytes under the CM attribute ID; the private data is cut to fit (the exchange
//!   carries none).
//!
//! A vendor channel also carries apm's own attributes, Migrate and MigrateAck
//! ([`crate::apm_msg`]): what a hardware-APM engine asks its peer before a forced
//! migration. The CM class cannot (it has no attributes of apm's).
//!
//! Every message is a Send (a request, so umad2sim and the kernel hand it to the
//! receiver's agent as unsolicited); the protocol engine pairs LAPs and APRs by comm
//! IDs, retransmits and detects duplicates. This module only encodes, sends, receives
//! and decodes; it never answers anything by itself.

use crate::auth::{Authenticator, CounterValues, Mode};
use ib_mad::cm::{Apr, CmBody, CmMad, Lap, Mra, CM_CLASS_VERSION};
use ib_mad::types::{Oui, U24};
use ib_mad::vendor::{VendorMad, VENDOR_DATA_SIZE};
use ib_mad::{Attribute, AttributeId, Method, MgmtClass};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::debug;
use umad::{AgentSpec, Dest, Port, RecvAddr, Unsolicited};

/// Which MAD class carries the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmChannel {
    /// CM class 0x07, version 2 (simulated fabrics; kernels without ib_cm on the port).
    CmClass,
    /// A vendor class 0x30-0x4F with an OUI (stock Linux kernels).
    Vendor {
        /// The class (0x30-0x4F).
        class: u8,
        /// The OUI registered with it.
        oui: [u8; 3],
    },
}

/// Default vendor class of the exchange on stock kernels. The OUI is the caller's to
/// choose (an organisation's own); none is assumed here.
pub const DEFAULT_VENDOR_CLASS: u8 = 0x30;

/// Version of the vendor class (our own protocol's version).
pub const VENDOR_CLASS_VERSION: u8 = 1;

impl CmChannel {
    /// The agent the port must register for this channel.
    pub fn agent(&self) -> AgentSpec {
        match *self {
            CmChannel::CmClass => AgentSpec::class(MgmtClass::CM.0, CM_CLASS_VERSION),
            CmChannel::Vendor { class, oui } => AgentSpec {
                oui: Some(oui),
                ..AgentSpec::class(class, VENDOR_CLASS_VERSION)
            },
        }
    }

    /// The management class on the wire.
    pub fn class(&self) -> u8 {
        match *self {
            CmChannel::CmClass => MgmtClass::CM.0,
            CmChannel::Vendor { class, .. } => class,
        }
    }
}

/// Errors of the umad CM transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The umad port failed.
    #[error(transparent)]
    Umad(#[from] umad::Error),
    /// The channel cannot carry this (e.g. a vendor class outside 0x30-0x4F).
    #[error("cannot encode: {0}")]
    Encode(String),
    /// Only LAP, APR and MRA are sent by this transport.
    #[error("unsupported CM message for this transport")]
    Unsupported,
}

/// A CM message received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// Where it came from (LID, QPN, SL).
    pub from: RecvAddr,
    /// Its transaction ID (as received; high bits may have been rewritten).
    pub tid: u64,
    /// The MAD's attribute ID: a CM message's, or one of apm's own
    /// ([`crate::apm_msg::is_apm_attribute`]).
    pub attribute: AttributeId,
    /// The message (LAP, APR or MRA); apm's own attributes arrive as `Other` holding
    /// the vendor data bytes (decode with [`crate::apm_msg::decode_attribute`]).
    pub body: CmBody,
}

/// The umad transport of one port.
#[derive(Debug, Clone)]
pub struct UmadCmTransport {
    port: Arc<Port>,
    channel: CmChannel,
    /// Seals what goes out and opens what comes in on a vendor channel
    /// ([`crate::auth_mad`]); the CM class carries no authentication.
    auth: Arc<Authenticator>,
}

impl UmadCmTransport {
    /// A transport on `port`, which must have the channel's agent ([`CmChannel::agent`]).
    /// `unsolicited` is the port's stream for that class (see [`umad::split_by_class`]);
    /// the returned receiver yields decoded messages. Must be called inside a tokio
    /// runtime.
    pub fn new(
        port: Arc<Port>,
        channel: CmChannel,
        unsolicited: Unsolicited,
    ) -> (UmadCmTransport, mpsc::UnboundedReceiver<Incoming>) {
        UmadCmTransport::authenticated(port, channel, unsolicited, Mode::Off)
    }

    /// As [`UmadCmTransport::new`], a vendor channel authenticated under `mode`
    /// ([`crate::auth_mad`]): with a key every MAD goes out sealed, and what comes in
    /// is opened before it is decoded (dropped and counted when it may not reach the
    /// engine). The CM class carries no authentication: `mode` is ignored there.
    pub fn authenticated(
        port: Arc<Port>,
        channel: CmChannel,
        mut unsolicited: Unsolicited,
        mode: Mode,
    ) -> (UmadCmTransport, mpsc::UnboundedReceiver<Incoming>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let sender = Authenticator::fresh_sender_id(&port.info().gid);
        let auth = Arc::new(Authenticator::new(mode, sender));
        let opener = Arc::clone(&auth);
        tokio::spawn(async move {
            let warned = AtomicU8::new(0);
            while let Some(m) = unsolicited.recv().await {
                let mad = match channel {
                    CmChannel::CmClass => m.mad.clone(),
                    CmChannel::Vendor { .. } => {
                        match opener.open_mad(&m.mad, crate::auth::wall_clock_ns()) {
                            Ok(mad) => mad.to_vec(),
                            Err(why) => {
                                let from = format!("LID {}", m.src.lid);
                                crate::auth::report_drop(&warned, why, from, m.mad.len());
                                continue;
                            }
                        }
                    }
                };
                match decode_carried(channel, &mad) {
                    Some((attribute, body)) => {
                        let inc = Incoming {
                            from: m.src,
                            tid: m.tid(),
                            attribute,
                            body,
                        };
                        if tx.send(inc).is_err() {
                            break;
                        }
                    }
                    None => debug!(
                        class = m.class(),
                        method = m.method(),
                        "not a LAP/APR/MRA for this channel; dropped"
                    ),
                }
            }
        });
        (
            UmadCmTransport {
                port,
                channel,
                auth,
            },
            rx,
        )
    }

    /// The authentication's counters (accepted, and dropped by reason).
    pub fn auth_counters(&self) -> CounterValues {
        self.auth.counters().get()
    }

    /// A fresh transaction ID for a new exchange.
    pub fn next_tid(&self) -> u64 {
        self.port.next_tid()
    }

    /// The channel in use.
    pub fn channel(&self) -> CmChannel {
        self.channel
    }

    /// Send one LAP, APR or MRA to `to` (QP1 of the peer's port) with `tid` (the engine
    /// keeps one TID per transaction so retransmissions are recognisable).
    pub fn send(&self, to: Dest, tid: u64, body: &CmBody) -> Result<(), TransportError> {
        let mad = encode(self.channel, tid, body)?;
        self.send_mad(to, &mad)
    }

    /// Send a MAD encoded elsewhere (apm's own attributes, [`crate::apm_msg::encode`])
    /// to `to`, sealed on an authenticated vendor channel.
    pub fn send_mad(&self, to: Dest, mad: &[u8; ib_mad::MAD_SIZE]) -> Result<(), TransportError> {
        let mut mad = *mad;
        if let CmChannel::Vendor { .. } = self.channel {
            if !self.auth.seal_mad(&mut mad, crate::auth::wall_clock_ns()) {
                return Err(TransportError::Encode(
                    "the MAD's last 32 bytes (the authentication's) are in use".into(),
                ));
            }
        }
        self.port.send(&mad, to)?;
        Ok(())
    }
}

/// What [`UmadCmTransport`] passes on from a received MAD: a LAP, APR or MRA, or on a
/// vendor channel one of apm's own attributes (as `Other`, the vendor data bytes).
fn decode_carried(channel: CmChannel, mad: &[u8]) -> Option<(AttributeId, CmBody)> {
    if let Some(body) = decode(channel, mad) {
        return Some((body.attribute_id()?, body));
    }
    let CmChannel::Vendor { class, oui } = channel else {
        return None;
    };
    let v = VendorMad::decode(mad).ok()?;
    let want = u32::from_be_bytes([0, oui[0], oui[1], oui[2]]);
    let attr = v.header.attribute_id;
    if v.header.mgmt_class.0 != class
        || v.oui.0.get() != want
        || v.header.method != Method::SEND
        || !crate::apm_msg::is_apm_attribute(attr)
    {
        return None;
    }
    let mut data = Box::new([0u8; ib_mad::cm::CM_DATA_SIZE]);
    data[..VENDOR_DATA_SIZE].copy_from_slice(&v.data[..]);
    Some((attr, CmBody::Other(data)))
}

/// Encode `body` for `channel`.
pub fn encode(
    channel: CmChannel,
    tid: u64,
    body: &CmBody,
) -> Result<[u8; ib_mad::MAD_SIZE], TransportError> {
    let attr = body.attribute_id().ok_or(TransportError::Unsupported)?;
    match channel {
        CmChannel::CmClass => Ok(CmMad::new(tid, body.clone()).encode()),
        CmChannel::Vendor { class, oui } => {
            let oui = Oui(U24::from_masked(u32::from_be_bytes([
                0, oui[0], oui[1], oui[2],
            ])));
            let mut v = VendorMad::new(
                MgmtClass(class),
                VENDOR_CLASS_VERSION,
                Method::SEND,
                tid,
                attr,
                oui,
            )
            .map_err(|e| TransportError::Encode(e.to_string()))?;
            // The CM message's first 216 bytes: all of it but the tail of the private
            // data, which this exchange leaves empty.
            let mut full = [0u8; ib_mad::cm::CM_DATA_SIZE];
            match body {
                CmBody::Lap(m) => m.encode(&mut full),
                CmBody::Apr(m) => m.encode(&mut full),
                CmBody::Mra(m) => m.encode(&mut full),
                CmBody::Other(_) => return Err(TransportError::Unsupported),
            }
            v.data.copy_from_slice(&full[..VENDOR_DATA_SIZE]);
            Ok(v.encode())
        }
    }
}

/// Decode a received MAD of `channel` into a LAP, APR or MRA (`None` for anything else).
pub fn decode(channel: CmChannel, mad: &[u8]) -> Option<CmBody> {
    match channel {
        CmChannel::CmClass => {
            let m = CmMad::decode(mad).ok()?;
            if m.header.method != Method::SEND {
                return None;
            }
            match m.body {
                CmBody::Other(_) => None,
                b => Some(b),
            }
        }
        CmChannel::Vendor { class, oui } => {
            let v = VendorMad::decode(mad).ok()?;
            let want = u32::from_be_bytes([0, oui[0], oui[1], oui[2]]);
            if v.header.mgmt_class.0 != class
                || v.oui.0.get() != want
                || v.header.method != Method::SEND
            {
                return None;
            }
            let d = &v.data[..];
            match v.header.attribute_id {
                AttributeId::CM_LAP => Lap::decode(d).ok().map(CmBody::Lap),
                AttributeId::CM_APR => Apr::decode(d).ok().map(CmBody::Apr),
                AttributeId::CM_MRA => Mra::decode(d).ok().map(CmBody::Mra),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ib_mad::cm::ApStatus;

    fn lap() -> Lap {
        Lap {
            local_comm_id: 0x1111_2222,
            remote_comm_id: 0x3333_4444,
            alt_local_lid: ib_mad::types::Lid(9),
            alt_remote_lid: ib_mad::types::Lid(13),
            ..Lap::default()
        }
    }

    #[test]
    fn a_vendor_channel_passes_apm_attributes_on_the_cm_class_does_not() {
        let (class, oui) = (DEFAULT_VENDOR_CLASS, [0x00, 0x14, 0x05]);
        let msg = apm_core::PeerMsg::MigrateAck(apm_core::MigrateAck {
            sender_comm_id: 7,
            receiver_comm_id: 9,
            ok: true,
        });
        let wire = crate::apm_msg::encode(class, oui, 0x42, &msg).unwrap();
        let (attr, body) = decode_carried(CmChannel::Vendor { class, oui }, &wire).unwrap();
        assert_eq!(attr, crate::apm_msg::MIGRATE_ACK_ATTR);
        let CmBody::Other(d) = body else {
            panic!("apm's attribute as Other: {body:?}")
        };
        let port = apm_core::PortKey::new(0, 1);
        assert_eq!(
            crate::apm_msg::decode_attribute(attr, &d[..], port),
            Some(msg)
        );
        assert_eq!(decode_carried(CmChannel::CmClass, &wire), None);
        // Another OUI's is not ours.
        let other = CmChannel::Vendor {
            class,
            oui: [0, 0, 1],
        };
        assert_eq!(decode_carried(other, &wire), None);
    }

    #[test]
    fn round_trip_both_channels() {
        let vendor = CmChannel::Vendor {
            class: DEFAULT_VENDOR_CLASS,
            oui: [0x00, 0x14, 0x05],
        };
        for ch in [CmChannel::CmClass, vendor] {
            for body in [
                CmBody::Lap(lap()),
                CmBody::Apr(Apr::answer(1, 2, ApStatus::Success)),
            ] {
                let wire = encode(ch, 0x42, &body).unwrap();
                assert_eq!(wire[1], ch.class());
                assert_eq!(wire[3], 0x03, "Send");
                assert_eq!(decode(ch, &wire), Some(body.clone()), "{ch:?}");
            }
        }
    }

    #[test]
    fn other_classes_and_ouis_ignored() {
        let wire = encode(CmChannel::CmClass, 1, &CmBody::Lap(lap())).unwrap();
        let vendor = CmChannel::Vendor {
            class: 0x30,
            oui: [1, 2, 3],
        };
        assert_eq!(decode(vendor, &wire), None);
        let other_oui = CmChannel::Vendor {
            class: 0x30,
            oui: [1, 2, 4],
        };
        let wire = encode(other_oui, 1, &CmBody::Lap(lap())).unwrap();
        assert_eq!(decode(vendor, &wire), None);
        assert_eq!(decode(CmChannel::CmClass, &wire[..100]), None);
        let bad = CmChannel::Vendor {
            class: 0x20,
            oui: [1, 2, 3],
        };
        assert!(encode(bad, 1, &CmBody::Lap(lap())).is_err());
    }
}
