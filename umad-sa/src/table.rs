//! SA tables: a GetTable query with RMPP reassembly (kernel-segmented or not), its
//! records decoded; and the NodeRecord queries that name a peer node's other ports.

use crate::{SaClient, SaError, STATUS_NO_RECORDS};
use ib_mad::rmpp::{RecvEvent, RmppHeader, RmppReceiver};
use ib_mad::sa::{node_record, table_records, NodeRecord, PathRecord, SaHeader, SaMad};
use ib_mad::sa::{SA_DATA_OFFSET, SA_DATA_SIZE};
use ib_mad::types::Gid;
use ib_mad::Attribute;
use ib_mad::{Method, MAD_SIZE};
use tracing::debug;
use umad::Dest;

impl SaClient {
    /// A GetTable query (`query`, a whole encoded SA MAD) with RMPP reassembly, retried
    /// as a whole on timeout; its records decoded as `R`.
    pub(crate) async fn get_table<R: Record>(&self, query: &[u8]) -> Result<Table<R>, SaError> {
        let dest = self.sa_dest()?;
        let opts = self.opts.request;
        let (mut pending, mad) = self.port.start_request(query)?;
        'attempt: loop {
            let mut rx = RmppReceiver::new();
            pending.send(&mad, dest, opts.timeout)?;
            loop {
                let Some(seg) = pending.recv_timeout(opts.timeout).await? else {
                    if pending.sends() > opts.retries {
                        return Err(pending.give_up().into());
                    }
                    debug!(
                        attempts = pending.sends(),
                        "GetTable timed out; asking again"
                    );
                    continue 'attempt;
                };
                if seg.method() != Method::GET_TABLE_RESP.0 {
                    continue; // e.g. a stray response with our TID low bits
                }
                let status = u16::from_be_bytes([seg.mad[4], seg.mad[5]]);
                if status == STATUS_NO_RECORDS {
                    return Ok(Table::default());
                }
                if status != 0 {
                    return Err(SaError::Status(status));
                }
                if seg.mad.len() > MAD_SIZE {
                    // The kernel reassembled the RMPP transfer (agent registered with
                    // RMPP): headers of the first segment, then every record.
                    let hdr = SaHeader::decode(&seg.mad)?;
                    let data = seg.mad.get(SA_DATA_OFFSET..).unwrap_or(&[]);
                    let records =
                        table_records::<R>(data, hdr.attribute_offset)
                            .collect::<Result<Vec<_>, _>>()?;
                    return Ok(Table {
                        records,
                        maybe_truncated: false,
                    });
                }
                // OpenSM leaves segmentation to the kernel: it marks its GetTableResp
                // RMPP-active with version 0 and type 0 and the kernel fills in the rest.
                // umad2sim has no kernel and truncates to one MAD, so such a MAD arrives
                // as is: take it as an unsegmented (possibly truncated) response.
                let mut mad = seg.mad.clone();
                let unsegmented = mad.len() > 26 && mad[24] == 0 && mad[25] == 0;
                if unsegmented {
                    mad[26] &= !0x07;
                }
                match rx.handle(&mad) {
                    Ok(RecvEvent::Continue { ack }) => {
                        if let Some(ack) = ack {
                            self.port.send(&ack, Dest::reply_to(&seg.src))?;
                        }
                    }
                    Ok(RecvEvent::Complete { ack, message }) => {
                        if let Some(ack) = ack {
                            self.port.send(&ack, Dest::reply_to(&seg.src))?;
                        }
                        let first = message.first_segment();
                        let hdr = SaHeader::decode(first)?;
                        let segmented = RmppHeader::decode(first)
                            .map(|h| h.is_active())
                            .unwrap_or(false);
                        let mut records = table_records::<R>(message.data(), hdr.attribute_offset)
                            .collect::<Result<Vec<_>, _>>()?;
                        if !segmented {
                            // No payload length: the unused tail of the MAD decodes as
                            // all-zero records, which no real record is.
                            records.retain(|r| !r.is_blank());
                        }
                        // A full single MAD may be a truncated table (see path_records).
                        let stride = (usize::from(hdr.attribute_offset) * 8).max(R::SIZE);
                        let maybe_truncated = !segmented && records.len() >= SA_DATA_SIZE / stride;
                        return Ok(Table {
                            records,
                            maybe_truncated,
                        });
                    }
                    Err(e) => {
                        // Name the segment: its common and RMPP headers say what went wrong.
                        let head: String =
                            seg.mad[..36].iter().map(|b| format!("{b:02x}")).collect();
                        return Err(SaError::Rmpp { source: e, head });
                    }
                }
            }
        }
    }
}

/// The records of one GetTable response.
#[derive(Debug)]
pub(crate) struct Table<R> {
    pub(crate) records: Vec<R>,
    /// Unsegmented and full: the SA may have had more records than one MAD holds.
    pub(crate) maybe_truncated: bool,
}

impl<R> Default for Table<R> {
    fn default() -> Self {
        Table {
            records: Vec::new(),
            maybe_truncated: false,
        }
    }
}

/// A record of an SA table.
pub(crate) trait Record: Attribute {
    /// An all-zero record, as the unused tail of an unsegmented MAD decodes (no real
    /// path has both LIDs 0, no real node record LID 0).
    fn is_blank(&self) -> bool;
}

impl Record for PathRecord {
    fn is_blank(&self) -> bool {
        self.slid.0 == 0 && self.dlid.0 == 0
    }
}

impl Record for NodeRecord {
    fn is_blank(&self) -> bool {
        self.lid.0 == 0
    }
}

impl SaClient {
    /// Every port of the node behind `lid` (a peer port, named by its LID as a QP
    /// without a GRH names it): `(port GID, base LID, port number)`, the GID made of
    /// this port's subnet prefix and each port's GUID. Two NodeRecord queries: by LID
    /// for the node's GUID, then by NodeGUID for every port (IBA 15.2.5.2: a channel
    /// adapter has one record per port).
    pub async fn node_ports(&self, lid: u16) -> Result<Vec<(Gid, u16, u8)>, SaError> {
        let by_lid = NodeRecord {
            lid: ib_mad::types::Lid(lid),
            ..NodeRecord::default()
        };
        let query = SaMad::node_record_query(0, &by_lid, node_record::mask::LID).encode();
        let first: Table<NodeRecord> = self.get_table(&query).await?;
        let Some(node) = first.records.first() else {
            return Ok(Vec::new());
        };
        let by_node = NodeRecord {
            node_guid: node.node_guid,
            ..NodeRecord::default()
        };
        let query = SaMad::node_record_query(0, &by_node, node_record::mask::NODE_GUID).encode();
        let mut all: Table<NodeRecord> = self.get_table(&query).await?;
        if all.maybe_truncated {
            // One unsegmented MAD holds one record (umad2sim: no kernel to segment):
            // ask for each port of the node by its number.
            debug!(
                lid,
                ports = node.num_ports,
                "unsegmented NodeRecord table: asking per port"
            );
            let mut records = Vec::new();
            for n in 1..=node.num_ports {
                let one = NodeRecord {
                    node_guid: node.node_guid,
                    local_port_num: n,
                    ..NodeRecord::default()
                };
                let m = node_record::mask::NODE_GUID | node_record::mask::LOCAL_PORT_NUM;
                let query = SaMad::node_record_query(0, &one, m).encode();
                let part: Table<NodeRecord> = self.get_table(&query).await?;
                records.extend(part.records);
            }
            all.records = records;
        }
        let prefix: [u8; 8] = self.port.refresh_info()?.gid[..8]
            .try_into()
            .unwrap_or([0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
        let mut out: Vec<(Gid, u16, u8)> = all
            .records
            .iter()
            .filter(|r| r.node_guid == node.node_guid)
            .map(|r| {
                let mut g = [0u8; 16];
                g[..8].copy_from_slice(&prefix);
                g[8..].copy_from_slice(&r.port_guid.to_be_bytes());
                (Gid(g), r.lid.0, r.local_port_num)
            })
            .collect();
        out.sort_by_key(|(_, _, port)| *port);
        out.dedup();
        debug!(lid, ports = out.len(), "the peer node's ports");
        Ok(out)
    }
}
