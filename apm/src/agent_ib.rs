//! The host agent's InfiniBand side on umad ([`apm_agent::ib::InfiniBand`]): one SA
//! client and one vendor-class MAD channel per InfiniBand port of the host, as a
//! library deployment has them ([`crate::ib::UmadFacets`]), shared by every process
//! the agent serves.
//!
//! `apm agent` builds it for every port whose link layer is InfiniBand
//! ([`infiniband_ports`], from sysfs); RoCE ports are the UDP channels' and the
//! hello's. The MAD channel is `[lap]`'s (vendor class and OUI, the key of `key_file`
//! sealing every MAD); the CM class is refused (the kernel's ib_cm holds it).

use crate::ib::{PortFabrics, PortPeers, UmadFacets, UmadOptions};
use crate::Config;
use apm_agent::ib::{IbPort, InfiniBand};
use apm_core::{
    FabricService, Gid, InputSink, Lid, Path, PeerAddr, PeerChannel, PeerMsg, PortKey,
    ProviderError,
};
use async_trait::async_trait;
use std::path::Path as FsPath;

/// Every InfiniBand port of the host, by device, from sysfs (`link_layer`).
pub fn infiniband_ports() -> Vec<(String, Vec<u8>)> {
    infiniband_ports_in(FsPath::new("/sys/class/infiniband"))
}

/// [`infiniband_ports`] over a sysfs tree at `root` (for tests).
pub fn infiniband_ports_in(root: &FsPath) -> Vec<(String, Vec<u8>)> {
    let sorted = |p: &FsPath| {
        let mut v: Vec<_> = std::fs::read_dir(p)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut out = Vec::new();
    for dev in sorted(root) {
        let Some(name) = dev.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let ports: Vec<u8> = sorted(&dev.join("ports"))
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(p.join("link_layer"))
                    .is_ok_and(|l| l.trim() == "InfiniBand")
            })
            .filter_map(|p| p.file_name()?.to_str()?.parse().ok())
            .collect();
        if !ports.is_empty() {
            out.push((name, ports));
        }
    }
    out
}

/// The configuration of the umad half for `ports`, with `lap`'s transport settings
/// and key (the agent's own configuration, if it has one).
pub fn umad_config(ports: &[(String, Vec<u8>)], lap: Option<&Config>) -> Result<Config, String> {
    let mut text = String::new();
    for (device, list) in ports {
        let list: Vec<String> = list.iter().map(u8::to_string).collect();
        text.push_str(&format!(
            "[[device]]\nname = {device:?}\nprovider = \"verbs\"\nports = [{}]\n",
            list.join(", ")
        ));
    }
    text.push_str("[lap]\ntransport = \"vendor\"\n");
    if let Some(l) = lap.map(|c| &c.lap) {
        if let Some(class) = &l.vendor_class {
            text.push_str(&format!("vendor_class = {}\n", class.get_ref()));
        }
        if let Some(oui) = &l.oui {
            text.push_str(&format!("oui = {}\n", oui.get_ref()));
        }
        if let Some(key) = &l.key_file {
            text.push_str(&format!("key_file = {:?}\n", key.get_ref()));
        }
        if let Some(require) = &l.require_auth {
            text.push_str(&format!("require_auth = {}\n", require.get_ref()));
        }
    }
    Config::parse(&text).map_err(|e| e.to_string())
}

/// The umad half as the agent's InfiniBand side.
#[derive(Debug)]
pub struct AgentInfiniBand {
    ports: Vec<IbPort>,
    peer: PortPeers,
    fabric: PortFabrics,
}

impl AgentInfiniBand {
    /// Open the umad ports of `config` (built by [`umad_config`]); call inside a tokio
    /// runtime.
    pub fn open(config: &Config, opts: &UmadOptions) -> Result<AgentInfiniBand, String> {
        let facets = UmadFacets::open(config, opts).map_err(|e| e.to_string())?;
        let ports = facets
            .ports()
            .iter()
            .map(|p| IbPort {
                key: p.key,
                device: p.device.clone(),
                port: p.port,
            })
            .collect();
        let (peer, fabric) = facets.into_facets();
        Ok(AgentInfiniBand {
            ports,
            peer,
            fabric,
        })
    }
}

#[async_trait]
impl InfiniBand for AgentInfiniBand {
    fn ports(&self) -> Vec<IbPort> {
        self.ports.clone()
    }

    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        self.fabric.start(sink.clone()).await?;
        self.peer.start(sink).await
    }

    async fn resolve_paths(&self, port: PortKey, dgid: Gid) -> Result<Vec<Path>, ProviderError> {
        self.fabric.resolve_paths(port, dgid).await
    }

    async fn gid_of_lid(&self, port: PortKey, lid: Lid) -> Result<Option<Gid>, ProviderError> {
        self.fabric.gid_of_lid(port, lid).await
    }

    async fn node_ports(
        &self,
        port: PortKey,
        lid: Lid,
    ) -> Result<Vec<(Gid, Lid, u8)>, ProviderError> {
        self.fabric.node_ports(port, lid).await
    }

    async fn subscribe(&self, port: PortKey) -> Result<(), ProviderError> {
        self.fabric.subscribe(port).await
    }

    async fn send(&self, port: PortKey, to: PeerAddr, msg: PeerMsg) -> Result<(), ProviderError> {
        self.peer.send(port, to, msg).await
    }

    fn sa_queries(&self) -> u64 {
        self.fabric.sa_queries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_infiniband_ports_are_taken_and_the_umad_half_configured() {
        let root = std::env::temp_dir().join(format!("apm-ib-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (dev, port, link) in [
            ("mlx5_0", 1, "InfiniBand"),
            ("mlx5_0", 2, "InfiniBand"),
            ("mlx5_1", 1, "Ethernet"),
            ("rxe0", 1, "Ethernet"),
        ] {
            let p = root.join(dev).join("ports").join(port.to_string());
            std::fs::create_dir_all(&p).expect("mkdir");
            std::fs::write(p.join("link_layer"), format!("{link}\n")).expect("write");
        }
        let ports = infiniband_ports_in(&root);
        assert_eq!(ports, vec![("mlx5_0".to_owned(), vec![1, 2])]);
        let c = umad_config(&ports, None).expect("config");
        assert_eq!(c.devices.len(), 1);
        assert_eq!(c.lap_transport(), crate::config::LapTransport::Vendor);
        let _ = std::fs::remove_dir_all(&root);
    }
}
