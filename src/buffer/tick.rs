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
//! A hit through a cell (`buffer::cell`) takes its tick with no shard
//! lock ([`Ticks::next_released`]) and records it in its way's clock of
//! releases, a cache line that only threads of that way write.
//!
//! Work on the IO pool (a read that lands, a failed write put back) uses
//! [`Ticks::next_synced`]: it comes after every shard's newest tick and
//! every release's, and publishes its own, so that it comes after every
//! use that happened before the job, and the host's next use after it
//! (after `flush`, say) comes after it in turn.

use crate::buffer::way::{self, WAYS};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How far a thread's ticks may run ahead of the published clock before it
/// publishes: one shared write per this many ticks, and the bound on how
/// far apart two threads' ticks can drift.
///
/// Every write costs each other thread a cache miss on its next tick,
/// which reads the clock. At 64, two threads hitting different keys spent
/// about a tenth of their time on those misses; at 256 the misses are a
/// quarter as many, and the drift is still small next to the resident
/// entries of a buffer that evicts (docs/BENCHMARKS.md, "The clock two
/// threads share").
pub(crate) const SLACK: u64 = 256;

thread_local! {
    /// The last tick this thread took, in any buffer (ticks only need to
    /// rise; sharing the cell across buffers costs nothing).
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// A clock on cache lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct Clock(AtomicU64);

/// The buffer's published clock, read by every tick and written once per
/// [`SLACK`] ticks, and the newest release through a hit cell per way.
pub(crate) struct Ticks {
    published: Clock,
    released: [Clock; WAYS],
}

impl Ticks {
    pub(crate) fn new() -> Self {
        Ticks {
            published: Clock::default(),
            released: Default::default(),
        }
    }

    /// A tick for the release of a hit cell's pin, taken with no shard
    /// lock and recorded as its way's newest release: a load and a store,
    /// no locked instruction. A way is one thread's for up to [`WAYS`]
    /// threads; past that, a thread of the same way may overwrite a newer
    /// tick with its own, which is at most [`SLACK`] older.
    #[inline]
    pub(crate) fn next_released(&self) -> u64 {
        let t = self.next(0);
        let clock = &self.released[way::this_thread()].0;
        if clock.load(Relaxed) < t {
            clock.store(t, Relaxed);
        }
        t
    }

    /// The newest tick a release through a hit cell took.
    pub(crate) fn newest_released(&self) -> u64 {
        self.released
            .iter()
            .map(|c| c.0.load(Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// A tick for an entry of a shard whose newest tick is `floor`. Take it
    /// under that shard's lock and store it as the shard's newest.
    #[inline]
    pub(crate) fn next(&self, floor: u64) -> u64 {
        let published = self.published.0.load(Relaxed);
        let t = LAST.with(|last| {
            let t = last.get().max(floor).max(published) + 1;
            last.set(t);
            t
        });
        if t >= published.saturating_add(SLACK) {
            self.published.0.fetch_max(t, Relaxed);
        }
        t
    }

    /// A tick after every tick in `floors` (every shard's newest) and every
    /// tick taken so far, published at once. For work that runs on the IO
    /// pool on behalf of the host. Take it under the lock of the shard it
    /// orders.
    pub(crate) fn next_synced(&self, floors: impl Iterator<Item = u64>) -> u64 {
        let floor = floors.max().unwrap_or(0).max(self.newest_released());
        let t = self.next(floor);
        self.published.0.fetch_max(t, Relaxed);
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
                                let before = ticks.published.0.load(Relaxed);
                                last = ticks.next_released();
                                writes += u64::from(ticks.published.0.load(Relaxed) != before);
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
    fn a_synced_tick_comes_after_unpublished_releases_of_other_threads() {
        let ticks = Ticks::new();
        // Another thread releases hit cells, never reaching the point
        // where it publishes.
        let theirs = std::thread::scope(|s| {
            s.spawn(|| (0..SLACK / 2).map(|_| ticks.next_released()).max().unwrap())
                .join()
                .unwrap()
        });
        assert!(
            ticks.published.0.load(Relaxed) < theirs,
            "the test wants unpublished ticks"
        );
        assert_eq!(ticks.newest_released(), theirs);
        let synced = std::thread::scope(|s| {
            s.spawn(|| ticks.next_synced(std::iter::empty()))
                .join()
                .unwrap()
        });
        assert!(synced > theirs, "synced {synced} after {theirs}");
    }
}
