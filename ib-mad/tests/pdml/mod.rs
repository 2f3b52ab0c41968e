//! Shared helpers for the tshark proof: pcap writing and a small PDML reader.
//!
//! The PDML reader is line based on purpose: tshark writes one `<field .../>` per line,
//! and a full XML parser would be a dependency for no gain.

#![allow(dead_code)] // each test binary uses a different subset

/// Byte position of the MAD inside each captured frame: exported-PDU tags (18 bytes:
/// dissector-name tag with "infiniband", end-of-options tag), LRH 8, BTH 12, DETH 8.
pub const MAD_POS: usize = 18 + 8 + 12 + 8;

/// One frame: exported PDU header for the `infiniband` dissector, then
/// LRH | BTH (UD SEND only) | DETH | MAD | ICRC | VCRC.
pub fn frame(mad: &[u8; 256], dest_qp: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(320);
    let name = b"infiniband";
    f.extend_from_slice(&12u16.to_be_bytes());
    f.extend_from_slice(&(name.len() as u16).to_be_bytes());
    f.extend_from_slice(name);
    f.extend_from_slice(&[0, 0, 0, 0]);
    // LRH: VL 0, LVer 0, SL 0, LNH 2 (IBA local: BTH follows), DLID 1, PktLen in
    // 4-byte words from LRH to ICRC (8+12+8+256+4 = 288 -> 72), SLID 2.
    f.extend_from_slice(&[0x00, 0x02, 0x00, 0x01, 0x00, 72, 0x00, 0x02]);
    // BTH: opcode 0x64 (UD SEND only), flags 0, P_Key 0xFFFF, DestQP, PSN 0.
    f.extend_from_slice(&[0x64, 0x00, 0xFF, 0xFF]);
    f.extend_from_slice(&(dest_qp & 0xFF_FFFF).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    // DETH: Q_Key 0x80010000 (the well-known GSI Q_Key), SrcQP = DestQP.
    f.extend_from_slice(&0x8001_0000u32.to_be_bytes());
    f.extend_from_slice(&(dest_qp & 0xFF_FFFF).to_be_bytes());
    f.extend_from_slice(mad);
    f.extend_from_slice(&[0; 6]); // ICRC, VCRC: tshark does not check them
    f
}

/// A classic pcap (microsecond, little endian) with link type 252 (exported PDU).
pub fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&252u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// One `<field>` of the PDML output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Field name, e.g. `infiniband.mad.attributeid`.
    pub name: String,
    /// Byte position in the frame.
    pub pos: usize,
    /// Size in bytes.
    pub size: usize,
    /// `show` attribute (display text).
    pub show: String,
    /// `value` attribute: hex of the (masked, shifted) value or of the bytes.
    pub value: String,
    /// `unmaskedvalue`: hex of the raw bytes of a bit field.
    pub unmasked: Option<String>,
    /// `showname`: for bit fields it starts with the bit pattern (`.000 0011 ...`).
    pub showname: String,
}

impl Field {
    /// The bit mask of a bit field, read from the pattern at the start of `showname`
    /// (`..00 0111` -> 0b0011_1111), over `size` bytes; `None` for byte-aligned fields.
    pub fn bit_mask(&self) -> Option<u64> {
        self.unmasked.as_ref()?;
        let pattern: String = self
            .showname
            .chars()
            .take_while(|c| matches!(c, '.' | '0' | '1' | ' '))
            .filter(|c| *c != ' ')
            .collect();
        if pattern.len() != self.size * 8 {
            return None;
        }
        let mut mask = 0u64;
        for c in pattern.chars() {
            mask = (mask << 1) | u64::from(c != '.');
        }
        Some(mask)
    }
}

fn attr(line: &str, key: &str) -> Option<String> {
    let pat = format!(" {key}=\"");
    let start = line.find(&pat)? + pat.len();
    let end = line[start..].find('"')? + start;
    Some(
        line[start..end]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&amp;", "&"),
    )
}

/// Split PDML into packets, each a list of fields in document order.
pub fn parse(pdml: &str) -> Vec<Vec<Field>> {
    let mut packets = Vec::new();
    let mut current: Vec<Field> = Vec::new();
    for line in pdml.lines() {
        let t = line.trim_start();
        if t.starts_with("<packet>") {
            current = Vec::new();
        } else if t.starts_with("</packet>") {
            packets.push(std::mem::take(&mut current));
        } else if t.starts_with("<field ") {
            let (Some(name), Some(pos), Some(size)) =
                (attr(t, "name"), attr(t, "pos"), attr(t, "size"))
            else {
                continue;
            };
            let (Ok(pos), Ok(size)) = (pos.parse(), size.parse()) else {
                continue;
            };
            current.push(Field {
                name,
                pos,
                size,
                show: attr(t, "show").unwrap_or_default(),
                value: attr(t, "value").unwrap_or_default(),
                unmasked: attr(t, "unmaskedvalue"),
                showname: attr(t, "showname").unwrap_or_default(),
            });
        }
    }
    packets
}
