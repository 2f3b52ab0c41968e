//! Engine benchmarks: time per connection to handle a `PORT_ERR` that affects 1k, 10k
//! and 100k armed connections, and memory per protected connection.
//!
//! Targets (printed, not asserted): under 1 us and under 512 bytes per connection at 100k.
//! Run with `cargo xtask bench` or `cargo bench -p apm-core`.

// A benchmark measures wall-clock time; the engine it drives still never reads a clock.
#![allow(clippy::disallowed_methods)]

use apm_core::*;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

/// Counts live heap bytes so memory per connection can be measured.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn path(port: u8, remote: u64) -> Path {
    Path::ib(
        PortKey::new(0, port),
        (
            Lid::new(u16::from(port)).expect("unicast"),
            Gid::from_guid(0xa0 + u64::from(port)),
        ),
        (
            Lid::new(100 + u16::try_from(remote).expect("small")).expect("unicast"),
            Gid::from_guid(0xb000 + remote),
        ),
        Path::MTU_4096,
        Path::ACK_TIMEOUT_67MS,
    )
}

/// An engine with `n` connections to 16 remote hosts, each armed with a port-disjoint
/// alternate (primary on port 1, alternate on port 2).
fn armed_engine(n: u64) -> Engine {
    let mut e = Engine::new(Policy::default()).expect("default policy");
    for p in [1u8, 2] {
        let info = PortInfo {
            key: PortKey::new(0, p),
            gids: vec![Gid::from_guid(0xa0 + u64::from(p))],
            lid: Lid::new(u16::from(p)).expect("unicast"),
            lmc: 0,
            active: true,
            link_layer: LinkLayer::InfiniBand,
        };
        e.handle_input(Time::ZERO, Input::PortInfo(info));
    }
    for i in 0..n {
        let host = (i % 16) * 2;
        let id32 = u32::try_from(i).expect("fits");
        let spec = ConnSpec {
            id: ConnId(i),
            role: Role::Active,
            mode: MigrationMode::Hardware,
            local_qpn: Qpn::new(id32 & 0xFF_FFFF).expect("24-bit"),
            remote_qpn: Qpn::new(id32 & 0xFF_FFFF).expect("24-bit"),
            local_comm_id: id32,
            remote_comm_id: id32,
            primary: path(1, host),
            agreed_alternate: Some(path(2, host + 1)),
            candidates: vec![],
        };
        e.protect(Time::ZERO, spec).expect("ok");
        complete_all(&mut e);
    }
    e
}

/// Answer every command with success until the engine is quiet.
fn complete_all(e: &mut Engine) -> usize {
    let mut outputs = 0;
    while let Some(out) = e.poll_output() {
        outputs += 1;
        if let Output::Command(c) = out {
            let result = match c.op {
                CommandOp::SetRearm { .. } => Ok(CommandOutcome::MigState(MigState::Armed)),
                _ => Ok(CommandOutcome::Done),
            };
            e.handle_input(Time::ZERO, Input::CommandDone { id: c.id, result });
        }
    }
    outputs
}

fn port_err(c: &mut Criterion) {
    let mut g = c.benchmark_group("port_err");
    g.sample_size(10);
    for n in [1_000u64, 10_000, 100_000] {
        g.throughput(Throughput::Elements(n));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut e = armed_engine(n);
                    let start = Instant::now();
                    e.handle_input(
                        Time::from_millis(1),
                        Input::PortEvent {
                            port: PortKey::new(0, 1),
                            event: PortEvent::Down,
                        },
                    );
                    // Taking the outputs is part of the work: a ForceMigrate per connection.
                    let mut outs = 0;
                    while e.poll_output().is_some() {
                        outs += 1;
                    }
                    total += start.elapsed();
                    assert!(outs >= n as usize, "every connection was acted on");
                }
                total
            })
        });
    }
    g.finish();
}

fn memory_report() {
    for n in [1_000u64, 10_000, 100_000] {
        let before = LIVE.load(Ordering::Relaxed);
        let e = armed_engine(n);
        let after = LIVE.load(Ordering::Relaxed);
        let per = (after - before) as f64 / n as f64;
        println!(
            "memory: {n:>7} armed connections: {per:>6.0} bytes/connection (target < 512){}",
            if per < 512.0 { "" } else { "  OVER TARGET" }
        );
        drop(e);
    }
}

criterion_group!(benches, port_err);

fn main() {
    memory_report();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
