//! APR, Alternate Path Response (CM attribute 0x001A, IBA 12.8.2): the answer to a LAP,
//! with the status of every outcome the IBA defines.

use crate::attribute::Attribute;
use crate::error::{DecodeError, RangeError};
use crate::header::AttributeId;
use crate::wire::{invalid, Reader, Writer};

/// AdditionalInfo room in an APR.
pub const APR_ADDITIONAL_INFO_SIZE: usize = 72;
/// Private data bytes of an APR.
pub const APR_PRIVATE_DATA_SIZE: usize = 148;

/// APStatus (byte 9): why the alternate path was or was not loaded. The one APStatus
/// type of the workspace: the engine (`apm_core::ApStatus`) re-exports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ApStatus {
    /// 0: the alternate path was loaded.
    Success = 0,
    /// 1: invalid communication ID.
    InvalidCommId = 1,
    /// 2: alternate paths not supported.
    Unsupported = 2,
    /// 3: rejected.
    Rejected = 3,
    /// 4: redirect (AdditionalInfo holds a ClassPortInfo).
    Redirect = 4,
    /// 5: the LAP repeats the current primary path.
    IsCurrent = 5,
    /// 6: invalid QPN/EECN.
    InvalidQpn = 6,
    /// 7: invalid LID (AdditionalInfo: the offending LID).
    InvalidLid = 7,
    /// 8: invalid GID (AdditionalInfo: the offending GID).
    InvalidGid = 8,
    /// 9: invalid flow label.
    InvalidFlowLabel = 9,
    /// 10: invalid traffic class.
    InvalidTrafficClass = 10,
    /// 11: invalid hop limit.
    InvalidHopLimit = 11,
    /// 12: invalid packet rate.
    InvalidPacketRate = 12,
    /// 13: invalid SL.
    InvalidSl = 13,
}

impl ApStatus {
    /// Every status, in code order.
    pub const ALL: [ApStatus; 14] = [
        ApStatus::Success,
        ApStatus::InvalidCommId,
        ApStatus::Unsupported,
        ApStatus::Rejected,
        ApStatus::Redirect,
        ApStatus::IsCurrent,
        ApStatus::InvalidQpn,
        ApStatus::InvalidLid,
        ApStatus::InvalidGid,
        ApStatus::InvalidFlowLabel,
        ApStatus::InvalidTrafficClass,
        ApStatus::InvalidHopLimit,
        ApStatus::InvalidPacketRate,
        ApStatus::InvalidSl,
    ];

    /// The status for a wire code, if it is one.
    pub fn from_code(code: u8) -> Option<ApStatus> {
        ApStatus::ALL.get(usize::from(code)).copied()
    }

    /// The wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// A short English description.
    pub fn description(self) -> &'static str {
        match self {
            ApStatus::Success => "alternate path loaded",
            ApStatus::InvalidCommId => "invalid communication ID",
            ApStatus::Unsupported => "alternate paths not supported",
            ApStatus::Rejected => "rejected",
            ApStatus::Redirect => "redirect",
            ApStatus::IsCurrent => "path is the current primary",
            ApStatus::InvalidQpn => "invalid QPN/EECN",
            ApStatus::InvalidLid => "invalid LID",
            ApStatus::InvalidGid => "invalid GID",
            ApStatus::InvalidFlowLabel => "invalid flow label",
            ApStatus::InvalidTrafficClass => "invalid traffic class",
            ApStatus::InvalidHopLimit => "invalid hop limit",
            ApStatus::InvalidPacketRate => "invalid packet rate",
            ApStatus::InvalidSl => "invalid SL",
        }
    }
}

/// AdditionalInfo: at most 72 bytes, its length in AdditionalInfoLength (byte 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdditionalInfo {
    len: u8,
    bytes: [u8; APR_ADDITIONAL_INFO_SIZE],
}

impl AdditionalInfo {
    /// No additional information.
    pub const EMPTY: AdditionalInfo = AdditionalInfo {
        len: 0,
        bytes: [0; APR_ADDITIONAL_INFO_SIZE],
    };

    /// Additional information, at most 72 bytes.
    pub fn new(info: &[u8]) -> Result<AdditionalInfo, RangeError> {
        if info.len() > APR_ADDITIONAL_INFO_SIZE {
            return Err(RangeError {
                what: "AdditionalInfo",
                value: info.len() as u64,
                max: APR_ADDITIONAL_INFO_SIZE as u64,
            });
        }
        let mut bytes = [0u8; APR_ADDITIONAL_INFO_SIZE];
        bytes[..info.len()].copy_from_slice(info);
        Ok(AdditionalInfo {
            len: info.len() as u8,
            bytes,
        })
    }

    /// The information bytes (AdditionalInfoLength of them).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(APR_ADDITIONAL_INFO_SIZE)]
    }
}

impl Default for AdditionalInfo {
    fn default() -> Self {
        AdditionalInfo::EMPTY
    }
}

/// APR.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Apr {
    /// LocalCommID (0-3).
    pub local_comm_id: u32,
    /// RemoteCommID (4-7).
    pub remote_comm_id: u32,
    /// APStatus (byte 9).
    pub ap_status: ApStatus,
    /// AdditionalInfoLength (byte 8) and AdditionalInfo (12-83).
    pub additional_info: AdditionalInfo,
    /// PrivateData (84-231).
    pub private_data: [u8; APR_PRIVATE_DATA_SIZE],
}

impl Apr {
    /// An APR answering a LAP with `status`, no additional info and no private data.
    pub fn answer(local_comm_id: u32, remote_comm_id: u32, ap_status: ApStatus) -> Apr {
        Apr {
            local_comm_id,
            remote_comm_id,
            ap_status,
            additional_info: AdditionalInfo::EMPTY,
            private_data: [0; APR_PRIVATE_DATA_SIZE],
        }
    }
}

impl Attribute for Apr {
    const ID: AttributeId = AttributeId::CM_APR;
    const SIZE: usize = 232;
    const MIN_SIZE: usize = 84;

    fn decode(buf: &[u8]) -> Result<Apr, DecodeError> {
        let r = Reader::new(buf);
        let len = r.u8(8, "additional_info_length")?;
        if usize::from(len) > APR_ADDITIONAL_INFO_SIZE {
            return Err(invalid(
                "additional_info_length",
                8,
                len,
                "exceeds the 72 bytes of AdditionalInfo",
            ));
        }
        let code = r.u8(9, "ap_status")?;
        let ap_status = ApStatus::from_code(code)
            .ok_or_else(|| invalid("ap_status", 9, code, "is not an APStatus (0-13)"))?;
        Ok(Apr {
            local_comm_id: r.u32(0, "local_comm_id")?,
            remote_comm_id: r.u32(4, "remote_comm_id")?,
            ap_status,
            additional_info: {
                // Bytes past AdditionalInfoLength are not information: drop them, so two
                // APRs that say the same compare equal (found by the `mad` fuzz target).
                let mut bytes: [u8; APR_ADDITIONAL_INFO_SIZE] = r.bytes(12, "additional_info")?;
                bytes[usize::from(len)..].fill(0);
                AdditionalInfo { len, bytes }
            },
            private_data: r.bytes_padded(84),
        })
    }

    fn encode(&self, buf: &mut [u8]) {
        let mut w = Writer::new(buf);
        w.u32(0, self.local_comm_id);
        w.u32(4, self.remote_comm_id);
        w.u8(8, self.additional_info.len);
        w.u8(9, self.ap_status.code());
        w.u16(10, 0);
        // Bytes past AdditionalInfoLength are zero on the wire whatever the caller kept.
        let mut info = [0u8; APR_ADDITIONAL_INFO_SIZE];
        let used = self.additional_info.as_bytes();
        info[..used.len()].copy_from_slice(used);
        w.bytes(12, &info);
        w.bytes(84, &self.private_data);
    }
}
