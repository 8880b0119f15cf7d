//! The eviction loop: find the victim [`choose`] picks from the tails
//! every shard publishes, take it out under its shard's lock, and act on
//! what the shard returned (drop a clean value, queue a dirty one's
//! write). The order, the back-off and the one-evictor lock are
//! [`super::eviction`]'s.

use super::Inner;
use crate::buffer::entry::ListKind;
use crate::buffer::eviction::choose;
use crate::buffer::Key;
use crate::metrics::Metrics;
use crate::sync::atomic::{fence, Ordering::Relaxed, Ordering::SeqCst};
use crate::sync::Arc;
use crate::value::Spill;

impl<K: Key, V: Spill> Inner<K, V> {
    /// Evict until unpinned resident bytes are within the target.
    ///
    /// One thread evicts for the target at a time (this, or
    /// [`drop_clean_for`](Self::drop_clean_for)). Two threads that find
    /// the same excess (the host's insert, and the pool's look at the
    /// target after a write ends) would otherwise both evict for it, and
    /// memory would fall below the target by a value each time. The
    /// second waits for the first, then finds the excess gone. The wait is
    /// for CPU work only: an eviction takes values out of the index and
    /// queues writes, it does no IO. The values evicted are dropped after
    /// the lock is released: a value's drop is the host's code (a Python
    /// object's release waits for the GIL), which must never run while
    /// another thread may be waiting for this lock. The lock is
    /// re-entrant all the same, for a re-entrant eviction from a value's
    /// drop on a thread that already holds it.
    pub(crate) fn evict_to_target(&self) {
        // Pairs with the fence in `check_target`: a change this thread
        // made before is seen by a thread checking after it, or this
        // thread sees that thread's change whole.
        fence(SeqCst);
        let mut evicted = Vec::new();
        if self.over_target() > 0 {
            let _one = self.eviction.lock();
            let writes = self.eviction.writes_allowed();
            while self.over_target() > 0 {
                if self.evict_one(writes, &mut evicted).is_none() {
                    break;
                }
            }
        }
        evicted.into_iter().for_each(|v| self.drop_value(v));
        self.wake_mem_waiters();
    }

    /// Evict if unpinned resident bytes pass the target, after a change
    /// that an eviction running at the same time may have missed or seen
    /// half done (see `Delta::needs_target_check`). Either that eviction
    /// saw the change whole, or this check (after the fence) sees both
    /// the change and what that eviction's thread had done before it.
    pub(crate) fn check_target(&self) {
        fence(SeqCst);
        if self.over_target() > 0 {
            self.evict_to_target();
        }
    }

    /// Evict at least `bytes` now, whatever the target. Returns the weight
    /// of the values dropped or queued for writing.
    pub(crate) fn evict_bytes(&self, bytes: usize) -> usize {
        let mut done = 0;
        let mut evicted = Vec::new();
        while done < bytes {
            match self.evict_one(true, &mut evicted) {
                Some(w) => done += w,
                None => break,
            }
        }
        evicted.into_iter().for_each(|v| self.drop_value(v));
        self.wake_mem_waiters();
        done
    }

    /// Make room within the target for a prefetch of `w` bytes by dropping
    /// clean unpinned values, which costs no IO: consumed ones first (tick
    /// 0), then the least recently used, but only values last used at or
    /// before tick `asked` (when the prefetch was asked for: values read
    /// back or used since are as wanted as the one to read). Never queues
    /// a write. Returns whether the room is there now, counted as
    /// [`Accounting::admit`](super::accounting::Accounting::admit) counts it; on
    /// `false` nothing more is dropped than the clean values that qualified.
    pub(crate) fn drop_clean_for(&self, w: usize, asked: u64) -> bool {
        let target = self.target();
        if w > target {
            return false;
        }
        // Not while `evict_to_target` runs, which may be evicting values
        // for part of the same excess. The values dropped here are let go
        // of after the lock is released (see `evict_to_target`).
        let mut evicted = Vec::new();
        let room = self.drop_clean_locked(w, target, asked, &mut evicted);
        evicted.into_iter().for_each(|v| self.drop_value(v));
        room
    }

    /// [`drop_clean_for`](Self::drop_clean_for) under the eviction lock,
    /// against the `target` it read, the values taken out left in
    /// `evicted` for the caller to drop.
    fn drop_clean_locked(
        &self,
        w: usize,
        target: usize,
        asked: u64,
        evicted: &mut Vec<Arc<V>>,
    ) -> bool {
        let _one = self.eviction.lock();
        let mut moved = 0;
        let hit_pinned = self.hit_pinned();
        loop {
            let pinned = self.pinned() + hit_pinned;
            if self.accounting.has_room(w, pinned, target) {
                return true;
            }
            let Some((tick, s)) = self.oldest_tail(ListKind::Clean) else {
                return false;
            };
            if tick > asked {
                return false;
            }
            match self.with_shard(s, |shard| shard.evict_tail(ListKind::Clean, Some(tick))) {
                Some((_, mut after)) => {
                    if after.clean_eviction {
                        Metrics::add(&self.metrics.clean_evictions, 1);
                    }
                    evicted.extend(after.drop.take());
                    self.act(s, after);
                }
                // Another thread moved that tail meanwhile: look again, a
                // few times.
                None => {
                    moved += 1;
                    if moved > 8 {
                        return false;
                    }
                }
            }
        }
    }

    /// The oldest tail of `kind` over every shard: (tick, shard), from the
    /// ticks each shard publishes (no lock taken).
    fn oldest_tail(&self, kind: ListKind) -> Option<(u64, usize)> {
        self.shards
            .iter()
            .enumerate()
            .map(|(i, sh)| (sh.tails[kind as usize].load(Relaxed), i))
            .min()
            .filter(|&(t, _)| t != u64::MAX)
    }

    /// Evict the entry [`choose`] picks: drop it if clean, queue its write
    /// if dirty (only if `writes`). Returns its weight, or `None` when
    /// nothing is evictable. A value taken out of the index goes to
    /// `evicted`, for the caller to drop once it holds no lock.
    fn evict_one(&self, writes: bool, evicted: &mut Vec<Arc<V>>) -> Option<usize> {
        for attempt in 0.. {
            let clean = self.oldest_tail(ListKind::Clean);
            let dirty = self.oldest_tail(ListKind::Dirty);
            // "Now" (a read of every shard's clock) only when both lists
            // have a candidate.
            let now = || self.now();
            let Some(kind) = choose(clean.map(|c| c.0), dirty.map(|d| d.0), now, writes) else {
                // Writes held back: a dirty tail pinned or used under a
                // read lock is still leased or moved up, so that what is
                // over the target is not overstated by pins.
                let (_, s) = dirty?;
                let settled = self.with_shard(s, |shard| shard.settle_tail(ListKind::Dirty));
                return settled.then_some(0);
            };
            let (tick, s) = match kind {
                ListKind::Clean => clean?,
                ListKind::Dirty => dirty?,
            };
            // Another thread may have moved that tail meanwhile; retry a
            // few times, then take what the shard has.
            let expect = (attempt < 8).then_some(tick);
            let taken = self.with_shard(s, |shard| shard.evict_tail(kind, expect));
            if let Some((w, mut after)) = taken {
                if after.clean_eviction {
                    Metrics::add(&self.metrics.clean_evictions, 1);
                }
                evicted.extend(after.drop.take());
                self.act(s, after);
                return Some(w);
            }
        }
        None
    }
}
