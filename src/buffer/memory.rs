//! Memory: the gauges of what the buffer holds, how far it is over its
//! target, and the back-pressure of `insert_async` (a FIFO of waiters
//! released when memory is within `memory_limit`, or cannot fall).
//!
//! The gauges change only by [`Gauges::apply`], with a [`Delta`] that
//! entry transitions computed, under the lock of the shard that made
//! them; so they are exact whenever no shard lock is held.

use super::entry::Delta;
use super::inner::Inner;
use super::Key;
use crate::value::Spill;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};

/// Gauges of what is in memory, kept exact under the shard locks.
#[derive(Default)]
pub(crate) struct Gauges {
    /// Weight of values in memory (resident, spilling, pinned).
    pub resident: AtomicUsize,
    pub resident_count: AtomicUsize,
    /// Weight of values with a write queued or running.
    pub spilling: AtomicUsize,
    /// `resident - spilling`: the weight in memory that no write is taking
    /// away, in one gauge for `over_target`. A finished write lowers
    /// `resident` and `spilling` by the same weight, which leaves this
    /// unchanged; read as two gauges, it could seem for a moment to have
    /// risen or fallen by that weight, and an eviction to be due or not.
    pub unheld: AtomicUsize,
    /// Weight of values both pinned and spilling: counted in the shards'
    /// pinned weight and in `spilling`, so `over_target` adds it back rather
    /// than count it twice.
    pub pinned_spilling: AtomicUsize,
    /// Weight of prefetch reads in flight (memory promised to them).
    pub reserved: AtomicUsize,
    /// Live keys.
    pub len: AtomicUsize,
    /// Weight and number of detached values: no longer any entry's but
    /// still held, by pins or IO jobs (see `entry::Detached`).
    pub detached: AtomicUsize,
    pub detached_count: AtomicUsize,
    /// Of `detached`, the weight IO jobs hold (it falls on its own).
    pub detached_io: AtomicUsize,
    /// `spilling + detached_io`: all the weight IO jobs hold, in one gauge
    /// so that one load sees both at the same instant. A value of a key
    /// removed while its write runs moves from one to the other, which
    /// leaves this unchanged; read as two gauges, it could show in neither
    /// for a moment.
    pub io_held: AtomicUsize,
    /// Weight of values set aside after their encode failed (resident,
    /// on no list).
    pub set_aside: AtomicUsize,
    /// Serialises prefetch admission (reading `resident` and taking a
    /// reservation) against a prefetched value moving from reserved to
    /// resident. Taken only inside a shard lock.
    admission: Mutex<()>,
}

fn shift(a: &AtomicUsize, d: isize) {
    if d > 0 {
        a.fetch_add(d as usize, Relaxed);
    } else if d < 0 {
        a.fetch_sub(d.unsigned_abs(), Relaxed);
    }
}

impl Gauges {
    /// Apply the changes a shard made; `pinned` is that shard's own pinned
    /// weight. The caller holds the shard's lock.
    #[inline]
    pub(crate) fn apply(&self, d: Delta, pinned: &AtomicUsize) {
        if d == Delta::ZERO {
            return;
        }
        if d.pinned != 0 {
            // Written only under the shard lock: a load and a store.
            let p = pinned.load(Relaxed) as isize + d.pinned;
            pinned.store(p as usize, Relaxed);
            // A pin or unpin of a resident value (the hit path) moves
            // nothing else.
            if (Delta { pinned: 0, ..d }) == Delta::ZERO {
                return;
            }
        }
        // A prefetched value moves from reserved to resident in one step
        // as `admit` sees it: resident first, under the admission lock, or
        // a concurrent prefetch could find the room it held free for a
        // moment and take it too.
        let _admission = (d.reserved != 0).then(|| self.admission.lock());
        self.shift_all(d);
    }

    /// Apply changes that no shard made (a value handed to the pool to be
    /// freed, and freed); they never touch a shard's pinned weight.
    pub(crate) fn apply_unsharded(&self, d: Delta) {
        debug_assert_eq!(d.pinned, 0, "pins are counted per shard");
        debug_assert_eq!(d.reserved, 0, "reservations move under a shard lock");
        self.shift_all(d);
    }

    #[inline]
    fn shift_all(&self, d: Delta) {
        shift(&self.resident, d.resident);
        shift(&self.resident_count, d.count);
        shift(&self.spilling, d.spilling);
        shift(&self.unheld, d.resident - d.spilling);
        shift(&self.pinned_spilling, d.pinned_spilling);
        shift(&self.reserved, d.reserved);
        shift(&self.len, d.len);
        shift(&self.detached, d.detached);
        shift(&self.detached_count, d.detached_count);
        shift(&self.detached_io, d.detached_io);
        shift(&self.io_held, d.spilling + d.detached_io);
        shift(&self.set_aside, d.set_aside);
    }

    /// Reserve `w` bytes for a prefetch if unpinned resident bytes plus
    /// reservations stay within `target`.
    pub(crate) fn admit(&self, w: usize, pinned: usize, target: usize) -> bool {
        let _admission = self.admission.lock();
        let unpinned = self.resident.load(Relaxed).saturating_sub(pinned);
        self.reserved
            .fetch_update(Relaxed, Relaxed, |r| {
                (unpinned + r + w <= target).then_some(r + w)
            })
            .is_ok()
    }
}

/// `insert_async` callers waiting for memory, oldest first.
#[derive(Default)]
pub(crate) struct MemoryWaiters {
    queue: Mutex<VecDeque<tokio::sync::oneshot::Sender<()>>>,
    waiting: AtomicUsize,
}

impl<K: Key, V: Spill> Inner<K, V> {
    /// Bytes above the target held by unpinned values that no write is
    /// already taking away. Pinned values are the host's working set: they
    /// count against `memory_limit`, not against the eviction target.
    pub(crate) fn over_target(&self) -> usize {
        let unheld = self.g.unheld.load(Relaxed);
        let target = self.target();
        // Under the target even before pins are counted: the common case
        // after an unpin, answered without reading every shard.
        if unheld <= target {
            return 0;
        }
        // A value both pinned and being written is already out of `unheld`.
        let pinned_only = self
            .pinned()
            .saturating_sub(self.g.pinned_spilling.load(Relaxed));
        unheld.saturating_sub(pinned_only).saturating_sub(target)
    }

    /// Weight of values with at least one pin, over all shards.
    pub(crate) fn pinned(&self) -> usize {
        self.shards.iter().map(|s| s.pinned.load(Relaxed)).sum()
    }

    /// Every value the buffer holds counts against the limit: resident
    /// ones and detached ones (of removed or replaced keys, still held).
    fn under_limit(&self) -> bool {
        self.memory_held() <= self.limit.load(Relaxed)
    }

    /// Every byte of value the buffer holds: resident values and detached
    /// ones. What `memory_limit` bounds (`Stats::memory_bytes`).
    pub(crate) fn memory_held(&self) -> usize {
        self.g.resident.load(Relaxed) + self.g.detached.load(Relaxed)
    }

    /// Resolves once memory is within the limit. Waiters are served in
    /// arrival order; a newcomer does not overtake a queue.
    pub(crate) async fn wait_for_memory(&self) {
        let rx = {
            let mut q = self.mem_waiters.queue.lock();
            if q.is_empty() && (self.under_limit() || self.stalled()) {
                return;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            q.push_back(tx);
            self.mem_waiters.waiting.store(q.len(), SeqCst);
            rx
        };
        // Pairs with the fence in `wake_mem_waiters`: either a thread
        // that just freed memory sees this waiter, or the check below sees
        // the freed memory. (The gauges are relaxed atomics.)
        fence(SeqCst);
        // Memory may have dropped before the waiter was queued.
        self.wake_mem_waiters();
        let _ = rx.await;
    }

    /// No write is in flight, nor any IO job holding a detached value (a
    /// write or a free), so memory will not fall without the host
    /// acting (unpinning, removing): eviction has already queued every
    /// write it could, and the rest is pinned or failed to spill. Waiting
    /// would never end, so back-pressure is released instead.
    fn stalled(&self) -> bool {
        !self.io_in_flight()
    }

    /// Some IO job holds memory (a write queued or running, or a value
    /// waiting to be freed on the pool): memory will fall without the host
    /// acting.
    pub(crate) fn io_in_flight(&self) -> bool {
        self.g.io_held.load(Relaxed) > 0
    }

    /// Resolve the waiting `insert_async` calls, all of them in arrival
    /// order, if memory is within the limit or cannot fall.
    pub(crate) fn wake_mem_waiters(&self) {
        // Pairs with the fence in `wait_for_memory`.
        fence(SeqCst);
        if self.mem_waiters.waiting.load(SeqCst) == 0 {
            return;
        }
        let ready = {
            let mut q = self.mem_waiters.queue.lock();
            if q.is_empty() || !(self.under_limit() || self.stalled()) {
                return;
            }
            self.mem_waiters.waiting.store(0, SeqCst);
            std::mem::take(&mut *q)
        };
        for tx in ready {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Apply `d` to `g`, then its negation, 20,000 times on another thread,
    /// while this thread calls `check` with the number of checks so far,
    /// until that thread is done. The negation is not a transition the
    /// buffer makes: it puts the weight back for the next round.
    fn while_applying(g: &Gauges, d: Delta, mut check: impl FnMut(u64)) {
        let pinned = AtomicUsize::new(0);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..20_000 {
                    g.apply(d, &pinned);
                    g.apply(d.negate(), &pinned);
                }
                done.store(true, SeqCst);
            });
            let mut checks = 0;
            while !done.load(SeqCst) {
                check(checks);
                checks += 1;
            }
        });
    }

    /// A write that ends lowers `resident` and `spilling` by the same
    /// weight. `over_target` reads what is in memory and not being written
    /// from `unheld` alone, so it must never see that change half made:
    /// either way it would be off by the write's weight, and evict a value
    /// too many or stop a value short.
    #[test]
    fn a_write_that_ends_never_shows_in_unheld() {
        const W: isize = 4096;
        let g = Gauges::default();
        let pinned = AtomicUsize::new(0);
        let resident = Delta {
            resident: 3 * W,
            count: 3,
            len: 3,
            ..Delta::ZERO
        };
        let evicted = Delta {
            spilling: W,
            ..Delta::ZERO
        };
        let written = Delta {
            resident: -W,
            count: -1,
            spilling: -W,
            ..Delta::ZERO
        };
        g.apply(resident, &pinned);
        g.apply(evicted, &pinned);
        let unheld = g.unheld.load(Relaxed);
        assert_eq!(unheld, 2 * W as usize);
        while_applying(&g, written, |_| {
            assert_eq!(g.unheld.load(Relaxed), unheld);
        });
        assert_eq!(
            g.resident.load(Relaxed) - g.spilling.load(Relaxed),
            g.unheld.load(Relaxed)
        );
    }

    /// A key removed while its value is being written moves that weight
    /// from `spilling` to `detached_io` in one change. Back-pressure asks
    /// whether any IO holds memory (`io_held`): a reader must never find
    /// the weight in neither, or it would release `insert_async` waiters
    /// while the write still holds the memory it will free.
    #[test]
    fn a_write_outliving_its_key_always_shows_as_io_in_flight() {
        const W: isize = 4096;
        let g = Gauges::default();
        let pinned = AtomicUsize::new(0);
        let written = Delta {
            resident: W,
            count: 1,
            spilling: W,
            len: 1,
            ..Delta::ZERO
        };
        let removed = Delta {
            resident: -W,
            count: -1,
            spilling: -W,
            len: -1,
            detached: W,
            detached_count: 1,
            detached_io: W,
            ..Delta::ZERO
        };
        g.apply(written, &pinned);
        while_applying(&g, removed, |reads| {
            assert!(
                g.io_held.load(Relaxed) > 0,
                "a write in flight showed as none after {reads} reads"
            );
        });
        assert_eq!(g.io_held.load(Relaxed), W as usize);
        assert_eq!(
            g.spilling.load(Relaxed) + g.detached_io.load(Relaxed),
            g.io_held.load(Relaxed)
        );
    }
}
