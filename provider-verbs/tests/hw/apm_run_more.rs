//! More of `apm run` in the VM: UCX, and the overhead benchmark (`cargo xtask bench
//! apm-run`), with `apm_run`'s helpers.

use super::*;

/// The figures of a perftest run: the first numeric row under its table header.
pub(super) fn perftest_row(out: &str) -> Vec<f64> {
    out.lines()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .find(|n| n.len() >= 4)
        .unwrap_or_default()
}

/// One perftest pair without a fault; the client's table row.
fn measure(pair: &Pair, apm: Option<&str>, tag: &str) -> Vec<f64> {
    let mut s = spawn(
        &format!("{tag}-s"),
        &pair.0,
        apm,
        &format!("/tmp/{tag}-s.json"),
    );
    wait_listening(tcp_port(&pair.0), Duration::from_secs(10));
    let mut c = spawn(
        &format!("{tag}-c"),
        &pair.1,
        apm,
        &format!("/tmp/{tag}-c.json"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let (cs, ss) = (c.wait(deadline), s.wait(deadline));
    assert_eq!((cs, ss), (Some(0), Some(0)), "{tag}: {}", c.tail());
    perftest_row(&std::fs::read_to_string(&c.out).unwrap_or_default())
}

/// `cargo xtask bench apm-run`: ib_write_bw and ib_send_lat with and without `apm run`,
/// no fault (apm touches no data path verb: the figures must match within noise).
/// A benchmark, not a test: it runs only with `APM_BENCH=1`.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask bench apm-run`"]
fn bench_apm_run_overhead() {
    if std::env::var("APM_BENCH").as_deref() != Ok("1") {
        println!("SKIPPED: a benchmark: `cargo xtask bench apm-run` runs it");
        return;
    }
    let Some((apm, _rails)) = prepare("/usr/bin/ib_send_lat") else {
        return;
    };
    let (ga, gb) = rail10();
    let bw = (
        v(&format!(
            "/usr/bin/ib_write_bw -d rxe1 -x {gb} -p 18631 -F -D 5"
        )),
        v(&format!(
            "/usr/bin/ib_write_bw -d rxe0 -x {ga} -p 18631 -F -D 5 127.0.0.1"
        )),
    );
    let lat = (
        v(&format!(
            "/usr/bin/ib_send_lat -d rxe1 -x {gb} -p 18632 -F -n 2000"
        )),
        v(&format!(
            "/usr/bin/ib_send_lat -d rxe0 -x {ga} -p 18632 -F -n 2000 127.0.0.1"
        )),
    );
    let reps = 3;
    let mut rows = Vec::new();
    for (what, pair, col, unit) in [
        ("ib_write_bw 64 KiB average", &bw, 3usize, "MB/s"),
        ("ib_send_lat 2 B typical", &lat, 4usize, "us"),
    ] {
        let (mut bare, mut with) = (Vec::new(), Vec::new());
        for i in 0..reps {
            // Alternate, so that drift in the VM's speed hits both alike.
            bare.push(
                measure(pair, None, &format!("bench-{i}-bare"))
                    .get(col)
                    .copied(),
            );
            with.push(
                measure(pair, Some(&apm), &format!("bench-{i}-apm"))
                    .get(col)
                    .copied(),
            );
        }
        let show = |v: &[Option<f64>]| {
            v.iter()
                .map(|x| x.map_or("-".to_owned(), |x| format!("{x:.2}")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        rows.push(format!(
            "{what:<28} {unit:<5} without apm: {:<24} under apm run: {}",
            show(&bare),
            show(&with)
        ));
    }
    println!("apm run overhead, no fault ({reps} runs each, alternating):");
    for r in rows {
        println!("  {r}");
    }
}

/// ucx_perftest over UCX's `rc_verbs` transport (UCX opens its InfiniBand transport as
/// a module with `dlopen`). Skipped, with UCX's own words, where UCX does not run on rxe.
/// What it shows in this bed: UCX runs on rxe (with `/dev/shm` and bcopy puts), its
/// `rc_verbs` QPs receive through an SRQ, which apm run reports unprotected under the
/// software migration of stock rxe (hardware APM protects them: `apm_run_hw_ucx.rs`),
/// and the program runs exactly as without apm. ucx_perftest's server takes the client's
/// device, so both ends land on rxe0 (a loopback pair the rail cut does not touch): this
/// is not a failover check.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_run_ucx_perftest_rc_verbs_across_a_silent_rail_cut() {
    let Some((apm, _rails)) = prepare("/usr/bin/ucx_perftest") else {
        return;
    };
    // UCX maps its shared-memory transports under /dev/shm, which the VM's devtmpfs
    // lacks.
    let _ = std::fs::create_dir_all("/dev/shm");
    let _ = Command::new("/bin/mount")
        .args(["-t", "tmpfs", "tmpfs", "/dev/shm"])
        .output();
    // The server takes the client's device (rxe0): both ends use rxe0's GID index.
    let (ga, _) = rail10();
    let ucx = |n: u32| -> Pair {
        (
            v(&format!(
                "/bin/env UCX_IB_GID_INDEX={ga} /usr/bin/ucx_perftest -d rxe1:1 -x rc_verbs -p 18641"
            )),
            v(&format!(
                "/bin/env UCX_IB_GID_INDEX={ga} /usr/bin/ucx_perftest -d rxe0:1 -x rc_verbs \
                 -p 18641 -t put_bw -D bcopy -s 4096 -n {n} 127.0.0.1"
            )),
        )
    };
    // A short run without a fault first: does UCX run on rxe here at all, and how fast?
    let probe = ucx(1000);
    let mut s = spawn("ucx-probe-s", &probe.0, None, "/tmp/ucx-probe-s.json");
    wait_listening(18641, Duration::from_secs(10));
    let t0 = Instant::now();
    let mut c = spawn("ucx-probe-c", &probe.1, None, "/tmp/ucx-probe-c.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (cs, ss) = (c.wait(deadline), s.wait(deadline + Duration::from_secs(3)));
    let took = t0.elapsed();
    if cs != Some(0) || ss != Some(0) {
        println!(
            "SKIPPED: ucx_perftest over rc_verbs does not run on rxe in this VM (client {cs:?}, \
             server {ss:?}):\n  client: {}\n  server: {}",
            c.tail(),
            s.tail()
        );
        return;
    }
    // About 8 s of traffic at the probe's pace.
    let per = took.as_secs_f64().max(0.01) / 1000.0;
    let n = ((8.0 / per) as u32).clamp(2_000, 5_000_000);
    println!("ucx_perftest: 1000 puts in {took:?}; the runs use {n}");
    without_then_with("ucx_perftest", &[ucx(n)], Duration::from_millis(1500), &apm);
}
