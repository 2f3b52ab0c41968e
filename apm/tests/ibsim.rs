//! Bed tests of `apm watch` against OpenSM over ibsim (`cargo xtask ibsim`): the built
//! `apm` binary runs as `apm watch --ibsim-bed --json` on a client node (under umad2sim,
//! which fakes umad and nothing else, so the watch takes SA notices alone), the test
//! Unlinks and ReLinks another node's port through ibsim's console and checks what the
//! watch prints: one trap 65 event, then one trap 64 event, for that port's GID.
//!
//! Skipped with a printed reason outside the bed (`umad::bed::Bed::or_skip`).
#![allow(clippy::disallowed_methods)] // bed tests measure wall-clock latencies

use std::io::{BufRead, BufReader};
use std::net::Ipv6Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use umad::bed::Bed;

/// What a watch process wrote: a stdout line (an event) or a stderr line.
#[derive(Debug)]
enum Out {
    Event(String),
    Note(String),
}

/// `apm watch` running as a node process of the bed; killed (by its PID) when dropped.
struct Watch {
    node: String,
    child: Child,
    lines: mpsc::Receiver<(Instant, Out)>,
}

impl Watch {
    /// Start `apm watch --ibsim-bed --json ARGS` on `node` and wait until it reports its
    /// SA subscription.
    fn start(bed: &Bed, node: &str, args: &[&str]) -> Watch {
        let mut w = Watch::spawn(bed, node, args);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match w.next(deadline.saturating_duration_since(Instant::now())) {
                Some((_, Out::Note(l))) if l.contains("SA notices (traps 64/65) through") => {
                    return w
                }
                Some((_, Out::Event(l))) => panic!("{node}: event before subscribing: {l}"),
                Some(_) => continue,
                None => panic!("{node}: apm watch did not subscribe within 10 s"),
            }
        }
    }

    fn spawn(bed: &Bed, node: &str, args: &[&str]) -> Watch {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        // umad2sim writes ./sys-<pid>: a fresh directory per process.
        let dir = bed.scratch.join(format!(
            "apm-watch-{node}-{}",
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_apm"))
            .args(["watch", "--ibsim-bed", "--json"])
            .args(args)
            .current_dir(&dir)
            .env("LD_PRELOAD", &bed.umad2sim)
            .env("SIM_HOST", node)
            .env("IBSIM_SOCKNAME", &bed.sockname)
            .env("APM_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("apm runs");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for (stream, is_event) in [
            (Box::new(out) as Box<dyn std::io::Read + Send>, true),
            (Box::new(err), false),
        ] {
            let tx = tx.clone();
            let name = node.to_owned();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let t = Instant::now();
                    println!("[{name} {}] {line}", if is_event { "out" } else { "err" });
                    let o = if is_event {
                        Out::Event(line)
                    } else {
                        Out::Note(line)
                    };
                    if tx.send((t, o)).is_err() {
                        break;
                    }
                }
            });
        }
        Watch {
            node: node.to_owned(),
            child,
            lines: rx,
        }
    }

    fn next(&mut self, timeout: Duration) -> Option<(Instant, Out)> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// The next event line within `timeout`, parsed, with the time it was read.
    fn event(&mut self, timeout: Duration) -> Option<(Instant, serde_json::Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now()))? {
                (t, Out::Event(l)) => {
                    let v = serde_json::from_str(&l)
                        .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", self.node));
                    return Some((t, v));
                }
                (_, Out::Note(_)) => continue,
            }
        }
    }

    /// Every event line within `window` (nothing expected: duplicates, filtered kinds).
    fn events_within(&mut self, window: Duration) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + window;
        let mut out = Vec::new();
        while let Some((_, v)) = self.event(deadline.saturating_duration_since(Instant::now())) {
            out.push(v);
        }
        out
    }

    /// Wait for the process to end by itself; whether it succeeded.
    fn wait(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The GID OpenSM gives an HCA port: the default subnet prefix and its port GUID.
fn gid_of(guid: u64) -> Ipv6Addr {
    Ipv6Addr::from((0xfe80_u128 << 112) | u128::from(guid))
}

/// The GID in OpenSM's `Reporting Informational Notice "GID out of service",
/// GID:fe80::...` log line.
fn logged_gid(line: &str) -> Option<Ipv6Addr> {
    let g = line.split("GID:").nth(1)?.split_whitespace().next()?;
    g.trim_end_matches(',').parse().ok()
}

fn str_of<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k)
        .and_then(|x| x.as_str())
        .unwrap_or_else(|| panic!("no string {k:?} in {v}"))
}

fn num_of(v: &serde_json::Value, k: &str) -> u64 {
    v.get(k)
        .and_then(|x| x.as_u64())
        .unwrap_or_else(|| panic!("no number {k:?} in {v}"))
}

/// One SA event line as the watch must print it: `kind` for `gid`, arrived on the
/// watching node's port 1 (ibsim0), with that port read back (active, LIDs, LMC).
fn check_event(v: &serde_json::Value, kind: &str, gid: Ipv6Addr, bed: &Bed) {
    assert_eq!(str_of(v, "event"), kind, "{v}");
    let got: Ipv6Addr = str_of(v, "gid")
        .parse()
        .unwrap_or_else(|e| panic!("gid of {v}: {e}"));
    assert_eq!(got, gid, "the event names another port: {v}");
    assert_eq!(str_of(v, "source"), "sa", "{v}");
    assert_eq!(str_of(v, "device"), "ibsim0", "{v}");
    assert_eq!(num_of(v, "port"), 1, "{v}");
    assert_eq!(str_of(v, "state"), "active", "{v}");
    assert!(num_of(v, "lid") > 0, "{v}");
    assert!(num_of(v, "sm_lid") > 0, "{v}");
    assert_eq!(num_of(v, "lmc"), u64::from(bed.lmc), "{v}");
    assert!(str_of(v, "time").ends_with('Z'), "RFC 3339 UTC: {v}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `apm watch` on a client node prints exactly one `gid_out_of_service` event (trap 65)
/// for another node's port when it is Unlinked, and exactly one `gid_in_service` (trap
/// 64) when it is ReLinked, with the GID OpenSM logs; every Report is answered.
#[test]
fn watch_prints_one_event_per_unlink_and_relink() {
    let Some(bed) = Bed::or_skip("watch_prints_one_event_per_unlink_and_relink") else {
        return;
    };
    let victim = bed.nodes[1].clone();
    // Read before any Unlink: OpenSM rewrites its subnet list without the lost port.
    let guid = bed.hca_ports()[&(victim.clone(), 2)];
    let gid = gid_of(guid);
    let mut w = Watch::start(&bed, &bed.nodes[0], &[]);
    let bound = Duration::from_secs(3);
    let mut lat = Vec::new();
    for round in 0..2 {
        let mark = bed.log_mark();
        let t0 = Instant::now();
        bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
        let (t1, out) = w
            .event(bound)
            .unwrap_or_else(|| panic!("round {round}: no event within {bound:?} of Unlink"));
        check_event(&out, "gid_out_of_service", gid, &bed);
        let logged = bed
            .wait_log_after(mark, "\"GID out of service\"", Duration::from_secs(1))
            .expect("OpenSM logged no trap 65");
        assert_eq!(
            logged_gid(&logged),
            Some(gid),
            "OpenSM's trap 65 is for another GID: {logged}"
        );
        // Nothing else about the Unlink (a second Report, a resend taken as new).
        let extra = w.events_within(Duration::from_millis(500));
        assert!(
            extra.is_empty(),
            "round {round}: more after Unlink: {extra:?}"
        );

        let t2 = Instant::now();
        bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
        let (t3, inn) = w
            .event(bound)
            .unwrap_or_else(|| panic!("round {round}: no event within {bound:?} of ReLink"));
        check_event(&inn, "gid_in_service", gid, &bed);
        lat.push((t1 - t0, t3 - t2));
        let extra = w.events_within(Duration::from_millis(500));
        assert!(
            extra.is_empty(),
            "round {round}: more after ReLink: {extra:?}"
        );
    }
    // OpenSM resends an unanswered Report after 200 ms, 3 times: wait them out.
    let extra = w.events_within(Duration::from_millis(800));
    assert!(
        extra.is_empty(),
        "duplicate or unexpected events: {extra:?}"
    );
    assert!(
        !bed.opensm_log().contains("ERR 1A06"),
        "a Report went unanswered"
    );
    for (i, (down, up)) in lat.iter().enumerate() {
        println!(
            "round {i}: Unlink -> apm watch gid_out_of_service line {:.2} ms, ReLink -> \
             gid_in_service line {:.2} ms",
            ms(*down),
            ms(*up)
        );
    }
}

/// `--event` drops the kinds not asked for: a watch for `gid_in_service` prints nothing
/// on Unlink while a watch for `gid_out_of_service` on another node does (so the trap
/// was sent), and prints the ReLink's event, which the other one drops; with `--count 1`
/// it then ends by itself, successfully. A `--device` naming no umad CA is an error.
#[test]
fn watch_event_filter_drops_other_kinds() {
    let Some(bed) = Bed::or_skip("watch_event_filter_drops_other_kinds") else {
        return;
    };
    let victim = bed.nodes[2].clone();
    let gid = gid_of(bed.hca_ports()[&(victim.clone(), 2)]);

    let mut bad = Watch::spawn(&bed, &victim, &["--device", "mlx5_0"]);
    assert!(
        !bad.wait(Duration::from_secs(10)),
        "--device mlx5_0 accepted"
    );
    let notes: Vec<String> = std::iter::from_fn(|| bad.next(Duration::from_millis(200)))
        .map(|(_, o)| match o {
            Out::Note(l) => l,
            Out::Event(l) => panic!("an event from a refused watch: {l}"),
        })
        .collect();
    assert!(
        notes
            .iter()
            .any(|l| l.contains("no umad device \"mlx5_0\"") && l.contains("ibsim0")),
        "{notes:?}"
    );

    let mut ins = Watch::start(
        &bed,
        &bed.nodes[0],
        &["--event", "gid_in_service", "--count", "1"],
    );
    let mut outs = Watch::start(&bed, &bed.nodes[1], &["--event", "gid-out-of-service"]);

    let t0 = Instant::now();
    bed.console(&format!("Unlink \"{victim}\"[2]")).unwrap();
    let (t1, out) = outs
        .event(Duration::from_secs(3))
        .expect("the gid_out_of_service watch saw no Unlink");
    check_event(&out, "gid_out_of_service", gid, &bed);
    let dropped = ins.events_within(Duration::from_millis(500));
    assert!(
        dropped.is_empty(),
        "--event gid_in_service let through: {dropped:?}"
    );

    let t2 = Instant::now();
    bed.console(&format!("ReLink \"{victim}\"[2]")).unwrap();
    let (t3, inn) = ins
        .event(Duration::from_secs(3))
        .expect("the gid_in_service watch saw no ReLink");
    check_event(&inn, "gid_in_service", gid, &bed);
    assert!(
        ins.wait(Duration::from_secs(5)),
        "--count 1: the watch did not end successfully after its event"
    );
    let dropped = outs.events_within(Duration::from_millis(500));
    assert!(
        dropped.is_empty(),
        "--event gid-out-of-service let through: {dropped:?}"
    );
    println!(
        "Unlink -> filtered watch's gid_out_of_service {:.2} ms, ReLink -> \
         gid_in_service {:.2} ms",
        ms(t1 - t0),
        ms(t3 - t2)
    );
}

/// `--ibsim-bed` is refused where umad2sim is not loaded (outside the bed, and inside it
/// for a process without the preload): a real fabric never sees the IsSM shim.
#[test]
fn ibsim_bed_flag_refused_without_umad2sim() {
    let out = Command::new(env!("CARGO_BIN_EXE_apm"))
        .args(["watch", "--ibsim-bed", "--timeout", "1"])
        .env_remove("LD_PRELOAD")
        .current_dir(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .output()
        .expect("apm runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("test-bed mode refused"), "{err}");
    assert!(out.stdout.is_empty());
}
