//! Authenticated peer datagrams: a keyed MAC over the whole datagram and a replay
//! window per sender, so that a host on the rail that does not hold the deployment's
//! key can neither forge a Migrate or LAP nor replay one it saw.
//!
//! **Wire format.** A datagram is one of two versions, told apart by its first byte:
//!
//! - version 1 (unauthenticated): the bare 256-byte vendor MAD of [`crate::apm_msg`],
//!   whose first byte is the MAD BaseVersion, 0x01;
//! - version 2 (authenticated), 296 bytes, big-endian:
//!
//! | offset | size | field                                                            |
//! |-------:|-----:|------------------------------------------------------------------|
//! | 0      | 1    | Version: 0x02                                                    |
//! | 1      | 1    | Reserved, 0 (a receiver drops anything else)                     |
//! | 2      | 2    | Reserved, 0                                                      |
//! | 4      | 4    | KeyID: the first 4 bytes of SHA-256("apm peer key" ‖ key)        |
//! | 8      | 8    | SenderID: chosen by the sending channel when it starts           |
//! | 16     | 8    | Sequence: nanoseconds since the Unix epoch, strictly increasing  |
//! | 24     | 256  | The MAD, exactly as version 1 carries it                         |
//! | 280    | 16   | Tag: HMAC-SHA-256(key, bytes 0..280), its first 16 bytes          |
//!
//! **Tag length.** 128 bits, as IPsec's HMAC-SHA-256-128 (RFC 4868): a forger without
//! the key succeeds with probability 2^-128 per datagram, and each attempt costs a
//! datagram on the wire that the receiver counts; nothing is gained by a longer tag,
//! and HMAC's security does not rest on the length of the output kept.
//!
//! **Replay.** A receiver keeps, per SenderID, the highest Sequence accepted and a
//! 64-entry bitmap below it (as IPsec's anti-replay window, RFC 4303): a Sequence seen
//! before, or more than 64 below the highest, is a replay. The Sequence is the sender's
//! wall clock in nanoseconds (bumped by one when the clock has not moved), so it keeps
//! growing across a sender's restart without any state on disk: a restarted sender
//! picks a new SenderID and a Sequence above every one it sent before. A receiver that
//! restarts has forgotten its windows, so it also refuses a Sequence further than
//! `max_skew` from its own clock (default 30 s): a replay then works at most once, of a
//! datagram less than `max_skew` old, which the engine's own duplicate checks see
//! through. This asks for clocks within `max_skew` of each other (NTP does that); a
//! sender whose clock is off by more has its datagrams dropped as stale, and counted.
//!
//! Nothing here decides what a message means: it only says whether a datagram's bytes
//! came from a key holder, once.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The first byte of an authenticated datagram.
pub const VERSION: u8 = 2;
/// The first byte of an unauthenticated one (the MAD's BaseVersion).
pub const UNAUTHENTICATED_VERSION: u8 = 1;
/// Bytes before the MAD.
pub const HEADER_LEN: usize = 24;
/// Bytes of the MAD carried.
pub const BODY_LEN: usize = ib_mad::MAD_SIZE;
/// Bytes of the tag.
pub const TAG_LEN: usize = 16;
/// An authenticated datagram's size.
pub const DATAGRAM_LEN: usize = HEADER_LEN + BODY_LEN + TAG_LEN;
/// The shortest key accepted: 256 bits, SHA-256's own strength.
pub const KEY_MIN: usize = 32;
/// The largest key file read.
pub const KEY_FILE_MAX: u64 = 4096;
/// Entries of the replay bitmap.
const WINDOW: u64 = 64;
/// Senders remembered at most (windows older than `max_skew` go first).
const MAX_SENDERS: usize = 4096;

type HmacSha256 = Hmac<Sha256>;

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read.
    #[error("cannot read the key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Someone other than its owner may read or write it (like ssh, apm refuses).
    #[error(
        "the key file {path} is accessible to its group or others (mode {mode:04o}): \
         `chmod 600 {path}`"
    )]
    Permissions {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Owned by someone else than the user running apm (or root).
    #[error("the key file {path} belongs to uid {owner}, not to this user ({me}) or root")]
    Owner {
        /// The file.
        path: String,
        /// Its owner.
        owner: u32,
        /// The effective uid.
        me: u32,
    },
    /// Not a regular file.
    #[error("the key file {path} is not a regular file")]
    NotAFile {
        /// The file.
        path: String,
    },
    /// Too short or too long.
    #[error(
        "the key in {path} is {len} bytes; a key has {KEY_MIN} to {KEY_FILE_MAX} bytes \
         (`head -c 32 /dev/urandom > FILE` makes one)"
    )]
    Length {
        /// The file.
        path: String,
        /// Its length in bytes (after a final newline is dropped).
        len: u64,
    },
}

/// A deployment's shared secret.
#[derive(Clone)]
pub struct Key {
    /// HMAC keyed with the secret (cloned per datagram).
    mac: HmacSha256,
    id: [u8; 4],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        write!(f, "Key(id {:02x?})", self.id)
    }
}

impl Key {
    /// A key from its bytes ([`KEY_MIN`] or more).
    pub fn new(secret: &[u8]) -> Option<Key> {
        if secret.len() < KEY_MIN {
            return None;
        }
        let digest = Sha256::new()
            .chain_update(b"apm peer key")
            .chain_update(secret)
            .finalize();
        let mut id = [0u8; 4];
        id.copy_from_slice(&digest[..4]);
        Some(Key {
            mac: HmacSha256::new_from_slice(secret).ok()?,
            id,
        })
    }

    /// The key in `path`: a regular file of the user running apm (or root), readable and
    /// writable by its owner alone, holding [`KEY_MIN`] bytes or more (one final newline
    /// is not part of the key, so `openssl rand -hex 32 > FILE` works too).
    pub fn from_file(path: &Path) -> Result<Key, KeyError> {
        use std::io::Read as _;
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        let name = path.display().to_string();
        let io = |source| KeyError::Io {
            path: name.clone(),
            source,
        };
        // Opened without blocking: a FIFO nobody writes would otherwise hold the open
        // (and the agent, `apm config check`, `apm run --config`) for ever; whatever
        // it is, only a regular file is read.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(KeyError::NotAFile { path: name });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: name,
                mode: meta.mode() & 0o7777,
            });
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me && meta.uid() != 0 {
            return Err(KeyError::Owner {
                path: name,
                owner: meta.uid(),
                me,
            });
        }
        let mut bytes = Vec::new();
        file.take(KEY_FILE_MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        let len = bytes.len() as u64;
        if len > KEY_FILE_MAX {
            return Err(KeyError::Length { path: name, len });
        }
        Key::new(&bytes).ok_or(KeyError::Length { path: name, len })
    }

    /// The key's public identifier (on the wire, to tell "another key" from "forged").
    pub fn id(&self) -> [u8; 4] {
        self.id
    }

    pub(crate) fn mac(&self) -> HmacSha256 {
        self.mac.clone()
    }
}

/// What the receive side does with each version of datagram.
#[derive(Clone, Debug)]
pub enum Mode {
    /// No key: send version 1; accept version 1, drop version 2 (counted).
    Off,
    /// Send version 2; accept only version 2 with a valid tag.
    Require(Key),
    /// Send version 2; accept valid version 2 and also version 1 (moving a deployment
    /// to keys one node at a time).
    AcceptUnauthenticated(Key),
}

impl Mode {
    pub(crate) fn key(&self) -> Option<&Key> {
        match self {
            Mode::Off => None,
            Mode::Require(k) | Mode::AcceptUnauthenticated(k) => Some(k),
        }
    }
}

/// Datagrams dropped by the authentication, by reason (and those accepted).
#[derive(Debug, Default)]
pub struct Counters {
    /// Accepted (authenticated, or version 1 where allowed).
    pub accepted: AtomicU64,
    /// Version 1 where a valid tag is required.
    pub unauthenticated: AtomicU64,
    /// Version 2 whose tag does not match: forged or corrupted.
    pub bad_tag: AtomicU64,
    /// Version 2 under another key (KeyID differs): a misconfigured peer.
    pub other_key: AtomicU64,
    /// A Sequence seen before or below the window.
    pub replayed: AtomicU64,
    /// A Sequence further than `max_skew` from this clock.
    pub stale: AtomicU64,
    /// Neither version, a wrong length, reserved bits set, version 2 without a key.
    pub malformed: AtomicU64,
    /// Woken at every count, for [`Counters::until`].
    counted: tokio::sync::Notify,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValues {
    /// See [`Counters::accepted`].
    pub accepted: u64,
    /// See [`Counters::unauthenticated`].
    pub unauthenticated: u64,
    /// See [`Counters::bad_tag`].
    pub bad_tag: u64,
    /// See [`Counters::other_key`].
    pub other_key: u64,
    /// See [`Counters::replayed`].
    pub replayed: u64,
    /// See [`Counters::stale`].
    pub stale: u64,
    /// See [`Counters::malformed`].
    pub malformed: u64,
}

impl Counters {
    /// The values once `done` holds for them (now, or after a later count): a waiter
    /// for a datagram's verdict without polling.
    pub async fn until(&self, done: impl Fn(&CounterValues) -> bool) -> CounterValues {
        loop {
            // Registered before the values are read, so no count falls in between.
            let counted = self.counted.notified();
            tokio::pin!(counted);
            counted.as_mut().enable();
            let v = self.get();
            if done(&v) {
                return v;
            }
            counted.await;
        }
    }

    /// The values now.
    pub fn get(&self) -> CounterValues {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterValues {
            accepted: l(&self.accepted),
            unauthenticated: l(&self.unauthenticated),
            bad_tag: l(&self.bad_tag),
            other_key: l(&self.other_key),
            replayed: l(&self.replayed),
            stale: l(&self.stale),
            malformed: l(&self.malformed),
        }
    }
}

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejected {
    /// See [`Counters::unauthenticated`].
    Unauthenticated,
    /// See [`Counters::bad_tag`].
    BadTag,
    /// See [`Counters::other_key`].
    OtherKey,
    /// See [`Counters::replayed`].
    Replayed,
    /// See [`Counters::stale`].
    Stale,
    /// See [`Counters::malformed`].
    Malformed,
}

/// One sender's replay window.
#[derive(Clone, Copy, Debug)]
struct Window {
    highest: u64,
    /// Bit i: `highest - i` was accepted.
    seen: u64,
}

impl Window {
    /// Accept `seq` once.
    fn accept(&mut self, seq: u64) -> bool {
        if seq > self.highest {
            let shift = seq - self.highest;
            self.seen = if shift >= WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.highest = seq;
            return true;
        }
        let back = self.highest - seq;
        if back >= WINDOW || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

/// Seals outgoing and opens incoming datagrams for one channel.
#[derive(Debug)]
pub struct Authenticator {
    mode: Mode,
    sender_id: u64,
    last_seq: Mutex<u64>,
    windows: Mutex<BTreeMap<u64, Window>>,
    max_skew_ns: u64,
    counters: Counters,
}

/// Log a dropped datagram or MAD: a warning the first time for each reason (an attack
/// or a misconfiguration shows without flooding the log), debug after that.
pub(crate) fn report_drop(
    warned: &std::sync::atomic::AtomicU8,
    why: Rejected,
    from: impl std::fmt::Display,
    len: usize,
) {
    let bit = 1u8 << (why as u8);
    if warned.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
        tracing::warn!(%from, len, ?why, "peer message dropped by authentication (further ones of this kind are logged at debug level)");
    } else {
        tracing::debug!(%from, len, ?why, "peer message dropped by authentication");
    }
}

/// The receiver's default tolerance between clocks.
pub const DEFAULT_MAX_SKEW: std::time::Duration = std::time::Duration::from_secs(30);

/// Nanoseconds since the Unix epoch (0 before it).
#[allow(clippy::disallowed_methods)] // a transport's replay protection needs the wall clock
pub fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Authenticator {
    /// An authenticator in `mode`, with `sender_id` naming this channel's datagrams
    /// (unique per channel and start; see [`Authenticator::fresh_sender_id`]).
    pub fn new(mode: Mode, sender_id: u64) -> Authenticator {
        Authenticator {
            mode,
            sender_id,
            last_seq: Mutex::new(0),
            windows: Mutex::new(BTreeMap::new()),
            max_skew_ns: DEFAULT_MAX_SKEW.as_nanos() as u64,
            counters: Counters::default(),
        }
    }

    /// A SenderID unlikely to be any other channel's: a hash of the process, the time
    /// and `salt` (the local address). It needs to be unique, not secret.
    pub fn fresh_sender_id(salt: &[u8]) -> u64 {
        let d = Sha256::new()
            .chain_update(std::process::id().to_be_bytes())
            .chain_update(wall_clock_ns().to_be_bytes())
            .chain_update(salt)
            .finalize();
        let mut b = [0u8; 8];
        b.copy_from_slice(&d[..8]);
        u64::from_be_bytes(b)
    }

    /// Set the receiver's tolerance between clocks (see the module docs).
    pub fn with_max_skew(mut self, skew: std::time::Duration) -> Authenticator {
        self.max_skew_ns = u64::try_from(skew.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// True when datagrams go out authenticated.
    pub fn seals(&self) -> bool {
        self.mode.key().is_some()
    }

    /// The datagram for `mad` at `now_ns`: the MAD itself without a key, else version 2.
    pub fn seal(&self, mad: &[u8; ib_mad::MAD_SIZE], now_ns: u64) -> Vec<u8> {
        let Some(key) = self.mode.key() else {
            return mad.to_vec();
        };
        let seq = self.next_seq(now_ns);
        let mut d = Vec::with_capacity(DATAGRAM_LEN);
        d.extend_from_slice(&[VERSION, 0, 0, 0]);
        d.extend_from_slice(&key.id);
        d.extend_from_slice(&self.sender_id.to_be_bytes());
        d.extend_from_slice(&seq.to_be_bytes());
        d.extend_from_slice(mad);
        let tag = key.mac().chain_update(&d).finalize().into_bytes();
        d.extend_from_slice(&tag[..TAG_LEN]);
        d
    }

    /// The next Sequence: the clock, or one above the last when it has not moved.
    pub(crate) fn next_seq(&self, now_ns: u64) -> u64 {
        let mut last = self.last_seq.lock().unwrap_or_else(|p| p.into_inner());
        *last = now_ns.max(last.saturating_add(1));
        *last
    }

    /// The mode (the key, and what is accepted without one).
    pub(crate) fn mode(&self) -> &Mode {
        &self.mode
    }

    /// This channel's SenderID.
    pub(crate) fn sender_id(&self) -> u64 {
        self.sender_id
    }

    /// The MAD in `datagram` if it may reach the engine, else why not (counted).
    pub fn open(&self, datagram: &[u8], now_ns: u64) -> Result<[u8; ib_mad::MAD_SIZE], Rejected> {
        self.counted(self.check(datagram, now_ns))
    }

    /// Count `r` by its outcome.
    pub(crate) fn counted<T>(&self, r: Result<T, Rejected>) -> Result<T, Rejected> {
        let c = &self.counters;
        let counter = match r {
            Ok(_) => &c.accepted,
            Err(Rejected::Unauthenticated) => &c.unauthenticated,
            Err(Rejected::BadTag) => &c.bad_tag,
            Err(Rejected::OtherKey) => &c.other_key,
            Err(Rejected::Replayed) => &c.replayed,
            Err(Rejected::Stale) => &c.stale,
            Err(Rejected::Malformed) => &c.malformed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        c.counted.notify_waiters();
        r
    }

    fn check(&self, d: &[u8], now_ns: u64) -> Result<[u8; ib_mad::MAD_SIZE], Rejected> {
        match (d.first(), &self.mode) {
            (Some(&UNAUTHENTICATED_VERSION), Mode::Off | Mode::AcceptUnauthenticated(_)) => {
                d.try_into().map_err(|_| Rejected::Malformed)
            }
            (Some(&UNAUTHENTICATED_VERSION), Mode::Require(_)) => Err(Rejected::Unauthenticated),
            (Some(&VERSION), Mode::Require(k) | Mode::AcceptUnauthenticated(k)) => {
                self.check_sealed(k, d, now_ns)
            }
            _ => Err(Rejected::Malformed),
        }
    }

    fn check_sealed(
        &self,
        key: &Key,
        d: &[u8],
        now_ns: u64,
    ) -> Result<[u8; ib_mad::MAD_SIZE], Rejected> {
        if d.len() != DATAGRAM_LEN || d[1..4] != [0, 0, 0] {
            return Err(Rejected::Malformed);
        }
        if d[4..8] != key.id {
            return Err(Rejected::OtherKey);
        }
        let (signed, tag) = d.split_at(DATAGRAM_LEN - TAG_LEN);
        // Constant-time comparison of the kept bytes.
        key.mac()
            .chain_update(signed)
            .verify_truncated_left(tag)
            .map_err(|_| Rejected::BadTag)?;
        let be64 = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&d[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let (sender, seq) = (be64(8), be64(16));
        self.fresh_once(sender, seq, now_ns)?;
        let mut mad = [0u8; ib_mad::MAD_SIZE];
        mad.copy_from_slice(&d[HEADER_LEN..HEADER_LEN + BODY_LEN]);
        Ok(mad)
    }

    /// `seq` of `sender` is within the clock skew and comes for the first time.
    pub(crate) fn fresh_once(&self, sender: u64, seq: u64, now_ns: u64) -> Result<(), Rejected> {
        if seq.abs_diff(now_ns) > self.max_skew_ns {
            return Err(Rejected::Stale);
        }
        self.accept_once(sender, seq, now_ns)
    }

    /// The replay window of `sender`: true the first time `seq` comes.
    fn accept_once(&self, sender: u64, seq: u64, now_ns: u64) -> Result<(), Rejected> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if !windows.contains_key(&sender) && windows.len() >= MAX_SENDERS {
            // Windows of senders silent for longer than the skew can go: anything they
            // would refuse is refused as stale anyway. Failing that, the quietest one.
            let horizon = now_ns.saturating_sub(self.max_skew_ns);
            windows.retain(|_, w| w.highest >= horizon);
            if windows.len() >= MAX_SENDERS {
                if let Some(oldest) = windows.iter().min_by_key(|(_, w)| w.highest) {
                    let k = *oldest.0;
                    windows.remove(&k);
                }
            }
        }
        let w = windows.entry(sender).or_insert(Window {
            highest: seq,
            seen: 0,
        });
        if w.accept(seq) {
            Ok(())
        } else {
            Err(Rejected::Replayed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key::new(&[b; 32]).expect("32 bytes")
    }

    fn mad() -> [u8; ib_mad::MAD_SIZE] {
        let mut m = [0u8; ib_mad::MAD_SIZE];
        m[0] = 1;
        m[1] = 0x30;
        m[40] = 0xAB;
        m
    }

    const NOW: u64 = 1_800_000_000_000_000_000;

    #[test]
    fn a_sealed_datagram_opens_once() {
        let a = Authenticator::new(Mode::Require(key(7)), 1);
        let b = Authenticator::new(Mode::Require(key(7)), 2);
        let d = a.seal(&mad(), NOW);
        assert_eq!(d.len(), DATAGRAM_LEN);
        assert_eq!(d[0], VERSION);
        assert_eq!(b.open(&d, NOW + 5), Ok(mad()));
        assert_eq!(b.open(&d, NOW + 6), Err(Rejected::Replayed));
        // The next one from the same sender, even at the same clock reading, opens.
        let d2 = a.seal(&mad(), NOW);
        assert_eq!(b.open(&d2, NOW + 7), Ok(mad()));
        let c = b.counters().get();
        assert_eq!((c.accepted, c.replayed), (2, 1));
    }

    #[test]
    fn forged_truncated_and_foreign_datagrams_are_dropped_by_reason() {
        let a = Authenticator::new(Mode::Require(key(7)), 1);
        let b = Authenticator::new(Mode::Require(key(7)), 2);
        let d = a.seal(&mad(), NOW);
        for i in [0usize, 5, 9, 20, 100, DATAGRAM_LEN - 1] {
            let mut bad = d.clone();
            bad[i] ^= 0x01;
            assert!(b.open(&bad, NOW).is_err(), "bit flip at {i} accepted");
        }
        let mut flipped = d.clone();
        flipped[100] ^= 1;
        assert_eq!(b.open(&flipped, NOW), Err(Rejected::BadTag));
        assert_eq!(
            b.open(&d[..DATAGRAM_LEN - 1], NOW),
            Err(Rejected::Malformed)
        );
        assert_eq!(b.open(&d[..1], NOW), Err(Rejected::Malformed));
        assert_eq!(b.open(&[], NOW), Err(Rejected::Malformed));
        let other = Authenticator::new(Mode::Require(key(8)), 3);
        assert_eq!(
            b.open(&other.seal(&mad(), NOW), NOW),
            Err(Rejected::OtherKey)
        );
        // A forger who copies the KeyID still has no tag.
        let mut forged = other.seal(&mad(), NOW);
        forged[4..8].copy_from_slice(&key(7).id());
        assert_eq!(b.open(&forged, NOW), Err(Rejected::BadTag));
        assert_eq!(b.open(&mad(), NOW), Err(Rejected::Unauthenticated));
        // The genuine one still opens after all that.
        assert_eq!(b.open(&d, NOW), Ok(mad()));
    }

    #[test]
    fn stale_datagrams_and_the_window_edges() {
        let a = Authenticator::new(Mode::Require(key(7)), 1);
        let b = Authenticator::new(Mode::Require(key(7)), 2);
        let skew = DEFAULT_MAX_SKEW.as_nanos() as u64;
        assert_eq!(
            b.open(&a.seal(&mad(), NOW), NOW + skew + 1),
            Err(Rejected::Stale)
        );
        assert_eq!(
            b.open(&a.seal(&mad(), NOW + 2 * skew), NOW),
            Err(Rejected::Stale)
        );
        let mut w = Window {
            highest: 100,
            seen: 1,
        };
        assert!(w.accept(90), "below the highest, inside the window, unseen");
        assert!(!w.accept(90));
        assert!(!w.accept(100 - WINDOW), "below the window");
        assert!(w.accept(500));
        assert!(!w.accept(100), "now below the window");
        assert!(w.accept(499));
    }

    #[test]
    fn modes_decide_about_version_1() {
        let off = Authenticator::new(Mode::Off, 1);
        assert_eq!(off.seal(&mad(), NOW), mad().to_vec());
        assert_eq!(off.open(&mad(), NOW), Ok(mad()));
        let sealed = Authenticator::new(Mode::Require(key(1)), 2).seal(&mad(), NOW);
        assert_eq!(off.open(&sealed, NOW), Err(Rejected::Malformed));
        let lenient = Authenticator::new(Mode::AcceptUnauthenticated(key(1)), 3);
        assert_eq!(lenient.open(&mad(), NOW), Ok(mad()));
        assert_eq!(lenient.open(&sealed, NOW), Ok(mad()));
        assert_eq!(lenient.open(&mad()[..200], NOW), Err(Rejected::Malformed));
    }

    #[test]
    fn key_files_are_checked_like_ssh_keys() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("cm-lap-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).expect("write");
        let set = |mode| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        set(0o644);
        let e = Key::from_file(&path).expect_err("world-readable");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        set(0o640);
        assert!(matches!(
            Key::from_file(&path),
            Err(KeyError::Permissions { .. })
        ));
        set(0o600);
        let k = Key::from_file(&path).expect("a good key");
        assert_eq!(
            k.id(),
            Key::new("ab".repeat(32).as_bytes()).expect("k").id()
        );
        std::fs::write(&path, b"short").expect("write");
        assert!(matches!(
            Key::from_file(&path),
            Err(KeyError::Length { len: 5, .. })
        ));
        assert!(matches!(
            Key::from_file(&dir),
            Err(KeyError::NotAFile { .. })
        ));
        assert!(matches!(
            Key::from_file(&dir.join("none")),
            Err(KeyError::Io { .. })
        ));
        // A FIFO nobody writes, and a device: refused at once, never waited on.
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        if made {
            assert!(matches!(
                Key::from_file(&fifo),
                Err(KeyError::NotAFile { .. })
            ));
        }
        assert!(matches!(
            Key::from_file(std::path::Path::new("/dev/zero")),
            Err(KeyError::NotAFile { .. })
        ));
        assert!(
            !format!("{k:?}").contains("abababab"),
            "Debug never shows the secret"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
