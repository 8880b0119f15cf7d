//! The hit path's part of an entry: the pins a lookup takes under its
//! shard's read lock, and the time of the entry's last use.
//!
//! Every resident entry on an LRU list holds a [`HitPins`] behind an
//! `Arc`. A lookup under the shard's read lock clones that `Arc`: the
//! clone *is* the pin, and its strong count, less the entry's own handle,
//! is the number of pins. A guard's release stores its tick in
//! `last_use` and lets its handle go, one atomic update each way, and
//! takes no lock; the entry stays where it is on its list. Eviction finds
//! an entry whose `last_use` is newer than its place on the list and
//! moves it up instead of evicting it, so for a single thread the order is
//! exact LRU.
//!
//! When the shard takes the entry off its list (under the write lock: to
//! evict it, pin it there, remove or replace it), no lookup can pin it any
//! more. If its `HitPins` has other handles than the entry's, they become
//! a **lease**: the entry counts one pin for all of them and lets go of
//! its handle, so the last guard to let go of its own gets the `HitPins`
//! back (`Arc::into_inner`, which gives it to exactly one caller) and
//! releases that pin through the buffer, as a guard of a pin taken under
//! the write lock does. Otherwise the entry keeps it, closed: only an entry
//! on a list gives out pins, and an entry holds a `HitPins` with other
//! handles only while it is on a list (`validate()` checks it).

use crate::buffer::clock::Ticks;
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
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
    /// the caller's thread. Also the end of a lease (see
    /// [`crate::buffer::hit`]).
    fn unpin(&self, at: PinAt, consume: bool, value: Arc<V>);
    /// Release one pin of `pins`, consuming: the entry goes first in line,
    /// as [`PinOwner::unpin`] with `consume` does.
    fn consume_hit(&self, pins: Arc<HitPins<V>>);
}

/// What every entry's [`HitPins`] shares: the buffer's clock, and the
/// buffer itself for the releases that need its shard.
pub(crate) struct HitContext<V> {
    pub ticks: Ticks,
    /// Weak: the entries live in the buffer.
    owner: Weak<dyn PinOwner<V>>,
}

impl<V> HitContext<V> {
    pub(crate) fn new(owner: Weak<dyn PinOwner<V>>) -> Self {
        HitContext {
            ticks: Ticks::new(),
            owner,
        }
    }
}

/// An entry's handle for pins taken under the read lock, and its last
/// use. See the module docs.
pub(crate) struct HitPins<V> {
    /// Tick of the latest release of a pin (or of the entry's link).
    last_use: AtomicU64,
    /// The entry's value: the same for the life of its hit pins, which
    /// the entry lets go of when the value leaves memory.
    value: Arc<V>,
    /// Where the entry is (shard, slot, version): fixed for its life.
    at: PinAt,
    ctx: Arc<HitContext<V>>,
}

impl<V> HitPins<V> {
    /// The hit pins of the entry at `at` holding `value`, linked at `tick`.
    pub(crate) fn new(ctx: Arc<HitContext<V>>, at: PinAt, value: Arc<V>, tick: u64) -> Self {
        HitPins {
            last_use: AtomicU64::new(tick),
            value,
            at,
            ctx,
        }
    }

    /// Release the pin `pins` is, `used` (its tick goes to `last_use`) or
    /// not (a consume, which puts the entry first in line rather than up).
    /// Returns the `HitPins` if this was the last handle on it: the end of
    /// a lease, whose pin the caller gives back to the buffer.
    #[inline]
    pub(crate) fn release(pins: Arc<Self>, used: bool) -> Option<Self> {
        if used {
            // A store, not a read-modify-write: of two threads releasing
            // the same key at once, either tick will do. The release of
            // the handle below orders it before the shard's next look.
            pins.last_use.store(pins.ctx.ticks.next(0), Relaxed);
        }
        Arc::into_inner(pins)
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

    /// The value, handed over by the last holder.
    pub(crate) fn into_value(self) -> Arc<V> {
        self.value
    }

    /// Where the entry is.
    pub(crate) fn at(&self) -> PinAt {
        self.at
    }

    /// Tick of the last release (or link). Read under the write lock
    /// after [`HitPins::pinned`] said no pin is held, which orders every
    /// release's store before it.
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Relaxed)
    }

    /// Whether pins are held through `pins` (handles other than the
    /// entry's). Under the write lock, with the entry off its list, nothing
    /// raises it from `false`.
    pub(crate) fn pinned(pins: &Arc<Self>) -> bool {
        let pinned = Arc::strong_count(pins) > 1;
        if !pinned {
            // Pairs with the release of the handles let go of: their
            // `last_use` stores come before what the caller reads next.
            crate::sync::atomic::fence(crate::sync::atomic::Ordering::Acquire);
        }
        pinned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoOwner;

    impl PinOwner<u8> for NoOwner {
        fn repin(&self, _: PinAt) {}
        fn unpin(&self, _: PinAt, _: bool, _: Arc<u8>) {}
        fn consume_hit(&self, _: Arc<HitPins<u8>>) {}
    }

    fn pins() -> Arc<HitPins<u8>> {
        let owner: Weak<dyn PinOwner<u8>> = Weak::<NoOwner>::new();
        let at = PinAt {
            shard: 0,
            slot: 0,
            version: 1,
        };
        Arc::new(HitPins::new(
            Arc::new(HitContext::new(owner)),
            at,
            Arc::new(0),
            5,
        ))
    }

    #[test]
    fn a_release_records_its_use_and_only_the_last_handle_gets_them_back() {
        let entry = pins();
        assert!(!HitPins::pinned(&entry));
        let guard = Arc::clone(&entry);
        assert!(HitPins::pinned(&entry));
        assert!(
            HitPins::release(guard, true).is_none(),
            "the entry holds it"
        );
        assert!(entry.last_use() > 0, "the release recorded no use");
        assert!(!HitPins::pinned(&entry));
        // Leased: the entry let go of its handle; the last guard gets it.
        let (a, b) = (Arc::clone(&entry), Arc::clone(&entry));
        assert!(HitPins::release(entry, false).is_none());
        assert!(HitPins::release(a, false).is_none());
        let last = HitPins::release(b, false).expect("the last handle");
        assert_eq!(last.at().version, 1);
    }

    #[test]
    fn two_threads_pin_and_release_and_exactly_one_gets_them_back() {
        let entry = pins();
        let (a, b) = (Arc::clone(&entry), Arc::clone(&entry));
        let back = std::thread::scope(|s| {
            let hs: Vec<_> = [a, b]
                .into_iter()
                .map(|p| {
                    s.spawn(move || {
                        for _ in 0..10_000 {
                            assert!(HitPins::release(Arc::clone(&p), true).is_none());
                        }
                        HitPins::release(p, true).is_some()
                    })
                })
                .collect();
            let entry_back = HitPins::release(entry, false).is_some();
            let guards: usize = hs.into_iter().map(|h| usize::from(h.join().unwrap())).sum();
            guards + usize::from(entry_back)
        });
        assert_eq!(back, 1, "the last handle was given back {back} times");
    }
}
