//! The deployment configuration: one TOML file that says which devices and ports apm
//! protects through which providers, how it learns remote failures (SA subscription),
//! how LAP/APR travel, and the engine's policy knobs.
//!
//! Parsing never panics and never guesses: unknown keys are errors, every error carries
//! the line and column of the key or value it is about and names the key, and every
//! problem in a file is reported, not only the first (`config/read.rs` reads each table alone).
//! A file's references to other files (the `[sim]` scenario, the peer key) are looked
//! at by [`Config::check_files`], which `apm config check` runs too.
//!
//! ```toml
//! [[device]]
//! name = "mlx5_0"
//! provider = "verbs"        # verbs (hardware APM) | rxe (RoCE, software) | sim
//! ports = [1, 2]            # empty or absent: every port
//!
//! [sa]
//! subscribe = true          # traps 64/65 through every InfiniBand port in use
//!
//! [lap]
//! transport = "vendor"      # vendor (default on IB) | cm | udp (default on RoCE)
//! # key_file = "/etc/apm/peer.key"  # udp, vendor: authenticate peer messages (cm-lap's auth)
//! # require_auth = true             # with key_file: drop unauthenticated messages
//!
//! [policy]
//! lap_timeout_ms = 100      # any apm_core::Policy field; see its docs for defaults
//!
//! [agent]                   # the host agent of `apm run` (`apm agent`)
//! # runtime_dir = "/run/apm"     # its socket's directory (root's default)
//! # socket_group = "apm"         # who may reach it: the socket's group ...
//! # socket_mode = 0o660          # ... and mode (0o666: every local user)
//! # operator_group = "apm-ops"   # may report rails down and watch every verdict
//! # user = "apm"                 # the user it runs as, when not root
//! ```

use apm_core::{Gid, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use toml::Spanned;
use toml_located::Collector;

mod agent;
mod read;
pub mod reference;

pub use agent::{AgentAccess, AgentSection};

/// A whole deployment.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Devices to protect connections on (`[[device]]` tables).
    #[serde(default, rename = "device")]
    pub devices: Vec<DeviceConfig>,
    /// Subnet administrator use.
    #[serde(default)]
    pub sa: SaConfig,
    /// How LAP/APR (and software-migration messages) travel.
    #[serde(default)]
    pub lap: LapConfig,
    /// The engine's knobs (`apm_core::Policy`; missing keys take its defaults).
    pub policy: Option<Policy>,
    /// The simulated fabric, for `provider = "sim"` devices.
    #[serde(default)]
    pub sim: SimConfig,
    /// The host agent of `apm run`.
    #[serde(default)]
    pub agent: AgentSection,
}

/// The `[sim]` table: the simulated fabric a `provider = "sim"` deployment runs on. Its
/// devices are the scenario's hosts, `h0`, `h1`, ...
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// A provider-sim scenario file (TOML); absent: the built-in dual-rail scenario.
    /// Relative paths are taken from the current directory.
    #[schemars(with = "Option<String>")]
    pub scenario: Option<Spanned<String>>,
    /// The simulation's seed. Default 1.
    pub seed: Option<u64>,
}

/// The scenario host a simulated device names (`h3` -> 3).
pub fn sim_host(name: &str) -> Option<usize> {
    let n = name.strip_prefix('h')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Which provider crate drives a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Hardware APM through libibverbs (provider-verbs): an InfiniBand HCA, or a RoCE
    /// device whose kernel accepts alternate paths (the patched soft-RoCE of
    /// `kernel/rxe-apm`; LAP/APR then go over `udp`).
    Verbs,
    /// Soft-RoCE or any RoCE device: software path migration (provider-rxe).
    Rxe,
    /// The built-in simulated fabric (provider-sim).
    Sim,
}

/// One `[[device]]` table.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// The RDMA device name (`ibv_devices`), e.g. `mlx5_0` or `rxe0`.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// The provider that drives it.
    #[schemars(with = "ProviderKind")]
    pub provider: Spanned<ProviderKind>,
    /// Ports to use (1-based). Empty: every port of the device.
    #[schemars(with = "Option<Vec<u8>>")]
    pub ports: Option<Spanned<Vec<u8>>>,
}

/// The `[sa]` table.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SaConfig {
    /// Subscribe for traps 64/65 (remote GID in/out of service). Default true.
    pub subscribe: bool,
    /// Ask the SA for paths when a connection runs out of candidates. Default true.
    pub resolve_paths: bool,
}

impl Default for SaConfig {
    fn default() -> SaConfig {
        SaConfig {
            subscribe: true,
            resolve_paths: true,
        }
    }
}

/// How LAP/APR travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LapTransport {
    /// A vendor MAD class with apm's OUI: works next to a stock kernel, whose ib_cm owns
    /// CM class 0x07 (and would swallow LAPs there). The default on InfiniBand.
    Vendor,
    /// CM class 0x07 itself: only where no kernel CM holds the class (simulated fabrics,
    /// ibsim beds, kernels without ib_cm).
    Cm,
    /// UDP datagrams: RoCE, where MADs to the CM are dropped. The default on RoCE.
    Udp,
}

/// The `[lap]` table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LapConfig {
    /// The transport; absent: vendor on InfiniBand, udp on RoCE.
    #[schemars(with = "Option<LapTransport>")]
    pub transport: Option<Spanned<LapTransport>>,
    /// Vendor class for `vendor` (0x30..=0x4F, classes with an OUI). Default 0x30.
    #[schemars(with = "Option<u8>")]
    pub vendor_class: Option<Spanned<u8>>,
    /// OUI for `vendor` (24 bits). Default: apm's own, 0x024150 (locally administered;
    /// the same on every node of a deployment).
    #[schemars(with = "Option<u32>")]
    pub oui: Option<Spanned<u32>>,
    /// Address to listen on for `udp`.
    #[schemars(with = "Option<SocketAddr>")]
    pub udp_listen: Option<Spanned<SocketAddr>>,
    /// Where each peer GID listens, for `udp` (`[[lap.peer]]` tables).
    #[serde(default, rename = "peer")]
    pub peers: Vec<UdpPeer>,
    /// For `udp` and `vendor`: a file holding the deployment's shared secret; every
    /// datagram or vendor MAD then carries a MAC and a sequence number under it
    /// (cm-lap's `auth`, `auth_mad`). Must be readable by its owner only. The CM class
    /// has no room for it.
    #[schemars(with = "Option<String>")]
    pub key_file: Option<Spanned<String>>,
    /// With `key_file`: drop messages without a valid MAC (default true). False accepts
    /// unauthenticated peers too, while a deployment moves to keys node by node.
    #[schemars(with = "Option<bool>")]
    pub require_auth: Option<Spanned<bool>>,
}

/// A `[[lap.peer]]` table: a peer's GID and UDP address.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UdpPeer {
    /// The peer port's GID (RoCE GIDs derive from its IP address); checked as it is
    /// read, so that a peer with a bad address too has both reported.
    #[serde(deserialize_with = "gid_text")]
    #[schemars(with = "String")]
    pub gid: Spanned<String>,
    /// Where its apm listens.
    #[schemars(with = "SocketAddr")]
    pub addr: Spanned<SocketAddr>,
}

/// A GID in IPv6 notation, refused as it is read.
fn gid_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Spanned<String>, D::Error> {
    let text = Spanned::<String>::deserialize(d)?;
    if text.get_ref().parse::<Gid>().is_err() {
        return Err(serde::de::Error::custom(format!(
            "{:?} is not a GID (IPv6 notation)",
            crate::input::truncate_echo(text.get_ref(), 80)
        )));
    }
    Ok(text)
}

/// A configuration problem, located in the file: its line and column (0 when it has
/// no place), the dotted key it is about, and what is wrong.
pub type ConfigError = toml_located::Problem;

/// Every problem [`Config::parse`] found, in file order. Prints one per line; indexes
/// and iterates as a slice of [`ConfigError`].
pub type ConfigErrors = toml_located::Problems;

/// The longest device name libibverbs has (`IBV_SYSFS_NAME_MAX`).
const DEVICE_NAME_MAX: usize = 64;

/// Why a device name cannot be one, if it cannot.
fn bad_device_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("device name is empty".into());
    }
    if name.len() >= DEVICE_NAME_MAX {
        return Some(format!(
            "device name is {} bytes long; RDMA device names have at most {} bytes",
            name.len(),
            DEVICE_NAME_MAX - 1
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || *c == '/' || c.is_whitespace())
    {
        return Some(format!(
            "device name {:?} contains {c:?}: RDMA device names have no control characters, \
             spaces or '/'",
            crate::input::truncate_echo(name, 80)
        ));
    }
    None
}

/// The RoCE/InfiniBand default transport for a set of devices.
fn default_transport(devices: &[DeviceConfig]) -> LapTransport {
    if devices
        .iter()
        .any(|d| *d.provider.get_ref() == ProviderKind::Rxe)
    {
        LapTransport::Udp
    } else {
        LapTransport::Vendor
    }
}

impl Config {
    /// Parse and check a configuration. Every problem is reported, not only the first;
    /// a syntax error stops at itself (what follows it cannot be read).
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        let mut errors = Collector::new(text);
        let config = read::read(text, &mut errors).map(|(c, declared)| {
            c.check(declared, &mut errors);
            c
        });
        match config {
            Some(c) if errors.is_empty() => Ok(c),
            _ => Err(errors.into_problems()),
        }
    }

    /// Check what the configuration names outside itself: the `[sim]` scenario file
    /// is a file and a valid scenario (its problems at this file's `scenario` line, each
    /// with the scenario's own line), the `[lap] key_file` holds a usable key that no one else can
    /// read. `text` is the configuration the spans refer to.
    pub fn check_files(&self, text: &str) -> ConfigErrors {
        let mut errors = Collector::new(text);
        if let Some(s) = &self.sim.scenario {
            let path = std::path::Path::new(s.get_ref());
            match std::fs::metadata(path) {
                // A regular file only: opening a FIFO nobody writes would wait for ever.
                Ok(m) if m.is_file() => match crate::scenario_file::read(path) {
                    Ok(_) => {}
                    Err(crate::scenario_file::ScenarioFileError::Invalid { path, problems }) => {
                        for p in &problems {
                            errors.push(Some(s.span()), "sim.scenario", &format!("{path}:{p}"));
                        }
                    }
                    Err(e) => errors.push(Some(s.span()), "sim.scenario", &e.to_string()),
                },
                Ok(_) => errors.push(Some(s.span()), "sim.scenario", "is not a regular file"),
                Err(e) => errors.push(
                    Some(s.span()),
                    "sim.scenario",
                    &format!("cannot read {}: {e}", path.display()),
                ),
            }
        }
        if let Some(k) = &self.lap.key_file {
            if let Err(e) = cm_lap::auth::Key::from_file(std::path::Path::new(k.get_ref())) {
                errors.push(Some(k.span()), "lap.key_file", &e.to_string());
            }
        }
        errors.into_problems()
    }

    /// The LAP transport in force (explicit or the default for the devices).
    pub fn lap_transport(&self) -> LapTransport {
        self.lap
            .transport
            .as_ref()
            .map_or_else(|| default_transport(&self.devices), |t| *t.get_ref())
    }

    /// The peer channel's authentication (UDP or vendor MADs): none without `key_file`;
    /// with it, the key
    /// read (and its file checked) now, and unauthenticated datagrams refused unless
    /// `require_auth = false`.
    pub fn peer_auth(&self) -> Result<cm_lap::auth::Mode, cm_lap::auth::KeyError> {
        use cm_lap::auth::{Key, Mode};
        let Some(file) = &self.lap.key_file else {
            return Ok(Mode::Off);
        };
        let key = Key::from_file(std::path::Path::new(file.get_ref()))?;
        let require = self.lap.require_auth.as_ref().is_none_or(|r| *r.get_ref());
        Ok(if require {
            Mode::Require(key)
        } else {
            Mode::AcceptUnauthenticated(key)
        })
    }

    /// The engine policy with the `[sa]` switches applied.
    pub fn engine_policy(&self) -> Policy {
        let mut p = self.policy.clone().unwrap_or_default();
        p.subscribe = p.subscribe && self.sa.subscribe;
        p.resolve_paths = p.resolve_paths && self.sa.resolve_paths;
        p
    }

    /// The semantic checks: values that parse but cannot work, alone or together.
    /// `declared`: the file has `[[device]]` tables (some may not have been read).
    fn check(&self, declared: bool, errors: &mut Collector<'_>) {
        let mut at = |span: Option<std::ops::Range<usize>>, key: &str, message: String| {
            errors.push(span, key, &message);
        };
        if !declared {
            at(
                None,
                "",
                "no [[device]] table: name at least one device to protect connections on".into(),
            );
        }
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        let first_kind = self.devices.first().map(|d| (d, *d.provider.get_ref()));
        for (i, d) in self.devices.iter().enumerate() {
            let key = |k: &str| format!("device[{}].{k}", i + 1);
            let name = d.name.get_ref();
            if let Some(why) = bad_device_name(name) {
                at(Some(d.name.span()), &key("name"), why);
            } else if let Some(first) = names.insert(name, i) {
                at(
                    Some(d.name.span()),
                    &key("name"),
                    format!(
                        "device {name:?} is listed twice (first as device[{}])",
                        first + 1
                    ),
                );
            }
            let kind = *d.provider.get_ref();
            let sim = kind == ProviderKind::Sim;
            if sim && bad_device_name(name).is_none() && sim_host(name).is_none() {
                at(
                    Some(d.name.span()),
                    &key("name"),
                    format!("simulated device {name:?}: name a scenario host, h0, h1, ..."),
                );
            }
            match first_kind {
                Some((_, k)) if (k == ProviderKind::Sim) != sim => at(
                    Some(d.provider.span()),
                    &key("provider"),
                    "simulated and real devices cannot be mixed in one deployment".into(),
                ),
                Some((o, k)) if k != kind => at(
                    Some(d.provider.span()),
                    &key("provider"),
                    format!(
                        "device {:?} is {:?} but {:?} is {:?}: one provider kind per \
                         deployment (run one apm per kind)",
                        name,
                        kind,
                        o.name.get_ref(),
                        k
                    ),
                ),
                _ => {}
            }
            if let Some(ports) = &d.ports {
                if ports.get_ref().contains(&0) {
                    at(
                        Some(ports.span()),
                        &key("ports"),
                        "port numbers start at 1".into(),
                    );
                }
            }
        }
        self.check_lap(&mut at);
        self.check_agent(&mut at);
    }

    /// `[lap]`: the transport against the devices, its own values, the peers.
    fn check_lap(&self, at: &mut impl FnMut(Option<std::ops::Range<usize>>, &str, String)) {
        let lap = &self.lap;
        let transport = self.lap_transport();
        let roce = self
            .devices
            .iter()
            .find(|d| *d.provider.get_ref() == ProviderKind::Rxe);
        // Where a problem of the transport is: the transport key if there is one, else
        // the device that made it the default.
        let transport_at = |fallback: Option<&DeviceConfig>| {
            if let Some(t) = &lap.transport {
                return (Some(t.span()), "lap.transport".to_owned());
            }
            let device = fallback.and_then(|d| {
                let i = self.devices.iter().position(|o| std::ptr::eq(o, d))?;
                Some((
                    Some(d.provider.span()),
                    format!("device[{}].provider", i + 1),
                ))
            });
            device.unwrap_or((None, "lap.transport".to_owned()))
        };
        if let (Some(d), LapTransport::Vendor | LapTransport::Cm) = (roce, transport) {
            let (span, key) = transport_at(Some(d));
            at(
                span,
                &key,
                format!(
                    "device {:?} is RoCE: MADs cannot carry LAPs there; use transport = \"udp\"",
                    d.name.get_ref()
                ),
            );
        }
        check_lap_numbers(lap, at);
        // `verbs` devices with `udp` are hardware APM on RoCE; whether they are RoCE is
        // known only at start (InfiniBand ones are refused there, with the reason).
        if transport == LapTransport::Udp && lap.udp_listen.is_none() {
            let (span, key) = transport_at(roce);
            let why = match &lap.transport {
                Some(_) => "the udp transport",
                None => "this RoCE device's peer messages travel over UDP, which",
            };
            at(
                span,
                &key,
                format!("{why} needs udp_listen = \"ADDRESS:PORT\" in [lap]"),
            );
        }
        check_lap_auth(lap, transport, at);
    }
}

/// `[lap]`'s vendor class and OUI.
fn check_lap_numbers(
    lap: &LapConfig,
    at: &mut impl FnMut(Option<std::ops::Range<usize>>, &str, String),
) {
    if let Some(c) = &lap.vendor_class {
        if !(0x30..=0x4F).contains(c.get_ref()) {
            at(
                Some(c.span()),
                "lap.vendor_class",
                format!(
                    "{:#04x} is not a vendor class with an OUI (0x30..=0x4f)",
                    c.get_ref()
                ),
            );
        }
    }
    if let Some(o) = &lap.oui {
        if *o.get_ref() > 0xFF_FFFF {
            at(
                Some(o.span()),
                "lap.oui",
                format!("{:#x} does not fit in 24 bits (3 bytes)", o.get_ref()),
            );
        }
    }
}

/// Peer authentication belongs to the UDP transport, and `require_auth` needs a key.
fn check_lap_auth(
    lap: &LapConfig,
    transport: LapTransport,
    at: &mut impl FnMut(Option<std::ops::Range<usize>>, &str, String),
) {
    if transport == LapTransport::Cm {
        for (k, span) in [
            ("lap.key_file", lap.key_file.as_ref().map(Spanned::span)),
            (
                "lap.require_auth",
                lap.require_auth.as_ref().map(Spanned::span),
            ),
        ] {
            if let Some(span) = span {
                at(
                    Some(span),
                    k,
                    "peer authentication is for transport = \"udp\" and \"vendor\"; \
                     the CM class has no room for it (use transport = \"vendor\")"
                        .into(),
                );
            }
        }
    } else if let (None, Some(r)) = (&lap.key_file, &lap.require_auth) {
        if *r.get_ref() {
            at(
                Some(r.span()),
                "lap.require_auth",
                "require_auth needs key_file = \"PATH\" (the shared secret)".into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match Config::parse(text) {
            Ok(_) => vec![],
            Err(es) => es.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn a_full_infiniband_config_parses_with_defaults() {
        let c = Config::parse(
            "[[device]]\nname = \"mlx5_0\"\nprovider = \"verbs\"\nports = [1, 2]\n\n[policy]\nlap_timeout_ms = 250\n",
        )
        .expect("valid");
        assert_eq!(c.lap_transport(), LapTransport::Vendor);
        assert_eq!(c.engine_policy().lap_timeout_ms, 250);
        assert_eq!(
            c.engine_policy().lap_max_tries,
            Policy::default().lap_max_tries
        );
    }

    #[test]
    fn roce_defaults_to_udp_and_needs_a_listen_address() {
        let text = "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n";
        assert_eq!(
            errors(text),
            [
                "line 3, column 12: device[1].provider: this RoCE device's peer messages travel \
              over UDP, which needs udp_listen = \"ADDRESS:PORT\" in [lap]"
            ]
        );
        let ok = format!("{text}[lap]\nudp_listen = \"0.0.0.0:18515\"\n");
        assert_eq!(
            Config::parse(&ok).expect("valid").lap_transport(),
            LapTransport::Udp
        );
    }

    #[test]
    fn udp_on_verbs_devices_is_left_to_the_start() {
        // Hardware APM on RoCE carries LAP/APR over UDP; on InfiniBand the start refuses
        // it (the link layer is known only there).
        let c = Config::parse(
            "[[device]]\nname = \"rxe0\"\nprovider = \"verbs\"\n[lap]\ntransport = \"udp\"\nudp_listen = \"0.0.0.0:1\"\n",
        )
        .expect("valid");
        assert_eq!(c.lap_transport(), LapTransport::Udp);
        let es = errors(
            "[[device]]\nname = \"rxe0\"\nprovider = \"verbs\"\n[lap]\ntransport = \"udp\"\n",
        );
        assert!(es[0].contains("udp_listen"), "{es:?}");
    }

    #[test]
    fn errors_point_at_their_line() {
        let text = "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n\n[lap]\ntransport = \"vendor\"\nvendor_class = 0x20\n";
        let es = errors(text);
        assert!(
            es.iter()
                .any(|e| e.starts_with("line 6") && e.contains("use transport = \"udp\"")),
            "{es:?}"
        );
        assert!(
            es.iter()
                .any(|e| e.starts_with("line 7") && e.contains("0x30..=0x4f")),
            "{es:?}"
        );
    }

    #[test]
    fn verbs_and_rxe_devices_are_not_mixed() {
        let es = errors(
            "[[device]]\nname = \"mlx5_0\"\nprovider = \"verbs\"\n[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n[lap]\ntransport = \"udp\"\nudp_listen = \"0.0.0.0:1\"\n",
        );
        assert!(
            es.iter()
                .any(|e| e.starts_with("line 6") && e.contains("one provider kind per deployment")),
            "{es:?}"
        );
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        let es = errors(
            "[[device]]\nname = \"mlx5_0\"\nprovider = \"verbs\"\n[policy]\nlap_timout_ms = 5\n",
        );
        assert!(
            es[0].starts_with("line 5") && es[0].contains("unknown field"),
            "{es:?}"
        );
        let es = errors("[[device]]\nname = \"mlx5_0\"\nprovider = \"infiniband\"\n");
        assert!(
            es[0].starts_with("line 3") && es[0].contains("unknown variant"),
            "{es:?}"
        );
        let es =
            errors("[[device]]\nname = \"a\"\nprovider = \"verbs\"\n[policy]\nlap_max_tries = 0\n");
        assert!(es[0].contains("lap_max_tries"), "{es:?}");
        let es = errors("[[device]]\nname = \"a\"\nprovider = \"verbs\"\n[[device]]\nname = \"a\"\nprovider = \"verbs\"\nports = [0]\n");
        assert_eq!(es.len(), 2, "{es:?}");
        assert!(errors("").iter().any(|e| e.contains("no [[device]]")));
        assert!(errors("this is not toml")
            .first()
            .is_some_and(|e| e.starts_with("line 1")));
    }

    #[test]
    fn every_error_is_reported_at_its_key() {
        let text = "[[device]]\nname = \"mlx5_0\"\nprovider = \"verbs\"\nports = [1, 300]\n\
                    [[device]]\nname = 7\nprovider = \"verbs\"\n\
                    [policy]\nlap_timeout_ms = 0\nlap_max_tries = 0\nbogus = 1\n\
                    [sa]\nsubscribe = \"yes\"\n";
        let es = errors(text);
        let want = [
            ("line 4, column 13: device[1].ports:", "300"),
            ("line 6, column 8: device[2].name:", "expected a string"),
            ("line 9, column 18: policy.lap_timeout_ms:", "at least 1"),
            ("line 10, column 17: policy.lap_max_tries:", "at least 1"),
            ("line 11, column 1: policy.bogus:", "unknown field"),
            ("line 13, column 13: sa.subscribe:", "expected a boolean"),
        ];
        assert_eq!(es.len(), want.len(), "{es:#?}");
        for ((at, what), e) in want.iter().zip(&es) {
            assert!(e.starts_with(at) && e.contains(what), "{e} / {at} {what}");
        }
    }

    #[test]
    fn device_names_with_control_characters_are_refused_at_their_line() {
        for bad in ["a\\u0000b", "a\\nb", "rx e0", "a/b"] {
            let text = format!("[[device]]\nname = \"{bad}\"\nprovider = \"verbs\"\n");
            let es = errors(&text);
            assert!(
                es.len() == 1 && es[0].starts_with("line 2, column 8: device[1].name:"),
                "{bad}: {es:?}"
            );
        }
        let long = "x".repeat(70);
        let es = errors(&format!(
            "[[device]]\nname = \"{long}\"\nprovider = \"verbs\"\n"
        ));
        assert!(es[0].contains("at most 63 bytes"), "{es:?}");
    }

    #[test]
    fn peer_authentication_keys_are_checked() {
        let roce =
            "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n[lap]\nudp_listen = \"0.0.0.0:1\"\n";
        let es = errors(&format!("{roce}require_auth = true\n"));
        assert!(es[0].contains("needs key_file"), "{es:?}");
        let ok = Config::parse(&format!("{roce}key_file = \"/k\"\n")).expect("valid");
        assert!(ok.peer_auth().is_err(), "no such file");
        // The vendor MADs of InfiniBand carry it too; the CM class has no room for it.
        let ib = "[[device]]\nname = \"mlx5_0\"\nprovider = \"verbs\"\n[lap]\nkey_file = \"/k\"\n";
        Config::parse(ib).expect("a key on the vendor channel");
        let es = errors(&format!("{ib}transport = \"cm\"\n"));
        assert!(
            es[0].starts_with("line 5, column 12: lap.key_file:") && es[0].contains("vendor"),
            "{es:?}"
        );
    }

    #[test]
    fn thousands_of_bad_peers_are_all_reported() {
        let mut text = String::from(
            "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n[lap]\nudp_listen = \"0.0.0.0:1\"\n",
        );
        for i in 0..20_000 {
            text.push_str(&format!(
                "[[lap.peer]]\ngid = \"nope{i}\"\naddr = \"10.0.0.1:1\"\n"
            ));
        }
        // Every one is found; the first 200 are listed and the rest counted.
        let es = errors(&text);
        assert_eq!(es.len(), 201);
        assert!(
            es[199].starts_with("line 604, column 7: lap.peer[200].gid:"),
            "{}",
            es[199]
        );
        assert!(es[200].contains("19800 more problems"), "{}", es[200]);
    }

    #[test]
    fn a_peer_with_a_bad_gid_and_a_bad_address_has_both_reported() {
        let text =
            "[[device]]\nname = \"rxe0\"\nprovider = \"rxe\"\n[lap]\nudp_listen = \"0.0.0.0:1\"\n\
                    [[lap.peer]]\ngid = \"nope\"\naddr = \"10.0.0.1:99999\"\n";
        let es = errors(text);
        assert_eq!(es.len(), 2, "{es:?}");
        assert!(
            es[0].starts_with("line 7, column 7: lap.peer[1].gid:") && es[0].contains("not a GID"),
            "{es:?}"
        );
        assert!(
            es[1].starts_with("line 8, column 8: lap.peer[1].addr:"),
            "{es:?}"
        );
    }

    #[test]
    fn a_huge_value_is_not_echoed_whole() {
        let text = format!(
            "[[device]]\nname = \"x\"\nprovider = \"{}\"\n",
            "v".repeat(5_000_000)
        );
        let es = errors(&text);
        assert_eq!(es.len(), 1);
        assert!(es[0].len() < 1000, "{} bytes", es[0].len());
    }
}
