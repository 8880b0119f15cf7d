//! The payload checksum of a record: which function a record's header
//! names (by its magic), computed whole or piece by piece.
//!
//! Records are written with XXH3-64 (its low 32 bits). Records of the
//! first format version, CRC-32 (IEEE), still read: a transfer from a
//! buffer of an older release carries them. XXH3 replaced CRC-32 because
//! on a large read the checksum is the one pass over the value that a
//! plain `read()` does not make, and XXH3 costs about half as much CPU
//! per byte as the fastest CRC-32 the crate can use without `unsafe`
//! (docs/read-path.md, "The payload checksum"). Against damaged or
//! overwritten data both miss with odds of 2^-32; what XXH3 gives up is
//! CRC-32's certainty for bursts of up to 32 flipped bits, which a disk
//! or a stray write does not produce alone.

use std::hash::Hasher as _;

/// The function a record's payload checksum was computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sum {
    /// Format version 1 (magic `SPR1`): CRC-32 (IEEE).
    Crc32,
    /// Format version 2 (magic `SPR2`): the low 32 bits of XXH3-64, seed 0.
    Xxh3,
}

impl Sum {
    /// The checksum of `bytes` in one call.
    pub(crate) fn of(self, bytes: &[u8]) -> u32 {
        match self {
            Sum::Crc32 => crc32fast::hash(bytes),
            // Truncation intended: the header has 32 bits for it.
            Sum::Xxh3 => twox_hash::XxHash3_64::oneshot(bytes) as u32,
        }
    }

    /// A checksum to feed piece by piece.
    pub(crate) fn stream(self) -> Stream {
        match self {
            Sum::Crc32 => Stream::Crc32(crc32fast::Hasher::new()),
            Sum::Xxh3 => Stream::Xxh3(Box::default()),
        }
    }
}

/// A payload checksum fed piece by piece; equal to [`Sum::of`] of the
/// pieces laid end to end.
pub(crate) enum Stream {
    Crc32(crc32fast::Hasher),
    /// Boxed: the state holds a 256-byte stripe buffer.
    Xxh3(Box<twox_hash::XxHash3_64>),
}

impl Stream {
    pub(crate) fn update(&mut self, piece: &[u8]) {
        match self {
            Stream::Crc32(h) => h.update(piece),
            Stream::Xxh3(h) => h.write(piece),
        }
    }

    pub(crate) fn finish(self) -> u32 {
        match self {
            Stream::Crc32(h) => h.finalize(),
            // Truncation intended, as in `Sum::of`.
            Stream::Xxh3(h) => h.finish() as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fed in pieces of any size, both sums equal the one-call figure;
    /// CRC-32 is the standard one (its check value), so records of the
    /// first format still verify.
    #[test]
    fn pieces_and_whole_agree() {
        assert_eq!(Sum::Crc32.of(b"123456789"), 0xcbf4_3926);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for sum in [Sum::Crc32, Sum::Xxh3] {
            for piece in [1, 7, 64, 240, 4096, 65_536, 100_000] {
                let mut s = sum.stream();
                for p in data.chunks(piece) {
                    s.update(p);
                }
                assert_eq!(s.finish(), sum.of(&data), "{sum:?} in pieces of {piece}");
            }
        }
        assert_ne!(Sum::Xxh3.of(&data), Sum::Crc32.of(&data));
    }
}
