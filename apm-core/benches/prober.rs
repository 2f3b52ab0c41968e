//! Prober benchmark: the cost of one timer step (`poll_timers`, draining the sends,
//! `next_deadline`) for a host with 1k and 10k probe sessions, most of which have
//! nothing due. A driver calls this at every deadline, so its cost should follow the
//! sessions that are due, not the sessions that exist.
//!
//! Run with `cargo xtask bench` or `cargo bench -p apm-core --bench prober`.

use apm_core::probe::{PathEnds, ProbePolicy, Prober};
use apm_core::{Gid, Time};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::time::Duration;

fn gid(host: u32, rail: u8) -> Gid {
    let mut b = [0u8; 16];
    b[0] = 0xfe;
    b[1] = 0x80;
    b[10..14].copy_from_slice(&host.to_be_bytes());
    b[15] = rail;
    Gid(b)
}

/// A prober watching `n` paths (n/2 peers on two rails), past its first sends.
fn prober(n: u32) -> (Prober, Time) {
    let policy = ProbePolicy {
        enabled: true,
        max_probes_per_sec: u32::MAX,
        ..ProbePolicy::default()
    };
    let mut p = Prober::new(policy, 1);
    for i in 0..n {
        let rail = (i % 2) as u8 + 1;
        p.watch(
            Time::ZERO,
            PathEnds {
                local: gid(0, rail),
                remote: gid(i / 2 + 1, rail),
            },
        );
    }
    let mut now = Time::ZERO;
    // Spread the sessions' deadlines over the down interval.
    for _ in 0..300 {
        p.poll_timers(now);
        while p.poll_output().is_some() {}
        now = now.plus(Duration::from_millis(1));
    }
    (p, now)
}

fn step(c: &mut Criterion) {
    let mut g = c.benchmark_group("prober_step");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    for n in [1_000u32, 10_000] {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let (mut p, mut now) = prober(n);
            b.iter(|| {
                // One step of 10 us: a handful of the sessions are due.
                now = now.plus(Duration::from_micros(10));
                p.poll_timers(now);
                while p.poll_output().is_some() {}
                std::hint::black_box(p.next_deadline())
            });
        });
    }
    g.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
