//! The bits of a MAD that no field `apm mad decode` shows covers (reserved by the IBA,
//! or beyond what the codec reads) and that are not zero. Decode shows them, by byte,
//! and encode writes them back, so that `apm mad decode --json | apm mad encode --json -`
//! gives back every byte of any MAD decode accepts, not only of those that keep their
//! reserved bits clear.

use anyhow::{bail, Context, Result};
use ib_mad::fields::Field;
use ib_mad::MAD_SIZE;

/// The JSON section (and `SECTION.OFFSET=VALUE` prefix) of the reserved bits.
pub(super) const SECTION: &str = "reserved";

/// Per byte, the bits some field covers.
fn covered(fields: &[Field]) -> [u8; MAD_SIZE] {
    let mut mask = [0u8; MAD_SIZE];
    for f in fields {
        let start = f.offset * 8 + usize::from(f.bit);
        for b in start..start + f.bits as usize {
            if let Some(m) = mask.get_mut(b / 8) {
                *m |= 0x80 >> (b % 8);
            }
        }
    }
    mask
}

/// Each byte with bits no field covers set: its offset, those bits, and the mask of the
/// bits no field covers.
pub(super) fn find(wire: &[u8], fields: &[Field]) -> Vec<(usize, u8, u8)> {
    covered(fields)
        .iter()
        .zip(wire)
        .enumerate()
        .filter_map(|(i, (c, w))| (w & !c != 0).then_some((i, w & !c, !c)))
        .collect()
}

/// Set the bits no field of `fields` covers in byte `offset` (given as decode printed
/// it: the section's key) to `value`, refusing bits a field covers.
pub(super) fn write(
    wire: &mut [u8; MAD_SIZE],
    fields: &[Field],
    offset: &str,
    value: &str,
) -> Result<()> {
    let at: usize = offset
        .parse()
        .ok()
        .filter(|o| *o < MAD_SIZE)
        .with_context(|| format!("{SECTION}.{offset}: not a byte offset (0..{MAD_SIZE})"))?;
    let v = value.trim();
    let v = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => v.parse(),
    }
    .with_context(|| format!("{SECTION}.{offset}: {value:?} is not a byte"))?;
    let free = !covered(fields)[at];
    if v & !free != 0 {
        bail!(
            "{SECTION}.{offset}: {v:#04x} sets bits {:#04x} of byte {at} that fields hold; \
             reserved bits there: {free:#04x}",
            v & !free
        );
    }
    wire[at] = (wire[at] & !free) | v;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ib_mad::Mad;

    #[test]
    fn reserved_bits_are_found_and_written_back_but_never_over_a_field() {
        let mut wire = [0u8; MAD_SIZE];
        wire[..4].copy_from_slice(&[1, 0x07, 2, 3]);
        wire[16..18].copy_from_slice(&0x19u16.to_be_bytes()); // LAP
        let fields = ib_mad::fields::describe(&Mad::decode(&wire).expect("LAP"));
        assert!(find(&wire, &fields).is_empty());
        let mut dirty = wire;
        dirty[32] = 0xa2; // reserved in a LAP
        assert_eq!(find(&dirty, &fields), [(32, 0xa2, 0xff)]);
        write(&mut wire, &fields, "32", "0xa2").expect("reserved");
        assert_eq!(wire, dirty);
        assert!(
            write(&mut wire, &fields, "24", "1").is_err(),
            "local_comm_id's byte"
        );
        assert!(write(&mut wire, &fields, "256", "1").is_err());
        assert!(write(&mut wire, &fields, "32", "0x100").is_err());
    }
}
