//! Eviction's own state: the order in which unpinned resident entries
//! leave memory ([`choose`]), the back-off that stops target-driven
//! writes for a while after a spill fails, and the lock that lets one
//! thread evict for the target at a time. The eviction loop itself
//! (`Inner::evict_to_target`) locks shards and acts on what they return.
//!
//! The order ([`choose`]): consumed entries first; otherwise the least
//! recently used clean entry and the least recently used dirty one are
//! compared by age (ticks since their last use), and the dirty one goes
//! only when it is more than [`DIRTY_AGE_FACTOR`] (5/4) times as old.
//! Dropping a clean value costs no IO now; writing a dirty one costs a
//! write now. But a value used again costs a read whichever way it left,
//! and the more recently used one is the likelier to be used again: a
//! strict clean-first order throws out every value just read back while
//! old dirty values nobody reads hold memory for good. And a dirty value
//! kept longer is usually written later anyway, so the write it saves is
//! small. A small factor keeps the disk reads at those of a plain LRU
//! (docs/BENCHMARKS.md, "Eviction policy", measures it); a dirty value
//! used just before a clean one still goes after it.

use super::entry::ListKind;
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use crate::sync::{ReentrantMutex, ReentrantMutexGuard};
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

/// The order, the back-off and the one-evictor lock.
pub(crate) struct Eviction {
    backoff: Backoff,
    /// Held by the thread evicting for the target: one evictor at a time.
    /// Re-entrant, for an eviction from a value's drop on a thread that
    /// already holds it.
    one: ReentrantMutex<()>,
}

impl Eviction {
    pub(crate) fn new() -> Self {
        Eviction {
            backoff: Backoff::new(),
            one: ReentrantMutex::new(()),
        }
    }

    /// Wait for any other thread evicting for the target, then hold off
    /// others while the guard lives.
    pub(crate) fn lock(&self) -> ReentrantMutexGuard<'_, ()> {
        self.one.lock()
    }

    /// May evictions for the target queue writes now (no back-off running)?
    pub(crate) fn writes_allowed(&self) -> bool {
        self.backoff.allows_writes()
    }

    /// A write failed for a cause of the disk's: back off.
    pub(crate) fn write_failed(&self) {
        self.backoff.failure();
    }

    /// A write succeeded, or space may have come back: end the back-off.
    pub(crate) fn write_succeeded(&self) {
        self.backoff.success();
    }

    /// Did the last write fail (no success since)?
    pub(crate) fn failing(&self) -> bool {
        self.backoff.failing()
    }
}

/// After a failed write (I/O error, disk full, `max_spill`; not an encode
/// error, see `buffer::inner::failure`), evictions by the target stop queueing
/// writes for a while (10 ms, doubling on each further failure up to 1 s,
/// reset by a success, a `remove` or `retry_spills`): with a broken or full disk, every insert would otherwise
/// re-encode and re-try every value over the target. Clean evictions go on,
/// and an explicit `evict` always tries.
struct Backoff {
    epoch: Instant,
    until_ns: AtomicU64,
    step_ns: AtomicU64,
}

impl Backoff {
    const FIRST_NS: u64 = 10_000_000;
    const MAX_NS: u64 = 1_000_000_000;

    fn new() -> Self {
        Backoff {
            epoch: Instant::now(),
            until_ns: AtomicU64::new(0),
            step_ns: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn allows_writes(&self) -> bool {
        let until = self.until_ns.load(Relaxed);
        until == 0 || self.now_ns() >= until
    }

    fn failure(&self) {
        let step = (self.step_ns.load(Relaxed) * 2).clamp(Self::FIRST_NS, Self::MAX_NS);
        self.step_ns.store(step, Relaxed);
        self.until_ns.store(self.now_ns() + step, Relaxed);
    }

    /// Did the last write fail (no success since)?
    fn failing(&self) -> bool {
        self.step_ns.load(Relaxed) != 0
    }

    fn success(&self) {
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
