//! Pins of a shard's entries: taken under the read lock (a hit, a handle
//! on the entry's hit pins) or under the write lock, released, and the
//! lease that pins of an entry taken off its list become (see
//! `buffer::hit`).

use super::Shard;
use crate::buffer::detached::Detached;
use crate::buffer::entry::Unpinned;
use crate::buffer::hit::{HitPins, PinAt};
use crate::sync::Arc;
use std::borrow::Borrow;
use std::hash::Hash;

impl<K: Hash + Eq + Clone, V> Shard<K, V> {
    /// Pin `key`'s value under the read lock, if it is in memory and on its
    /// list: the pin is a handle on its hit pins, and the entry stays where
    /// it is (its release records the use).
    #[inline]
    pub(crate) fn hit<Q>(&self, hash: u64, key: &Q) -> Option<Arc<HitPins<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.bucket_of(hash, key)?.hits.clone()
    }

    /// Weight of the entries pinned through their hit pins: pinned, though
    /// not counted (a lease is). A walk of the index.
    pub(crate) fn hit_pinned(&self) -> usize {
        self.map
            .iter()
            .filter(|b| b.hits.as_ref().is_some_and(HitPins::pinned))
            .map(|b| self.node(b.slot).weight)
            .sum()
    }

    /// One pin of slot `idx` (of `version`) released. Returns a value to
    /// drop: one the entry dropped (a clean eviction: `true`), or the
    /// value of a removed or replaced entry that this pin was the last to
    /// hold (`false`).
    pub(crate) fn unpin(
        &mut self,
        idx: u32,
        version: u64,
        consume: bool,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<(Arc<V>, bool)> {
        let n = match self.slab.get_mut(idx as usize) {
            Some(Some(n)) if n.version == version => n,
            _ => {
                let value = self.release_detached(version, Detached::unpin)?;
                return Some((value, false));
            }
        };
        let (next, d) = n.unpin(consume, target);
        self.add(d);
        match next {
            Unpinned::Nothing => None,
            Unpinned::Freed(value) => Some((value, true)),
            Unpinned::Link {
                kind,
                first_out: true,
            } => {
                self.link_back(idx, kind);
                None
            }
            Unpinned::Link { kind, .. } => {
                self.link_front(idx, kind, tick());
                None
            }
        }
    }

    /// One more pin of slot `idx` (a guard cloned).
    pub(crate) fn repin(&mut self, idx: u32, version: u64) {
        match self.slab.get_mut(idx as usize) {
            Some(Some(n)) if n.version == version => n.repin(),
            _ => {
                if let Some(det) = self.detached.get_mut(&version) {
                    det.repin();
                }
            }
        }
    }

    /// A holder of the pin `hits` consumed it: that pin goes, and the
    /// entry is first in line once no pin is left. The entry comes off its
    /// list first (its pins there become a lease) so that the release is
    /// the shard's to order. Returns what [`Shard::unpin`] does.
    pub(crate) fn consume_hit(
        &mut self,
        hits: Arc<HitPins<V>>,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<(Arc<V>, bool)> {
        let at = hits.at();
        let live = self.live(at);
        if let Some(idx) = live {
            self.unlink(idx);
        }
        match HitPins::release(hits, false) {
            // The last pin of the lease: the entry's pin for it goes.
            // This guard's handle on the value goes first, so that a
            // value the shard lets go of is left with the caller's.
            Some(last) => {
                drop(last);
                self.unpin(at.slot, at.version, true, target, tick)
            }
            None => {
                if let Some(idx) = live {
                    self.node_mut(idx).mark_consumed();
                }
                None
            }
        }
    }

    /// The slot at `at`, if it still holds that version.
    fn live(&self, at: PinAt) -> Option<u32> {
        match self.slab.get(at.slot as usize) {
            Some(Some(n)) if n.version == at.version => Some(at.slot),
            _ => None,
        }
    }
}
