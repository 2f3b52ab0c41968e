//! Liveness probes: one session per path between two hosts (a local port GID and a peer
//! port GID), in the spirit of BFD's asynchronous mode (RFC 5880), so that a failure no
//! local event reports (a cable cut between two switches, a far-end port down on RoCE
//! where no SA tells anyone, a switch that black-holes traffic) is found in
//! `multiplier x interval` instead of a QP's retry budget or a stall timer.
//!
//! Sans-IO like the engine: [`Prober`] never reads a clock and never sends; the caller
//! hands it the time and the probes that arrived, carries the [`ProbeOutput::Send`]s over
//! apm's peer channel, and turns [`ProbeOutput::Down`]/[`ProbeOutput::Up`] into engine
//! input. Jitter comes from a seeded generator: same seed, same sends.
//!
//! Cost is per path, never per QP: a host with `P` peers reached over `R` rails runs
//! `P x R` sessions however many connections share them. With the default 15 ms interval
//! a session sends 76 probes a second (gaps average 7/8 of the interval), so 1,000 peers
//! on two rails would be 152,000 probes a second; [`ProbePolicy::max_probes_per_sec`]
//! (default 5,000) stretches the interval instead (`budget.rs`: to 457 ms there,
//! detection in 0.9 to 1.4 s), and [`Prober::budget`] says what the sessions watched
//! cost and buy.
//!
//! Deadlines (each session's next send, its detection expiry, the end of a damped
//! return's hold) sit in one timer queue ordered by time, deleted lazily, so
//! [`Prober::poll_timers`] and [`Prober::next_deadline`] cost what is due, not what is
//! watched (`cargo bench -p apm-core --bench prober`: a 10 us step at 10,000 sessions).
//!
//! A path that keeps going down and coming back is damped (`damping.rs`, after RFC 2439):
//! its return is held, for longer the more it flaps, so connections stop moving back and
//! forth onto it.
//!
//! What the module must never do: create state for a path nobody asked it to watch (a
//! stranger's probe is counted and dropped), or report a path down that it never saw up
//! (a session that has not come up yet says nothing: the engine keeps its own view).

mod budget;
mod damping;
mod driver;
mod park;
mod schedule;
mod session;
mod verdict;

pub use budget::Budget;
pub use driver::{ProbeAction, ProbeDriver};
pub use session::{Diag, SessionState};
pub use verdict::PathVerdict;

use crate::engine::timers::Timers;
use crate::policy::PolicyError;
use crate::types::{Gid, Time};
use damping::DampingRule;
use schedule::Grid;
use serde::{Deserialize, Serialize};
use session::Session;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// The two ends of a probed path, seen from this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PathEnds {
    /// This host's port GID (on RoCE, the rail's GID).
    pub local: Gid,
    /// The peer's port GID on the same rail.
    pub remote: Gid,
}

impl PathEnds {
    /// The same path seen from the other end.
    pub fn reversed(self) -> PathEnds {
        PathEnds {
            local: self.remote,
            remote: self.local,
        }
    }
}

/// The most of the sender's dead ports one probe names (more are left out).
pub const MAX_PORTS_DOWN: usize = 8;

/// The sender's ports that are down, as a probe carries them (at most
/// [`MAX_PORTS_DOWN`]; a fixed array so that peer messages stay `Copy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortsDown {
    len: u8,
    gids: [Gid; MAX_PORTS_DOWN],
}

impl PortsDown {
    /// The first [`MAX_PORTS_DOWN`] of `gids`.
    pub fn of(gids: impl IntoIterator<Item = Gid>) -> PortsDown {
        let mut p = PortsDown::default();
        for g in gids.into_iter().take(MAX_PORTS_DOWN) {
            p.gids[usize::from(p.len)] = g;
            p.len += 1;
        }
        p
    }

    /// The GIDs.
    pub fn as_slice(&self) -> &[Gid] {
        &self.gids[..usize::from(self.len).min(MAX_PORTS_DOWN)]
    }

    /// Whether `gid` is among them.
    pub fn contains(&self, gid: &Gid) -> bool {
        self.as_slice().contains(gid)
    }
}

/// One probe packet (carried by the peer channel as apm's vendor attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The sender's session state.
    pub state: SessionState,
    /// Why the sender's session last left Up.
    pub diag: Diag,
    /// The sender's detection multiplier.
    pub detect_mult: u8,
    /// The sender's discriminator for this session (never 0).
    pub my_disc: u32,
    /// The receiver's discriminator as last heard, 0 when none.
    pub your_disc: u32,
    /// The interval the sender transmits at, in microseconds.
    pub tx_interval_us: u32,
    /// The shortest interval the sender wants to receive at, in microseconds.
    pub rx_interval_us: u32,
    /// The path, from the sender's side (`local` is the sender's GID).
    pub ends: PathEnds,
    /// The sender's ports that are down: lets the receiver tell a peer port failure
    /// from the fabric's.
    pub ports_down: PortsDown,
}

/// Probe timing, part of the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ProbePolicy {
    /// Probe on every watched path. Default false for now: in the VM suite, under
    /// load, a userspace prober at 20 ms missed its own deadlines (qemu stalls longer than
    /// the 60 ms detection time then), its sessions flapped and connections moved for nothing;
    /// probes need flap damping and a measured default before they are on by default.
    pub enabled: bool,
    /// Interval between probes on an Up session. Default 15 ms: with the multiplier, a
    /// silent failure is found 45 ms after the last probe heard (30 to 45 ms after the
    /// failure, the sender's jitter shortening intervals by up to a quarter), so that a
    /// connection runs again within the 50 ms a stalled collective or storage request
    /// tolerates (the simulator's `nccl-silent` scenario: restore p99 42 ms, against 57 ms
    /// at 20 ms), and far below a QP's retry budget (537 ms at ACK timeout 14, 34 s at
    /// NCCL's 20); a lost probe or two (a scheduling hiccup of the sender) still does not
    /// end a session. It costs 67 probes a second per path; at 1,000 peers on two rails
    /// that would be 152,000 a second, above [`ProbePolicy::max_probes_per_sec`], which
    /// stretches the interval to 457 ms there.
    pub interval_ms: u32,
    /// Probes missed in a row before a session is declared down. Default 3 (BFD's usual
    /// value: one lost packet never ends a session).
    pub multiplier: u8,
    /// Interval while a session is not Up (no point probing a dead path fast; RFC 5880
    /// says one a second, apm uses 250 ms so that a repaired path is found quickly).
    pub down_interval_ms: u32,
    /// Cap on the probes this host sends a second over every session together; beyond
    /// it the interval (Up and down alike) is stretched evenly, and the detection time
    /// with it (`apm agent --explain` prints both for the agent's sessions). Default
    /// 5,000: 65 paths at the default 15 ms, the rails to the peers of a host in a job of
    /// a few dozen; about 320 kB/s of 64-byte datagrams on RoCE; on InfiniBand, where
    /// each probe is a MAD on QP1 that the receiving host's MAD agent handles one at a
    /// time beside the SM's Reports and the SA's answers, a load the agent keeps up
    /// with (a tenth of it busy at the simulator's 20 us a MAD).
    pub max_probes_per_sec: u32,
    /// Probe InfiniBand paths too. Default false: there probes would ride vendor MADs on
    /// QP1, whose rate is small (an HCA's MAD path, and every MAD shares it with the SM's
    /// traffic: on the OpenSM bed 200 probes a second delayed the SA's Reports past their
    /// tests' deadlines), while the SM's traps 64/65 already report ports. RoCE paths
    /// (UDP) are always probed when `enabled`.
    pub infiniband: bool,
    /// Flap damping (RFC 2439's shape): each time a path's session leaves Up it earns a
    /// penalty of one flap, halved every `damping_half_life_ms`. Default 5000: flaps
    /// seconds apart are one incident (a cable being reseated, a port retraining),
    /// minutes apart are unrelated. 0 turns damping off.
    pub damping_half_life_ms: u32,
    /// The flap, counted with decay, at which a path's return is held until the
    /// penalty halves. Default 3: a failure and its repair, even twice, is reported at
    /// once; a third flap within a few seconds holds the path for about six seconds,
    /// longer as it keeps flapping.
    pub damping_suppress: u8,
    /// The longest a return is held. Default 30000: a path that stopped flapping is
    /// used again within half a minute, however long its history.
    pub damping_max_hold_ms: u32,
}

impl Default for ProbePolicy {
    fn default() -> ProbePolicy {
        ProbePolicy {
            enabled: false,
            interval_ms: 15,
            multiplier: 3,
            down_interval_ms: 250,
            max_probes_per_sec: 5_000,
            infiniband: false,
            damping_half_life_ms: 5_000,
            damping_suppress: 3,
            damping_max_hold_ms: 30_000,
        }
    }
}

impl ProbePolicy {
    /// Check the settings against their ranges: the first setting out of its range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every setting out of its range, in [`ProbePolicy::validate`]'s order.
    pub fn problems(&self) -> Vec<PolicyError> {
        let mut out = Vec::new();
        let mut bad = |field, value: u32, why| {
            out.push(PolicyError::OutOfRange {
                field,
                value: u64::from(value),
                why,
            })
        };
        if !(1..=10_000).contains(&self.interval_ms) {
            bad("probe.interval_ms", self.interval_ms, "must be 1..=10000");
        }
        if !(1..=50).contains(&self.multiplier) {
            bad(
                "probe.multiplier",
                u32::from(self.multiplier),
                "must be 1..=50",
            );
        }
        if self.down_interval_ms < self.interval_ms || self.down_interval_ms > 60_000 {
            bad(
                "probe.down_interval_ms",
                self.down_interval_ms,
                "must be at least interval_ms and at most 60000",
            );
        }
        if self.max_probes_per_sec == 0 {
            bad("probe.max_probes_per_sec", 0, "must be at least 1");
        }
        if self.damping_half_life_ms > 3_600_000 {
            bad(
                "probe.damping_half_life_ms",
                self.damping_half_life_ms,
                "must be at most 3600000 (0 turns damping off)",
            );
        }
        if !(1..=100).contains(&self.damping_suppress) {
            bad(
                "probe.damping_suppress",
                u32::from(self.damping_suppress),
                "must be 1..=100",
            );
        }
        if !(1..=3_600_000).contains(&self.damping_max_hold_ms) {
            bad(
                "probe.damping_max_hold_ms",
                self.damping_max_hold_ms,
                "must be 1..=3600000",
            );
        }
        out
    }

    fn damping(&self) -> DampingRule {
        DampingRule {
            half_life: Duration::from_millis(u64::from(self.damping_half_life_ms)),
            suppress: f64::from(self.damping_suppress),
            max_hold: Duration::from_millis(u64::from(self.damping_max_hold_ms)),
        }
    }
}

/// What a queued deadline of a session is for (in this order when due together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// The detection time passes unless a probe arrived meanwhile.
    Detect,
    /// The next probe goes out.
    Send,
}

/// What kind of failure took a path down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// This host's port on the path is down.
    LocalPort,
    /// The peer's port on the path is down (the peer said so over another path).
    PeerPort,
    /// Both ports are up but probes stopped: a cable, switch or route between.
    Fabric,
}

impl FailureKind {
    /// The name used in notifications and JSON: `local_port`, `peer_port`, `fabric`.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::LocalPort => "local_port",
            FailureKind::PeerPort => "peer_port",
            FailureKind::Fabric => "fabric",
        }
    }
}

/// What the prober asks of its caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutput {
    /// Send `probe` over the path `ends` (from `ends.local` to `ends.remote`).
    Send {
        /// The path.
        ends: PathEnds,
        /// The packet.
        probe: Probe,
    },
    /// A session that was Up went down.
    Down {
        /// The path.
        ends: PathEnds,
        /// What kind of failure it was.
        kind: FailureKind,
    },
    /// A session came up after having been down (or for the first time).
    Up {
        /// The path.
        ends: PathEnds,
        /// False the first time the session comes up: nothing changed for the engine.
        after_down: bool,
        /// The path has been flapping: it should not be used before then unless
        /// nothing better is left (the damping's hold), `None` when usable at once.
        held_until: Option<Time>,
    },
}

/// Counters for `apm watch` and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeCounters {
    /// Probes handed out to send.
    pub sent: u64,
    /// Probes accepted.
    pub received: u64,
    /// Probes for a path not watched, or with a discriminator that does not match.
    pub dropped: u64,
    /// Detection expiries put off because this host's prober had been held (see
    /// [`Prober::poll_timers`]).
    pub deferred_after_hold: u64,
}

/// Every probe session of one host.
#[derive(Debug)]
pub struct Prober {
    policy: ProbePolicy,
    damping: DampingRule,
    sessions: BTreeMap<PathEnds, Session>,
    /// Every session's deadlines (sends and detection expiries), lazily deleted: an entry is acted on only when it is
    /// still its session's deadline of that kind.
    timers: Timers<(PathEnds, Due)>,
    /// This host's ports that are down.
    local_down: BTreeSet<Gid>,
    /// Peer ports a peer said are down, with when it last said so.
    peer_down: BTreeMap<Gid, Time>,
    /// Drives every grid's jitter (`schedule.rs`).
    seed: u64,
    next_disc: u32,
    /// Sessions that left the parked state on their own since the caller last asked
    /// (`park.rs`).
    unparked: Vec<PathEnds>,
    out: VecDeque<ProbeOutput>,
    counters: ProbeCounters,
    /// When the caller last ran the timers: a long gap since means this host was held.
    last_poll: Option<Time>,
}

impl Prober {
    /// A prober with no sessions; `seed` drives the jitter.
    pub fn new(policy: ProbePolicy, seed: u64) -> Prober {
        Prober {
            damping: policy.damping(),
            policy,
            sessions: BTreeMap::new(),
            timers: Timers::default(),
            local_down: BTreeSet::new(),
            peer_down: BTreeMap::new(),
            seed,
            next_disc: 1,
            unparked: Vec::new(),
            out: VecDeque::new(),
            counters: ProbeCounters::default(),
            last_poll: None,
        }
    }

    /// The interval Up sessions transmit at now: the policy's, stretched when the
    /// sessions together would send more than `max_probes_per_sec` (`budget.rs`).
    pub fn interval(&self) -> Duration {
        self.policy
            .stretched(self.policy.interval_ms, self.sessions.len())
    }

    /// The interval sessions that are not Up transmit at now, stretched the same way.
    fn down_interval(&self) -> Duration {
        self.policy
            .stretched(self.policy.down_interval_ms, self.sessions.len())
    }

    /// What the sessions watched now cost and buy (`apm agent --explain`).
    pub fn budget(&self) -> Budget {
        self.policy.budget(self.sessions.len())
    }

    /// Probe `ends` from now on. Watching a watched path again does nothing; the session
    /// starts Down and sends at once.
    pub fn watch(&mut self, now: Time, ends: PathEnds) {
        if self.sessions.contains_key(&ends) || !self.policy.enabled {
            return;
        }
        let disc = self.next_disc;
        self.next_disc = self.next_disc.checked_add(1).unwrap_or(1);
        self.sessions
            .insert(ends, Session::new(disc, self.policy.multiplier));
        self.send_now(ends, now);
    }

    /// Probe exactly `paths` from now on: a new one starts as [`Prober::watch`] starts
    /// it, one left out stops with no output (nobody needs that path any more).
    pub fn follow(&mut self, now: Time, paths: &BTreeSet<PathEnds>) {
        let unparked = &mut self.unparked;
        self.sessions.retain(|ends, s| {
            let keep = paths.contains(ends);
            if !keep && s.parked {
                unparked.push(*ends);
            }
            keep
        });
        for ends in paths {
            self.watch(now, *ends);
        }
        // Entries of sessions that left are dropped as they come due; when they are
        // most of the queue (a host that stopped following most paths), now.
        if self.timers.len() > 4 * self.sessions.len() + 64 {
            let sessions = &self.sessions;
            self.timers
                .retain(|_, (ends, _)| sessions.contains_key(&ends));
        }
    }

    /// The paths watched, with their state.
    pub fn sessions(&self) -> impl Iterator<Item = (PathEnds, SessionState)> + '_ {
        self.sessions.iter().map(|(e, s)| (*e, s.state))
    }

    /// The state of one path's session.
    pub fn state(&self, ends: PathEnds) -> Option<SessionState> {
        self.sessions.get(&ends).map(|s| s.state)
    }

    /// True when the path's session is Up but its return is held for flapping at
    /// `now`.
    pub fn damped(&self, ends: PathEnds, now: Time) -> bool {
        self.sessions
            .get(&ends)
            .is_some_and(|s| s.state == SessionState::Up && s.release_at.is_some_and(|t| now < t))
    }

    /// The counters so far.
    pub fn counters(&self) -> ProbeCounters {
        self.counters
    }

    /// One of this host's ports went down or came up. Down ends its sessions at once
    /// (kind [`FailureKind::LocalPort`]); every other session sends at once, so that
    /// peers learn which port died without waiting for their detection time.
    pub fn local_port(&mut self, now: Time, gid: Gid, up: bool) {
        let changed = if up {
            self.local_down.remove(&gid)
        } else {
            self.local_down.insert(gid)
        };
        if !changed {
            return;
        }
        let keys: Vec<PathEnds> = self.sessions.keys().copied().collect();
        for ends in keys {
            if ends.local == gid && !up {
                self.session_down(now, ends, Diag::LocalPortDown, FailureKind::LocalPort);
            } else {
                self.send_now(ends, now);
            }
        }
    }

    /// A probe arrived (already authenticated by the channel).
    pub fn receive(&mut self, now: Time, probe: &Probe) {
        let ends = probe.ends.reversed();
        let detect = self.detect_time(probe);
        let Some(s) = self.sessions.get_mut(&ends) else {
            self.counters.dropped += 1;
            return;
        };
        if self.local_down.contains(&ends.local) || !s.accepts(probe) {
            self.counters.dropped += 1;
            return;
        }
        self.counters.received += 1;
        let was = s.state;
        let after_down = s.was_up;
        s.heard(now, probe, detect);
        let now_state = s.state;
        if let Some(d) = s.detect_at {
            // One queued expiry per session: a later one is re-queued when it comes due.
            if s.detect_queued.is_none_or(|q| d < q) {
                s.detect_queued = Some(d);
                self.timers.schedule(d, (ends, Due::Detect));
            }
        }
        if now_state != was {
            if std::mem::take(&mut s.parked) {
                self.unparked.push(ends);
            }
            // A change is told to the peer at once (BFD's poll sequence, simplified).
            self.send_now(ends, now);
        }
        self.note_peer_ports(now, probe);
        match (was, now_state) {
            (SessionState::Up, SessionState::Down) => {
                let kind = self.kind_of(ends, now);
                self.left_up(now, ends, kind);
            }
            (w, SessionState::Up) if w != SessionState::Up => {
                self.came_up(now, ends, after_down);
            }
            _ => {}
        }
    }

    /// Run the timers due at `now`: detection expiries and sends.
    ///
    /// A detection expiry is evidence only if this host was listening through it. While
    /// a session is Up or Init its next send is at most one interval away, so a caller
    /// that keeps its deadlines runs the timers at least that often; a gap of more than
    /// one and a half intervals since the last run means this host was held (its
    /// process not scheduled: seen for tens of milliseconds in a loaded emulated guest),
    /// and the peer's probes of that time may still be queued unread on its socket. An
    /// expiry found then is put off by one interval, in which those probes arrive;
    /// a path that really died goes down one interval later.
    pub fn poll_timers(&mut self, now: Time) {
        // The Up interval: the grace of an expiry found after a hold, and the next sends'.
        let up_interval = self.interval();
        let held = self.was_held(now, up_interval);
        let mut sends = Vec::new();
        while let Some((at, (ends, due))) = self.timers.pop_due(now) {
            let Some(s) = self.sessions.get_mut(&ends) else {
                continue;
            };
            match due {
                Due::Detect if s.detect_queued == Some(at) => {
                    s.detect_queued = None;
                    if s.parked {
                        // Nothing is expected of a parked session; `resume` queues its
                        // expiry again.
                        continue;
                    }
                    match s.detect_at {
                        Some(d) if d <= now && held => {
                            let later = now.plus(up_interval);
                            s.detect_at = Some(later);
                            s.detect_queued = Some(later);
                            self.timers.schedule(later, (ends, Due::Detect));
                            self.counters.deferred_after_hold += 1;
                        }
                        Some(d) if d <= now => {
                            let silent = s.last_heard.map(|t| now.since(t));
                            let kind = self.kind_of(ends, now);
                            tracing::info!(local = %ends.local, remote = %ends.remote,
                                silent_ms = silent.map(|d| d.as_millis()), late_ms = now.since(d).as_millis(),
                                "probe session down: nothing heard for the detection time");
                            self.session_down(now, ends, Diag::DetectionExpired, kind);
                        }
                        Some(d) => {
                            // Probes arrived since: the expiry moved on.
                            s.detect_queued = Some(d);
                            self.timers.schedule(d, (ends, Due::Detect));
                        }
                        None => {}
                    }
                }
                // A parked session sends only at once (slot 0: a change to tell),
                // never a periodic probe.
                Due::Send if s.parked && s.grid.next > 0 => {}
                Due::Send if s.next_tx == at && !self.local_down.contains(&ends.local) => {
                    sends.push(ends);
                }
                _ => {}
            }
        }
        // Sends after every expiry of this instant, so that a probe says Down at once.
        let down_interval = self.down_interval();
        let ports_down = PortsDown::of(self.local_down.iter().copied());
        for ends in sends {
            let seed = self.seed;
            let Some(s) = self.sessions.get_mut(&ends) else {
                continue;
            };
            let interval = if s.state == SessionState::Up {
                up_interval
            } else {
                down_interval
            };
            let probe = s.packet(ends, up_interval, ports_down);
            // RFC 5880 6.8.7: each interval shortened by 0-25% so senders never lock
            // step, on a grid whose slots are known in closed form (`schedule.rs`). A
            // change of interval starts a new grid at this send.
            if s.grid.interval() != interval {
                s.grid = Grid::start(
                    now,
                    interval,
                    schedule::salt(seed, u64::from(s.my_disc), s.anchors),
                );
                s.anchors += 1;
            }
            s.grid.next += 1;
            s.next_tx = s.grid.next_at();
            self.timers.schedule(s.next_tx, (ends, Due::Send));
            self.counters.sent += 1;
            self.out.push_back(ProbeOutput::Send { ends, probe });
        }
    }

    /// Whether the timers were last run so long before `now` that this host must have
    /// been held meanwhile; notes `now` as the last run. Only detection expiries ask,
    /// and one is pending only while its session is Up or Init, which sends every
    /// interval: with every session Down the gaps are long and nobody asks. Constant
    /// time: the sessions are not looked at.
    fn was_held(&mut self, now: Time, up_interval: Duration) -> bool {
        let last = self.last_poll.replace(now);
        let limit = up_interval.mul_f64(HELD_AFTER);
        last.is_some_and(|t| now.since(t) > limit)
    }

    /// The earliest time [`Prober::poll_timers`] may have work (a deadline since
    /// superseded only costs a wake-up that does nothing).
    pub fn next_deadline(&self) -> Option<Time> {
        self.timers.next()
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<ProbeOutput> {
        self.out.pop_front()
    }

    /// How long the peer's session may stay silent: its multiplier times the slower of
    /// its transmit interval and the interval we want to receive at (RFC 5880 6.8.4).
    fn detect_time(&self, probe: &Probe) -> Duration {
        let ours = self.interval();
        let theirs = Duration::from_micros(u64::from(probe.tx_interval_us));
        ours.max(theirs) * u32::from(probe.detect_mult.max(1))
    }

    /// The session's next probe goes out now, at slot 0 of a new grid (`schedule.rs`)
    /// drawn for the interval of its state.
    fn send_now(&mut self, ends: PathEnds, now: Time) {
        let interval = self.interval();
        let down_interval = self.down_interval();
        if let Some(s) = self.sessions.get_mut(&ends) {
            let interval = if s.state == SessionState::Up {
                interval
            } else {
                down_interval
            };
            if s.parked {
                s.unsent += s.grid.sent_by(now).0;
            }
            s.grid = Grid::start(
                now,
                interval,
                schedule::salt(self.seed, u64::from(s.my_disc), s.anchors),
            );
            s.anchors += 1;
            s.next_tx = now;
            self.timers.schedule(now, (ends, Due::Send));
        }
    }

    fn session_down(&mut self, now: Time, ends: PathEnds, diag: Diag, kind: FailureKind) {
        let Some(s) = self.sessions.get_mut(&ends) else {
            return;
        };
        let was_up = s.state == SessionState::Up;
        if std::mem::take(&mut s.parked) {
            self.unparked.push(ends);
        }
        s.go_down(diag);
        if was_up {
            self.left_up(now, ends, kind);
        }
    }

    /// The session left Up: one flap more, and the caller hears of it if it was told
    /// the path was up.
    fn left_up(&mut self, now: Time, ends: PathEnds, kind: FailureKind) {
        let Some(s) = self.sessions.get_mut(&ends) else {
            return;
        };
        s.damping.flap(&self.damping, now);
        s.release_at = None;
        if std::mem::take(&mut s.told_up) {
            self.out.push_back(ProbeOutput::Down { ends, kind });
        }
    }

    /// The session is Up: tell the caller, with the hold its flap penalty asks for.
    fn came_up(&mut self, now: Time, ends: PathEnds, after_down: bool) {
        let Some(s) = self.sessions.get_mut(&ends) else {
            return;
        };
        let held_until = s.damping.release_at(&self.damping, now);
        s.release_at = held_until;
        s.told_up = true;
        self.out.push_back(ProbeOutput::Up {
            ends,
            after_down,
            held_until,
        });
    }

    /// Remember the peer ports `probe`'s sender says are down; a session to one of them
    /// that is still Up ends now (the peer cannot send on it, and waiting for the
    /// detection time would only lose traffic).
    fn note_peer_ports(&mut self, now: Time, probe: &Probe) {
        for gid in probe.ports_down.as_slice() {
            // Sessions to that port ended when it was first said to be down (none can
            // come up meanwhile): walk them only then.
            if self.peer_down.insert(*gid, now).is_some() {
                continue;
            }
            let keys: Vec<PathEnds> = self
                .sessions
                .iter()
                .filter(|(e, s)| e.remote == *gid && s.state == SessionState::Up)
                .map(|(e, _)| *e)
                .collect();
            for ends in keys {
                self.session_down(now, ends, Diag::NeighborSignaledDown, FailureKind::PeerPort);
            }
        }
        // The sender's own port is evidently up; old words about others fade.
        self.peer_down.remove(&probe.ends.local);
        self.peer_down
            .retain(|_, said| now.since(*said) < STALE_PEER_PORT);
    }

    fn kind_of(&self, ends: PathEnds, now: Time) -> FailureKind {
        if self.local_down.contains(&ends.local) {
            FailureKind::LocalPort
        } else if self
            .peer_down
            .get(&ends.remote)
            .is_some_and(|t| now.since(*t) < STALE_PEER_PORT)
        {
            FailureKind::PeerPort
        } else {
            FailureKind::Fabric
        }
    }
}

/// Timers not run for this many Up intervals: the host was held (see
/// [`Prober::poll_timers`]). More than one interval, so that a wake-up a little late is
/// not taken for a hold.
const HELD_AFTER: f64 = 1.5;

/// How long a peer's word that one of its ports is down counts.
const STALE_PEER_PORT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests;
