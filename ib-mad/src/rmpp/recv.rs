//! The receiving side of an RMPP transfer: reassembly plus the ACK/window handshake.
//!
//! The receiver acknowledges segment 1 at once (opening a window of `window`
//! segments), then the last segment of every window and the final segment. Duplicate
//! segments are answered by repeating the last ACK (the sender's ACK was lost);
//! segments beyond the expected one are dropped and the last ACK repeated so the
//! sender goes back. Memory is bounded by the configured limit, checked against the
//! announced PayloadLength before anything is stored.

use super::{control_mad, data_offset, RmppError, RmppFlags, RmppHeader, RmppType};
use super::{RMPP_PAYLOAD_OFFSET, RMPP_SEGMENT_PAYLOAD, RMPP_VERSION};
use crate::header::{MadHeader, MAD_SIZE};

/// What the caller does after handing a segment to [`RmppReceiver::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecvEvent {
    /// Send `ack` when present, then wait for more segments.
    Continue {
        /// An ACK MAD to send back to the sender.
        ack: Option<[u8; MAD_SIZE]>,
    },
    /// The transfer is complete: send `ack` when present, then use `message`.
    Complete {
        /// The final ACK (absent when the MAD did not use RMPP at all).
        ack: Option<[u8; MAD_SIZE]>,
        /// The reassembled message.
        message: Reassembled,
    },
}

/// A reassembled multi-segment message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reassembled {
    first: Box<[u8; MAD_SIZE]>,
    data_off: usize,
    data: Vec<u8>,
}

impl Reassembled {
    /// The first segment as received: its common, RMPP and class headers describe the
    /// whole message.
    pub fn first_segment(&self) -> &[u8; MAD_SIZE] {
        &self.first
    }

    /// The common MAD header of the message.
    pub fn header(&self) -> Option<MadHeader> {
        MadHeader::decode(&self.first[..]).ok()
    }

    /// The class header (the SA header, or the vendor reserved byte and OUI).
    pub fn class_header(&self) -> &[u8] {
        self.first
            .get(RMPP_PAYLOAD_OFFSET..self.data_off)
            .unwrap_or(&[])
    }

    /// The class data of all segments, concatenated, without padding.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The data, by value.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }
}

/// Reassembles one RMPP transfer (one TID). Create one per outstanding request.
#[derive(Debug, Clone)]
pub struct RmppReceiver {
    window: u32,
    max_data: usize,
    first: Option<Box<[u8; MAD_SIZE]>>,
    data_off: usize,
    data: Vec<u8>,
    next_seg: u32,
    window_last: u32,
    done: bool,
}

impl RmppReceiver {
    /// The window the Linux MAD layer uses by default.
    pub const DEFAULT_WINDOW: u32 = 64;
    /// Default limit on reassembled data: 1 MiB, ~5000 PathRecords.
    pub const DEFAULT_MAX_DATA: usize = 1 << 20;

    /// A receiver with the default window and limit.
    pub fn new() -> RmppReceiver {
        RmppReceiver::with_limits(Self::DEFAULT_WINDOW, Self::DEFAULT_MAX_DATA)
    }

    /// A receiver that opens windows of `window` segments (at least 1) and refuses
    /// transfers whose class data exceeds `max_data` bytes.
    pub fn with_limits(window: u32, max_data: usize) -> RmppReceiver {
        RmppReceiver {
            window: window.max(1),
            max_data,
            first: None,
            data_off: 0,
            data: Vec::new(),
            next_seg: 1,
            window_last: 1,
            done: false,
        }
    }

    /// Whether the transfer completed.
    pub fn is_complete(&self) -> bool {
        self.done
    }

    /// Handle one received MAD of the transfer.
    pub fn handle(&mut self, mad: &[u8]) -> Result<RecvEvent, RmppError> {
        let (rmpp, data_off, seg_buf) = read_segment(mad)?;
        self.check_same_transfer(&seg_buf)?;
        if !rmpp.is_active() {
            // A response short enough not to use RMPP at all.
            self.done = true;
            return Ok(RecvEvent::Complete {
                ack: None,
                message: Reassembled {
                    data: seg_buf[data_off..].to_vec(),
                    first: Box::new(seg_buf),
                    data_off,
                },
            });
        }
        data_segment(&rmpp)?;
        let seg = rmpp.data1;
        let class_hdr = data_off - RMPP_PAYLOAD_OFFSET;
        let per_seg = (MAD_SIZE - data_off) as u64;
        if self.first.is_none() {
            if seg != 1 || !rmpp.flags.first {
                // Nothing to acknowledge yet: the sender starts again from segment 1.
                return Ok(RecvEvent::Continue { ack: None });
            }
            // PayloadLength counts the class header of every segment; bound the data.
            let total = u64::from(rmpp.data2);
            let segs = total.div_ceil(RMPP_SEGMENT_PAYLOAD as u64);
            let needed = total.saturating_sub(segs * class_hdr as u64);
            if needed > self.max_data as u64 {
                return Err(RmppError::TooLarge {
                    needed,
                    limit: self.max_data,
                });
            }
            self.first = Some(Box::new(seg_buf));
            self.data_off = data_off;
        }
        if self.done || seg < self.next_seg {
            return Ok(RecvEvent::Continue {
                ack: Some(self.ack(self.next_seg - 1)),
            });
        }
        if seg > self.next_seg {
            return Ok(RecvEvent::Continue {
                ack: Some(self.ack(self.next_seg - 1)),
            });
        }
        let needed = u64::from(seg) * per_seg;
        let mut chunk = &seg_buf[data_off..];
        if rmpp.flags.last {
            let paylen = rmpp.data2 as usize;
            if paylen > RMPP_SEGMENT_PAYLOAD || paylen < class_hdr {
                return Err(RmppError::BadPayloadLength(rmpp.data2));
            }
            chunk = &chunk[..paylen - class_hdr];
        } else if needed > self.max_data as u64 {
            return Err(RmppError::TooLarge {
                needed,
                limit: self.max_data,
            });
        }
        if self.data.len() + chunk.len() > self.max_data {
            return Err(RmppError::TooLarge {
                needed: (self.data.len() + chunk.len()) as u64,
                limit: self.max_data,
            });
        }
        self.data.extend_from_slice(chunk);
        self.next_seg = seg.saturating_add(1);
        if rmpp.flags.last {
            self.done = true;
            self.window_last = seg.saturating_add(self.window);
            let ack = self.ack(seg);
            let first = self.first.take().unwrap_or_else(|| Box::new(seg_buf));
            let message = Reassembled {
                first,
                data_off,
                data: core::mem::take(&mut self.data),
            };
            // Keep a copy of the header so duplicates of the last segment are re-ACKed.
            self.first = Some(message.first.clone());
            return Ok(RecvEvent::Complete {
                ack: Some(ack),
                message,
            });
        }
        if seg >= self.window_last {
            self.window_last = seg.saturating_add(self.window);
            return Ok(RecvEvent::Continue {
                ack: Some(self.ack(seg)),
            });
        }
        Ok(RecvEvent::Continue { ack: None })
    }

    /// A segment of another transfer (class, TID, method) is refused.
    fn check_same_transfer(&self, seg_buf: &[u8; MAD_SIZE]) -> Result<(), RmppError> {
        if let Some(first) = &self.first {
            let same = first[1] == seg_buf[1]
                && first[8..18] == seg_buf[8..18]
                && first[3] & 0x7f == seg_buf[3] & 0x7f;
            if !same {
                return Err(RmppError::Mismatch);
            }
        }
        Ok(())
    }

    fn ack(&self, seg: u32) -> [u8; MAD_SIZE] {
        let template = self.first.as_deref().copied().unwrap_or([0u8; MAD_SIZE]);
        control_mad(
            &template,
            self.data_off,
            RmppHeader {
                version: RMPP_VERSION,
                rmpp_type: RmppType::Ack,
                flags: RmppFlags {
                    active: true,
                    ..RmppFlags::default()
                },
                data1: seg,
                data2: self.window_last,
                ..RmppHeader::NONE
            },
        )
    }
}

impl Default for RmppReceiver {
    fn default() -> Self {
        RmppReceiver::new()
    }
}

/// One received MAD as a segment: its RMPP header, where its class puts the data, and
/// the whole MAD (exactly [`MAD_SIZE`] bytes).
fn read_segment(mad: &[u8]) -> Result<(RmppHeader, usize, [u8; MAD_SIZE]), RmppError> {
    let header = MadHeader::decode(mad)?;
    let rmpp = RmppHeader::decode(mad)?;
    let data_off =
        data_offset(header.mgmt_class).ok_or(RmppError::NotRmppClass(header.mgmt_class))?;
    let mut seg_buf = [0u8; MAD_SIZE];
    match mad.get(..MAD_SIZE) {
        Some(m) if mad.len() == MAD_SIZE => seg_buf.copy_from_slice(m),
        _ => {
            return Err(crate::error::DecodeError::Length {
                len: mad.len(),
                expected: MAD_SIZE,
            }
            .into())
        }
    }
    Ok((rmpp, data_off, seg_buf))
}

/// An active segment must carry data: a Stop or Abort ends the transfer, anything else
/// is unexpected here.
fn data_segment(rmpp: &RmppHeader) -> Result<(), RmppError> {
    match rmpp.rmpp_type {
        RmppType::Data => Ok(()),
        t @ (RmppType::Stop | RmppType::Abort) => Err(RmppError::Ended {
            rmpp_type: t,
            status: rmpp.status,
        }),
        t => Err(RmppError::UnexpectedType(t)),
    }
}
