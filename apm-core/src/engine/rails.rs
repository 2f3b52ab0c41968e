//! Local RoCE rails: a source GID that leaves its port's GID table, or whose interface
//! lost its link, is a dead rail.
//!
//! On RoCE a rail is an address of the port (a GID), and one port carries several (one
//! per interface the device's netdev has: VLANs, the netdev itself). When a rail's
//! interface goes down the kernel removes its GIDs and raises `GID_CHANGE` on the port,
//! with no `PORT_ERR`: the port stays up for the other rails. So a GID that the port
//! reported and no longer reports is treated as a dead local port for the paths that
//! leave from it (every connection whose primary does moves, none is armed onto one),
//! and its return as that port coming back. GIDs never seen in the table are not judged
//! (a provider that does not list them, like the simulator, keeps the engine's view).
//! InfiniBand paths are left alone: they all leave from the port GID. The kernel keeps
//! an IPv4 GID in the table while its interface's link is down (only the address's
//! removal takes it out), so providers also report each rail's link state
//! ([`Input::RailLink`](crate::Input::RailLink)), which counts the same way.

use super::Engine;
use crate::io::{Cause, Link};
use crate::types::{Gid, LinkLayer, Path, PortInfo, PortKey};
use tracing::info;

impl Engine {
    /// True when `path` leaves from a local GID its port no longer has.
    pub(super) fn local_gid_gone(&self, path: &Path) -> bool {
        let key = (path.port, path.sgid);
        (!self.gone_gids.is_empty() && self.gone_gids.contains(&key))
            || (!self.rails_down.is_empty() && self.rails_down.contains(&key))
    }

    /// Whether local GID `gid` of `port` can carry traffic as far as the rail rules know.
    fn rail_usable(&self, port: PortKey, gid: Gid) -> bool {
        !self.gone_gids.contains(&(port, gid)) && !self.rails_down.contains(&(port, gid))
    }

    /// The link of the interface behind local GID `gid` of `port` changed.
    pub(super) fn rail_link(&mut self, port: PortKey, gid: Gid, link: Link) {
        let was = self.rail_usable(port, gid);
        let changed = match link {
            Link::Down => self.rails_down.insert((port, gid)),
            Link::Up => self.rails_down.remove(&(port, gid)),
        };
        if !changed {
            return;
        }
        info!(%port, %gid, ?link, "rail's link");
        match (was, self.rail_usable(port, gid)) {
            (true, false) => {
                self.path_failed(|p| p.port == port && p.sgid == gid, Cause::LocalPort);
            }
            (false, true) => self.path_returned(|p| p.port == port && p.sgid == gid),
            _ => {}
        }
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
            let was = self.rail_usable(key, gid);
            if self.gone_gids.insert((key, gid)) && was {
                info!(port = %key, %gid, "local GID gone: its rail is down");
                self.path_failed(|p| p.port == key && p.sgid == gid, Cause::LocalPort);
            }
        }
        for gid in back {
            self.gone_gids.remove(&(key, gid));
            info!(port = %key, %gid, "local GID back");
            if self.rail_usable(key, gid) {
                self.path_returned(|p| p.port == key && p.sgid == gid);
            }
        }
    }
}
