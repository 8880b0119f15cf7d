//! LRU ticks without a counter that every use writes. A shared
//! `fetch_add` per unpin made one cache line bounce between the cores of
//! two threads pinning different keys. Instead a tick is a Lamport-style
//! clock: above the newest tick of the shard it orders (so each shard's
//! lists stay in tick order), above the last tick this thread took (so one
//! thread's uses are ordered exactly, across shards), and at least the
//! buffer's published clock, which a thread advances only once its own
//! ticks are [`SLACK`] past it. Two threads' ticks thus never drift more
//! than `SLACK` apart: for eviction, entries used by different threads are
//! ordered within that many uses of each other.
//!
//! A pin released without the shard's write lock (`buffer::hit`) takes its
//! tick the same way: a read of the published clock and of this thread's last
//! tick. It writes nothing shared but, once per `SLACK` ticks, the clock.
//!
//! Work on the IO pool (a read that lands, a failed write put back) uses
//! [`Ticks::next_synced`]: it comes after every shard's newest tick and
//! the published clock, and publishes its own, so that the host's next
//! use after it (after `flush`, say) comes after it in turn. A thread that
//! queues a read publishes its own ticks first ([`Ticks::publish`]), so
//! that the read lands after every use that thread made before: for a
//! single thread the order stays exact. Another thread's uses it did not
//! publish yet are at most [`SLACK`] ticks ahead, as always.

use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::cell::Cell;

/// How far a thread's ticks may run ahead of the published clock before it
/// publishes: one shared write per this many ticks, and the bound on how
/// far apart two threads' ticks can drift.
///
/// Every write costs each other thread a cache miss on its next tick,
/// which reads the clock: the larger, the fewer misses, and the drift is
/// still small next to the resident entries of a buffer that evicts.
pub(crate) const SLACK: u64 = 256;

thread_local! {
    /// The last tick this thread took, in any buffer (ticks only need to
    /// rise; sharing the cell across buffers costs nothing).
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// The buffer's published clock, read by every tick and written once per
/// [`SLACK`] ticks, on cache lines of its own.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Ticks {
    published: AtomicU64,
}

impl Ticks {
    pub(crate) fn new() -> Self {
        Ticks::default()
    }

    /// A tick for an entry of a shard whose newest tick is `floor`, or for
    /// the release of a pin taken under the read lock (`floor` 0: its entry stays
    /// where it is on its list). For a shard, take it under that shard's
    /// lock and store it as the shard's newest.
    ///
    /// It is also "now" for the calling thread: every use it made before
    /// has an older tick, every use it makes after a newer one.
    #[inline]
    pub(crate) fn next(&self, floor: u64) -> u64 {
        let published = self.published.load(Relaxed);
        let t = LAST.with(|last| {
            let t = last.get().max(floor).max(published) + 1;
            last.set(t);
            t
        });
        if t >= published.saturating_add(SLACK) {
            self.published.fetch_max(t, Relaxed);
        }
        t
    }

    /// "Now" for the calling thread: at or after `floor`, the published
    /// clock and every tick the thread took, and before every tick it
    /// takes next. Takes no tick of its own.
    pub(crate) fn now(&self, floor: u64) -> u64 {
        let published = self.published.load(Relaxed);
        LAST.with(|last| {
            let t = last.get().max(floor).max(published);
            last.set(t);
            t
        })
    }

    /// Publish `t` (a tick this thread took, or its "now"): every synced
    /// tick taken after comes after it.
    pub(crate) fn publish(&self, t: u64) {
        if self.published.load(Relaxed) < t {
            self.published.fetch_max(t, Relaxed);
        }
    }

    /// A tick after every tick in `floors` (every shard's newest) and the
    /// published clock, published at once. For work that runs on the IO
    /// pool on behalf of the host. Take it under the lock of the shard it
    /// orders.
    pub(crate) fn next_synced(&self, floors: impl Iterator<Item = u64>) -> u64 {
        let t = self.next(floors.max().unwrap_or(0));
        self.published.fetch_max(t, Relaxed);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_is_ordered_exactly_across_floors() {
        let ticks = Ticks::new();
        let mut prev = 0;
        // Shards whose newest ticks lag far behind, or run ahead.
        for floor in [0, 5, 0, 1000, 3, 0, 2000, 1999] {
            let t = ticks.next(floor);
            assert!(t > prev, "tick {t} after {prev}");
            assert!(t > floor, "tick {t} not above its shard's {floor}");
            prev = t;
        }
    }

    #[test]
    fn threads_drift_at_most_slack_apart() {
        let ticks = Ticks::new();
        let mut ahead = 0;
        for _ in 0..10_000 {
            ahead = ticks.next(0);
        }
        // A fresh thread, which has taken no tick yet, starts no further
        // than SLACK behind the busy one.
        let behind = std::thread::scope(|s| s.spawn(|| ticks.next(0)).join().unwrap());
        assert!(
            behind + SLACK >= ahead,
            "fresh thread at {behind}, busy one at {ahead}"
        );
    }

    #[test]
    fn two_threads_in_turn_publish_once_per_slack_ticks_and_stay_within_it() {
        const TICKS: u64 = 16 * SLACK;
        let ticks = Ticks::new();
        let turns = std::sync::Barrier::new(2);
        // The threads take ticks in turn, each seeing the other's last
        // one, and count the writes they make to the clock.
        let [(a_writes, a_last), (b_writes, b_last)] = std::thread::scope(|s| {
            [0, 1]
                .map(|me| {
                    let (ticks, turns) = (&ticks, &turns);
                    s.spawn(move || {
                        let (mut writes, mut last) = (0, 0);
                        for turn in 0..TICKS {
                            if turn % 2 == me {
                                let before = ticks.published.load(Relaxed);
                                last = ticks.next(0);
                                writes += u64::from(ticks.published.load(Relaxed) != before);
                            }
                            turns.wait();
                        }
                        (writes, last)
                    })
                })
                .map(|h| h.join().unwrap())
        });
        let writes = a_writes + b_writes;
        // One write per SLACK ticks of the pair: the thread behind jumps
        // to the clock the other published rather than publishing too.
        assert!(
            writes <= TICKS / SLACK + 1,
            "{writes} writes in {TICKS} ticks"
        );
        assert!(
            writes >= TICKS / (2 * SLACK),
            "{writes} writes in {TICKS} ticks"
        );
        assert!(a_last.abs_diff(b_last) <= SLACK, "{a_last} and {b_last}");
    }

    #[test]
    fn a_synced_tick_comes_after_every_floor_and_is_published() {
        let ticks = Ticks::new();
        let synced = std::thread::scope(|s| {
            s.spawn(|| ticks.next_synced([7, 500, 42].into_iter()))
                .join()
                .unwrap()
        });
        assert!(synced > 500);
        // Another thread's next tick comes after it, whatever its own past.
        let later = std::thread::scope(|s| s.spawn(|| ticks.next(0)).join().unwrap());
        assert!(later > synced, "{later} after the synced {synced}");
    }

    #[test]
    fn a_synced_tick_comes_after_what_other_threads_published() {
        let ticks = Ticks::new();
        // Another thread releases hits, never reaching the point
        // where it publishes, then queues a read.
        let (unpublished, theirs) = std::thread::scope(|s| {
            s.spawn(|| {
                let theirs = (0..SLACK / 2).map(|_| ticks.next(0)).max().unwrap();
                let unpublished = ticks.published.load(Relaxed) < theirs;
                let now = ticks.now(0);
                ticks.publish(now);
                (unpublished, now)
            })
            .join()
            .unwrap()
        });
        assert!(unpublished, "the test wants unpublished ticks");
        assert_eq!(theirs, SLACK / 2, "now is the thread's last tick");
        let synced = std::thread::scope(|s| {
            s.spawn(|| ticks.next_synced(std::iter::empty()))
                .join()
                .unwrap()
        });
        assert!(synced > theirs, "synced {synced} after {theirs}");
        assert_eq!(ticks.published.load(Relaxed), synced);
    }

    #[test]
    fn now_takes_no_tick_and_comes_between_a_threads_ticks() {
        let ticks = Ticks::new();
        let (before, now, again, after) = std::thread::scope(|s| {
            s.spawn(|| {
                let before = ticks.next(0);
                // A shard's newest tick, ahead of this thread's.
                let now = ticks.now(before + 10);
                (before, now, ticks.now(0), ticks.next(0))
            })
            .join()
            .unwrap()
        });
        assert_eq!(now, before + 10);
        assert_eq!(again, now, "a second now took a tick");
        assert_eq!(after, now + 1);
    }
}
