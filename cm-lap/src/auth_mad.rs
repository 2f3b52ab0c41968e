//! Authenticated vendor MADs: the InfiniBand peer channel (umad, apm's vendor class)
//! under the same key, MAC and replay window as the UDP datagrams of [`crate::auth`].
//!
//! A MAD cannot grow (256 bytes on the wire), so the authentication rides in its last
//! 32 bytes, which no apm message uses: a liveness probe with eight dead ports ends at
//! byte 224, Migrate and MigrateAck end far earlier, and LAP, APR and MRA have their
//! private data there, which the exchange leaves empty. The receiver checks the trailer
//! and zeroes it before anything decodes the MAD, so decoders see what they always saw.
//!
//! | MAD offset | size | field                                                       |
//! |-----------:|-----:|-------------------------------------------------------------|
//! | 224        | 4    | KeyID (as [`crate::auth`]); all zero: an unauthenticated MAD |
//! | 228        | 4    | SenderID: the low 32 bits of the channel's                  |
//! | 232        | 8    | Sequence: nanoseconds since the Unix epoch, increasing      |
//! | 240        | 16   | Tag: HMAC-SHA-256 of the MAD with the tag and the TID's upper 32 bits zeroed, first 16 bytes |
//!
//! A receiver without a key does not look at the trailer at all: it zeroes it and
//! passes the MAD on. That is what lets an unkeyed deployment run where the last bytes
//! do not arrive as sent: ibsim's umad2sim (the OpenSM bed) delivers a MAD between two
//! of its clients with bytes from about 232 on lost or overwritten, so sealed MADs
//! cannot be tested there, only unsealed ones.
//!
//! The TID's upper half is left out of the tag because the kernel's umad layer
//! rewrites it on the way out (it routes answers to the sending agent by it); nothing
//! decides anything on it. The SenderID is 32 bits where a datagram has 64: two
//! senders of one receiver that drew the same one (2^-32 per pair) share a replay
//! window, which can drop a message (the engine retransmits), never accept a forged
//! or replayed one. The tag, the window and the clock-skew bound are those of the
//! datagrams: see [`crate::auth`] for why.

use crate::auth::{Authenticator, Key, Mode, Rejected};
use hmac::Mac;
use ib_mad::MAD_SIZE;

/// Where the trailer starts.
pub const TRAILER_AT: usize = MAD_SIZE - TRAILER_LEN;
/// Bytes of the trailer.
pub const TRAILER_LEN: usize = 32;
/// Where the tag starts.
const TAG_AT: usize = MAD_SIZE - crate::auth::TAG_LEN;
/// The TID's upper 32 bits (MAD bytes 8..12), rewritten by the kernel.
const TID_HIGH: std::ops::Range<usize> = 8..12;

/// The tag of `mad` under `key`: the MAD with its tag and the TID's upper half zeroed.
fn tag(key: &Key, mad: &[u8; MAD_SIZE]) -> hmac::Hmac<sha2::Sha256> {
    let mut m = *mad;
    m[TID_HIGH].fill(0);
    m[TAG_AT..].fill(0);
    key.mac().chain_update(m)
}

impl Authenticator {
    /// Seal `mad` in place at `now_ns` (nothing without a key). False, and `mad`
    /// untouched, when its last 32 bytes are not free: a message that uses them
    /// cannot be authenticated and must not go out.
    pub fn seal_mad(&self, mad: &mut [u8; MAD_SIZE], now_ns: u64) -> bool {
        if mad[TRAILER_AT..].iter().any(|b| *b != 0) {
            return false;
        }
        let Some(key) = self.mode().key() else {
            return true;
        };
        let seq = self.next_seq(now_ns);
        mad[TRAILER_AT..TRAILER_AT + 4].copy_from_slice(&key.id());
        mad[TRAILER_AT + 4..TRAILER_AT + 8]
            .copy_from_slice(&(self.sender_id() as u32).to_be_bytes());
        mad[TRAILER_AT + 8..TAG_AT].copy_from_slice(&seq.to_be_bytes());
        let t = tag(key, mad).finalize().into_bytes();
        mad[TAG_AT..].copy_from_slice(&t[..crate::auth::TAG_LEN]);
        true
    }

    /// The MAD received as `mad`, trailer zeroed, if it may reach the engine; else
    /// why not (counted with the datagrams' counters).
    pub fn open_mad(&self, mad: &[u8], now_ns: u64) -> Result<[u8; MAD_SIZE], Rejected> {
        self.counted(self.check_mad(mad, now_ns))
    }

    fn check_mad(&self, mad: &[u8], now_ns: u64) -> Result<[u8; MAD_SIZE], Rejected> {
        let mut mad: [u8; MAD_SIZE] = mad.try_into().map_err(|_| Rejected::Malformed)?;
        if matches!(self.mode(), Mode::Off) {
            // Without a key the trailer means nothing here, so it is not judged: a
            // channel that does not carry a MAD's last bytes intact (ibsim's umad2sim
            // between two clients, see the module header) must still work unkeyed.
            mad[TRAILER_AT..].fill(0);
            return Ok(mad);
        }
        let id = &mad[TRAILER_AT..TRAILER_AT + 4];
        if id == [0; 4] {
            if mad[TRAILER_AT..].iter().any(|b| *b != 0) {
                return Err(Rejected::Malformed);
            }
            return match self.mode() {
                Mode::Require(_) => Err(Rejected::Unauthenticated),
                Mode::Off | Mode::AcceptUnauthenticated(_) => Ok(mad),
            };
        }
        let Some(key) = self.mode().key() else {
            return Err(Rejected::Malformed);
        };
        if id != key.id() {
            return Err(Rejected::OtherKey);
        }
        tag(key, &mad)
            .verify_truncated_left(&mad[TAG_AT..])
            .map_err(|_| Rejected::BadTag)?;
        let be = |r: std::ops::Range<usize>| {
            mad[r]
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
        };
        let (sender, seq) = (
            be(TRAILER_AT + 4..TRAILER_AT + 8),
            be(TRAILER_AT + 8..TAG_AT),
        );
        self.fresh_once(sender, seq, now_ns)?;
        mad[TRAILER_AT..].fill(0);
        Ok(mad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apm_core::probe::{Diag, PathEnds, PortsDown, Probe, SessionState, MAX_PORTS_DOWN};
    use apm_core::{Gid, Lid, PeerMsg, PortKey};

    fn key(b: u8) -> Key {
        Key::new(&[b; 32]).expect("32 bytes")
    }

    const NOW: u64 = 1_800_000_000_000_000_000;

    /// A Migrate as the vendor channel sends it.
    fn migrate() -> [u8; MAD_SIZE] {
        let p = apm_core::Path::ib(
            PortKey::new(0, 1),
            (Lid::from_wire(3), Gid::from_guid(3)),
            (Lid::from_wire(9), Gid::from_guid(9)),
            4,
            14,
        );
        let msg = PeerMsg::Migrate(apm_core::Migrate {
            sender_comm_id: 1,
            receiver_comm_id: 2,
            path: p,
            intent: apm_core::MigrateIntent::Probe,
        });
        crate::apm_msg::encode(0x30, [2, 0x41, 0x50], 0x1234_5678_9abc_def0, &msg).expect("encodes")
    }

    #[test]
    fn a_sealed_mad_opens_once_even_with_its_tid_rewritten_and_decodes_as_before() {
        let a = Authenticator::new(Mode::Require(key(7)), 0xaaaa_bbbb_0000_0001);
        let b = Authenticator::new(Mode::Require(key(7)), 2);
        let plain = migrate();
        let mut m = plain;
        assert!(a.seal_mad(&mut m, NOW));
        assert_ne!(m, plain);
        // The kernel puts its agent's id in the TID's upper half.
        m[8..12].copy_from_slice(&[9, 9, 9, 9]);
        let mut want = plain;
        want[8..12].copy_from_slice(&[9, 9, 9, 9]);
        assert_eq!(b.open_mad(&m, NOW + 5), Ok(want));
        assert_eq!(b.open_mad(&m, NOW + 6), Err(Rejected::Replayed));
        let c = b.counters().get();
        assert_eq!((c.accepted, c.replayed), (1, 1));
    }

    #[test]
    fn forged_truncated_foreign_and_unauthenticated_mads_are_dropped_by_reason() {
        let a = Authenticator::new(Mode::Require(key(7)), 1);
        let b = Authenticator::new(Mode::Require(key(7)), 2);
        let mut m = migrate();
        assert!(a.seal_mad(&mut m, NOW));
        // Every byte the tag covers (all but the TID's upper half) is protected.
        for i in (0..MAD_SIZE).filter(|i| !TID_HIGH.contains(i)) {
            let mut bad = m;
            bad[i] ^= 0x01;
            assert!(b.open_mad(&bad, NOW).is_err(), "bit flip at {i} accepted");
        }
        let mut flipped = m;
        flipped[60] ^= 1;
        assert_eq!(b.open_mad(&flipped, NOW), Err(Rejected::BadTag));
        assert_eq!(
            b.open_mad(&m[..MAD_SIZE - 1], NOW),
            Err(Rejected::Malformed)
        );
        assert_eq!(b.open_mad(&[], NOW), Err(Rejected::Malformed));
        let other = Authenticator::new(Mode::Require(key(8)), 3);
        assert_eq!(other.open_mad(&m, NOW), Err(Rejected::OtherKey));
        assert_eq!(b.open_mad(&m, NOW + 31_000_000_000), Err(Rejected::Stale));
        // A forger without the key: a plain MAD is refused when keys are required...
        assert_eq!(b.open_mad(&migrate(), NOW), Err(Rejected::Unauthenticated));
        // ...accepted while a deployment moves to keys, and alone without keys.
        let moving = Authenticator::new(Mode::AcceptUnauthenticated(key(7)), 4);
        assert_eq!(moving.open_mad(&migrate(), NOW), Ok(migrate()));
        let off = Authenticator::new(Mode::Off, 5);
        assert_eq!(off.open_mad(&migrate(), NOW), Ok(migrate()));
        // Without a key the trailer is not judged: a sealed MAD opens as its plain self.
        let mut plain = m;
        plain[TRAILER_AT..].fill(0);
        assert_eq!(off.open_mad(&m, NOW), Ok(plain));
        assert!(
            b.open_mad(&m, NOW).is_ok(),
            "the original still opens, once"
        );
        // 252 flips: 4 in the KeyID (another key), 248 elsewhere (a bad tag), and
        // the flip above.
        let c = b.counters().get();
        assert_eq!(
            (
                c.other_key,
                c.bad_tag,
                c.malformed,
                c.stale,
                c.unauthenticated,
                c.accepted
            ),
            (4, 249, 2, 1, 1, 1)
        );
    }

    #[test]
    fn the_largest_probe_leaves_the_trailer_free() {
        let ends = PathEnds {
            local: Gid::from_guid(1),
            remote: Gid::from_guid(2),
        };
        let p = Probe {
            state: SessionState::Up,
            diag: Diag::None,
            detect_mult: 3,
            my_disc: 7,
            your_disc: 9,
            tx_interval_us: 1000,
            rx_interval_us: 1000,
            ends,
            ports_down: PortsDown::of((0..MAX_PORTS_DOWN).map(|i| Gid::from_guid(100 + i as u64))),
        };
        let mut m =
            crate::apm_msg::encode(0x30, [2, 0x41, 0x50], 1, &PeerMsg::Probe(p)).expect("encodes");
        let a = Authenticator::new(Mode::Require(key(7)), 1);
        assert!(a.seal_mad(&mut m, NOW), "the trailer is free");
    }
}
