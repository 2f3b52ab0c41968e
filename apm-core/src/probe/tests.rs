//! Two probers wired back to back over two rails, driven in 1 ms steps.

use super::*;

fn gid(host: u8, rail: u8) -> Gid {
    let mut b = [0u8; 16];
    b[0] = 0xfe;
    b[1] = 0x80;
    b[14] = host;
    b[15] = rail;
    Gid(b)
}

/// The probes on, every 20 ms: the mechanics below are written to that interval (a
/// 60 ms detection time); the default's own figure is checked apart
/// (`the_default_finds_a_silent_cut_within_45_ms_of_it`).
fn on() -> ProbePolicy {
    ProbePolicy {
        enabled: true,
        interval_ms: 20,
        ..ProbePolicy::default()
    }
}

fn ends(from: u8, rail: u8) -> PathEnds {
    let to = if from == 1 { 2 } else { 1 };
    PathEnds {
        local: gid(from, rail),
        remote: gid(to, rail),
    }
}

/// Hosts 1 and 2, each watching its two rails to the other.
struct Bed {
    now: Time,
    hosts: [Prober; 2],
    /// Rails whose probes are lost (a silent cut).
    cut: Vec<u8>,
    /// Probes in flight: (arrival, to host index, probe).
    wire: Vec<(Time, usize, Probe)>,
    /// Every Up/Down seen, with the host index and the time.
    seen: Vec<(Time, usize, ProbeOutput)>,
    /// A host held (its process not scheduled) until then: it neither reads nor runs
    /// its timers; when it runs again its timers come first, then what queued up.
    held: Option<(usize, Time)>,
}

impl Bed {
    fn new(seed: u64) -> Bed {
        Bed::with(on(), seed)
    }

    fn with(policy: ProbePolicy, seed: u64) -> Bed {
        let mut hosts = [
            Prober::new(policy.clone(), seed),
            Prober::new(policy, seed + 1),
        ];
        for (i, h) in hosts.iter_mut().enumerate() {
            for rail in 1..=2 {
                h.watch(Time::ZERO, ends(i as u8 + 1, rail));
            }
        }
        Bed {
            now: Time::ZERO,
            hosts,
            cut: Vec::new(),
            wire: Vec::new(),
            seen: Vec::new(),
            held: None,
        }
    }

    fn run_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now = self.now.plus(Duration::from_millis(1));
            let now = self.now;
            let held = self.held.filter(|(_, until)| now < *until).map(|(h, _)| h);
            let resumes = self.held.filter(|(_, until)| now == *until).map(|(h, _)| h);
            if let Some(h) = resumes {
                // Woken: the timers run before the queued probes are read.
                self.hosts[h].poll_timers(now);
            }
            let (due, later): (Vec<_>, Vec<_>) = self
                .wire
                .drain(..)
                .partition(|w| w.0 <= now && Some(w.1) != held);
            self.wire = later;
            for (_, to, probe) in due {
                self.hosts[to].receive(now, &probe);
            }
            for i in 0..2 {
                if Some(i) == held {
                    continue;
                }
                self.hosts[i].poll_timers(now);
                while let Some(o) = self.hosts[i].poll_output() {
                    match o {
                        ProbeOutput::Send { ends, probe } => {
                            let rail = ends.local.0[15];
                            if !self.cut.contains(&rail) {
                                self.wire.push((
                                    now.plus(Duration::from_micros(100)),
                                    1 - i,
                                    probe,
                                ));
                            }
                        }
                        other => self.seen.push((now, i, other)),
                    }
                }
            }
        }
    }

    /// After 100 ms of probing, rail 1 is cut silently for 200 ms: each Down seen then,
    /// with its time since the cut.
    fn cut_rail_1(&mut self) -> Vec<(Duration, PathEnds, FailureKind)> {
        self.run_ms(100);
        let t0 = self.now;
        self.cut.push(1);
        self.run_ms(200);
        self.seen
            .iter()
            .filter_map(|(t, _, o)| match o {
                ProbeOutput::Down { ends, kind } => Some((t.since(t0), *ends, *kind)),
                _ => None,
            })
            .collect()
    }

    fn downs(&self) -> Vec<(usize, PathEnds, FailureKind)> {
        self.seen
            .iter()
            .filter_map(|(_, h, o)| match o {
                ProbeOutput::Down { ends, kind } => Some((*h, *ends, *kind)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn sessions_come_up_within_a_few_milliseconds_and_say_so_once() {
    let mut bed = Bed::new(1);
    bed.run_ms(10);
    for h in &bed.hosts {
        assert!(
            h.sessions().all(|(_, s)| s == SessionState::Up),
            "{:?}",
            h.sessions().collect::<Vec<_>>()
        );
    }
    let ups: Vec<_> = bed
        .seen
        .iter()
        .filter(|(_, _, o)| {
            matches!(
                o,
                ProbeOutput::Up {
                    after_down: false,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(ups.len(), 4, "{:?}", bed.seen);
    bed.run_ms(1000);
    assert_eq!(
        bed.seen.len(),
        4,
        "nothing more happens on a quiet fabric: {:?}",
        bed.seen
    );
}

#[test]
fn a_silent_cut_is_a_fabric_failure_on_both_sides_within_the_detection_time() {
    let mut bed = Bed::new(2);
    let downs = bed.cut_rail_1();
    assert_eq!(downs.len(), 2, "{downs:?}");
    for (after, ends, kind) in downs {
        assert_eq!(ends.local.0[15], 1);
        assert_eq!(kind, FailureKind::Fabric);
        // Detection: 3 x 20 ms after the last probe heard, which left up to 20 ms before
        // the cut.
        assert!(after <= Duration::from_millis(62), "{after:?}");
        assert!(after >= Duration::from_millis(40), "{after:?}");
    }
    assert_eq!(bed.hosts[0].state(ends(1, 2)), Some(SessionState::Up));
}

#[test]
fn the_default_finds_a_silent_cut_within_45_ms_of_it() {
    // 3 x 15 ms after the last probe heard, which left at most one (jittered) interval
    // before the cut: never more than 45 ms after it, over many seeds.
    let policy = ProbePolicy {
        enabled: true,
        ..ProbePolicy::default()
    };
    for seed in 1..=50 {
        let downs = Bed::with(policy.clone(), seed).cut_rail_1();
        assert_eq!(downs.len(), 2, "seed {seed}: {downs:?}");
        for (after, _, _) in downs {
            assert!(
                after <= Duration::from_millis(47) && after >= Duration::from_millis(28),
                "seed {seed}: down {after:?} after the cut"
            );
        }
    }
}

#[test]
fn a_repaired_path_comes_up_again_and_says_it_was_down() {
    let mut bed = Bed::new(3);
    bed.run_ms(100);
    bed.cut.push(2);
    bed.run_ms(200);
    bed.cut.clear();
    bed.run_ms(300);
    let again: Vec<_> = bed
        .seen
        .iter()
        .filter(|(_, _, o)| {
            matches!(
                o,
                ProbeOutput::Up {
                    after_down: true,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(again.len(), 2, "{:?}", bed.seen);
    for h in &bed.hosts {
        assert!(h.sessions().all(|(_, s)| s == SessionState::Up));
    }
}

#[test]
fn a_port_down_is_local_at_once_and_the_peers_port_on_the_other_side_before_detection() {
    let mut bed = Bed::new(4);
    bed.run_ms(100);
    let t0 = bed.now;
    // Host 1's rail-1 port dies: its probes on that rail stop (the cut) and it knows.
    bed.cut.push(1);
    bed.hosts[0].local_port(t0, gid(1, 1), false);
    bed.run_ms(200);
    let downs = bed.downs();
    assert!(
        downs.contains(&(0, ends(1, 1), FailureKind::LocalPort)),
        "{downs:?}"
    );
    assert!(
        downs.contains(&(1, ends(2, 1), FailureKind::PeerPort)),
        "{downs:?}"
    );
    assert_eq!(downs.len(), 2, "{downs:?}");
    let peer_at = bed
        .seen
        .iter()
        .find(|(_, h, o)| *h == 1 && matches!(o, ProbeOutput::Down { .. }))
        .map(|(t, _, _)| *t)
        .expect("the peer saw it");
    assert!(
        peer_at.since(t0) <= Duration::from_millis(5),
        "told over rail 2 at once"
    );
}

#[test]
fn strangers_and_wrong_discriminators_change_nothing() {
    let mut bed = Bed::new(5);
    bed.run_ms(50);
    let before: Vec<_> = bed.hosts[0].sessions().collect();
    let mut p = bed.hosts[1]
        .sessions
        .get(&ends(2, 1))
        .expect("watched")
        .packet(ends(2, 1), Duration::from_millis(20), PortsDown::default());
    // Wrong discriminator: claims Down, would end the session.
    p.state = SessionState::Down;
    p.your_disc = 0xdead;
    bed.hosts[0].receive(bed.now, &p);
    // A path host 1 does not watch.
    let mut q = p;
    q.ends.local = gid(9, 1);
    q.your_disc = 0;
    bed.hosts[0].receive(bed.now, &q);
    assert_eq!(bed.hosts[0].counters().dropped, 2);
    assert_eq!(before, bed.hosts[0].sessions().collect::<Vec<_>>());
    assert_eq!(
        bed.hosts[0].sessions.len(),
        2,
        "no session created for a stranger"
    );
}

#[test]
fn many_sessions_stretch_the_interval_to_the_rate_cap() {
    let mut p = Prober::new(on(), 0);
    for host in 0..1000u16 {
        for rail in 1..=2 {
            let mut r = gid(0, rail);
            r.0[12..14].copy_from_slice(&host.to_be_bytes());
            p.watch(
                Time::ZERO,
                PathEnds {
                    local: gid(250, rail),
                    remote: r,
                },
            );
        }
    }
    // 2,000 sessions within 5,000 probes a second: one probe each every 400 ms on
    // average, gaps averaging 7/8 of the interval.
    assert_eq!(p.interval().as_nanos(), 457_142_857);
    let b = p.budget();
    assert!((b.probes_per_sec - 5_000.0).abs() < 0.01, "{b:?}");
}

#[test]
fn same_seed_same_sends() {
    let run = |seed| {
        let mut bed = Bed::new(seed);
        bed.cut.push(1);
        bed.run_ms(50);
        bed.cut.clear();
        bed.run_ms(500);
        format!("{:?}", bed.seen)
    };
    assert_eq!(run(7), run(7));
}

/// Rail 1 cut `n` times, each cut long enough to end the sessions.
fn flap_rail_1(bed: &mut Bed, n: usize) {
    for _ in 0..n {
        bed.cut.push(1);
        bed.run_ms(150);
        bed.cut.clear();
        bed.run_ms(400);
    }
}

/// Host 0's verdicts about its rail-1 path: `Some(hold)` for an Up, `None` for a Down.
fn rail_1_verdicts(bed: &Bed) -> Vec<Option<Option<Time>>> {
    bed.seen
        .iter()
        .filter_map(|(_, h, o)| match o {
            ProbeOutput::Up {
                ends, held_until, ..
            } if *h == 0 && ends.local.0[15] == 1 => Some(Some(*held_until)),
            ProbeOutput::Down { ends, .. } if *h == 0 && ends.local.0[15] == 1 => Some(None),
            _ => None,
        })
        .collect()
}

#[test]
fn a_path_that_keeps_flapping_comes_back_held_and_the_hold_ends_when_quiet() {
    let mut bed = Bed::new(8);
    bed.run_ms(100);
    flap_rail_1(&mut bed, 3);
    let v = rail_1_verdicts(&bed);
    // Up at start, then down/up, down/up, down and a third return that is held.
    assert_eq!(v.len(), 7, "{v:?}");
    assert!(v[..6].iter().step_by(2).all(|x| *x == Some(None)), "{v:?}");
    assert!(v[1..6].iter().step_by(2).all(Option::is_none), "{v:?}");
    let until = v[6].flatten().expect("the third return is held");
    // About 1.2 half-lives (6 s) from the return.
    let hold = until.since(bed.now);
    assert!(
        hold > Duration::from_secs(5) && hold < Duration::from_secs(7),
        "{hold:?}"
    );
    assert!(bed.hosts[0].damped(ends(1, 1), bed.now));
    assert!(
        !bed.hosts[0].damped(ends(1, 2), bed.now),
        "rail 2 never flapped"
    );
    bed.run_ms(7_000);
    assert!(!bed.hosts[0].damped(ends(1, 1), bed.now));
    assert_eq!(
        rail_1_verdicts(&bed).len(),
        7,
        "nothing more to say when quiet"
    );
}

#[test]
fn a_cut_during_a_hold_is_news_and_lengthens_the_next_hold() {
    let mut bed = Bed::new(9);
    bed.run_ms(100);
    flap_rail_1(&mut bed, 3);
    let third = rail_1_verdicts(&bed)[6].flatten().expect("held");
    let third_hold = third.since(bed.now);
    flap_rail_1(&mut bed, 1);
    let v = rail_1_verdicts(&bed);
    assert_eq!(v.len(), 9, "{v:?}");
    assert_eq!(
        v[7], None,
        "the engine was told the path is up: its loss is news"
    );
    let fourth = v[8].flatten().expect("held again");
    assert!(
        fourth.since(bed.now) > third_hold,
        "{fourth:?} vs {third:?}"
    );
}

#[test]
fn damping_off_reports_every_return() {
    let policy = ProbePolicy {
        damping_half_life_ms: 0,
        ..on()
    };
    let mut bed = Bed::new(10);
    bed.hosts = [Prober::new(policy.clone(), 10), Prober::new(policy, 11)];
    for (i, h) in bed.hosts.iter_mut().enumerate() {
        for rail in 1..=2 {
            h.watch(Time::ZERO, ends(i as u8 + 1, rail));
        }
    }
    bed.run_ms(100);
    for _ in 0..5 {
        bed.cut.push(1);
        bed.run_ms(150);
        bed.cut.clear();
        bed.run_ms(400);
    }
    assert!(!bed.hosts[0].damped(ends(1, 1), bed.now));
    let ups = bed
        .seen
        .iter()
        .filter(|(_, h, o)| {
            *h == 0 && matches!(o, ProbeOutput::Up { ends, .. } if ends.local.0[15] == 1)
        })
        .count();
    assert_eq!(ups, 6);
}

#[test]
fn the_timer_queue_stays_bounded_and_wakes_only_for_what_is_due() {
    let mut bed = Bed::new(12);
    bed.run_ms(2_000);
    // Each session keeps about one send and one expiry queued.
    for h in &bed.hosts {
        assert!(
            h.timers.len() <= 3 * h.sessions.len() + 2,
            "{}",
            h.timers.len()
        );
        let next = h.next_deadline().expect("sessions send");
        assert!(next > bed.now, "nothing overdue after a poll");
    }
    // Following no path leaves no session; stale entries do nothing when due.
    bed.hosts[0].follow(bed.now, &BTreeSet::new());
    bed.run_ms(1_000);
    assert_eq!(bed.hosts[0].sessions().count(), 0);
    assert_eq!(bed.hosts[0].next_deadline(), None);
}

#[test]
fn a_host_held_for_most_of_the_detection_time_does_not_take_its_own_hold_for_a_failure() {
    // Host 1 (index 0) is not scheduled for 50 ms: less than the 60 ms detection time,
    // but with the time since it last heard its peer, often more than what was left of
    // it. The peer's probes wait on its socket meanwhile. Without the hold rule it
    // would find its sessions expired when it runs again, before reading them.
    let mut saved = 0;
    for seed in 1..=40 {
        let mut bed = Bed::new(seed);
        bed.run_ms(100);
        bed.held = Some((0, bed.now.plus(Duration::from_millis(50))));
        bed.run_ms(300);
        let first_down = |h: usize| {
            bed.seen
                .iter()
                .find(|(_, i, o)| *i == h && matches!(o, ProbeOutput::Down { .. }))
                .map(|(t, _, _)| *t)
        };
        // The held host may only hear of a failure its peer saw (the peer, not
        // scheduled to hear it, may take the silence for one).
        if let Some(t) = first_down(0) {
            assert!(
                first_down(1).is_some_and(|p| p <= t),
                "seed {seed}: the held host judged first: {:?}",
                bed.seen
            );
        }
        if bed.downs().is_empty() && bed.hosts[0].counters().deferred_after_hold > 0 {
            saved += 1;
        }
    }
    assert!(saved > 0, "some holds found an expiry and put it off");
}

#[test]
fn a_path_that_died_while_its_host_was_held_goes_down_one_interval_later() {
    let mut bed = Bed::new(8);
    bed.run_ms(100);
    let t0 = bed.now;
    bed.cut.push(1);
    // Held for less than its peer takes to judge it silent: rail 2 stays up.
    bed.held = Some((0, t0.plus(Duration::from_millis(30))));
    bed.run_ms(300);
    let downs: Vec<_> = bed
        .seen
        .iter()
        .filter(|(_, h, o)| *h == 0 && matches!(o, ProbeOutput::Down { .. }))
        .collect();
    assert_eq!(downs.len(), 1, "rail 1 alone, once: {:?}", bed.seen);
    let (at, _, o) = downs[0];
    assert!(matches!(o, ProbeOutput::Down { ends, .. } if ends.local.0[15] == 1));
    // Rail 1 silent since the cut: its expiry (60 ms after the last probe heard) comes
    // at most one interval (20 ms) later than without the hold.
    let after = at.since(t0);
    assert!(
        after <= Duration::from_millis(80),
        "down {after:?} after the cut: {:?}",
        bed.seen
    );
}
