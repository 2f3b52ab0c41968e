//! What ran on the guest's CPUs during a stall, for `bench failover --sched-trace`: the
//! kernel's scheduler and softirq trace events (tracefs), summed per CPU over the
//! stall's window (each task's time on the CPU, softirq time apart from the task it
//! interrupted, idle), and how long each pingpong's threads waited for a CPU once woken
//! or preempted (and, on request, what each thread's time went to, system call by
//! system call). The Manager's traces show steps with nothing asynchronous between them
//! lying milliseconds apart; this says whether apm's threads were waiting for a CPU
//! then, and what ran instead.
//!
//! The trace clock is `mono` (CLOCK_MONOTONIC, the clock of Rust's `Instant`); a line
//! written to `trace_marker` at start ties it to the caller's clock.

use std::collections::BTreeMap;
use std::time::Instant;

/// Where tracefs is (mounted here when it is not yet).
const TRACING: &str = "/sys/kernel/tracing";

/// The events read: switches and wake-ups for the CPUs' owners and the waits, softirq
/// entry and exit for the time rxe's packet work and the network stack take there.
const EVENTS: [&str; 4] = [
    "sched/sched_switch",
    "sched/sched_wakeup",
    "irq/softirq_entry",
    "irq/softirq_exit",
];

/// With `APM_BENCH_SCHED_SYSCALLS=1` also the system calls, for what a thread's time on
/// a CPU went to (rxe's verbs and its packet work run in the caller's calls). Not by
/// default: they multiply the events (every verb, datagram and wait of every thread),
/// and the tracing's own cost with them.
const SYSCALL_EVENTS: [&str; 2] = ["raw_syscalls/sys_enter", "raw_syscalls/sys_exit"];

/// The events this run traces.
fn events() -> Vec<&'static str> {
    let syscalls = std::env::var("APM_BENCH_SCHED_SYSCALLS").is_ok_and(|v| v == "1");
    let extra = if syscalls { &SYSCALL_EVENTS[..] } else { &[] };
    EVENTS.iter().chain(extra).copied().collect()
}

/// The marker's word; the caller's clock in ms follows it.
const ORIGIN: &str = "apm-bench-origin";

/// The trace instance each run gets: a buffer of its own, made empty and removed with
/// the run, so that no buffer is reset (a new clock, a clear) while events flow.
const INSTANCE: &str = "instances/apm-bench";

/// Tracing while it lives (stopped, its instance removed, on drop). Start with
/// [`SchedTrace::start`].
pub(crate) struct SchedTrace {
    removed: bool,
}

/// Whether the benchmark was asked to trace (`APM_BENCH_SCHED_TRACE=1`).
pub(crate) fn wanted() -> bool {
    std::env::var("APM_BENCH_SCHED_TRACE").is_ok_and(|v| v == "1")
}

/// Turn the events on once for the whole boot, in the top instance with its own
/// recording off, so that a run's instance turning them on and off changes no
/// tracepoint's static key: each change patches the kernel's code on every CPU, and
/// runs that did so each time stalled the guest's kernel (RCU stalls) within a few.
fn hold_tracepoints_on() -> Result<(), String> {
    static HELD: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    HELD.get_or_init(|| {
        tracefs_write("tracing_on", "0")?;
        tracefs_write("buffer_size_kb", "4")?;
        for e in events() {
            tracefs_write(&format!("events/{e}/enable"), "1")?;
        }
        Ok(())
    })
    .clone()
}

/// Write `value` to tracefs' `file` (a path under its root).
fn tracefs_write(file: &str, value: &str) -> Result<(), String> {
    let path = format!("{TRACING}/{file}");
    std::fs::write(&path, value).map_err(|e| format!("{path}: {e}"))
}

/// Write `value` to the run's instance's `file`.
fn write(file: &str, value: &str) -> Result<(), String> {
    tracefs_write(&format!("{INSTANCE}/{file}"), value)
}

impl SchedTrace {
    /// Make a fresh trace instance and start tracing into it; `t0` is the caller's clock
    /// origin. An error says what could not be set (no tracefs in the kernel, not
    /// root).
    pub(crate) fn start(t0: Instant) -> Result<SchedTrace, String> {
        if !std::path::Path::new(&format!("{TRACING}/instances")).exists() {
            let st = std::process::Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACING])
                .status()
                .map_err(|e| format!("mount tracefs: {e}"))?;
            if !st.success() {
                return Err(format!("mount -t tracefs on {TRACING}: {st}"));
            }
        }
        hold_tracepoints_on()?;
        let dir = format!("{TRACING}/{INSTANCE}");
        // A run that died midway may have left its instance.
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
        let trace = SchedTrace { removed: false };
        write("tracing_on", "0")?;
        write("trace_clock", "mono")?;
        write("buffer_size_kb", "4096")?;
        // Full, it keeps the oldest events: the fault's, which come first.
        write("options/overwrite", "0")?;
        for e in events() {
            write(&format!("events/{e}/enable"), "1")?;
        }
        write("tracing_on", "1")?;
        let now_ms = t0.elapsed().as_secs_f64() * 1e3;
        write("trace_marker", &format!("{ORIGIN} {now_ms:.3}\n"))?;
        Ok(trace)
    }

    /// Stop and read what was traced.
    pub(crate) fn finish(mut self) -> Result<String, String> {
        let _ = write("tracing_on", "0");
        let path = format!("{TRACING}/{INSTANCE}/trace");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"));
        self.remove();
        text
    }

    /// Stop the events and remove the instance (its buffer with it).
    fn remove(&mut self) {
        if !self.removed {
            self.removed = true;
            let _ = write("tracing_on", "0");
            for e in events() {
                let _ = write(&format!("events/{e}/enable"), "0");
            }
            let _ = std::fs::remove_dir(format!("{TRACING}/{INSTANCE}"));
        }
    }
}

impl Drop for SchedTrace {
    /// A run that panics midway stops the tracing too.
    fn drop(&mut self) {
        self.remove();
    }
}

/// The thread ids of process `pid` (its `/proc` task list), for naming its threads in
/// the summary; empty when it is gone.
pub(crate) fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// One trace line's parts: CPU, time in seconds, event name, the rest.
fn parse_line(line: &str) -> Option<(usize, f64, &str, &str)> {
    // `<comm>-<pid> [CPU] FLAGS SECONDS: EVENT: DETAILS`; the comm may hold spaces, so
    // look for the CPU's brackets from the event's end of the line.
    let (head, rest) = line.split_once(": ")?;
    let (event, details) = rest.split_once(": ").unwrap_or((rest, ""));
    let open = head.rfind('[')?;
    let close = open + head[open..].find(']')?;
    let cpu = head[open + 1..close].trim().parse().ok()?;
    let seconds = head[close + 1..].split_whitespace().last()?.parse().ok()?;
    Some((cpu, seconds, event, details))
}

/// `key=` value in `details` up to `until` (the next key), or to the next space.
fn field<'a>(details: &'a str, key: &str, until: Option<&str>) -> Option<&'a str> {
    let from = details.find(key)? + key.len();
    let rest = &details[from..];
    let end = until
        .and_then(|u| rest.find(u))
        .or_else(|| rest.find(' '))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// What one CPU is doing as the trace is read.
#[derive(Default)]
struct Cpu {
    /// The task on it (its label, its thread id), once known.
    task: Option<String>,
    tid: Option<u32>,
    /// The system call its task is in, if any.
    syscall: Option<u32>,
    /// The softirq it is in, if any.
    softirq: Option<String>,
    /// Since when (ms, caller's clock).
    since: f64,
    /// Time per owner within the window.
    owners: BTreeMap<String, f64>,
}

/// A thread's waits for a CPU within the window.
#[derive(Default)]
struct Waits {
    count: u32,
    total: f64,
    longest: f64,
}

/// A trace's events, read once for any number of windows: (CPU, ms on the caller's
/// clock, event name, details).
pub(crate) struct Events<'a>(Vec<(usize, f64, &'a str, &'a str)>);

/// The events of `trace`, their times put on the caller's clock by the origin marker;
/// an error when the trace has no marker.
pub(crate) fn read_events<'a>(trace: &'a str) -> Result<Events<'a>, String> {
    let lines: Vec<(usize, f64, &str, &str)> = trace.lines().filter_map(parse_line).collect();
    let origin = lines
        .iter()
        .find_map(|&(_, s, event, details)| {
            let ms: f64 = details.strip_prefix(ORIGIN)?.trim().parse().ok()?;
            (event == "tracing_mark_write").then_some(s * 1e3 - ms)
        })
        .ok_or("no origin marker in the trace")?;
    let on_our_clock = |(n, s, event, details): (usize, f64, &'a str, &'a str)| {
        (n, s * 1e3 - origin, event, details)
    };
    Ok(Events(lines.into_iter().map(on_our_clock).collect()))
}

/// A summary of `events` over `[from, to]` ms of the caller's clock: a line per CPU
/// (owners, longest first) and a line per named process's thread (its waits for a CPU
/// that ended within the window). `names` maps thread ids to a process's name.
pub(crate) fn summarise(
    events: &Events<'_>,
    from: f64,
    to: f64,
    names: &BTreeMap<u32, &str>,
) -> Vec<String> {
    let mut tally = Tally {
        from,
        to,
        names,
        cpus: Vec::new(),
        woken: BTreeMap::new(),
        waits: BTreeMap::new(),
        in_syscall: BTreeMap::new(),
        split: BTreeMap::new(),
        saw_syscalls: false,
    };
    for &(n, at, event, details) in &events.0 {
        match event {
            "sched_switch" => tally.switch(n, at, details),
            "sched_wakeup" => tally.wakeup(at, details),
            "softirq_entry" => tally.softirq(n, at, field(details, "action=", Some("]"))),
            "softirq_exit" => tally.softirq(n, at, None),
            "sys_enter" => tally.syscall(n, at, syscall_nr(details)),
            "sys_exit" => tally.syscall(n, at, None),
            _ => {}
        }
    }
    tally.lines()
}

/// The trace read so far.
struct Tally<'a> {
    from: f64,
    to: f64,
    names: &'a BTreeMap<u32, &'a str>,
    cpus: Vec<Cpu>,
    /// Threads waiting for a CPU (by label), since when.
    woken: BTreeMap<String, f64>,
    waits: BTreeMap<String, Waits>,
    /// The system call each thread off a CPU is in.
    in_syscall: BTreeMap<u32, u32>,
    /// The named threads' time on a CPU, per system call (or outside one).
    split: BTreeMap<String, BTreeMap<&'static str, f64>>,
    /// Whether system calls were traced at all (without them, the split is only a
    /// total).
    saw_syscalls: bool,
}

impl Tally<'_> {
    /// How a thread is named in the summary: `idle`, `comm/tid`, or `process:comm/tid`.
    fn label(&self, comm: &str, pid: &str) -> String {
        if pid == "0" {
            return "idle".to_owned();
        }
        match pid.parse().ok().and_then(|p: u32| self.names.get(&p)) {
            Some(n) => format!("{n}:{comm}/{pid}"),
            None => format!("{comm}/{pid}"),
        }
    }

    fn cpu(&mut self, n: usize) -> &mut Cpu {
        if self.cpus.len() <= n {
            self.cpus.resize_with(n + 1, || Cpu {
                since: f64::MIN,
                ..Cpu::default()
            });
        }
        &mut self.cpus[n]
    }

    /// Count CPU `n`'s time up to `until` to its owner. Before a CPU's first switch its
    /// task is unknown: that time is not counted.
    fn credit(&mut self, n: usize, until: f64) {
        let (from, to) = (self.from, self.to);
        let cpu = self.cpu(n);
        let owner = match (&cpu.softirq, &cpu.task) {
            (Some(s), _) => Some(format!("softirq {s}")),
            (None, task) => task.clone(),
        };
        let inside = (until.min(to) - cpu.since.max(from)).max(0.0);
        cpu.since = until;
        let Some(owner) = owner.filter(|_| inside > 0.0) else {
            return;
        };
        // Outside a system call is user code, and the kernel's work for it that is not a
        // call: page faults, interrupts, preemption (softirqs are counted apart).
        let bucket = cpu.syscall.map_or("outside syscalls", syscall_name);
        *cpu.owners.entry(owner.clone()).or_default() += inside;
        // A softirq's time is its own ("softirq X"), never a named thread's.
        if self.is_named(&owner) {
            *self
                .split
                .entry(owner)
                .or_default()
                .entry(bucket)
                .or_default() += inside;
        }
    }

    /// Whether `label` is a thread of a named process.
    fn is_named(&self, label: &str) -> bool {
        self.names
            .values()
            .any(|n| label.strip_prefix(n).is_some_and(|r| r.starts_with(':')))
    }

    /// CPU `n`'s task enters system call `nr` (`Some`) or leaves it (`None`).
    fn syscall(&mut self, n: usize, at: f64, nr: Option<u32>) {
        self.saw_syscalls = true;
        self.credit(n, at);
        self.cpu(n).syscall = nr;
    }

    fn switch(&mut self, n: usize, at: f64, details: &str) {
        let prev =
            field(details, "prev_comm=", Some(" prev_pid=")).zip(field(details, "prev_pid=", None));
        let next =
            field(details, "next_comm=", Some(" next_pid=")).zip(field(details, "next_pid=", None));
        let (Some(prev), Some(next)) = (prev, next) else {
            return;
        };
        let next_tid: Option<u32> = next.1.parse().ok();
        let (prev, next) = (self.label(prev.0, prev.1), self.label(next.0, next.1));
        if self.cpu(n).task.is_none() {
            self.cpu(n).task = Some(prev.clone());
        }
        self.credit(n, at);
        // The thread leaving keeps its system call; the one arriving resumes its own.
        let cpu = &mut self.cpus[n];
        if let Some(tid) = cpu.tid {
            match cpu.syscall {
                Some(nr) => self.in_syscall.insert(tid, nr),
                None => self.in_syscall.remove(&tid),
            };
        }
        cpu.tid = next_tid;
        cpu.syscall = next_tid.and_then(|t| self.in_syscall.remove(&t));
        // A wake-up seen while it still ran is over; preempted while runnable, it waits
        // for a CPU from now.
        self.woken.remove(&prev);
        if field(details, "prev_state=", None).is_some_and(|s| s.starts_with('R')) {
            self.woken.insert(prev, at);
        }
        if let Some(since) = self.woken.remove(&next) {
            if at >= self.from && at <= self.to {
                let w = self.waits.entry(next.clone()).or_default();
                w.count += 1;
                w.total += at - since.max(self.from);
                w.longest = w.longest.max(at - since);
            }
        }
        self.cpu(n).task = Some(next);
    }

    fn wakeup(&mut self, at: f64, details: &str) {
        let woken = field(details, "comm=", Some(" pid=")).zip(field(details, "pid=", None));
        if let Some((comm, pid)) = woken {
            let label = self.label(comm, pid);
            self.woken.entry(label).or_insert(at);
        }
    }

    /// CPU `n` enters softirq `action` (`Some`) or leaves it (`None`).
    fn softirq(&mut self, n: usize, at: f64, action: Option<&str>) {
        self.credit(n, at);
        self.cpu(n).softirq = action.map(str::to_owned);
    }

    fn lines(mut self) -> Vec<String> {
        let mut out = Vec::new();
        for n in 0..self.cpus.len() {
            self.credit(n, self.to);
            let mut owners: Vec<(&String, &f64)> = self.cpus[n].owners.iter().collect();
            owners.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
            let shown: Vec<String> = owners
                .iter()
                .take(8)
                .map(|(o, ms)| format!("{o} {ms:.1}"))
                .collect();
            let rest: f64 = owners.iter().skip(8).map(|(_, ms)| **ms).sum();
            let shown = if shown.is_empty() {
                "nothing traced".to_owned()
            } else {
                shown.join(", ")
            };
            let rest = if rest > 0.0 {
                format!(", others {rest:.1}")
            } else {
                String::new()
            };
            let (from, to) = (self.from, self.to);
            out.push(format!("cpu{n} over {from:.0}..{to:.0} ms: {shown}{rest}"));
        }
        let mut waited: Vec<(&String, &Waits)> = self
            .waits
            .iter()
            .filter(|(t, _)| self.is_named(t))
            .collect();
        waited.sort_by(|a, b| b.1.total.total_cmp(&a.1.total).then(a.0.cmp(b.0)));
        for (thread, w) in waited {
            out.push(format!(
                "{thread} waited for a CPU {} times, {:.1} ms in all, longest {:.1}",
                w.count, w.total, w.longest
            ));
        }
        // (total, the line), the busiest thread first.
        let mut busy: Vec<(f64, String)> = self
            .split
            .iter()
            .map(|(thread, by)| {
                let mut by: Vec<(&&str, &f64)> = by.iter().collect();
                by.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
                let total: f64 = by.iter().map(|(_, ms)| **ms).sum();
                let by: Vec<String> = by.iter().map(|(k, ms)| format!("{k} {ms:.1}")).collect();
                let line = if self.saw_syscalls {
                    format!("{thread} on a CPU {total:.1} ms: {}", by.join(", "))
                } else {
                    format!("{thread} on a CPU {total:.1} ms")
                };
                (total, line)
            })
            .collect();
        busy.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        out.extend(busy.into_iter().map(|(_, line)| line));
        out
    }
}

/// The number of a `sys_enter` line's system call (`NR 16 (...)`).
fn syscall_nr(details: &str) -> Option<u32> {
    details.strip_prefix("NR ")?.split(' ').next()?.parse().ok()
}

/// The x86-64 name of system call `nr`, for those a pingpong makes (`other` for the
/// rest): libibverbs' commands to the kernel are `write` and `ioctl` on the uverbs
/// device, the peer channel's and the probes' datagrams `sendto` and `recvfrom`.
fn syscall_name(nr: u32) -> &'static str {
    match nr {
        0 => "read",
        1 => "write",
        7 => "poll",
        16 => "ioctl",
        24 => "sched_yield",
        35 => "nanosleep",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        202 => "futex",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        233 => "epoll_ctl",
        281 => "epoll_pwait",
        284 => "eventfd",
        290 => "eventfd2",
        299 => "recvmmsg",
        307 => "sendmmsg",
        _ => "other",
    }
}

#[test]
fn a_trace_is_summed_per_cpu_and_the_waits_per_thread() {
    // Origin: the marker at 10.000 s is the caller's 100 ms, so 10.050 s is 150 ms.
    let trace = "\
# tracer: nop
           bench-7       [000] .....  10.000000: tracing_mark_write: apm-bench-origin 100.000
          <idle>-0       [001] d..2.  10.010000: sched_wakeup: comm=apm-control pid=42 prio=120 target_cpu=000
     kworker/0:1-9       [000] d..2.  10.020000: sched_switch: prev_comm=kworker/0:1 prev_pid=9 prev_prio=120 prev_state=R ==> next_comm=apm-control next_pid=42 next_prio=120
     apm-control-42      [000] .....  10.025000: sys_enter: NR 16 (3, c0183a01, 7ffd0000, 0, 0, 0)
     apm-control-42      [000] ..s1.  10.030000: softirq_entry: vec=6 [action=TASKLET]
     apm-control-42      [000] ..s1.  10.035000: softirq_exit: vec=6 [action=TASKLET]
     apm-control-42      [000] .....  10.038000: sys_exit: NR 16 = 0
     apm-control-42      [000] d..2.  10.040000: sched_switch: prev_comm=apm-control prev_pid=42 prev_prio=120 prev_state=S ==> next_comm=kworker/0:1 next_pid=9 next_prio=120
";
    let names = BTreeMap::from([(42, "client")]);
    let lines = summarise(&read_events(trace).unwrap(), 105.0, 150.0, &names);
    assert_eq!(
        lines,
        [
            "cpu0 over 105..150 ms: kworker/0:1/9 25.0, client:apm-control/42 15.0, softirq TASKLET 5.0",
            "client:apm-control/42 waited for a CPU 1 times, 10.0 ms in all, longest 10.0",
            "client:apm-control/42 on a CPU 15.0 ms: ioctl 8.0, outside syscalls 7.0",
        ]
    );
    // Without system calls traced, a thread's time is a total, not "outside" them.
    let without: String = trace
        .lines()
        .filter(|l| !l.contains(": sys_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let lines = summarise(&read_events(&without).unwrap(), 105.0, 150.0, &names);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("client:apm-control/42 on a CPU 15.0 ms")
    );
}
