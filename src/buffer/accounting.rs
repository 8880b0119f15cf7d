//! Accounting: the gauges of what the buffer holds in memory, the target
//! and the limit they are held to, and the back-pressure of
//! `insert_async` (a FIFO of waiters released when memory is within the
//! limit, or cannot fall).
//!
//! The gauges change only by [`Accounting::apply`], with a [`Delta`] that
//! entry transitions computed, under the lock of the shard that made
//! them; so they are exact whenever no shard lock is held. Each gauge is
//! listed once, in the [`gauges!`] invocation below: the [`Delta`] field
//! that moves it, the atomic that holds it and the [`Readings`] field that
//! reports it all come from that line.

use crate::sync::atomic::{fence, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use crate::sync::Mutex;
use std::collections::VecDeque;

/// Defines [`Delta`] (signed changes, one field per gauge and per-shard
/// gauge), [`Gauges`] (one atomic per gauge and per derived gauge) and
/// [`Readings`] (their values), from one list.
macro_rules! gauges {
    (
        gauges { $($(#[$doc:meta])* $field:ident,)* }
        per_shard { $($(#[$sdoc:meta])* $sfield:ident,)* }
        derived { $($(#[$ddoc:meta])* $dfield:ident = $of:expr,)* }
    ) => {
        /// Changes to the memory gauges made by one or more transitions.
        /// Signed byte and count changes; [`Accounting::apply`] applies
        /// them under the shard lock that made them.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub(crate) struct Delta {
            $($(#[$doc])* pub $field: isize,)*
            $($(#[$sdoc])* pub $sfield: isize,)*
        }

        impl Delta {
            pub(crate) const ZERO: Delta = Delta { $($field: 0,)* $($sfield: 0,)* };

            /// Both changes together.
            pub(crate) fn plus(self, o: Delta) -> Delta {
                Delta {
                    $($field: self.$field + o.$field,)*
                    $($sfield: self.$sfield + o.$sfield,)*
                }
            }

            /// The opposite change.
            pub(crate) fn negate(self) -> Delta {
                Delta { $($field: -self.$field,)* $($sfield: -self.$sfield,)* }
            }
        }

        /// The buffer-wide gauges, kept exact under the shard locks.
        #[derive(Default)]
        struct Gauges {
            $($(#[$doc])* $field: AtomicUsize,)*
            $($(#[$ddoc])* $dfield: AtomicUsize,)*
            /// Tests only: called with each change once its first gauge
            /// (`resident`) has moved and before the others do, so that a
            /// test can hold a change half made while another thread reads
            /// the gauges (`tests/gauge_tear.rs`).
            #[cfg(test)]
            halfway: Mutex<Option<Halfway>>,
        }

        impl Gauges {
            /// Apply every buffer-wide part of `d`.
            #[inline]
            fn shift_all(&self, d: Delta) {
                $(
                    shift(&self.$field, d.$field);
                    #[cfg(test)]
                    if stringify!($field) == "resident" {
                        self.halfway(&d);
                    }
                )*
                $(shift(&self.$dfield, ($of)(d));)*
            }

            fn read(&self) -> Readings {
                Readings {
                    $($field: self.$field.load(Relaxed),)*
                    $($dfield: self.$dfield.load(Relaxed),)*
                }
            }
        }

        /// The buffer-wide gauges' values at one moment (read one by one).
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub(crate) struct Readings {
            $($(#[$doc])* pub $field: usize,)*
            $($(#[$ddoc])* pub $dfield: usize,)*
        }

        impl Readings {
            /// What the gauges read when the changes that brought them
            /// from zero add up to `total`.
            #[cfg(any(test, feature = "testing"))]
            pub(crate) fn of(total: Delta) -> Readings {
                Readings {
                    $($field: total.$field as usize,)*
                    $($dfield: ($of)(total) as usize,)*
                }
            }

            /// The gauges whose values differ: (name, in `self`, in `other`).
            #[cfg(any(test, feature = "testing"))]
            pub(crate) fn differences(&self, other: &Readings) -> Vec<(&'static str, usize, usize)> {
                let mut out = Vec::new();
                $(if self.$field != other.$field {
                    out.push((stringify!($field), self.$field, other.$field));
                })*
                $(if self.$dfield != other.$dfield {
                    out.push((stringify!($dfield), self.$dfield, other.$dfield));
                })*
                out
            }
        }
    };
}

gauges! {
    gauges {
    /// Weight of values in memory (resident, spilling, pinned).
    resident,
    /// Number of values in memory.
    count,
    /// Weight of values with a write queued or running.
    spilling,
    /// Weight of values both pinned and spilling: counted in the shards'
    /// pinned weight and in `spilling`, so `over_target` adds it back
    /// rather than count it twice.
    pinned_spilling,
    /// Weight promised to prefetch reads in flight.
    reserved,
    /// Live keys.
    len,
    /// Weight of the live keys' values, wherever they are (in memory or
    /// only on disk).
    live_weight,
    /// Weight of detached values: no longer any entry's (removed,
    /// replaced, or on their way to be freed on the pool) but still held,
    /// by pins or by IO jobs.
    detached,
    /// Number of detached values.
    detached_count,
    /// Of `detached`, the weight an IO job holds (a write queued or
    /// running, a free queued on the pool): it falls without the host
    /// doing anything.
    detached_io,
    /// Weight of values set aside after their encode failed (resident, on
    /// no list).
    set_aside,
    }
    per_shard {
    /// Weight of pinned values: each shard's own gauge, written under its
    /// lock (see [`Accounting::apply`]).
    pinned,
    }
    derived {
    /// `resident - spilling`: the weight in memory that no write is taking
    /// away, in one gauge for `over_target`. A finished write lowers
    /// `resident` and `spilling` by the same weight, which leaves this
    /// unchanged; read as two gauges, it could seem for a moment to have
    /// risen or fallen by that weight, and an eviction to be due or not.
    unheld = |d: Delta| d.resident - d.spilling,
    /// `spilling + detached_io`: all the weight IO jobs hold, in one gauge
    /// so that one load sees both at the same instant. A value of a key
    /// removed while its write runs moves from one to the other, which
    /// leaves this unchanged; read as two gauges, it could show in neither
    /// for a moment.
    io_held = |d: Delta| d.spilling + d.detached_io,
    /// `live_weight - resident`: the weight of the live keys whose values
    /// are not in memory (on disk, or being read back), in one gauge so
    /// that a value leaving or entering memory never shows in both or in
    /// neither.
    spilled_weight = |d: Delta| d.live_weight - d.resident,
    }
}

impl Delta {
    /// A value of weight `w` entering memory.
    pub(crate) fn enter(w: isize) -> Delta {
        Delta {
            resident: w,
            count: 1,
            ..Delta::ZERO
        }
    }

    /// A value of weight `w` leaving memory.
    pub(crate) fn leave(w: isize) -> Delta {
        Delta {
            resident: -w,
            count: -1,
            ..Delta::ZERO
        }
    }

    /// A value of weight `w` handed to the IO pool to be freed there (see
    /// `Inner::drop_value`): detached and held by a job until the job has
    /// dropped it, when the negation of this is applied.
    pub(crate) fn freeing(w: usize) -> Delta {
        let w = w as isize;
        Delta {
            detached: w,
            detached_count: 1,
            detached_io: w,
            ..Delta::ZERO
        }
    }

    /// Must the thread that applied this change look at the target again
    /// (see `Inner::with_shard`)? `over_target` reads `unheld` (resident
    /// less spilling, one gauge), the shards' `pinned` and
    /// `pinned_spilling` one after another, and a change moving several
    /// of them lands one gauge at a time: a concurrent reader may see a sum
    /// that was never true, below both the one before and the one after
    /// (a value pinned while its write runs, then unpinned, moves `pinned`
    /// and `pinned_spilling` by the same weight), and stop evicting. A
    /// change lowering `spilling` is a write that ended: if it failed, what
    /// is over the target rose, which a reader that came just before
    /// missed; if it succeeded, it ended any back-off that had kept
    /// evictions from writing. Inserts, unspills and unpins, the other
    /// changes that raise what is over the target, evict afterwards
    /// anyway. The check is cheap when nothing is over the target, and
    /// waits for an eviction running on another thread rather than evict
    /// for the same excess (`Inner::evict_to_target`).
    pub(crate) fn needs_target_check(&self) -> bool {
        let moved = [
            self.resident,
            self.spilling,
            self.pinned,
            self.pinned_spilling,
        ]
        .iter()
        .filter(|&&change| change != 0)
        .count();
        moved > 1 || self.spilling < 0
    }
}

/// The hook of `Gauges::halfway`.
#[cfg(test)]
pub(crate) type Halfway = crate::sync::Arc<dyn Fn(&Delta) + Send + Sync>;

#[cfg(test)]
impl Gauges {
    /// Call the test hook, if one is set, with the change `d`.
    fn halfway(&self, d: &Delta) {
        // Not called under the hook's lock: other threads apply changes
        // while it holds this one.
        let halfway = self.halfway.lock().clone();
        if let Some(halfway) = halfway {
            halfway(d);
        }
    }
}

fn shift(a: &AtomicUsize, d: isize) {
    if d > 0 {
        a.fetch_add(d as usize, Relaxed);
    } else if d < 0 {
        a.fetch_sub(d.unsigned_abs(), Relaxed);
    }
}

/// A value alone on its cache lines (two, against adjacent-line
/// prefetching), so that the atomics every transition updates do not
/// invalidate the read-mostly fields next to them on other cores.
#[derive(Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// What the buffer holds in memory, against what it may hold.
pub(crate) struct Accounting {
    gauges: Padded<Gauges>,
    /// Eviction starts above this many bytes of unpinned values.
    target: AtomicUsize,
    /// `insert_async` waits while memory held is above this.
    limit: AtomicUsize,
    /// No limit was set: it moves with the target.
    limit_follows_target: bool,
    /// Serialises prefetch admission (reading `resident` and taking a
    /// reservation) against a prefetched value moving from reserved to
    /// resident. Taken only inside a shard lock.
    admission: Mutex<()>,
    /// `insert_async` callers waiting for memory, oldest first.
    waiters: Mutex<VecDeque<tokio::sync::oneshot::Sender<()>>>,
    /// The length of `waiters`, read without its lock.
    waiting: AtomicUsize,
}

impl Accounting {
    /// Gauges at zero; the limit follows the target when it is `None`.
    pub(crate) fn new(target: usize, limit: Option<usize>) -> Self {
        Accounting {
            gauges: Padded::default(),
            target: AtomicUsize::new(target),
            limit: AtomicUsize::new(limit.unwrap_or(target)),
            limit_follows_target: limit.is_none(),
            admission: Mutex::new(()),
            waiters: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
        }
    }

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
        self.gauges.0.shift_all(d);
    }

    /// Apply changes that no shard made (a value handed to the pool to be
    /// freed, and freed); they never touch a shard's pinned weight.
    pub(crate) fn apply_unsharded(&self, d: Delta) {
        debug_assert_eq!(d.pinned, 0, "pins are counted per shard");
        debug_assert_eq!(d.reserved, 0, "reservations move under a shard lock");
        self.gauges.0.shift_all(d);
    }

    /// The gauges now, read one by one.
    pub(crate) fn read(&self) -> Readings {
        self.gauges.0.read()
    }

    /// Live keys.
    pub(crate) fn len(&self) -> usize {
        self.gauges.0.len.load(Relaxed)
    }

    /// Weight of values set aside after their encode failed.
    pub(crate) fn set_aside(&self) -> usize {
        self.gauges.0.set_aside.load(Relaxed)
    }

    pub(crate) fn target(&self) -> usize {
        self.target.load(Relaxed)
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Relaxed)
    }

    /// A new target; a limit that was never set follows it, one that was
    /// stays at least the target.
    pub(crate) fn set_target(&self, bytes: usize) {
        self.target.store(bytes, Relaxed);
        if self.limit_follows_target {
            self.limit.store(bytes, Relaxed);
        } else {
            self.limit.fetch_max(bytes, Relaxed);
        }
    }

    /// A new target, the limit left alone: for tests that look at
    /// `over_target` without the eviction a new target starts.
    #[cfg(test)]
    pub(crate) fn store_target(&self, bytes: usize) {
        self.target.store(bytes, Relaxed);
    }

    /// Set or clear the hook that holds each change of the gauges after its
    /// first store (see `Gauges::halfway`).
    #[cfg(test)]
    pub(crate) fn set_halfway(&self, hook: Option<Halfway>) {
        *self.gauges.0.halfway.lock() = hook;
    }

    /// Reserve `w` bytes for a prefetch if unpinned resident bytes plus
    /// reservations stay within `target`; `pinned` is the weight of pinned
    /// values.
    pub(crate) fn admit(&self, w: usize, pinned: usize, target: usize) -> bool {
        let _admission = self.admission.lock();
        let g = &self.gauges.0;
        let unpinned = g.resident.load(Relaxed).saturating_sub(pinned);
        g.reserved
            .fetch_update(Relaxed, Relaxed, |r| {
                (unpinned + r + w <= target).then_some(r + w)
            })
            .is_ok()
    }

    /// Is there room for `w` more bytes within `target`, counted as
    /// [`admit`](Self::admit) counts it (without reserving them)?
    pub(crate) fn has_room(&self, w: usize, pinned: usize, target: usize) -> bool {
        let g = &self.gauges.0;
        let held = g.resident.load(Relaxed).saturating_sub(pinned) + g.reserved.load(Relaxed);
        held + w <= target
    }

    /// Bytes above the target held by unpinned values that no write is
    /// already taking away; `pinned` gives the weight of pinned values
    /// (asked for only when the answer depends on it). Pinned values are
    /// the host's working set: they count against `memory_limit`, not
    /// against the eviction target.
    pub(crate) fn over_target(&self, pinned: impl FnOnce() -> usize) -> usize {
        let g = &self.gauges.0;
        let unheld = g.unheld.load(Relaxed);
        let target = self.target();
        // Under the target even before pins are counted: the common case
        // after an unpin, answered without reading every shard.
        if unheld <= target {
            return 0;
        }
        // A value both pinned and being written is already out of `unheld`.
        let pinned_only = pinned().saturating_sub(g.pinned_spilling.load(Relaxed));
        unheld.saturating_sub(pinned_only).saturating_sub(target)
    }

    /// Every byte of value the buffer holds: resident values and detached
    /// ones (of removed or replaced keys, still held). What `memory_limit`
    /// bounds (`Stats::memory_bytes`).
    pub(crate) fn memory_held(&self) -> usize {
        let g = &self.gauges.0;
        g.resident.load(Relaxed) + g.detached.load(Relaxed)
    }

    fn under_limit(&self) -> bool {
        self.memory_held() <= self.limit()
    }

    /// Some IO job holds memory (a write queued or running, or a value
    /// waiting to be freed on the pool): memory will fall without the host
    /// acting.
    pub(crate) fn io_in_flight(&self) -> bool {
        self.gauges.0.io_held.load(Relaxed) > 0
    }

    /// No write is in flight, nor any IO job holding a detached value (a
    /// write or a free), so memory will not fall without the host
    /// acting (unpinning, removing): eviction has already queued every
    /// write it could, and the rest is pinned or failed to spill. Waiting
    /// would never end, so back-pressure is released instead.
    fn stalled(&self) -> bool {
        !self.io_in_flight()
    }

    /// Resolves once memory is within the limit. Waiters are served in
    /// arrival order; a newcomer does not overtake a queue.
    pub(crate) async fn wait_for_memory(&self) {
        let rx = {
            let mut q = self.waiters.lock();
            if q.is_empty() && (self.under_limit() || self.stalled()) {
                return;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            q.push_back(tx);
            self.waiting.store(q.len(), SeqCst);
            rx
        };
        // Pairs with the fence in `wake_waiters`: either a thread that
        // just freed memory sees this waiter, or the check below sees the
        // freed memory. (The gauges are relaxed atomics.)
        fence(SeqCst);
        // Memory may have dropped before the waiter was queued.
        self.wake_waiters();
        let _ = rx.await;
    }

    /// Resolve the waiting `insert_async` calls, all of them in arrival
    /// order, if memory is within the limit or cannot fall.
    pub(crate) fn wake_waiters(&self) {
        // Pairs with the fence in `wait_for_memory`.
        fence(SeqCst);
        if self.waiting.load(SeqCst) == 0 {
            return;
        }
        let ready = {
            let mut q = self.waiters.lock();
            if q.is_empty() || !(self.under_limit() || self.stalled()) {
                return;
            }
            self.waiting.store(0, SeqCst);
            std::mem::take(&mut *q)
        };
        for tx in ready {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests;
