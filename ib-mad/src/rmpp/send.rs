//! The sending side of an RMPP transfer: segmentation and the window protocol.
//!
//! The sender may have segments up to NewWindowLast outstanding; it starts with a
//! window of one segment (IBA 13.6.3.2) and widens it as ACKs arrive. Time is the
//! caller's: on its retransmission timeout it calls [`RmppSender::retransmit`], which
//! rewinds to the first unacknowledged segment.

use super::{control_mad, data_offset, RmppError, RmppFlags, RmppHeader, RmppType};
use super::{RMPP_PAYLOAD_OFFSET, RMPP_SEGMENT_PAYLOAD, RMPP_VERSION};
use crate::header::{MadHeader, MgmtClass, MAD_SIZE};
use crate::types::Timeout;

/// Sends one message as RMPP DATA segments.
#[derive(Debug, Clone)]
pub struct RmppSender {
    template: Box<[u8; MAD_SIZE]>,
    data_off: usize,
    data: Vec<u8>,
    seg_count: u32,
    next: u32,
    /// Highest segment ever sent: after a rewind, ACKs may still cover segments above
    /// `next` that the receiver got the first time.
    sent_max: u32,
    last_acked: u32,
    window_last: u32,
    resp_time: Timeout,
}

impl RmppSender {
    /// A sender for `data` with the headers of `template` (common header and class
    /// header, e.g. a GetTableResp SaMad encoded with empty data). The class must use
    /// RMPP; `resp_time` goes into every segment's RRespTime.
    pub fn new(
        template: &[u8; MAD_SIZE],
        data: Vec<u8>,
        resp_time: Timeout,
    ) -> Result<RmppSender, RmppError> {
        let header = MadHeader::decode(&template[..])?;
        let class: MgmtClass = header.mgmt_class;
        let data_off = data_offset(class).ok_or(RmppError::NotRmppClass(class))?;
        let per_seg = MAD_SIZE - data_off;
        let seg_count = data.len().div_ceil(per_seg).max(1);
        let seg_count = u32::try_from(seg_count).map_err(|_| RmppError::TooLarge {
            needed: data.len() as u64,
            limit: u32::MAX as usize,
        })?;
        Ok(RmppSender {
            template: Box::new(*template),
            data_off,
            data,
            seg_count,
            next: 1,
            sent_max: 0,
            last_acked: 0,
            window_last: 1,
            resp_time,
        })
    }

    /// Number of segments in the transfer.
    pub fn segment_count(&self) -> u32 {
        self.seg_count
    }

    /// Whether the receiver acknowledged the last segment.
    pub fn is_complete(&self) -> bool {
        self.last_acked >= self.seg_count
    }

    /// The next segment that the window allows to send, if any.
    pub fn poll_transmit(&mut self) -> Option<[u8; MAD_SIZE]> {
        if self.next > self.seg_count || self.next > self.window_last {
            return None;
        }
        let seg = self.segment(self.next);
        self.sent_max = self.sent_max.max(self.next);
        self.next += 1;
        Some(seg)
    }

    /// Handle an ACK (or STOP/ABORT) from the receiver.
    pub fn handle_ack(&mut self, mad: &[u8]) -> Result<(), RmppError> {
        let rmpp = RmppHeader::decode(mad)?;
        match rmpp.rmpp_type {
            RmppType::Ack => {}
            t @ (RmppType::Stop | RmppType::Abort) => {
                return Err(RmppError::Ended {
                    rmpp_type: t,
                    status: rmpp.status,
                })
            }
            t => return Err(RmppError::UnexpectedType(t)),
        }
        let (seg, new_window_last) = (rmpp.data1, rmpp.data2);
        if seg > self.sent_max {
            return Err(RmppError::BadAck {
                segment: seg,
                sent: self.sent_max,
            });
        }
        if seg > self.last_acked {
            self.last_acked = seg;
            self.next = self.next.max(seg + 1);
        }
        self.window_last = self.window_last.max(new_window_last);
        Ok(())
    }

    /// Rewind to the first unacknowledged segment (the caller's timer expired).
    pub fn retransmit(&mut self) {
        self.next = self.last_acked + 1;
    }

    /// Build DATA segment `n` (1-based).
    pub fn segment(&self, n: u32) -> [u8; MAD_SIZE] {
        let per_seg = MAD_SIZE - self.data_off;
        let class_hdr = self.data_off - RMPP_PAYLOAD_OFFSET;
        let start = (n.saturating_sub(1) as usize).saturating_mul(per_seg);
        let end = start.saturating_add(per_seg).min(self.data.len());
        let chunk = self.data.get(start..end).unwrap_or(&[]);
        let first = n == 1;
        let last = n == self.seg_count;
        let pad = self.seg_count as usize * per_seg - self.data.len();
        let payload_length = if first {
            self.seg_count as usize * RMPP_SEGMENT_PAYLOAD - pad
        } else if last {
            class_hdr + chunk.len()
        } else {
            0
        };
        let mut out = [0u8; MAD_SIZE];
        out[..self.data_off].copy_from_slice(&self.template[..self.data_off]);
        out[self.data_off..self.data_off + chunk.len()].copy_from_slice(chunk);
        RmppHeader {
            version: RMPP_VERSION,
            rmpp_type: RmppType::Data,
            resp_time: self.resp_time,
            flags: RmppFlags {
                active: true,
                first,
                last,
            },
            status: 0,
            data1: n,
            data2: payload_length as u32,
        }
        .encode(&mut out);
        out
    }

    /// A STOP or ABORT cannot come from the sender's side of the protocol except as
    /// ABORT: build one for this transfer.
    pub fn abort(&self, status: u8) -> [u8; MAD_SIZE] {
        let mut mad = control_mad(
            &self.template,
            self.data_off,
            RmppHeader {
                version: RMPP_VERSION,
                rmpp_type: RmppType::Abort,
                flags: RmppFlags {
                    active: true,
                    ..RmppFlags::default()
                },
                status,
                ..RmppHeader::NONE
            },
        );
        // control_mad flips the response bit for receivers; the sender keeps its own.
        mad[3] ^= 0x80;
        mad
    }
}
