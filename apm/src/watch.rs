//! `apm watch`: user-level port and fabric events (docs/iba-facts.md §2), each once, with
//! the port's state read back after it.
//!
//! Sources:
//! - every RDMA device and port (or those named) through provider-verbs: its QP-control
//!   facet reports the unaffiliated async events (port active/down, LID, SM, P_Key and GID
//!   change, client reregister, device fatal) as engine inputs, and the port is queried
//!   again (`ibv_query_port`: state, LID, SM LID, LMC) when one arrives;
//! - SA notices (trap 64 GID in service, trap 65 GID out of service) through umad-sa on
//!   every active InfiniBand port whose SA answers the subscription; subscribed again
//!   after a client reregister or an SM change (the SA forgot us);
//! - or SA notices alone (`--source sa`, or where libibverbs lists no device but
//!   libibumad lists ports): the umad ports themselves, without libibverbs
//!   ([`sa_only`]); this is how `apm watch` runs on the ibsim bed (`--ibsim-bed`);
//! - or, with `--sim`, the simulated fabric of provider-sim: one `apm_core::Manager` per
//!   watched host, its unaffiliated event stream, in virtual time (a whole scenario
//!   plays in moments), liveness probe verdicts included;
//! - or, with `--agent`, the verdicts of this host's apm agent (`apm run`'s): its
//!   liveness probes' (path down, of which kind, up, held) and operators' rail-downs,
//!   as a watcher attached to its local socket ([`agent`]).
//!
//! Each event is printed once. soft-RoCE (rxe) raises `PORT_ACTIVE` twice for one link
//! up, about 1 ms apart (80 ms seen on a loaded machine): an event identical to the
//! previous event of its port (same device, port and kind, and the same state read back:
//! state, LID, SM LID, LMC, GID) within `--dedup-ms` (default 1000 ms) is dropped. A
//! different event in between (down, then active again) always shows, and so does a
//! repeated kind that changed something (a second LID change to another LID).
//!
//! SIGINT and SIGTERM end the watch cleanly: a running `--exec` command is killed with
//! its process group and everything it started, SA subscriptions are dropped, and apm
//! then ends by that signal. What a command leaves running in its process group when it
//! exits is ended then.
//! Each `--exec` command runs at most `--exec-timeout` seconds (default 10) before it
//! is reported and killed ([`exec`]).
//!
//! This module only observes: it never modifies a port or a QP.

use anyhow::Context as _;
use apm_core::probe::{PathEnds, PathVerdict};
use apm_core::Gid;
use provider_verbs::ffi::{Context, PortState};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

mod agent;
mod devices;
mod exec;
mod kind;
mod sa_only;
mod sim;
mod tree;

pub use kind::EventKind;
#[cfg(test)]
use kind::KINDS;

use devices::watch_devices;
use exec::Stop;

/// Where `apm watch` takes its events from (not with `--sim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// libibverbs when it lists a device; otherwise SA notices alone through the umad
    /// ports, if libibumad lists any.
    Auto,
    /// libibverbs' devices only: port events, and SA notices on their InfiniBand ports.
    Verbs,
    /// SA notices (traps 64/65) alone, through the umad ports (libibumad): no libibverbs,
    /// no port events.
    Sa,
}

/// Arguments of `apm watch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// One JSON object per line instead of human-readable lines.
    #[arg(long)]
    json: bool,
    /// Run this shell command (`sh -c`) for every event, one at a time in event order,
    /// with the event in APM_EVENT, APM_DEVICE, APM_PORT, APM_TIME, APM_STATE, APM_LID,
    /// APM_SM_LID, APM_LMC, APM_GID, APM_SOURCE, and for path events APM_LOCAL_GID,
    /// APM_PEER_GID, APM_PATH_KIND (path_down: local_port, peer_port or fabric) and
    /// APM_HOLD_MS (path_held) (unknown values are empty). What it leaves running in its
    /// process group (`cmd &`) is ended when it exits; start a daemon with setsid.
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// Kill an `--exec` command (its whole process group) that runs longer than this
    /// many seconds, and say so; the next event's command then runs.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = crate::values::seconds)]
    exec_timeout: f64,
    /// Only this device (repeatable). In `--sim`, devices are hosts: h0, h1, ...; with
    /// SA notices alone, libibumad's CA names (`ibsim0` under the simulator).
    #[arg(long = "device", value_name = "NAME")]
    devices: Vec<String>,
    /// Only this port number (repeatable). Events without a port (device fatal, SA
    /// notices in `--sim`) always pass. With SA notices alone, subscribes only through
    /// these ports.
    #[arg(long = "port", value_name = "N")]
    ports: Vec<u8>,
    /// Only events of this kind (repeatable, or comma-separated): port_active, port_down,
    /// lid_change, sm_change, client_reregister, pkey_change, gid_change, device_fatal,
    /// gid_in_service, gid_out_of_service, path_down, path_up, path_held, rail_down.
    #[arg(long = "event", value_name = "KIND", value_delimiter = ',', value_parser = EventKind::parse)]
    events: Vec<EventKind>,
    /// Watch the simulated fabric instead of this machine's devices (works anywhere).
    #[arg(long)]
    sim: bool,
    /// With `--sim`: the scenario (TOML, see provider-sim/scenarios/). Default: the
    /// built-in dual-rail scenario.
    #[arg(long, value_name = "FILE", requires = "sim")]
    scenario: Option<PathBuf>,
    /// With `--sim`: the simulation's seed.
    #[arg(long, default_value_t = 1, requires = "sim")]
    seed: u64,
    /// Where events come from (not with `--sim`).
    #[arg(long, value_enum, default_value_t = Source::Auto, conflicts_with = "sim")]
    source: Source,
    /// Watch this host's apm agent (`apm run`'s, or `apm agent`): every verdict it
    /// makes, its liveness probes' (path_down with the kind, path_up, path_held) and
    /// operators' rail_down. Nothing changes for the protected programs.
    #[arg(long, conflicts_with_all = ["sim", "source", "no_sa", "ibsim_bed"])]
    agent: bool,
    /// With `--agent`: the agent's peer port (`apm agent --port`, or `[lap] udp_listen`'s).
    #[arg(long, value_name = "PORT", default_value_t = apm_agent::DEFAULT_PEER_PORT, requires = "agent")]
    agent_port: u16,
    /// With `--agent`: the directory of the agent's socket (`[agent] runtime_dir`;
    /// default /run/apm, or this user's own when root's agent is not there).
    #[arg(long, value_name = "DIR", env = "APM_RUNTIME_DIR", requires = "agent")]
    runtime_dir: Option<std::path::PathBuf>,
    /// Do not subscribe for SA notices (traps 64/65).
    #[arg(long)]
    no_sa: bool,
    /// For the ibsim test bed of `cargo xtask ibsim` only, and refused anywhere else
    /// (libumad2sim.so must be preloaded and APM_IBSIM_SOCKNAME set): SA notices alone,
    /// the umad ports opened as a NOT_ACTIVE SM so that the simulator delivers Reports.
    #[arg(long, conflicts_with_all = ["sim", "no_sa"])]
    ibsim_bed: bool,
    /// Drop an event identical to the previous one of its port (same kind, same state
    /// read back) within this many ms: rxe's double PORT_ACTIVE.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    dedup_ms: u64,
    /// Stop after this many events (after filtering).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop after this many seconds (virtual seconds with `--sim`, which otherwise ends
    /// with its scenario).
    #[arg(long, value_name = "SECS", value_parser = crate::values::seconds)]
    timeout: Option<f64>,
}

/// An event as a source saw it, before read-back, filters and de-duplication.
#[derive(Clone, Debug)]
struct Raw {
    device: String,
    port: Option<u8>,
    kind: EventKind,
    /// The remote GID of an SA notice (the address of a rail-down).
    gid: Option<Gid>,
    /// The path and the verdict of a path event.
    path: Option<(PathEnds, PathVerdict)>,
    source: &'static str,
}

/// A port's state read back after an event.
#[derive(Clone, Debug, Default, PartialEq)]
struct PortNow {
    state: Option<String>,
    lid: Option<u16>,
    sm_lid: Option<u16>,
    lmc: Option<u8>,
    gid: Option<Gid>,
}

/// One output line.
#[derive(Debug, Serialize)]
struct Line {
    /// RFC 3339 UTC for devices; `+SECONDS` of virtual time for `--sim`.
    time: String,
    /// Since the watch started (virtual with `--sim`).
    elapsed_ms: f64,
    event: &'static str,
    device: String,
    port: Option<u8>,
    state: Option<String>,
    lid: Option<u16>,
    sm_lid: Option<u16>,
    lmc: Option<u8>,
    /// The remote GID of an SA notice, else the port's GID 0.
    gid: Option<String>,
    /// Path events: this host's GID on the path.
    #[serde(skip_serializing_if = "Option::is_none")]
    local_gid: Option<String>,
    /// Path events: the peer's GID on the path.
    #[serde(skip_serializing_if = "Option::is_none")]
    peer_gid: Option<String>,
    /// path_down: local_port, peer_port or fabric.
    #[serde(skip_serializing_if = "Option::is_none")]
    path_kind: Option<&'static str>,
    /// path_held: how long the path is held, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_ms: Option<u64>,
    /// verbs, sa, sim or agent.
    source: &'static str,
}

/// Run `apm watch`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.sim {
        sim::watch(&args)
    } else {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?;
        rt.block_on(async {
            let stop = Stop::install().context("handling signals")?;
            if args.agent {
                agent::watch(&args, stop).await
            } else {
                watch_devices(&args, stop).await
            }
        })
    }
}

/// Filters, de-duplication, output and `--exec`, shared by every source.
struct Sink<'a> {
    args: &'a Args,
    /// Per (device, port): the last event kind and when.
    last: BTreeMap<(String, Option<u8>), (EventKind, PortNow, Duration)>,
    shown: u64,
    stop: Stop,
    /// Whether standard output still takes the events.
    output: Output,
}

/// Standard output, as the watch last found it.
#[derive(Debug)]
enum Output {
    /// Writable.
    Open,
    /// Closed by its reader: the watch ends as a filter does.
    Closed,
    /// Failed otherwise (a full disk): the watch ends with that error.
    Failed(anyhow::Error),
}

impl<'a> Sink<'a> {
    fn new(args: &'a Args, stop: Stop) -> Self {
        Sink {
            args,
            last: BTreeMap::new(),
            shown: 0,
            stop,
            output: Output::Open,
        }
    }

    /// After the watch cleaned up: end by the signal that stopped it, or by SIGPIPE's
    /// convention when standard output was closed.
    fn finish(self) -> anyhow::Result<()> {
        if let Some(sig) = self.stop.signal() {
            exec::die_of(sig);
        }
        match self.output {
            Output::Open => Ok(()),
            Output::Closed => Err(crate::out::StdoutClosed.into()),
            Output::Failed(e) => Err(e),
        }
    }

    fn passes(&self, raw: &Raw) -> bool {
        let a = self.args;
        (a.devices.is_empty() || a.devices.contains(&raw.device))
            && (a.ports.is_empty() || raw.port.is_none_or(|p| a.ports.contains(&p)))
            && (a.events.is_empty() || a.events.contains(&raw.kind))
    }

    /// True when this is a repeat of its port's previous event (same kind, same state
    /// read back) within the window.
    fn duplicate(&mut self, raw: &Raw, now: &PortNow, elapsed: Duration) -> bool {
        // SA notices de-duplicate on the GID they are about (two ports of a device on
        // one subnet both receive the Report), path events on their path.
        let key = match (raw.path, raw.gid) {
            (Some((e, _)), _) => (
                format!("{} path {} {}", raw.device, e.local, e.remote),
                None,
            ),
            (None, Some(g)) => (format!("{} gid {g}", raw.device), None),
            (None, None) => (raw.device.clone(), raw.port),
        };
        let window = Duration::from_millis(self.args.dedup_ms);
        let dup = self.last.get(&key).is_some_and(|(k, n, t)| {
            *k == raw.kind && n == now && elapsed.saturating_sub(*t) <= window
        });
        self.last.insert(key, (raw.kind, now.clone(), elapsed));
        dup
    }

    /// Handle one event; false once `--count` events were shown.
    async fn event(&mut self, raw: Raw, now: PortNow, time: String, elapsed: Duration) -> bool {
        if self.duplicate(&raw, &now, elapsed) {
            tracing::debug!(
                device = raw.device,
                port = raw.port,
                kind = raw.kind.name(),
                "duplicate dropped"
            );
            return true;
        }
        if !self.passes(&raw) {
            return true;
        }
        let verdict = raw.path.map(|(_, v)| v);
        let line = Line {
            time,
            elapsed_ms: elapsed.as_secs_f64() * 1000.0,
            event: raw.kind.name(),
            device: raw.device,
            port: raw.port,
            state: now.state,
            lid: now.lid,
            sm_lid: now.sm_lid,
            lmc: now.lmc,
            gid: raw.gid.or(now.gid).map(|g| g.to_string()),
            local_gid: raw.path.map(|(e, _)| e.local.to_string()),
            peer_gid: raw.path.map(|(e, _)| e.remote.to_string()),
            path_kind: verdict.and_then(PathVerdict::failure).map(|k| k.name()),
            hold_ms: match verdict {
                Some(PathVerdict::Held { hold_ms }) => Some(hold_ms),
                _ => None,
            },
            source: raw.source,
        };
        let text = if self.args.json {
            // A struct of strings and numbers always serializes.
            serde_json::to_string(&line).unwrap_or_default()
        } else {
            human(&line)
        };
        if let Err(e) = crate::out::outln!("{text}") {
            // A closed stdout (`apm watch | head`) ends the watch as it ends a filter;
            // any other failure ends it with the error.
            self.output = if crate::out::is_stdout_closed(&e) {
                Output::Closed
            } else {
                Output::Failed(e)
            };
            return false;
        }
        if let Some(cmd) = &self.args.exec {
            let what = format!("{} {}", line.event, line.device);
            let limit = Duration::from_secs_f64(self.args.exec_timeout);
            let ended = exec::run(
                cmd,
                exec_env(&line),
                what,
                limit,
                self.stop.clone(),
                self.args.json,
            )
            .await;
            if ended == exec::Ended::Stopped {
                return false;
            }
        }
        self.shown += 1;
        self.stop.signal().is_none() && self.args.count.is_none_or(|n| self.shown < n)
    }
}

fn human(l: &Line) -> String {
    let mut s = format!("{} {}", l.time, l.device);
    if let Some(p) = l.port {
        s += &format!(" port {p}");
    }
    s += &format!(" {}", l.event);
    let opt = |v: Option<u16>| v.map_or("-".to_owned(), |v| v.to_string());
    if l.state.is_some() || l.lid.is_some() {
        s += &format!(
            " state={} lid={} sm_lid={} lmc={}",
            l.state.as_deref().unwrap_or("-"),
            opt(l.lid),
            opt(l.sm_lid),
            l.lmc.map_or("-".to_owned(), |v| v.to_string())
        );
    }
    match (&l.local_gid, &l.peer_gid, &l.gid) {
        // A path's local GID is its port's: said once.
        (Some(local), Some(peer), _) => s += &format!(" local={local} peer={peer}"),
        (_, _, Some(g)) => s += &format!(" gid={g}"),
        _ => {}
    }
    if let Some(k) = l.path_kind {
        s += &format!(" kind={k}");
    }
    if let Some(ms) = l.hold_ms {
        s += &format!(" hold_ms={ms}");
    }
    s += &format!(" ({})", l.source);
    s
}

/// The environment of an event's `--exec` command.
fn exec_env(l: &Line) -> Vec<(&'static str, String)> {
    let opt = |v: Option<String>| v.unwrap_or_default();
    vec![
        ("APM_EVENT", l.event.to_owned()),
        ("APM_DEVICE", l.device.clone()),
        ("APM_PORT", opt(l.port.map(|p| p.to_string()))),
        ("APM_TIME", l.time.clone()),
        ("APM_STATE", opt(l.state.clone())),
        ("APM_LID", opt(l.lid.map(|v| v.to_string()))),
        ("APM_SM_LID", opt(l.sm_lid.map(|v| v.to_string()))),
        ("APM_LMC", opt(l.lmc.map(|v| v.to_string()))),
        ("APM_GID", opt(l.gid.clone())),
        ("APM_SOURCE", l.source.to_owned()),
        ("APM_LOCAL_GID", opt(l.local_gid.clone())),
        ("APM_PEER_GID", opt(l.peer_gid.clone())),
        ("APM_PATH_KIND", opt(l.path_kind.map(str::to_owned))),
        ("APM_HOLD_MS", opt(l.hold_ms.map(|v| v.to_string()))),
    ]
}

fn port_state_name(s: PortState) -> String {
    match s {
        PortState::Nop => "nop".into(),
        PortState::Down => "down".into(),
        PortState::Init => "init".into(),
        PortState::Armed => "armed".into(),
        PortState::Active => "active".into(),
        PortState::ActiveDefer => "active_defer".into(),
        PortState::Other(v) => format!("unknown({v})"),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
}

/// The port read back through verbs (`ibv_query_port`, GID 0).
fn read_back(ctx: &Context, port: u8) -> PortNow {
    match ctx.query_port(port) {
        Ok(p) => PortNow {
            state: Some(port_state_name(p.state)),
            lid: Some(p.lid),
            sm_lid: Some(p.sm_lid),
            lmc: Some(p.lmc),
            gid: ctx.query_gid(port, 0).ok().flatten().map(|g| Gid(g.gid)),
        },
        Err(e) => {
            tracing::warn!(device = ctx.name(), port, error = %e, "query_port after the event failed");
            PortNow::default()
        }
    }
}

/// Wall-clock time as RFC 3339 UTC with milliseconds.
#[allow(clippy::disallowed_methods)] // the watcher stamps real events with real time
fn wall_clock() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d)
}

/// `d` after the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (days to civil date:
/// Howard Hinnant's algorithm).
fn rfc3339(d: Duration) -> String {
    let secs = d.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(Duration::from_millis(1_795_000_000_123)),
            "2026-11-18T11:06:40.123Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn repeats_are_dropped_only_when_nothing_changed_within_the_window() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            watch: Args,
        }
        let args = <Cli as clap::Parser>::try_parse_from(["watch"])
            .expect("defaults")
            .watch;
        let mut sink = Sink::new(&args, Stop::never());
        let raw = |kind| Raw {
            device: "rxe0".into(),
            port: Some(1),
            kind,
            gid: None,
            path: None,
            source: "verbs",
        };
        let at = |lid: u16| PortNow {
            state: Some("active".into()),
            lid: Some(lid),
            ..PortNow::default()
        };
        let ms = Duration::from_millis;
        // rxe's second PORT_ACTIVE, even 80 ms later: dropped.
        assert!(!sink.duplicate(&raw(EventKind::PortActive), &at(0), ms(0)));
        assert!(sink.duplicate(&raw(EventKind::PortActive), &at(0), ms(80)));
        // Down then active again: both show.
        assert!(!sink.duplicate(&raw(EventKind::PortDown), &at(0), ms(100)));
        assert!(!sink.duplicate(&raw(EventKind::PortActive), &at(0), ms(120)));
        // Two LID changes to different LIDs: both show; the same LID again does not.
        assert!(!sink.duplicate(&raw(EventKind::LidChange), &at(5), ms(200)));
        assert!(!sink.duplicate(&raw(EventKind::LidChange), &at(7), ms(210)));
        assert!(sink.duplicate(&raw(EventKind::LidChange), &at(7), ms(220)));
        // Outside the window an identical event shows again.
        assert!(!sink.duplicate(&raw(EventKind::LidChange), &at(7), ms(5000)));
    }

    #[test]
    fn event_kinds_parse_in_either_spelling() {
        assert_eq!(EventKind::parse("port-down"), Ok(EventKind::PortDown));
        assert_eq!(
            EventKind::parse("GID_OUT_OF_SERVICE"),
            Ok(EventKind::GidOutOfService)
        );
        assert!(EventKind::parse("port_up")
            .unwrap_err()
            .contains("port_active"));
        for k in KINDS {
            assert_eq!(EventKind::parse(k.name()), Ok(k));
        }
    }
}
