//! Subnet administration (class 0x03, version 2): the SA header, the SA MAD with a
//! typed payload, and the attributes umad-sa needs (InformInfo, Notice, PathRecord,
//! ClassPortInfo).
//!
//! Layout of an SA MAD: common header 0-23, RMPP header 24-35, SA header 36-55, data
//! 56-255 (200 bytes).

mod class_port_info;
mod inform_info;
pub mod node_record;
mod notice;
pub mod path_record;

pub use class_port_info::{ClassAddress, ClassPortInfo};
pub use inform_info::InformInfo;
pub use node_record::NodeRecord;
pub use notice::{Notice, NoticeDetails, DATA_DETAILS_SIZE};
pub use path_record::PathRecord;

use crate::attribute::Attribute;
use crate::error::DecodeError;
use crate::header::{AttributeId, MadHeader, Method, MgmtClass, MAD_SIZE};
use crate::rmpp::RmppHeader;
use crate::wire::{Reader, Writer};

/// SA class version.
pub const SA_CLASS_VERSION: u8 = 2;
/// Offset of the SA header in the MAD.
pub const SA_HEADER_OFFSET: usize = 36;
/// Offset of the SA data in the MAD.
pub const SA_DATA_OFFSET: usize = 56;
/// SA data bytes in one MAD.
pub const SA_DATA_SIZE: usize = MAD_SIZE - SA_DATA_OFFSET;

/// The SA header (MAD bytes 36-55).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SaHeader {
    /// SM_Key (bytes 36-43); 0 for ordinary clients.
    pub sm_key: u64,
    /// AttributeOffset (bytes 44-45): record size in 8-byte words, in table responses.
    pub attribute_offset: u16,
    /// ComponentMask (bytes 48-55): which template fields a query matches on.
    pub component_mask: u64,
}

impl SaHeader {
    /// Decode from a whole MAD (reads bytes 36-55).
    pub fn decode(mad: &[u8]) -> Result<SaHeader, DecodeError> {
        let r = Reader::new(mad);
        Ok(SaHeader {
            sm_key: r.u64(36, "sm_key")?,
            attribute_offset: r.u16(44, "attribute_offset")?,
            component_mask: r.u64(48, "component_mask")?,
        })
    }

    /// Encode into MAD bytes 36-55 (reserved bytes 46-47 zero).
    pub fn encode(&self, mad: &mut [u8; MAD_SIZE]) {
        let mut w = Writer::new(mad);
        w.u64(36, self.sm_key);
        w.u16(44, self.attribute_offset);
        w.u16(46, 0);
        w.u64(48, self.component_mask);
    }
}

/// The data of an SA MAD, typed by attribute where this crate knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaPayload {
    /// InformInfo (0x0003): a subscription, or its GetResp.
    InformInfo(InformInfo),
    /// Notice (0x0002): a trap forwarded in a Report.
    Notice(Notice),
    /// PathRecord (0x0035): a query template or a Get response.
    PathRecord(PathRecord),
    /// ClassPortInfo (0x0001).
    ClassPortInfo(ClassPortInfo),
    /// Anything else: other attributes, error responses, RMPP segments, table
    /// responses (decode those with [`table_records`]). The 200 data bytes as they are.
    Raw(Box<[u8; SA_DATA_SIZE]>),
}

impl SaPayload {
    /// The AttributeID that goes with a typed payload (`None` for raw data).
    pub fn attribute_id(&self) -> Option<AttributeId> {
        Some(match self {
            SaPayload::InformInfo(_) => InformInfo::ID,
            SaPayload::Notice(_) => Notice::ID,
            SaPayload::PathRecord(_) => PathRecord::ID,
            SaPayload::ClassPortInfo(_) => ClassPortInfo::ID,
            SaPayload::Raw(_) => return None,
        })
    }

    fn encode(&self, data: &mut [u8]) {
        match self {
            SaPayload::InformInfo(a) => a.encode(data),
            SaPayload::Notice(a) => a.encode(data),
            SaPayload::PathRecord(a) => a.encode(data),
            SaPayload::ClassPortInfo(a) => a.encode(data),
            SaPayload::Raw(raw) => Writer::new(data).bytes(0, &raw[..]),
        }
    }
}

/// A whole SA MAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaMad {
    /// Common MAD header (class 0x03, version 2).
    pub header: MadHeader,
    /// RMPP header (all zero unless the MAD is part of an RMPP transfer).
    pub rmpp: RmppHeader,
    /// SA header.
    pub sa: SaHeader,
    /// The data.
    pub payload: SaPayload,
}

impl SaMad {
    /// An SA MAD with `method`, `tid` and a typed payload; the attribute ID follows the
    /// payload, RMPP is off, SM_Key 0.
    pub fn new(method: Method, transaction_id: u64, payload: SaPayload) -> SaMad {
        let attribute_id = payload.attribute_id().unwrap_or(AttributeId(0));
        SaMad {
            header: MadHeader::new(
                MgmtClass::SUBN_ADM,
                SA_CLASS_VERSION,
                method,
                transaction_id,
                attribute_id,
            ),
            rmpp: RmppHeader::NONE,
            sa: SaHeader::default(),
            payload,
        }
    }

    /// A subscription request: Set(InformInfo). Subscribe or unsubscribe is
    /// `info.subscribe`. The SA answers GetResp(InformInfo) with the same TID.
    pub fn set_inform_info(transaction_id: u64, info: InformInfo) -> SaMad {
        SaMad::new(Method::SET, transaction_id, SaPayload::InformInfo(info))
    }

    /// A GetTable(PathRecord) query: `template` fields selected by `component_mask`
    /// (see [`path_record::mask`]). The response may span several RMPP segments.
    pub fn path_record_query(
        transaction_id: u64,
        template: PathRecord,
        component_mask: u64,
    ) -> SaMad {
        let mut mad = SaMad::new(
            Method::GET_TABLE,
            transaction_id,
            SaPayload::PathRecord(template),
        );
        mad.sa.component_mask = component_mask;
        mad
    }

    /// A GetTable(NodeRecord) query: `template` fields selected by `component_mask`
    /// (`node_record::mask`). The record goes as raw data: apm asks for NodeRecords and
    /// reads them from the table, it never sends one otherwise.
    pub fn node_record_query(
        transaction_id: u64,
        template: &NodeRecord,
        component_mask: u64,
    ) -> SaMad {
        let mut data = Box::new([0u8; SA_DATA_SIZE]);
        template.encode(&mut data[..]);
        let mut mad = SaMad::new(Method::GET_TABLE, transaction_id, SaPayload::Raw(data));
        mad.header.attribute_id = NodeRecord::ID;
        mad.sa.component_mask = component_mask;
        mad
    }

    /// The ReportResp that acknowledges this Report: same TID, attribute and Notice.
    /// Without it OpenSM retransmits the Report and logs ERR 1A06.
    pub fn report_response(&self) -> SaMad {
        SaMad {
            header: self.header.response(0),
            rmpp: RmppHeader::NONE,
            sa: self.sa,
            payload: self.payload.clone(),
        }
    }

    /// Decode a whole SA MAD (exactly 256 bytes).
    pub fn decode(mad: &[u8]) -> Result<SaMad, DecodeError> {
        if mad.len() != MAD_SIZE {
            return Err(DecodeError::Length {
                len: mad.len(),
                expected: MAD_SIZE,
            });
        }
        let header = MadHeader::decode(mad)?;
        header.expect_class_version(SA_CLASS_VERSION)?;
        let rmpp = RmppHeader::decode(mad)?;
        let sa = SaHeader::decode(mad)?;
        let r = Reader::new(mad);
        let data = r.bytes::<SA_DATA_SIZE>(SA_DATA_OFFSET, "sa_data")?;
        // One typed attribute only where the data is exactly one attribute: not in an
        // RMPP segment (a slice of a stream: reassemble it with RmppReceiver), not in a
        // table response (several records: use table_records), not in an error
        // response. Everything else stays raw so that no byte is lost.
        let table = matches!(
            header.method,
            Method::GET_TABLE_RESP | Method::GET_MULTI_RESP
        );
        let typed = header.status == 0 && !rmpp.is_active() && !table;
        let at = |e: DecodeError| e.shifted(SA_DATA_OFFSET);
        let payload = match header.attribute_id {
            _ if !typed => SaPayload::Raw(Box::new(data)),
            InformInfo::ID => SaPayload::InformInfo(InformInfo::decode(&data).map_err(at)?),
            Notice::ID => SaPayload::Notice(Notice::decode(&data).map_err(at)?),
            PathRecord::ID => SaPayload::PathRecord(PathRecord::decode(&data).map_err(at)?),
            ClassPortInfo::ID => {
                SaPayload::ClassPortInfo(ClassPortInfo::decode(&data).map_err(at)?)
            }
            _ => SaPayload::Raw(Box::new(data)),
        };
        Ok(SaMad {
            header,
            rmpp,
            sa,
            payload,
        })
    }

    /// Encode the whole MAD.
    pub fn encode(&self) -> [u8; MAD_SIZE] {
        let mut mad = [0u8; MAD_SIZE];
        self.header.encode(&mut mad);
        self.rmpp.encode(&mut mad);
        self.sa.encode(&mut mad);
        self.payload.encode(&mut mad[SA_DATA_OFFSET..]);
        mad
    }
}

/// Decode the records of a reassembled table (GetTableResp data): `attribute_offset`
/// is the SA header's record stride in 8-byte words. Records are decoded lazily; an
/// error names the record's offset within `data`.
pub fn table_records<A: Attribute>(
    data: &[u8],
    attribute_offset: u16,
) -> impl Iterator<Item = Result<A, DecodeError>> + '_ {
    let stride = (usize::from(attribute_offset) * 8).max(A::SIZE);
    let count = data.len() / stride;
    (0..count).map(move |i| {
        let start = i * stride;
        let end = (start + A::SIZE).min(data.len());
        A::decode(data.get(start..end).unwrap_or(&[])).map_err(|e| e.shifted(start))
    })
}
