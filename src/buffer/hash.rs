//! The key hash: one seeded folded-multiply hash (the construction of
//! foldhash and of ahash's fallback) used both to pick a key's shard and
//! to find it in the shard's table. SipHash, std's default, costs an
//! order of magnitude more per integer key, and would be paid twice per
//! lookup. The
//! seed is random per buffer, so the layout of one process's tables says
//! nothing about another's.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

const MUL: u64 = 0x5851_f42d_4c95_7f2d;

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Which of `shards` shards a key of hash `hash` belongs to.
#[inline]
pub(crate) fn shard_of(hash: u64, shards: usize) -> usize {
    // Middle bits: the table inside the shard uses the low ones for the
    // bucket and the top seven for its control bytes. Scaled by a
    // multiply rather than reduced by `%`: a division costs more than
    // the rest of the hashing.
    let mid = (hash >> 24) & 0xffff_ffff;
    ((mid * shards as u64) >> 32) as usize
}

/// Builds [`KeyHasher`]s that share one random seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyHash {
    seed: [u64; 2],
}

impl KeyHash {
    pub(crate) fn new() -> Self {
        // std's RandomState is the crate's source of per-process randomness.
        let r = RandomState::new();
        KeyHash {
            seed: [r.hash_one(1u64) | 1, r.hash_one(2u64)],
        }
    }

    /// The hash of `key`.
    #[inline]
    pub(crate) fn of<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.hash_one(key)
    }
}

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    #[inline]
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher {
            acc: self.seed[0],
            seed: self.seed[1],
        }
    }
}

/// The streaming state of one hash.
pub(crate) struct KeyHasher {
    acc: u64,
    seed: u64,
}

impl Hasher for KeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let x = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
            self.acc = fold(self.acc ^ x, MUL);
        }
        let rest = chunks.remainder();
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        // The length goes in so that "a\0" and "a" differ.
        let x = u64::from_le_bytes(tail) ^ ((bytes.len() as u64) << 56);
        self.acc = fold(self.acc ^ x, MUL);
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.acc = fold(self.acc ^ i, MUL);
    }

    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.write_u64(i as u64);
        self.write_u64((i >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fold(self.acc, self.seed ^ MUL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn integer_keys_spread_over_high_and_low_bits() {
        let h = KeyHash::new();
        let n = 1u64 << 16;
        let low: HashSet<u64> = (0..n).map(|k| h.of(&k) & 0xffff).collect();
        let high: HashSet<u64> = (0..n).map(|k| h.of(&k) >> 48).collect();
        // A uniform hash fills about 1 - 1/e of the buckets.
        assert!(low.len() > n as usize / 2, "low bits: {}", low.len());
        assert!(high.len() > n as usize / 2, "high bits: {}", high.len());
    }

    #[test]
    fn strings_differ_by_length_and_content() {
        let h = KeyHash::new();
        assert_ne!(h.of("a"), h.of("a\0"));
        assert_ne!(h.of("abcdefgh1"), h.of("abcdefgh2"));
        assert_eq!(h.of("same key"), h.of(&String::from("same key")));
    }
}
