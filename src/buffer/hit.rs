//! The hit path's part of an entry: the pins a lookup takes under its
//! shard's read lock, and the time of the entry's last use.
//!
//! Every resident entry on an LRU list has a [`HitPins`], shared (an
//! `Arc`) between the entry and the guards of the pins taken through it.
//! One atomic word holds those pins and two flags; every step is a single
//! atomic update of it:
//!
//! - **open**: the entry is on its list. A lookup under the shard's read
//!   lock adds a pin while the word is open; the shard cannot close it
//!   meanwhile, since closing takes the write lock. The entry stays where
//!   it is on its list, and the pin's release stores its tick in
//!   `last_use`. Eviction finds an entry whose `last_use` is newer than
//!   its place on the list and moves it up instead of evicting it, so for
//!   a single thread the order is exact LRU.
//! - **closed**: the shard took the entry off its list (to evict it, pin
//!   it under the write lock, remove or replace it). Lookups take the
//!   write lock. Closing a word that holds pins turns them into a
//!   **lease**: one pin the shard counts on the entry, so the value stays
//!   pinned (and counted as pinned) until the last of them goes. That
//!   release ends the lease through the buffer, under the write lock.
//!
//! The shard opens and closes the word only under its write lock, and the
//! word is open exactly when its entry is on a list (`validate()` checks
//! it).

use crate::buffer::clock::Ticks;
use crate::sync::atomic::{
    AtomicIsize, AtomicU64,
    Ordering::{AcqRel, Relaxed},
};
use crate::sync::{Arc, Weak};

/// Where a pin lives: shard, slot and the entry's version. A pin whose
/// entry was removed or replaced finds another version there and does
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PinAt {
    pub shard: u32,
    pub slot: u32,
    pub version: u64,
}

/// What a pin needs of the buffer, without naming its key type.
pub(crate) trait PinOwner<V>: Send + Sync {
    /// Add one pin (a clone of a guard).
    fn repin(&self, at: PinAt);
    /// Drop one pin; `consume` marks the entry first in line for eviction.
    /// The guard's own handle on the value comes along, so that when it is
    /// the last one, a heavy value is freed on the IO pool rather than on
    /// the caller's thread.
    fn unpin(&self, at: PinAt, consume: bool, value: Arc<V>);
    /// The last pin of a lease of `pins` was released: give the lease
    /// back (see [`crate::buffer::hit`]). The guard's handle on `pins`
    /// comes along, so that when it holds the last handle on the value
    /// but the entry's, it goes first and the entry's is the last one.
    fn end_lease(&self, pins: Arc<HitPins<V>>);
    /// Release one pin of `pins`, consuming: the entry goes first in
    /// line, as [`PinOwner::unpin`] with `consume` does. Returns whether
    /// that release ended a lease.
    fn consume_hit(&self, pins: Arc<HitPins<V>>);
}

/// The pins: the low 32 bits of the word.
const PINS: u64 = 0xffff_ffff;
/// A lookup refuses to pin past this many pins (it takes the write lock),
/// and a guard cloned past it aborts, as an `Arc` cloned past its limit
/// does: the pins must never carry into the flags.
const MAX_PINS: u64 = 1 << 31;
/// The entry is on its list: lookups under the read lock may pin.
const OPEN: u64 = 1 << 32;
/// Closed while pinned: the entry holds one pin for all of them, which
/// the last of them gives back.
const LEASED: u64 = 1 << 33;

/// What a release of a pin leaves to do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Nothing: other pins remain, or the entry was on its list all along.
    Done,
    /// It was the last pin of a lease: give the lease back to the shard
    /// ([`PinOwner::end_lease`]).
    EndLease,
}

/// What every entry's [`HitPins`] shares: the buffer's clock, the weight
/// pinned under the read lock per shard, and the buffer itself for the
/// releases that need its shard.
pub(crate) struct HitContext<V> {
    pub ticks: Ticks,
    /// Per shard, the weight of entries with pins here and no lease (a
    /// lease counts in the shard's own pinned weight). It may be off for
    /// a moment, even below zero, between a pin's word update and its
    /// gauge update.
    pinned: Box<[Gauge]>,
    /// Weak: the entries live in the buffer.
    owner: Weak<dyn PinOwner<V>>,
}

/// A gauge on cache lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct Gauge(AtomicIsize);

impl<V> HitContext<V> {
    pub(crate) fn new(owner: Weak<dyn PinOwner<V>>, shards: usize) -> Self {
        HitContext {
            ticks: Ticks::new(),
            pinned: (0..shards).map(|_| Gauge::default()).collect(),
            owner,
        }
    }

    /// Weight of entries pinned here and not leased, over every shard.
    pub(crate) fn pinned(&self) -> usize {
        let sum: isize = self.pinned.iter().map(|g| g.0.load(Relaxed)).sum();
        sum.max(0) as usize
    }

    /// [`HitContext::pinned`] of one shard.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn pinned_in(&self, shard: usize) -> isize {
        self.pinned[shard].0.load(Relaxed)
    }
}

/// An entry's pins taken under the read lock, and its last use. See the
/// module docs.
pub(crate) struct HitPins<V> {
    word: AtomicU64,
    /// Tick of the latest release of a pin (or of the last link).
    last_use: AtomicU64,
    /// The entry's value: the same for the life of its hit pins, which
    /// the entry lets go of when the value leaves memory.
    value: Arc<V>,
    /// Where the entry is (shard, slot, version): fixed for its life.
    at: PinAt,
    /// The entry's weight, for the pinned gauge.
    weight: isize,
    ctx: Arc<HitContext<V>>,
}

impl<V> HitPins<V> {
    /// Closed, with no pin, for the entry at `at` holding `value` of
    /// `weight`.
    pub(crate) fn new(ctx: Arc<HitContext<V>>, at: PinAt, value: Arc<V>, weight: usize) -> Self {
        HitPins {
            word: AtomicU64::new(0),
            last_use: AtomicU64::new(0),
            value,
            at,
            weight: weight as isize,
            ctx,
        }
    }

    fn gauge(&self) -> &AtomicIsize {
        &self.ctx.pinned[self.at.shard as usize].0
    }

    /// Add a pin if the word is open. Under the shard's read lock, which
    /// keeps the word from being opened or closed meanwhile: only pins
    /// and releases change it concurrently.
    #[inline]
    pub(crate) fn try_pin(&self) -> bool {
        let w = self.word.load(Relaxed);
        if w & OPEN == 0 || w & PINS >= MAX_PINS {
            return false;
        }
        if self.word.fetch_add(1, Relaxed) & PINS == 0 {
            self.gauge().fetch_add(self.weight, Relaxed);
        }
        true
    }

    /// One more pin by a holder of one (a guard cloned). Open or leased,
    /// the word stays so while any pin is held.
    pub(crate) fn repin(&self) {
        let before = self.word.fetch_add(1, Relaxed);
        if before & PINS >= MAX_PINS {
            // Some 2^31 clones of guards of one key: the count would
            // reach the flags next.
            std::process::abort();
        }
    }

    /// A pin released; `used`: its tick goes to `last_use` (not for a
    /// consume, which puts the entry first in line rather than up).
    #[inline]
    pub(crate) fn release(&self, used: bool) -> Released {
        if used {
            // A store, not a read-modify-write: of two threads releasing
            // the same key at once, either tick will do.
            self.last_use.store(self.ctx.ticks.next(0), Relaxed);
        }
        // AcqRel: the shard that closes the word next sees `last_use`,
        // and a lease ended here is given back after the close that took
        // it.
        let before = self.word.fetch_sub(1, AcqRel);
        debug_assert!(before & PINS > 0, "a release without a pin");
        if before & PINS != 1 {
            return Released::Done;
        }
        if before & LEASED != 0 {
            return Released::EndLease;
        }
        self.gauge().fetch_sub(self.weight, Relaxed);
        Released::Done
    }

    /// A use without a pin ([`crate::SpillBuffer::with_resident`]): its
    /// tick goes to `last_use`, as a pin's release would. Under the
    /// shard's read lock, which orders it before the next close.
    #[inline]
    pub(crate) fn touch(&self) {
        self.last_use.store(self.ctx.ticks.next(0), Relaxed);
    }

    /// The buffer, for a release that needs the shard; `None` once it is
    /// gone.
    pub(crate) fn owner(&self) -> Option<Arc<dyn PinOwner<V>>> {
        self.ctx.owner.upgrade()
    }

    /// The value, for the holder of a pin.
    pub(crate) fn value(&self) -> &Arc<V> {
        &self.value
    }

    /// Where the entry is.
    pub(crate) fn at(&self) -> PinAt {
        self.at
    }

    /// The entry went on its list at `tick`: lookups may pin again. Under
    /// the write lock, with no pin held (a lease ended before the entry
    /// could be linked).
    pub(crate) fn open(&self, tick: u64) {
        self.last_use.store(tick, Relaxed);
        let before = self.word.fetch_or(OPEN, AcqRel);
        debug_assert_eq!(before & (PINS | LEASED), 0, "opened while pinned");
    }

    /// The entry left its list: no more pins under the read lock. Returns
    /// how many were held; if any, they are now a lease, and the caller
    /// pins the entry once for them. Under the write lock.
    pub(crate) fn close(&self) -> u32 {
        let closed = self.word.fetch_update(AcqRel, Relaxed, |w| {
            (w & OPEN != 0).then(|| {
                let leased = if w & PINS > 0 { LEASED } else { 0 };
                (w & !OPEN) | leased
            })
        });
        let pins = closed.map_or(0, |w| (w & PINS) as u32);
        if pins > 0 {
            // The shard counts them from now: its lease pin.
            self.gauge().fetch_sub(self.weight, Relaxed);
        }
        pins
    }

    /// The shard took back the lease whose last pin was released. Under
    /// the write lock.
    pub(crate) fn lease_returned(&self) {
        let before = self.word.fetch_and(!LEASED, AcqRel);
        debug_assert_eq!(before & (PINS | OPEN), 0, "a lease returned while held");
    }

    /// Tick of the last release (or link).
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Relaxed)
    }

    /// Pins held now (a release may lower it at once; under the write
    /// lock, nothing raises it from 0).
    pub(crate) fn pins(&self) -> u32 {
        (self.word.load(Relaxed) & PINS) as u32
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn is_open(&self) -> bool {
        self.word.load(Relaxed) & OPEN != 0
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn is_leased(&self) -> bool {
        self.word.load(Relaxed) & LEASED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoOwner;

    impl PinOwner<u8> for NoOwner {
        fn repin(&self, _: PinAt) {}
        fn unpin(&self, _: PinAt, _: bool, _: Arc<u8>) {}
        fn end_lease(&self, _: Arc<HitPins<u8>>) {}
        fn consume_hit(&self, pins: Arc<HitPins<u8>>) {
            pins.release(false);
        }
    }

    fn pins() -> HitPins<u8> {
        let owner: Weak<dyn PinOwner<u8>> = Weak::<NoOwner>::new();
        let at = PinAt {
            shard: 0,
            slot: 0,
            version: 1,
        };
        HitPins::new(Arc::new(HitContext::new(owner, 1)), at, Arc::new(0), 8)
    }

    #[test]
    fn pins_only_while_open() {
        let p = pins();
        assert!(!p.try_pin(), "a closed word pinned");
        p.open(5);
        assert!(p.try_pin());
        assert_eq!(p.ctx.pinned(), 8);
        assert_eq!(p.release(true), Released::Done);
        assert_eq!(p.ctx.pinned(), 0);
        assert!(p.last_use() > 0, "the release recorded no use");
        assert_eq!(p.close(), 0);
        assert!(!p.is_leased(), "closed without pins, yet leased");
        assert!(!p.try_pin());
    }

    #[test]
    fn closing_while_pinned_leases_and_the_last_release_ends_it() {
        let p = pins();
        p.open(1);
        assert!(p.try_pin());
        p.repin();
        assert_eq!(p.close(), 2);
        assert!(p.is_leased());
        assert_eq!(p.ctx.pinned(), 0, "a lease is the shard's to count");
        assert_eq!(p.close(), 0, "a second close took a second lease");
        assert_eq!(p.release(true), Released::Done);
        assert_eq!(p.release(false), Released::EndLease);
        p.lease_returned();
        assert!(!p.is_leased());
        p.open(2);
        assert!(p.is_open());
    }

    #[test]
    fn two_threads_pin_and_release_and_the_count_holds() {
        let p = pins();
        p.open(1);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        assert!(p.try_pin());
                        assert_eq!(p.release(true), Released::Done);
                    }
                });
            }
        });
        assert_eq!(p.close(), 0, "pins left after every release");
        assert_eq!(p.ctx.pinned_in(0), 0);
    }
}
