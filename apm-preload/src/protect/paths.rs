//! The paths of an adopted QP: its primary, read from its own attributes (the program
//! set it up; there is no CM exchange to read), and the candidates for its alternate,
//! from the host's agent: on RoCE the rails the agents pair between the two hosts'
//! addresses; on InfiniBand the SA's paths from each of the device's ports to each port
//! of the peer's node (`apm_agent::facets::ib_connection`).

use super::device::{Device, Link, Opened};
use super::Protector;
use crate::infiniband::{named_dgid, primary_path, PortFacts};
use apm_agent::facets::{ib_connection, IbPeer};
use apm_agent::local::ip_of;
use apm_core::{Gid, Path, PortKey};
use provider_verbs::ffi::QpAttr;

/// An adopted QP's paths and the peer addresses its messages may come from.
pub(super) struct QpPaths {
    pub(super) sgid: Gid,
    pub(super) dgid: Gid,
    pub(super) primary: Path,
    pub(super) candidates: Vec<Path>,
    /// Every address of the peer the connection may hear from: the GIDs its paths lead
    /// to and (InfiniBand) the peer's ports' LIDs, since a MAD without a GRH names its
    /// sender by LID alone.
    pub(super) peer_gids: Vec<Gid>,
    pub(super) peer_lids: Vec<u16>,
    /// The `(local, peer)` address pairs the agent probes (RoCE rails; none on
    /// InfiniBand, whose failures the SA's notices and the ports' events tell).
    pub(super) probed: Vec<(Gid, Gid)>,
}

/// The port an RC QP past RTR uses: its address vector's (libibverbs fills it in from
/// the QP's own when the program leaves it 0).
pub(super) fn qp_port(attr: &QpAttr) -> u8 {
    attr.ah_attr.port_num.max(attr.port_num).max(1)
}

/// The QP's paths on `dev` (a device whose QPs are on `link`).
pub(super) async fn qp_paths(
    p: &Protector,
    opened: &Opened,
    dev: &Device,
    link: Link,
    attr: &QpAttr,
) -> Result<QpPaths, String> {
    match link {
        Link::Ethernet => roce(p, dev, attr).await,
        Link::InfiniBand => infiniband(p, opened, dev, attr).await,
    }
}

/// RoCE: the primary from the QP's GIDs (both must be IP addresses: RoCE v2), one
/// candidate per rail the peer's agent pairs with ours.
async fn roce(p: &Protector, dev: &Device, attr: &QpAttr) -> Result<QpPaths, String> {
    let port = qp_port(attr);
    let sgid = dev
        .ctx
        .query_gid(port, u32::from(attr.ah_attr.sgid_index))
        .ok()
        .flatten()
        .map(|e| Gid(e.gid))
        .ok_or("its source GID is not in the device's GID table")?;
    let dgid = Gid(attr.ah_attr.dgid);
    let (Some(sip), Some(dip)) = (ip_of(&sgid), ip_of(&dgid)) else {
        return Err(format!(
            "its path {sgid} -> {dgid} is not between IP addresses (RoCE v2 GIDs; link-local \
             IPv6 GIDs carry no interface scope)"
        ));
    };
    let local_gids: Vec<Gid> = dev
        .ctx
        .gid_table(port)
        .map(|t| t.into_iter().map(|e| Gid(e.gid)).collect())
        .unwrap_or_default();
    let rails = p.client.candidates(sgid, dgid, local_gids).await;
    let rails = rails.map_err(|e| e.to_string())?;
    let key = PortKey::new(0, port);
    let mtu = attr.path_mtu.code();
    let path = |l: Gid, r: Gid| -> Option<Path> {
        let mut p = provider_rxe::roce_path(key, ip_of(&l)?, ip_of(&r)?, mtu, attr.timeout);
        p.sgid_index = 0;
        Some(p)
    };
    let mut primary = provider_rxe::roce_path(key, sip, dip, mtu, attr.timeout);
    primary.sgid_index = attr.ah_attr.sgid_index;
    let candidates: Vec<Path> = rails.iter().filter_map(|(l, r)| path(*l, *r)).collect();
    let all = || std::iter::once(&primary).chain(&candidates);
    Ok(QpPaths {
        sgid,
        dgid,
        peer_gids: all().map(|p| p.dgid).collect(),
        peer_lids: Vec::new(),
        probed: all().map(|p| (p.sgid, p.dgid)).collect(),
        primary,
        candidates,
    })
}

/// InfiniBand: the primary from the QP's address vector on its port (the peer's GID
/// from the SA when the QP names the peer by LID alone), the candidates every path the
/// SA gives from each of the device's active ports to the peer's node.
async fn infiniband(
    p: &Protector,
    opened: &Opened,
    dev: &Device,
    attr: &QpAttr,
) -> Result<QpPaths, String> {
    let port = qp_port(attr);
    let facts = port_facts(dev, port)?;
    let ports = opened.ib_ports();
    if let super::device::Paths::InfiniBand(_, known) = &dev.paths {
        // A port that came up since the engine started: its GID names it to the agent.
        for (key, gid) in &ports {
            known.set(*key, *gid);
        }
    }
    let peer = match named_dgid(attr) {
        Some(g) => IbPeer::Gid(g),
        None => IbPeer::Lid(attr.ah_attr.dlid),
    };
    let conn = ib_connection(&p.client, &ports, facts.key, peer)
        .await
        .map_err(|e| format!("the agent found no path to its peer: {e}"))?;
    let primary = primary_path(attr, &facts, conn.dgid)?;
    let candidates: Vec<Path> = conn
        .paths
        .iter()
        .filter(|c| !c.same_route(&primary))
        .copied()
        .collect();
    let mut peer_gids: Vec<Gid> = conn.peer_ports.iter().map(|(g, _)| *g).collect();
    let mut peer_lids: Vec<u16> = conn.peer_ports.iter().map(|(_, l)| *l).collect();
    // The QP's own peer addresses, whatever the SA said of the node's ports.
    for path in std::iter::once(&primary).chain(&candidates) {
        if !peer_gids.contains(&path.dgid) {
            peer_gids.push(path.dgid);
        }
        if !peer_lids.contains(&path.dlid.get()) {
            peer_lids.push(path.dlid.get());
        }
    }
    Ok(QpPaths {
        sgid: primary.sgid,
        dgid: conn.dgid,
        primary,
        candidates,
        peer_gids,
        peer_lids,
        probed: Vec::new(),
    })
}

/// What the QP's port is: its engine key, LIDs and GID table by index.
fn port_facts(dev: &Device, port: u8) -> Result<PortFacts, String> {
    let attr = dev
        .ctx
        .query_port(port)
        .map_err(|e| format!("its port {port} cannot be queried: {e}"))?;
    let table = dev
        .ctx
        .gid_table(port)
        .map_err(|e| format!("its port {port}'s GID table cannot be read: {e}"))?;
    // A QP names its source GID by an 8-bit index: the entries past 255 are not its.
    let table: Vec<_> = table.into_iter().filter(|e| e.index < 256).collect();
    let len = table
        .iter()
        .map(|e| e.index as usize + 1)
        .max()
        .unwrap_or(0);
    let mut gids = vec![None; len];
    for e in table {
        gids[e.index as usize] = Some(Gid(e.gid));
    }
    Ok(PortFacts {
        key: PortKey::new(0, port),
        lid: attr.lid,
        lmc: attr.lmc,
        gids,
    })
}
