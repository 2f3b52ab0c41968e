//! Typed field values: each type can only hold what its wire field can carry.
//!
//! Narrow integer fields (24-bit QPNs, 20-bit flow labels, 5-bit timeouts, ...) are
//! newtypes whose constructor refuses out-of-range values, so an encoder never has to
//! mask (and silently corrupt) a value. Decoders build them from masked wire bits.

use crate::error::RangeError;
use core::fmt;

macro_rules! bounded_uint {
    ($(#[$meta:meta])* $name:ident, $repr:ty, $bits:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name($repr);

        impl $name {
            /// Width of the field on the wire, in bits.
            pub const BITS: u32 = $bits;
            /// The largest value the field holds.
            pub const MAX: Self = Self(((1u64 << $bits) - 1) as $repr);
            /// Zero.
            pub const ZERO: Self = Self(0);

            /// The value, or an error when it needs more than [`Self::BITS`] bits.
            pub const fn new(value: $repr) -> Result<Self, RangeError> {
                if (value as u64) > Self::MAX.0 as u64 {
                    Err(RangeError {
                        what: stringify!($name),
                        value: value as u64,
                        max: Self::MAX.0 as u64,
                    })
                } else {
                    Ok(Self(value))
                }
            }

            /// The value with bits above [`Self::BITS`] dropped: for decoders, which
            /// read exactly the field's bits.
            pub const fn from_masked(value: $repr) -> Self {
                Self(value & Self::MAX.0)
            }

            /// The value as an integer.
            pub const fn get(self) -> $repr {
                self.0
            }
        }

        impl TryFrom<$repr> for $name {
            type Error = RangeError;
            fn try_from(value: $repr) -> Result<Self, RangeError> {
                Self::new(value)
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

bounded_uint!(
    /// A queue pair (or EE context) number: 24 bits.
    Qpn,
    u32,
    24
);
bounded_uint!(
    /// A 24-bit field: ProducerType, VendorID, RedirectQP, ...
    U24,
    u32,
    24
);
bounded_uint!(
    /// An IPv6-style flow label: 20 bits.
    FlowLabel,
    u32,
    20
);
bounded_uint!(
    /// A 5-bit time exponent: 4.096 µs × 2^value (CM timeouts, RespTimeValue).
    Timeout,
    u8,
    5
);
bounded_uint!(
    /// A service level: 4 bits.
    Sl,
    u8,
    4
);
bounded_uint!(
    /// A 2-bit field (PathRecord selectors).
    U2,
    u8,
    2
);
bounded_uint!(
    /// A 3-bit field (CM retry counts, REQ transport fields).
    U3,
    u8,
    3
);
bounded_uint!(
    /// A 4-bit field (SMInfo priority, REQ MTU and MaxCMRetries).
    U4,
    u8,
    4
);
bounded_uint!(
    /// A 6-bit field: static rate, MTU and packet life time codes.
    U6,
    u8,
    6
);
bounded_uint!(
    /// A 7-bit field (Notice type, PathRecord NumbPath).
    U7,
    u8,
    7
);
bounded_uint!(
    /// A 12-bit field (PathRecord QoSClass).
    U12,
    u16,
    12
);
bounded_uint!(
    /// A 15-bit field (Notice count, directed-route SMP status).
    U15,
    u16,
    15
);
bounded_uint!(
    /// A 27-bit field (ClassPortInfo CapabilityMask2).
    U27,
    u32,
    27
);

/// A local identifier. All 16-bit values occur on the wire (0xFFFF is the permissive LID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lid(pub u16);

impl Lid {
    /// The permissive LID, 0xFFFF (also "all LIDs" in InformInfo.LIDRangeBegin).
    pub const PERMISSIVE: Lid = Lid(0xFFFF);
}

impl fmt::Display for Lid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// A 128-bit global identifier: subnet prefix then interface ID, network byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// A GID from its subnet prefix and interface ID (port GUID).
    pub fn new(subnet_prefix: u64, interface_id: u64) -> Gid {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&subnet_prefix.to_be_bytes());
        raw[8..].copy_from_slice(&interface_id.to_be_bytes());
        Gid(raw)
    }

    /// The upper 64 bits.
    pub fn subnet_prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(b)
    }

    /// The lower 64 bits (the port GUID for a default GID).
    pub fn interface_id(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for Gid {
    /// IPv6 notation with `::` compression, as tshark and `ibstat` print GIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        core::net::Ipv6Addr::from(self.0).fmt(f)
    }
}

impl core::str::FromStr for Gid {
    type Err = core::net::AddrParseError;
    fn from_str(s: &str) -> Result<Gid, Self::Err> {
        s.parse::<core::net::Ipv6Addr>().map(|a| Gid(a.octets()))
    }
}

/// An IEEE organizationally unique identifier: 24 bits, in vendor-class MADs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Oui(pub U24);

impl fmt::Display for Oui {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_refuses_out_of_range() {
        assert_eq!(Qpn::new(0xFF_FFFF).map(Qpn::get), Ok(0xFF_FFFF));
        let err = Qpn::new(0x100_0000).unwrap_err();
        assert_eq!(err.max, 0xFF_FFFF);
        assert!(Timeout::new(32).is_err());
        assert_eq!(Timeout::MAX.get(), 31);
        assert_eq!(FlowLabel::from_masked(0xFFF_FFFF).get(), 0xF_FFFF);
        assert!(U27::new(1 << 27).is_err());
    }

    #[test]
    fn gid_parts_and_text() {
        let gid = Gid::new(0xfe80_0000_0000_0000, 0x0002_c903_0000_1234);
        assert_eq!(gid.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(gid.interface_id(), 0x0002_c903_0000_1234);
        assert_eq!(gid.to_string(), "fe80::2:c903:0:1234");
        assert_eq!("fe80::2:c903:0:1234".parse::<Gid>(), Ok(gid));
    }
}
