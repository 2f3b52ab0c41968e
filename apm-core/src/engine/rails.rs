//! Local RoCE rails: a source GID that leaves its port's GID table is a dead rail.
//!
//! On RoCE a rail is an address of the port (a GID), and one port carries several (one
//! per interface the device's netdev has: VLANs, the netdev itself). When a rail's
//! interface goes down the kernel removes its GIDs and raises `GID_CHANGE` on the port,
//! with no `PORT_ERR`: the port stays up for the other rails. So a GID that the port
//! reported and no longer reports is treated as a dead local port for the paths that
//! leave from it (every connection whose primary does moves, none is armed onto one),
//! and its return as that port coming back. GIDs never seen in the table are not judged
//! (a provider that does not list them, like the simulator, keeps the engine's view).
//! InfiniBand paths are left alone: they all leave from the port GID.

use super::Engine;
use crate::io::Cause;
use crate::types::{Gid, LinkLayer, Path, PortInfo};
use tracing::info;

impl Engine {
    /// True when `path` leaves from a local GID its port no longer has.
    pub(super) fn local_gid_gone(&self, path: &Path) -> bool {
        !self.gone_gids.is_empty() && self.gone_gids.contains(&(path.port, path.sgid))
    }

    /// The port's GID table changed from `old` to `new`: rails gone and rails back.
    pub(super) fn local_gids_changed(&mut self, old: &PortInfo, new: &PortInfo) {
        if new.link_layer != LinkLayer::Ethernet {
            return;
        }
        let key = new.key;
        let gone: Vec<Gid> = old
            .gids
            .iter()
            .filter(|g| !new.gids.contains(g))
            .copied()
            .collect();
        let back: Vec<Gid> = new
            .gids
            .iter()
            .filter(|g| self.gone_gids.contains(&(key, **g)))
            .copied()
            .collect();
        for gid in gone {
            if self.gone_gids.insert((key, gid)) {
                info!(port = %key, %gid, "local GID gone: its rail is down");
                self.path_failed(|p| p.port == key && p.sgid == gid, Cause::LocalPort);
            }
        }
        for gid in back {
            self.gone_gids.remove(&(key, gid));
            info!(port = %key, %gid, "local GID back: its rail is up");
            self.path_returned(|p| p.port == key && p.sgid == gid);
        }
    }
}
