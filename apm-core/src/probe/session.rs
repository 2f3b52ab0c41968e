//! One probe session's state machine: RFC 5880's Down -> Init -> Up three-way handshake
//! and its detection timer, without authentication (the peer channel authenticates) and
//! without demand mode or echo (apm probes the path itself, never through the peer's
//! forwarding plane).

use super::damping::Damping;
use super::schedule::Grid;
use super::{PathEnds, PortsDown, Probe};
use crate::types::Time;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A session's state (RFC 5880 4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Held down by its owner; never sent by apm, understood when received.
    AdminDown,
    /// Not working (or not yet known to work).
    Down,
    /// This end hears the peer; the peer has not said it hears us.
    Init,
    /// Both ends hear each other.
    Up,
}

impl SessionState {
    /// The wire code (RFC 5880's numbering).
    pub fn code(self) -> u8 {
        match self {
            SessionState::AdminDown => 0,
            SessionState::Down => 1,
            SessionState::Init => 2,
            SessionState::Up => 3,
        }
    }

    /// The state of a wire code, `None` for an unknown one.
    pub fn from_code(code: u8) -> Option<SessionState> {
        Some(match code {
            0 => SessionState::AdminDown,
            1 => SessionState::Down,
            2 => SessionState::Init,
            3 => SessionState::Up,
            _ => return None,
        })
    }
}

/// Why a session last left Up (RFC 5880 4.1's diagnostic, the codes apm uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Diag {
    /// No diagnostic.
    None,
    /// Nothing heard for the detection time.
    DetectionExpired,
    /// The peer said its session went down.
    NeighborSignaledDown,
    /// This end's port went down.
    LocalPortDown,
}

impl Diag {
    /// The wire code (RFC 5880's where one exists; 4 is its "forwarding plane reset",
    /// the nearest to a port going down).
    pub fn code(self) -> u8 {
        match self {
            Diag::None => 0,
            Diag::DetectionExpired => 1,
            Diag::NeighborSignaledDown => 3,
            Diag::LocalPortDown => 4,
        }
    }

    /// The diagnostic of a wire code; unknown codes read as `None` (informational only).
    pub fn from_code(code: u8) -> Diag {
        match code {
            1 => Diag::DetectionExpired,
            3 => Diag::NeighborSignaledDown,
            4 => Diag::LocalPortDown,
            _ => Diag::None,
        }
    }
}

/// One path's session.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) state: SessionState,
    pub(super) diag: Diag,
    pub(super) my_disc: u32,
    your_disc: u32,
    multiplier: u8,
    /// When the next probe goes out.
    pub(super) next_tx: Time,
    /// The slots its probes go out in (`schedule.rs`).
    pub(super) grid: Grid,
    /// Grids it had so far (each draws its jitter afresh).
    pub(super) anchors: u64,
    /// The caller vouches for the path: no periodic probe is sent or expected
    /// (`park.rs`).
    pub(super) parked: bool,
    /// Periodic probes it did not send, parked, on grids it has since left.
    pub(super) unsent: u64,
    /// The detection time the last accepted probe set.
    pub(super) detect: Duration,
    /// When the session goes down unless a probe arrives (Init and Up only).
    pub(super) detect_at: Option<Time>,
    /// The expiry queued in the prober's timers (at most one per session).
    pub(super) detect_queued: Option<Time>,
    /// It has been Up before: a later Up is news for the engine.
    pub(super) was_up: bool,
    /// The caller was told the path is up (and has not heard it went down since).
    pub(super) told_up: bool,
    /// The flap history.
    pub(super) damping: Damping,
    /// Its last return was held for flapping until then.
    pub(super) release_at: Option<Time>,
    /// When a probe was last accepted (for the log line of an expiry).
    pub(super) last_heard: Option<Time>,
}

impl Session {
    pub(super) fn new(my_disc: u32, multiplier: u8) -> Session {
        Session {
            state: SessionState::Down,
            diag: Diag::None,
            my_disc,
            your_disc: 0,
            multiplier,
            next_tx: Time::ZERO,
            grid: Grid::start(Time::ZERO, Duration::ZERO, 0),
            anchors: 0,
            parked: false,
            unsent: 0,
            detect: Duration::ZERO,
            detect_at: None,
            detect_queued: None,
            was_up: false,
            told_up: false,
            damping: Damping::default(),
            release_at: None,
            last_heard: None,
        }
    }

    /// RFC 5880 6.8.6's checks that concern apm: the peer must name us correctly once it
    /// knows us, and its discriminator is never 0.
    pub(super) fn accepts(&self, probe: &Probe) -> bool {
        if probe.my_disc == 0 || probe.detect_mult == 0 {
            return false;
        }
        if probe.your_disc != 0 && probe.your_disc != self.my_disc {
            return false;
        }
        // Init and Up are claims about us: they must name us.
        !(matches!(probe.state, SessionState::Init | SessionState::Up) && probe.your_disc == 0)
    }

    /// Take in an accepted probe (RFC 5880 6.8.6's state table).
    pub(super) fn heard(&mut self, now: Time, probe: &Probe, detect: Duration) {
        self.last_heard = Some(now);
        self.detect = detect;
        self.your_disc = probe.my_disc;
        self.state = match (self.state, probe.state) {
            (_, SessionState::AdminDown) => {
                if self.state != SessionState::Down {
                    self.diag = Diag::NeighborSignaledDown;
                }
                SessionState::Down
            }
            (SessionState::Down, SessionState::Down) => SessionState::Init,
            (SessionState::Down, SessionState::Init) => SessionState::Up,
            (SessionState::Init, SessionState::Init | SessionState::Up) => SessionState::Up,
            (SessionState::Up, SessionState::Down) => {
                self.diag = Diag::NeighborSignaledDown;
                SessionState::Down
            }
            (s, _) => s,
        };
        if self.state == SessionState::Up {
            self.was_up = true;
        }
        self.detect_at = match self.state {
            SessionState::Init | SessionState::Up => Some(now.plus(detect)),
            _ => None,
        };
    }

    /// Leave whatever state for Down.
    pub(super) fn go_down(&mut self, diag: Diag) {
        if self.state != SessionState::Down {
            self.diag = diag;
        }
        self.state = SessionState::Down;
        self.detect_at = None;
        // A new handshake must name us afresh (RFC 5880 6.8.1: bfd.RemoteDiscr reset
        // when the detection time passes).
        self.your_disc = 0;
    }

    /// The probe to send now.
    pub(super) fn packet(
        &self,
        ends: PathEnds,
        interval: Duration,
        ports_down: PortsDown,
    ) -> Probe {
        let us = u32::try_from(interval.as_micros()).unwrap_or(u32::MAX);
        Probe {
            state: self.state,
            diag: self.diag,
            detect_mult: self.multiplier,
            my_disc: self.my_disc,
            your_disc: self.your_disc,
            tx_interval_us: us,
            rx_interval_us: us,
            ends,
            ports_down,
        }
    }
}
