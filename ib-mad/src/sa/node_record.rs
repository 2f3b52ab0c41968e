//! NodeRecord (SA attribute 0x0011, 108 bytes; IBA 15.2.5.2): a node's NodeInfo and
//! description, one record per port for a channel adapter. apm asks for the records of
//! a peer's node to learn the peer HCA's other ports (their LIDs and port GUIDs), which
//! no PathRecord to the peer's primary port names.
//!
//! Layout: LID (0-1), reserved (2-3), NodeInfo (4-43: BaseVersion 4, ClassVersion 5,
//! NodeType 6, NumPorts 7, SystemImageGUID 8-15, NodeGUID 16-23, PortGUID 24-31,
//! PartitionCap 32-33, DeviceID 34-35, Revision 36-39, LocalPortNum 40, VendorID
//! 41-43), NodeDescription (44-107).

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::AttributeId;
use crate::types::Lid;
use crate::wire::{Reader, Writer};

/// ComponentMask bits for NodeRecord queries (IBA 15.2.5.2; OpenSM's
/// `IB_NR_COMPMASK_*`).
pub mod mask {
    /// LID.
    pub const LID: u64 = 1;
    /// NodeInfo:NodeType.
    pub const NODE_TYPE: u64 = 1 << 4;
    /// NodeInfo:NodeGUID.
    pub const NODE_GUID: u64 = 1 << 7;
    /// NodeInfo:PortGUID.
    pub const PORT_GUID: u64 = 1 << 8;
    /// NodeInfo:LocalPortNum.
    pub const LOCAL_PORT_NUM: u64 = 1 << 12;
}

/// NodeRecord: the NodeInfo of the node behind one port, with that port's LID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeRecord {
    /// The port's base LID (0-1).
    pub lid: Lid,
    /// NodeType (6): 1 channel adapter, 2 switch, 3 router.
    pub node_type: u8,
    /// NumPorts (7).
    pub num_ports: u8,
    /// SystemImageGUID (8-15).
    pub system_image_guid: u64,
    /// NodeGUID (16-23).
    pub node_guid: u64,
    /// PortGUID (24-31): the GUID of the port the record is about.
    pub port_guid: u64,
    /// PartitionCap (32-33).
    pub partition_cap: u16,
    /// DeviceID (34-35).
    pub device_id: u16,
    /// Revision (36-39).
    pub revision: u32,
    /// LocalPortNum (40): the port's number on its node.
    pub local_port_num: u8,
    /// VendorID (41-43, 24 bits).
    pub vendor_id: u32,
    /// NodeDescription (44-107), as bytes (NUL-padded text by convention).
    pub description: [u8; 64],
}

impl Default for NodeRecord {
    fn default() -> Self {
        NodeRecord {
            lid: Lid(0),
            node_type: 0,
            num_ports: 0,
            system_image_guid: 0,
            node_guid: 0,
            port_guid: 0,
            partition_cap: 0,
            device_id: 0,
            revision: 0,
            local_port_num: 0,
            vendor_id: 0,
            description: [0; 64],
        }
    }
}

impl NodeRecord {
    /// The description as text, up to its first NUL (lossy).
    pub fn description_text(&self) -> String {
        let end = self
            .description
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.description.len());
        String::from_utf8_lossy(&self.description[..end]).into_owned()
    }
}

impl Attribute for NodeRecord {
    const ID: AttributeId = AttributeId::NODE_RECORD;
    const SIZE: usize = 108;

    fn decode(buf: &[u8]) -> Result<NodeRecord, DecodeError> {
        let r = Reader::new(buf);
        let w40 = r.u32(40, "local_port_num")?;
        Ok(NodeRecord {
            lid: Lid(r.u16(0, "lid")?),
            node_type: r.u8(6, "node_type")?,
            num_ports: r.u8(7, "num_ports")?,
            system_image_guid: r.u64(8, "system_image_guid")?,
            node_guid: r.u64(16, "node_guid")?,
            port_guid: r.u64(24, "port_guid")?,
            partition_cap: r.u16(32, "partition_cap")?,
            device_id: r.u16(34, "device_id")?,
            revision: r.u32(36, "revision")?,
            local_port_num: (w40 >> 24) as u8,
            vendor_id: w40 & 0x00ff_ffff,
            description: r.bytes(44, "description")?,
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u16(0, self.lid.0);
        w.u16(2, 0);
        // BaseVersion and ClassVersion: 1 (NodeInfo's own), as the SA fills them.
        w.u8(4, 1);
        w.u8(5, 1);
        w.u8(6, self.node_type);
        w.u8(7, self.num_ports);
        w.u64(8, self.system_image_guid);
        w.u64(16, self.node_guid);
        w.u64(24, self.port_guid);
        w.u16(32, self.partition_cap);
        w.u16(34, self.device_id);
        w.u32(36, self.revision);
        w.u32(
            40,
            (u32::from(self.local_port_num) << 24) | (self.vendor_id & 0x00ff_ffff),
        );
        w.bytes(44, &self.description);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let mut description = [0u8; 64];
        description[..6].copy_from_slice(b"H2 HCA");
        let nr = NodeRecord {
            lid: Lid(0x0102),
            node_type: 1,
            num_ports: 2,
            system_image_guid: 0x1111_2222_3333_4444,
            node_guid: 0x0002_c903_0000_0100,
            port_guid: 0x0002_c903_0000_0102,
            partition_cap: 64,
            device_id: 0x1017,
            revision: 0x0000_00a0,
            local_port_num: 2,
            vendor_id: 0x0002c9,
            description,
        };
        let mut buf = [0u8; 108];
        nr.encode(&mut buf);
        assert_eq!(&buf[0..8], &[0x01, 0x02, 0, 0, 1, 1, 1, 2]);
        assert_eq!(&buf[16..24], &0x0002_c903_0000_0100u64.to_be_bytes());
        assert_eq!(&buf[24..32], &0x0002_c903_0000_0102u64.to_be_bytes());
        assert_eq!(&buf[40..44], &[2, 0x00, 0x02, 0xc9]);
        assert_eq!(&buf[44..50], b"H2 HCA");
        assert_eq!(NodeRecord::decode(&buf), Ok(nr));
        assert_eq!(nr.description_text(), "H2 HCA");
        assert!(NodeRecord::decode(&buf[..100]).is_err(), "short");
    }
}
