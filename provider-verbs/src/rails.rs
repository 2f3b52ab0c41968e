//! The link state of the interfaces behind a RoCE port's GIDs (its rails), as engine
//! inputs ([`Input::RailLink`]).
//!
//! On RoCE one port carries several rails: each address of the device's netdev and of
//! the interfaces above it (VLANs) is a GID. A rail's interface losing its link raises no
//! `PORT_ERR` (the port is up for the others), and the kernel keeps an IPv4 GID in the
//! table while its link is down. So the facet looks at each rail's interface itself: the
//! GID table names each GID's interface (`ndev_ifindex`), and sysfs says whether its
//! carrier is up. A look reads one small sysfs file per interface; it is taken when the
//! kernel announces a link change (a netlink socket on the link group: the change is
//! seen as it happens, and an idle watcher costs nothing), at least every
//! [`POLL_WITH_ANNOUNCEMENTS`], and every [`POLL`] where no announcements can be had.
//! The GID-to-interface map is read again every [`REMAP`] (addresses come and go).
//!
//! What it must never do: report a rail down that it could not look at as down for any
//! other reason than its interface (an unreadable carrier file is an interface that is
//! administratively down, which is down), or report anything for InfiniBand ports.
#![forbid(unsafe_code)]

use crate::ffi::{Context, GidType, LinkChanges};
use apm_core::{Gid, Input, InputSink, Link, PortKey};
use std::collections::BTreeMap;
use std::time::Duration;

/// How often each rail's carrier is looked at when the kernel's link announcements
/// cannot be had (no netlink socket): a rail's link going down is seen within this (plus
/// the event's way to the engine).
pub const POLL: Duration = Duration::from_millis(10);

/// With the kernel's link announcements, how often the carriers are looked at anyway
/// (an announcement missed costs at most this).
pub const POLL_WITH_ANNOUNCEMENTS: Duration = Duration::from_millis(200);

/// How often the GID-to-interface map is read again.
pub const REMAP: Duration = Duration::from_millis(500);

/// The interface name of each RoCE v2 GID of `port` (IP addresses; a GID listed twice,
/// for RoCE v1 and v2, counts once).
fn rails_of(ctx: &Context, port: u8) -> BTreeMap<Gid, String> {
    let names = interface_names();
    ctx.gid_table(port)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.gid_type == GidType::RoceV2 && e.ndev_ifindex != 0)
        .filter_map(|e| Some((Gid(e.gid), names.get(&e.ndev_ifindex)?.clone())))
        .collect()
}

/// Interface index to name, from sysfs.
fn interface_names() -> BTreeMap<u32, String> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return BTreeMap::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let index = std::fs::read_to_string(e.path().join("ifindex")).ok()?;
            Some((index.trim().parse().ok()?, name))
        })
        .collect()
}

/// Whether `ifname` has its carrier (`/sys/class/net/IF/carrier` reads "1"; the file
/// cannot be read while the interface is administratively down).
fn link_of(ifname: &str) -> Link {
    match std::fs::read_to_string(format!("/sys/class/net/{ifname}/carrier")) {
        Ok(s) if s.trim() == "1" => Link::Up,
        _ => Link::Down,
    }
}

/// Watch the rails of RoCE port `key` of `ctx` until the engine goes away: every change
/// of a rail's link becomes an [`Input::RailLink`]; a rail found down at the first look is
/// reported too.
pub async fn watch(ctx: Context, key: PortKey, sink: InputSink) {
    let mut last: BTreeMap<Gid, Link> = BTreeMap::new();
    let mut rails = BTreeMap::new();
    let mut mapped_at: Option<tokio::time::Instant> = None;
    // The kernel announces a carrier change at once; polling is the fallback.
    let mut changes = match LinkChanges::open() {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::info!(error = %e, "no link announcements (netlink): polling the carriers every {POLL:?}");
            None
        }
    };
    loop {
        if mapped_at.is_none_or(|t| t.elapsed() >= REMAP) {
            let c = ctx.clone();
            let port = key.port;
            rails = tokio::task::spawn_blocking(move || rails_of(&c, port))
                .await
                .unwrap_or_default();
            last.retain(|g, _| rails.contains_key(g));
            mapped_at = Some(tokio::time::Instant::now());
        }
        for (gid, ifname) in &rails {
            let link = link_of(ifname);
            let before = last.insert(*gid, link);
            let news = match before {
                Some(b) => b != link,
                None => link == Link::Down,
            };
            if news {
                tracing::info!(device = ctx.name(), %gid, interface = %ifname, ?link, "rail link");
                let input = Input::RailLink {
                    port: key,
                    gid: *gid,
                    link,
                };
                if sink.send(input).is_err() {
                    return;
                }
            }
        }
        match &changes {
            Some(c) => {
                tokio::select! {
                    r = c.changed() => {
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "link announcements failed: polling the carriers every {POLL:?}");
                            changes = None;
                        }
                    }
                    () = tokio::time::sleep(POLL_WITH_ANNOUNCEMENTS) => {}
                }
            }
            None => tokio::time::sleep(POLL).await,
        }
    }
}
