//! Eviction and writes in a shard: taking an unpinned tail off its list
//! (dropped if clean, handed to the spill queue if dirty), and applying the
//! outcome of its write (done, failed, no longer wanted).

use super::{After, Shard};
use crate::buffer::detached::Detached;
use crate::buffer::entry::{Evicted, ListKind};
use crate::buffer::hit::HitPins;
use crate::buffer::spill_queue::SpillJob;
use crate::store::DiskLoc;
use crate::sync::Arc;
use std::hash::Hash;

impl<K: Hash + Eq + Clone, V> Shard<K, V> {
    /// Evict the tail of `kind` if its tick is `expect_tick` (when given):
    /// a clean value is dropped, a dirty one queued for writing. Returns
    /// its weight and what to do. A tail pinned or used under the read
    /// lock since it was linked is not evicted (weight 0, nothing to do):
    /// it is leased, or moved up to its last use.
    pub(crate) fn evict_tail(
        &mut self,
        kind: ListKind,
        expect_tick: Option<u64>,
    ) -> Option<(usize, After<K, V>)> {
        let (idx, tick) = self.tail(kind)?;
        if expect_tick.is_some_and(|t| t != tick) {
            return None;
        }
        if !self.settle(idx, tick, kind) {
            return Some((0, After::default()));
        }
        let n = self.node_mut(idx);
        let (w, key, version) = (n.weight, n.key.clone(), n.version);
        let (evicted, d) = n.evict()?;
        self.add(d);
        let after = match evicted {
            Evicted::Dropped(value) => After {
                drop: Some(value),
                clean_eviction: true,
                ..After::default()
            },
            Evicted::Write(value) => After {
                write: Some(SpillJob {
                    key,
                    version,
                    value,
                }),
                ..After::default()
            },
        };
        Some((w, after))
    }

    /// Take the tail `idx` of `kind` (placed at `tick`) off its list, for
    /// eviction. `false` if it must not go: pinned under the read lock
    /// (leased now, and relinked by the last release), or used since it
    /// was placed (moved up to its last use, and back on its list).
    /// Otherwise it is off its list.
    fn settle(&mut self, idx: u32, tick: u64, kind: ListKind) -> bool {
        let used = self.unlink(idx).expect("a list's tail is on it");
        if self.node(idx).pins() > 0 {
            return false;
        }
        if used > tick {
            self.node_mut(idx).used_again();
            self.relink_sorted(idx, kind, used);
            self.repaired = self.repaired.max(used);
            return false;
        }
        true
    }

    /// Put `idx` back on `kind` in the place of `tick`.
    fn relink_sorted(&mut self, idx: u32, kind: ListKind, tick: u64) {
        self.lists.link_sorted(&mut self.slab, idx, kind, tick);
        self.hits_linked(idx, tick);
    }

    /// When writes are held back: lease the tail of `kind` if it is pinned
    /// under the read lock, or move it up if it was used since it was
    /// placed, so that the pinned gauge and the order are true; a tail
    /// that would be evicted stays. Returns whether it did either.
    pub(crate) fn settle_tail(&mut self, kind: ListKind) -> bool {
        let Some((idx, tick)) = self.tail(kind) else {
            return false;
        };
        let Some(hits) = self.hits_of(idx) else {
            return false;
        };
        // Under the write lock no pin is added from none: a tail seen
        // unpinned and unused here stays so.
        if !HitPins::pinned(hits) && hits.last_use() <= tick {
            return false;
        }
        if self.settle(idx, tick, kind) {
            // Its pins were released meanwhile: back in its place.
            self.relink_sorted(idx, kind, tick);
            return false;
        }
        true
    }

    /// `key`'s write finished at `loc`. Returns what to do and whether the
    /// entry stayed in memory (it was pinned meanwhile).
    pub(crate) fn spill_done(&mut self, key: &K, version: u64, loc: DiskLoc) -> After<K, V> {
        let Some(idx) = self.find_version(key, version) else {
            // Removed or replaced meanwhile: the record is dead, and the
            // write no longer holds the value.
            return After {
                release: Some(loc),
                drop: self.release_detached(version, Detached::write_ended),
                ..After::default()
            };
        };
        let (freed, d) = self.node_mut(idx).spill_done(loc);
        self.add(d);
        After {
            drop: freed,
            ..After::default()
        }
    }

    /// `key`'s write failed: the value stays, relinked as most recently
    /// used at `tick()` so that the next eviction tries another one; or,
    /// `set_aside` (its encode failed), left on no list. If the entry was
    /// removed or replaced meanwhile, returns its value when the write was
    /// its last holder (to drop after unlocking).
    pub(crate) fn spill_failed(
        &mut self,
        key: &K,
        version: u64,
        set_aside: bool,
        tick: impl FnOnce() -> u64,
    ) -> Option<Arc<V>> {
        let Some(idx) = self.find_version(key, version) else {
            return self.release_detached(version, Detached::write_ended);
        };
        let n = self.node_mut(idx);
        let d = n.spill_failed(set_aside);
        let unpinned = n.pins() == 0;
        self.add(d);
        if unpinned && !set_aside {
            self.link_front(idx, ListKind::Dirty, tick());
        }
        None
    }

    /// Is the write of `key` at `version` still wanted (the entry not
    /// removed or replaced since it was queued)? If not, the job is about
    /// to drop its value without writing: it no longer holds it, and the
    /// value is returned when that was its last holder.
    pub(crate) fn write_wanted(&mut self, key: &K, version: u64) -> (bool, Option<Arc<V>>) {
        if self.find_version(key, version).is_some() {
            return (true, None);
        }
        (false, self.release_detached(version, Detached::write_ended))
    }

    /// Make every set-aside entry a candidate for eviction again, linked
    /// as most recently used. Returns how many there were.
    pub(crate) fn retry_spills(&mut self, mut tick: impl FnMut() -> u64) -> usize {
        let idxs: Vec<u32> = self
            .nodes()
            .filter(|(_, n)| n.set_aside())
            .map(|(i, _)| i)
            .collect();
        for &idx in &idxs {
            let n = self.node_mut(idx);
            let (_, d) = n.retry_spill();
            let unpinned = n.pins() == 0;
            self.add(d);
            if unpinned {
                self.link_front(idx, ListKind::Dirty, tick());
            }
        }
        idxs.len()
    }
}
