//! The deployment configuration: one TOML file that says which devices and ports apm
//! protects through which providers, how it learns remote failures (SA subscription),
//! how LAP/APR travel, and the engine's policy knobs.
//!
//! Parsing never panics and never guesses: unknown keys are errors, and every error
//! carries the line and column it is about, so `apm config check` can point at it.
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
//!
//! [policy]
//! lap_timeout_ms = 100      # any apm_core::Policy field; see its docs for defaults
//! ```

use apm_core::{Gid, Policy};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use toml::Spanned;

/// A whole deployment.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
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
    pub policy: Option<Spanned<Policy>>,
    /// The simulated fabric, for `provider = "sim"` devices.
    #[serde(default)]
    pub sim: SimConfig,
}

/// The `[sim]` table: the simulated fabric a `provider = "sim"` deployment runs on. Its
/// devices are the scenario's hosts, `h0`, `h1`, ...
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// A provider-sim scenario file (TOML); absent: the built-in dual-rail scenario.
    /// Relative paths are taken from the current directory.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// The RDMA device name (`ibv_devices`), e.g. `mlx5_0` or `rxe0`.
    pub name: Spanned<String>,
    /// The provider that drives it.
    pub provider: Spanned<ProviderKind>,
    /// Ports to use (1-based). Empty: every port of the device.
    pub ports: Option<Spanned<Vec<u8>>>,
}

/// The `[sa]` table.
#[derive(Clone, Debug, Deserialize, Serialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LapConfig {
    /// The transport; absent: vendor on InfiniBand, udp on RoCE.
    pub transport: Option<Spanned<LapTransport>>,
    /// Vendor class for `vendor` (0x30..=0x4F, classes with an OUI). Default 0x30.
    pub vendor_class: Option<Spanned<u8>>,
    /// OUI for `vendor` (24 bits). Default: apm's own, 0x024150 (locally administered;
    /// the same on every node of a deployment).
    pub oui: Option<Spanned<u32>>,
    /// Address to listen on for `udp`.
    pub udp_listen: Option<Spanned<SocketAddr>>,
    /// Where each peer GID listens, for `udp` (`[[lap.peer]]` tables).
    #[serde(default, rename = "peer")]
    pub peers: Vec<UdpPeer>,
}

/// A `[[lap.peer]]` table: a peer's GID and UDP address.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UdpPeer {
    /// The peer port's GID (RoCE GIDs derive from its IP address).
    pub gid: Spanned<String>,
    /// Where its apm listens.
    pub addr: Spanned<SocketAddr>,
}

/// A configuration problem, located in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConfigError {
    /// 1-based line (0 when the problem has no place, e.g. an empty file).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong, and what to do about it.
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(
                f,
                "line {}, column {}: {}",
                self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// Line and column (1-based) of byte `offset` in `text`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
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
    /// Parse and check a configuration. All semantic problems are reported, not only
    /// the first; a syntax error stops at itself.
    pub fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map_or((0, 0), |s| position(text, s.start));
            vec![ConfigError {
                line,
                column,
                message: e.message().to_string(),
            }]
        })?;
        let errors = config.check(text);
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(errors)
        }
    }

    /// The LAP transport in force (explicit or the default for the devices).
    pub fn lap_transport(&self) -> LapTransport {
        self.lap
            .transport
            .as_ref()
            .map_or_else(|| default_transport(&self.devices), |t| *t.get_ref())
    }

    /// The engine policy with the `[sa]` switches applied.
    pub fn engine_policy(&self) -> Policy {
        let mut p = self
            .policy
            .as_ref()
            .map(|p| p.get_ref().clone())
            .unwrap_or_default();
        p.subscribe = p.subscribe && self.sa.subscribe;
        p.resolve_paths = p.resolve_paths && self.sa.resolve_paths;
        p
    }

    fn check(&self, text: &str) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut at = |span: std::ops::Range<usize>, message: String| {
            let (line, column) = position(text, span.start);
            errors.push(ConfigError {
                line,
                column,
                message,
            });
        };
        if self.devices.is_empty() {
            at(
                0..0,
                "no [[device]] table: name at least one device to protect connections on".into(),
            );
        }
        for (i, d) in self.devices.iter().enumerate() {
            let name = d.name.get_ref();
            if name.is_empty() {
                at(d.name.span(), "device name is empty".into());
            }
            if self.devices[..i].iter().any(|o| o.name.get_ref() == name) {
                at(d.name.span(), format!("device {name:?} is listed twice"));
            }
            let sim = *d.provider.get_ref() == ProviderKind::Sim;
            if sim && !name.is_empty() && sim_host(name).is_none() {
                at(
                    d.name.span(),
                    format!("simulated device {name:?}: name a scenario host, h0, h1, ..."),
                );
            }
            if self.devices[..i]
                .iter()
                .any(|o| (*o.provider.get_ref() == ProviderKind::Sim) != sim)
            {
                at(
                    d.provider.span(),
                    "simulated and real devices cannot be mixed in one deployment".into(),
                );
            } else if let Some(o) = self.devices[..i]
                .iter()
                .find(|o| o.provider.get_ref() != d.provider.get_ref())
            {
                at(
                    d.provider.span(),
                    format!(
                        "device {:?} is {:?} but {:?} is {:?}: one provider kind per \
                         deployment (run one apm per kind)",
                        name,
                        d.provider.get_ref(),
                        o.name.get_ref(),
                        o.provider.get_ref()
                    ),
                );
            }
            if let Some(ports) = &d.ports {
                if ports.get_ref().contains(&0) {
                    at(ports.span(), "port numbers start at 1".into());
                }
            }
        }
        if let Some(policy) = &self.policy {
            if let Err(e) = policy.get_ref().validate() {
                at(policy.span(), e.to_string());
            }
        }
        let transport = self.lap_transport();
        let transport_span = self.lap.transport.as_ref().map_or(0..0, |t| t.span());
        let roce = self
            .devices
            .iter()
            .find(|d| *d.provider.get_ref() == ProviderKind::Rxe);
        if let (Some(d), LapTransport::Vendor | LapTransport::Cm) = (roce, transport) {
            at(
                transport_span.clone(),
                format!(
                    "device {:?} is RoCE: MADs cannot carry LAPs there; use transport = \"udp\"",
                    d.name.get_ref()
                ),
            );
        }
        if let Some(c) = &self.lap.vendor_class {
            if !(0x30..=0x4F).contains(c.get_ref()) {
                at(
                    c.span(),
                    format!(
                        "vendor_class {:#04x} is not a vendor class with an OUI (0x30..=0x4f)",
                        c.get_ref()
                    ),
                );
            }
        }
        if let Some(o) = &self.lap.oui {
            if *o.get_ref() > 0xFF_FFFF {
                at(
                    o.span(),
                    format!("oui {:#x} does not fit in 24 bits", o.get_ref()),
                );
            }
        }
        // `verbs` devices with `udp` are hardware APM on RoCE; whether they are RoCE is
        // known only at start (InfiniBand ones are refused there, with the reason).
        if transport == LapTransport::Udp && self.lap.udp_listen.is_none() {
            at(
                transport_span,
                "the udp transport needs udp_listen = \"ADDRESS:PORT\" in [lap]".into(),
            );
        }
        for peer in &self.lap.peers {
            if peer.gid.get_ref().parse::<Gid>().is_err() {
                at(
                    peer.gid.span(),
                    format!("{:?} is not a GID (IPv6 notation)", peer.gid.get_ref()),
                );
            }
        }
        errors
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
            ["line 1, column 1: the udp transport needs udp_listen = \"ADDRESS:PORT\" in [lap]"]
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
}
