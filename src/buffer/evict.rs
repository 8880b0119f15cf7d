//! Eviction: which unpinned resident entry leaves memory next, and the
//! back-off that stops target-driven writes for a while after a spill
//! fails.
//!
//! The order ([`choose`]): consumed entries first; otherwise the least
//! recently used clean entry and the least recently used dirty one are
//! compared by age (ticks since their last use), and the dirty one goes
//! only when it is more than [`DIRTY_AGE_FACTOR`] (5/4) times as old.
//! Dropping a clean value costs no IO now; writing a dirty one costs a
//! write now. But a value used again costs a read whichever way it left,
//! and the more recently used one is the likelier to be used again: a
//! strict clean-first order threw out every value just read back while
//! old dirty values nobody reads held memory for good (2.6-5× the disk
//! reads of an LRU on zipf reads). And a dirty value kept longer is
//! usually written later anyway, so the write it saves is small: replayed
//! through this rule, a factor of 2 saved at most 5% of writes and cost up
//! to 19% more reads than LRU on zipf reads mixed with inserts, a factor
//! of 4 up to 38% (and 6% on zipf reads alone), while 5/4 stays within
//! 1.00× of LRU's reads on zipf reads and scans and within 1.06× with
//! inserts (docs/BENCHMARKS.md, "Eviction policy"). A dirty value used
//! just before a clean one still goes after it.

use super::entry::ListKind;
use super::inner::Inner;
use super::Key;
use crate::metrics::Metrics;
use crate::value::Spill;
use std::sync::atomic::{fence, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Instant;

/// A dirty entry is evicted before a clean one only when it is more than
/// this many times as old (in ticks since last use), as a fraction
/// (numerator, denominator). (1, 1) is plain LRU over both lists; larger
/// factors spare a few writes and cost reads.
pub(crate) const DIRTY_AGE_FACTOR: (u64, u64) = (5, 4);

/// Which list gives the next victim, from the ticks of the two lists'
/// least recently used entries (`None`: the list is empty) and `now`, the
/// newest tick (asked for only when both lists have a candidate). A tick
/// of 0 marks a consumed entry, first in line. Dirty entries are
/// candidates only when `writes` are allowed.
pub(crate) fn choose(
    clean: Option<u64>,
    dirty: Option<u64>,
    now: impl FnOnce() -> u64,
    writes: bool,
) -> Option<ListKind> {
    let dirty = dirty.filter(|_| writes);
    match (clean, dirty) {
        (None, None) => None,
        (Some(_), None) => Some(ListKind::Clean),
        (None, Some(_)) => Some(ListKind::Dirty),
        (Some(0), Some(_)) => Some(ListKind::Clean),
        (Some(_), Some(0)) => Some(ListKind::Dirty),
        (Some(c), Some(d)) => {
            let now = now();
            let age_c = now.saturating_sub(c) as u128;
            let age_d = now.saturating_sub(d) as u128;
            let (num, den) = DIRTY_AGE_FACTOR;
            if age_d * den as u128 > age_c * num as u128 {
                Some(ListKind::Dirty)
            } else {
                Some(ListKind::Clean)
            }
        }
    }
}

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
            let _one = self.evicting.lock();
            let writes = self.backoff.allows_writes();
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
        let _one = self.evicting.lock();
        let mut moved = 0;
        loop {
            let pinned = self.pinned() + self.hit_pinned();
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

/// After a failed write (I/O error, disk full, `max_spill`; not an encode
/// error, see `buffer::failure`), evictions by the target stop queueing
/// writes for a while (10 ms, doubling on each further failure up to 1 s,
/// reset by a success, a `remove` or `retry_spills`): with a broken or full disk, every insert would otherwise
/// re-encode and re-try every value over the target. Clean evictions go on,
/// and an explicit `evict` always tries.
pub(crate) struct Backoff {
    epoch: Instant,
    until_ns: AtomicU64,
    step_ns: AtomicU64,
}

impl Backoff {
    const FIRST_NS: u64 = 10_000_000;
    const MAX_NS: u64 = 1_000_000_000;

    pub(crate) fn new() -> Self {
        Backoff {
            epoch: Instant::now(),
            until_ns: AtomicU64::new(0),
            step_ns: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(crate) fn allows_writes(&self) -> bool {
        let until = self.until_ns.load(Relaxed);
        until == 0 || self.now_ns() >= until
    }

    pub(crate) fn failure(&self) {
        let step = (self.step_ns.load(Relaxed) * 2).clamp(Self::FIRST_NS, Self::MAX_NS);
        self.step_ns.store(step, Relaxed);
        self.until_ns.store(self.now_ns() + step, Relaxed);
    }

    /// Did the last write fail (no success since)?
    pub(crate) fn failing(&self) -> bool {
        self.step_ns.load(Relaxed) != 0
    }

    pub(crate) fn success(&self) {
        if self.until_ns.load(Relaxed) != 0 {
            self.step_ns.store(0, Relaxed);
            self.until_ns.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumed_first_then_clean_unless_the_dirty_one_is_much_older() {
        use ListKind::{Clean, Dirty};
        assert_eq!(choose(None, None, || 9, true), None);
        assert_eq!(choose(Some(5), Some(0), || 100, true), Some(Dirty));
        assert_eq!(choose(Some(5), Some(0), || 100, false), Some(Clean));
        assert_eq!(choose(None, Some(3), || 100, false), None);
        // now 100: clean used at 80 (age 20), dirty at 75 (age 25): not
        // more than 5/4 as old, so the clean one goes.
        assert_eq!(choose(Some(80), Some(75), || 100, true), Some(Clean));
        assert_eq!(choose(Some(80), Some(74), || 100, true), Some(Dirty));
        // A clean value older than the dirty one always goes first.
        assert_eq!(choose(Some(10), Some(50), || 100, true), Some(Clean));
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let b = Backoff::new();
        assert!(b.allows_writes());
        b.failure();
        assert_eq!(b.step_ns.load(Relaxed), Backoff::FIRST_NS);
        b.failure();
        assert_eq!(b.step_ns.load(Relaxed), 2 * Backoff::FIRST_NS);
        for _ in 0..20 {
            b.failure();
        }
        assert_eq!(b.step_ns.load(Relaxed), Backoff::MAX_NS);
        assert!(!b.allows_writes(), "within a one-second back-off");
        b.success();
        assert!(b.allows_writes());
        assert_eq!(b.step_ns.load(Relaxed), 0);
    }
}
