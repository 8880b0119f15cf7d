//! Questions about keys that the index answers by itself, without reading
//! a value back or taking a pin: where a key's value is and what it
//! weighs ([`SpillBuffer::key_info`]), the keys of each tier
//! ([`SpillBuffer::resident_keys`], [`SpillBuffer::spilled_keys`]), the
//! key as stored ([`SpillBuffer::stored_key`]), and a look at a value in
//! memory that counts as a use ([`SpillBuffer::with_resident`]).
//!
//! Each takes one shard's lock in read mode and nothing else: no value is
//! encoded, dropped or written under it, and no other lock is waited
//! for. A host whose values need a lock of its own to drop (a Python
//! binding's values need the GIL) may therefore call these while holding
//! that lock; see each method for what runs under the shard's lock.

use super::Inner;
use crate::buffer::entry::Node;
use crate::buffer::hit::HitPins;
use crate::buffer::shard::Shard;
use crate::buffer::{Key, SpillBuffer};
use crate::sync::Arc;
use crate::value::Spill;
use std::borrow::Borrow;
use std::hash::Hash;

/// What the index holds for a key ([`SpillBuffer::key_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyInfo {
    /// The value's weight ([`Spill::weight`] when it was inserted; for a
    /// received record, the weight its sender stored with it), wherever
    /// the value is.
    pub weight: usize,
    /// Whether the value is in memory: resident, pinned, or being written
    /// (it stays readable from memory until its write lands). `false`
    /// when it is only on disk, or being read back.
    pub resident: bool,
}

impl KeyInfo {
    fn of<K, V>(n: &Node<K, V>) -> KeyInfo {
        KeyInfo {
            weight: n.weight,
            resident: n.state().value().is_some(),
        }
    }
}

impl<K: Key, V: Spill> Inner<K, V> {
    /// `f` on `key`'s shard, its slot and its hit pins (if listed), under
    /// the shard's read lock; `None` if the key is absent.
    fn read_key<Q, R>(
        &self,
        key: &Q,
        f: impl FnOnce(&Shard<K, V>, u32, Option<&Arc<HitPins<V>>>) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.of(key);
        let shard = self.shards[self.shard_of_hash(hash)].core.read();
        let (idx, hits) = shard.find_with_hits(hash, key)?;
        f(&shard, idx, hits)
    }

    /// Every live key whose entry passes `keep`, shard by shard.
    fn keys_where(&self, keep: impl Fn(&Node<K, V>) -> bool) -> Vec<K> {
        let mut out = Vec::new();
        for locked in self.shards.iter() {
            let shard = locked.core.read();
            out.extend(
                shard
                    .nodes()
                    .filter(|(_, n)| keep(n))
                    .map(|(_, n)| n.key.clone()),
            );
        }
        out
    }
}

impl<K: Key, V: Spill> SpillBuffer<K, V> {
    /// Where `key`'s value is and what it weighs, from the index alone:
    /// nothing is read back, and the key's place in the eviction order
    /// does not change. `None` if the key is absent.
    ///
    /// A snapshot: another thread's insert, eviction or read may change
    /// it as soon as it is returned. Takes the key's shard lock in read
    /// mode only (see the module docs of `buffer::inner::query`).
    pub fn key_info<Q>(&self, key: &Q) -> Option<KeyInfo>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner()
            .read_key(key, |shard, i, _| Some(KeyInfo::of(shard.node(i))))
    }

    /// The key as stored, equal to `key`: the one given to the insert
    /// that made the entry. Equal keys may differ in form (a binding
    /// whose keys compare as its language's do, `1 == 1.0`); a mapping
    /// that keeps the first form inserted, as Python's `dict` does,
    /// inserts this one when replacing a value. `None` if absent.
    pub fn stored_key<Q>(&self, key: &Q) -> Option<K>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner()
            .read_key(key, |shard, i, _| Some(shard.node(i).key.clone()))
    }

    /// Call `f` on `key`'s value if it is in memory, without pinning it,
    /// and return what `f` returns; `None` if the key is absent or its
    /// value is not in memory (nothing is read back). Counts as a use of
    /// the key, as a memory hit of [`SpillBuffer::try_pin`] does.
    ///
    /// `f` runs under the key's shard lock in read mode: keep it short
    /// (copy out what you need), and do not call into the buffer from it.
    /// What it returns must not hold on to the value (the borrow ends with
    /// the call): to keep the value, pin it. Unlike a pin, this takes no
    /// guard whose release could evict or drop values, so a host may call
    /// it while holding a lock that dropping its values needs.
    pub fn with_resident<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner().read_key(key, |shard, idx, hits| {
            let value = shard.node(idx).state().value()?;
            // The use, as a pin's release records it. An entry on no list
            // (pinned under the write lock, being written, or set aside)
            // gets a new tick when it goes back on one, whatever is
            // recorded here.
            if let Some(hits) = hits {
                hits.touch();
            }
            Some(f(value))
        })
    }

    /// The live keys whose values are in memory (resident, pinned or
    /// being written), in no particular order: the keys
    /// [`SpillBuffer::key_info`] calls resident. Reads no value back and
    /// leaves the eviction order alone. A snapshot, shard by shard, as
    /// [`SpillBuffer::keys`] is.
    pub fn resident_keys(&self) -> Vec<K> {
        self.inner().keys_where(|n| n.state().value().is_some())
    }

    /// The live keys whose values are not in memory (only on disk, or
    /// being read back): the complement of [`SpillBuffer::resident_keys`].
    pub fn spilled_keys(&self) -> Vec<K> {
        self.inner().keys_where(|n| n.state().value().is_none())
    }
}
