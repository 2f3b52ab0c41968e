//! InfiniBand management datagram (MAD) wire formats: pure encode/decode, no IO.
#![forbid(unsafe_code)]
