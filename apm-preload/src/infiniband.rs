//! An adopted QP on an InfiniBand port: its primary path read from its own attributes,
//! as the program's connection set it up (no CM exchange to read it from).
//!
//! An InfiniBand QP's address vector names its peer by LID, and by GID only when it
//! carries a GRH (another subnet, or a program that always sets one): the peer's port
//! GID, which apm's engine and the agent key connections by, comes from the SA through
//! the agent when the QP has none (`ToAgent::Paths` by LID). The source LID is the
//! port's base LID plus the QP's path bits (within the port's LMC range); the source GID
//! the one at the QP's GID index (index 0, the port GID, without a GRH).
#![forbid(unsafe_code)]

use apm_core::{Gid, Lid, Path, PortKey};
use provider_verbs::ffi::QpAttr;

/// What apm knows of the QP's local port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortFacts {
    /// The engine's key for the port.
    pub key: PortKey,
    /// Its base LID.
    pub lid: u16,
    /// Its LMC (2^LMC LIDs from the base).
    pub lmc: u8,
    /// Its GID table, by index.
    pub gids: Vec<Option<Gid>>,
}

/// The QP's primary path, from `attr` (an RC QP past RTR) on `port`, to the peer port
/// `dgid` (the QP's own when it has a GRH; else what the SA says of its LID).
pub fn primary_path(attr: &QpAttr, port: &PortFacts, dgid: Gid) -> Result<Path, String> {
    let av = &attr.ah_attr;
    if av.dlid == 0 {
        return Err("its address vector names no destination LID".into());
    }
    let index = if av.is_global { av.sgid_index } else { 0 };
    let sgid = port
        .gids
        .get(usize::from(index))
        .copied()
        .flatten()
        .ok_or_else(|| format!("its source GID index {index} is not in the port's table"))?;
    // The path bits within the LMC range: the rest of the field is not the port's.
    let bits_mask = (1u16 << port.lmc.min(7)) - 1;
    let slid = port
        .lid
        .wrapping_add(u16::from(av.src_path_bits) & bits_mask);
    Ok(Path {
        port: port.key,
        slid: Lid::from_wire(slid),
        dlid: Lid::from_wire(av.dlid),
        sgid,
        dgid,
        sgid_index: index,
        sl: av.sl,
        flow_label: if av.is_global { av.flow_label } else { 0 },
        traffic_class: if av.is_global { av.traffic_class } else { 0 },
        hop_limit: if av.is_global { av.hop_limit } else { 0 },
        rate: av.static_rate,
        mtu: attr.path_mtu.code(),
        pkey_index: attr.pkey_index,
        ack_timeout: attr.timeout,
    })
}

/// The peer's GID when the QP names it (a GRH), else `None` (ask the SA by LID).
pub fn named_dgid(attr: &QpAttr) -> Option<Gid> {
    attr.ah_attr
        .is_global
        .then_some(Gid(attr.ah_attr.dgid))
        .filter(|g| *g != Gid::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_verbs::ffi::{AddressVector, Mtu};

    fn port(n: u8, lid: u16, lmc: u8) -> PortFacts {
        PortFacts {
            key: PortKey::new(0, n),
            lid,
            lmc,
            gids: vec![
                Some(Gid::from_guid(0x0002_c903_0000_0100 + u64::from(n))),
                Some(Gid::from_guid(0x0002_c903_0000_0200 + u64::from(n))),
            ],
        }
    }

    fn attr(av: AddressVector) -> QpAttr {
        QpAttr {
            ah_attr: av,
            path_mtu: Mtu::Mtu2048,
            pkey_index: 3,
            timeout: 14,
            dest_qp_num: 0x55,
            ..QpAttr::default()
        }
    }

    #[test]
    fn a_lid_routed_qp_on_port_2_with_path_bits() {
        // LMC 2: four LIDs from 0x20; path bits 1 are the second; bits beyond the LMC
        // are not the port's.
        let p2 = port(2, 0x20, 2);
        let peer = Gid::from_guid(0x0002_c903_0000_0902);
        let a = attr(AddressVector {
            dlid: 0x41,
            sl: 5,
            src_path_bits: 0b101,
            static_rate: 7,
            port_num: 2,
            ..AddressVector::default()
        });
        assert_eq!(named_dgid(&a), None, "no GRH: ask the SA by LID");
        let path = primary_path(&a, &p2, peer).expect("path");
        assert_eq!(path.port, PortKey::new(0, 2));
        assert_eq!(
            path.slid,
            Lid::from_wire(0x21),
            "base + (bits within LMC 2)"
        );
        assert_eq!(path.dlid, Lid::from_wire(0x41));
        assert_eq!(path.sgid, p2.gids[0].expect("gid 0"), "the port GID");
        assert_eq!(path.dgid, peer);
        assert_eq!((path.sl, path.rate, path.hop_limit), (5, 7, 0));
        assert_eq!((path.mtu, path.pkey_index, path.ack_timeout), (4, 3, 14));
    }

    #[test]
    fn a_global_qp_on_port_1_names_its_peer_and_its_gid_index() {
        let p1 = port(1, 0x10, 0);
        let peer = Gid::from_guid(0x0002_c903_0000_0901);
        let a = attr(AddressVector {
            dlid: 0x40,
            port_num: 1,
            is_global: true,
            dgid: peer.0,
            sgid_index: 1,
            flow_label: 0xabcde,
            hop_limit: 2,
            traffic_class: 0x20,
            ..AddressVector::default()
        });
        assert_eq!(named_dgid(&a), Some(peer));
        let path = primary_path(&a, &p1, peer).expect("path");
        assert_eq!(path.slid, Lid::from_wire(0x10), "LMC 0: the base LID");
        assert_eq!(path.sgid, p1.gids[1].expect("gid 1"));
        assert_eq!((path.sgid_index, path.flow_label), (1, 0xabcde));
        assert_eq!((path.hop_limit, path.traffic_class), (2, 0x20));
        // A GID index the table does not hold, and no LID: refused with why.
        let bad = attr(AddressVector {
            sgid_index: 9,
            ..a.ah_attr
        });
        assert!(primary_path(&bad, &p1, peer)
            .expect_err("index")
            .contains("index 9"));
        let none = attr(AddressVector {
            dlid: 0,
            ..a.ah_attr
        });
        assert!(primary_path(&none, &p1, peer)
            .expect_err("lid")
            .contains("no destination LID"));
    }
}
