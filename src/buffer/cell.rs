//! The hit path: a pin of a resident key that takes no lock and writes
//! nothing shared but the key's own cell.
//!
//! A key whose value is in memory and was pinned before has a [`HitCell`]:
//! one word holding its *cell pins* and two flags, the time of its last
//! release, and a handle on the value. The cells live in a [`HitIndex`],
//! a concurrent map read without a lock (under an epoch guard, so that a
//! cell removed meanwhile stays readable until no reader can hold it).
//!
//! The word's protocol, every step a single atomic update of the word:
//!
//! - **open**: the entry is on its shard's LRU list (resident, with no
//!   pin the shard counts). A hit adds a cell pin only while the cell is
//!   open; the entry stays where it is on the list, and the release
//!   stores its tick in `last_use`. Eviction finds an entry whose
//!   `last_use` is newer than its place on the list and moves it up
//!   instead of evicting it (a lazily repaired LRU: for a single thread
//!   the order is exact).
//! - **closed**: the shard took the entry off its list (to evict it, pin
//!   it through the shard, remove or replace it). A hit fails and takes
//!   the shard's path. Closing a cell that holds pins turns them into a
//!   **lease**: one pin the shard counts on the entry, so the value stays
//!   pinned (and counted as pinned) until the last cell pin goes; that
//!   release ends the lease through the owner, under the shard lock.
//!
//! The shard opens, closes and drops cells only under its lock, and a cell
//! is open exactly when its entry is on a list (`validate()` checks it).

use crate::buffer::hash::KeyHash;
use crate::buffer::pinned::{PinAt, PinOwner};
use crate::buffer::tick::Ticks;
use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::hash::Hash;
use std::sync::{Arc, Weak};

#[cfg(not(all(test, shuttle)))]
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

#[cfg(all(test, shuttle))]
use shuttle::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// The cell pins: the low 32 bits of the word.
const PINS: u64 = 0xffff_ffff;
/// The entry is on its list: hits may pin.
const OPEN: u64 = 1 << 32;
/// The cell was closed while pinned: the entry holds one shard pin for all
/// the cell pins, which the last of them gives back.
const LEASED: u64 = 1 << 33;

/// What a release of a cell pin leaves to do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Nothing: other pins remain, or the entry was on its list all along.
    Done,
    /// It was the last pin of a lease: give the lease back to the shard
    /// ([`PinOwner::end_lease`]).
    EndLease,
}

/// One key's hit cell. See the module docs for its protocol.
pub(crate) struct HitCell<V> {
    word: AtomicU64,
    /// Tick of the latest release of a cell pin (or of the last link).
    last_use: AtomicU64,
    /// The entry's value while it is in memory. Written only under the
    /// shard lock while the cell is closed and holds no pin; read by hits
    /// that hold a cell pin.
    value: UnsafeCell<Option<Arc<V>>>,
    /// The buffer, for the release that ends a lease or a consume. Weak:
    /// a hit writes no reference count but the cell's own.
    owner: Weak<dyn PinOwner<V>>,
    ticks: Arc<Ticks>,
    at: PinAt,
}

// SAFETY: `value` is written only by the shard, under its lock, while no
// hit can read it (the cell is closed and holds no pin, so every `try_pin`
// fails), and read only by holders of a pin; the word's acquire/release
// updates order the two. Everything else is `Send + Sync` already.
unsafe impl<V: Send + Sync> Send for HitCell<V> {}
// SAFETY: as for `Send`.
unsafe impl<V: Send + Sync> Sync for HitCell<V> {}

impl<V> HitCell<V> {
    /// A closed cell for the entry at `at`, holding `value`.
    pub(crate) fn new(
        value: Arc<V>,
        owner: Weak<dyn PinOwner<V>>,
        ticks: Arc<Ticks>,
        at: PinAt,
    ) -> Self {
        HitCell {
            word: AtomicU64::new(0),
            last_use: AtomicU64::new(0),
            value: UnsafeCell::new(Some(value)),
            owner,
            ticks,
            at,
        }
    }

    /// A hit: one more cell pin if the cell is open.
    #[inline]
    pub(crate) fn try_pin(&self) -> bool {
        let mut w = self.word.load(Relaxed);
        loop {
            if w & OPEN == 0 || w & PINS == PINS {
                return false;
            }
            // Acquire: the value read next was stored before the open.
            match self.word.compare_exchange_weak(w, w + 1, Acquire, Relaxed) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }

    /// One more pin by a holder of one (a guard cloned). Open or leased,
    /// the cell stays so while any pin is held.
    pub(crate) fn repin(&self) {
        self.word.fetch_add(1, Relaxed);
    }

    /// A cell pin released, used now: its tick goes to `last_use`.
    #[inline]
    pub(crate) fn release(&self) -> Released {
        // A store, not a read-modify-write: of two threads releasing the
        // same key at once, either tick will do.
        self.last_use.store(self.ticks.next_released(), Relaxed);
        self.unpin()
    }

    /// A cell pin released without a use to record: consumed, the entry
    /// goes first in line rather than up.
    pub(crate) fn release_consumed(&self) -> Released {
        self.unpin()
    }

    fn unpin(&self) -> Released {
        let mut w = self.word.load(Relaxed);
        loop {
            debug_assert!(w & PINS > 0, "a release without a pin");
            let mut next = w - 1;
            let ends = next & PINS == 0 && next & LEASED != 0;
            if ends {
                next &= !LEASED;
            }
            // Release: the shard that closes the cell next sees
            // `last_use`. Acquire: a lease ended here is given back after
            // the close that took it.
            match self.word.compare_exchange_weak(w, next, AcqRel, Relaxed) {
                Ok(_) if ends => return Released::EndLease,
                Ok(_) => return Released::Done,
                Err(now) => w = now,
            }
        }
    }

    /// The value, for a holder of a pin.
    pub(crate) fn value(&self) -> &Arc<V> {
        // SAFETY: the caller holds a pin, so the shard does not write
        // `value` until it is released (see `take_value`).
        let value = unsafe { &*self.value.get() };
        value.as_ref().expect("a pinned cell holds its value")
    }

    pub(crate) fn owner(&self) -> Option<Arc<dyn PinOwner<V>>> {
        self.owner.upgrade()
    }

    /// Where the entry is, for the shard that ends a lease.
    pub(crate) fn at(&self) -> PinAt {
        self.at
    }

    /// The entry went on its list at `tick`: hits may pin again. Under the
    /// shard lock, with no pin held (a lease ended before the entry could
    /// be linked).
    pub(crate) fn open(&self, tick: u64) {
        self.last_use.store(tick, Relaxed);
        let before = self.word.fetch_or(OPEN, Release);
        debug_assert_eq!(before & (PINS | LEASED), 0, "opened while pinned");
    }

    /// The entry left its list: no more hits. Returns how many cell pins
    /// were held; if any, they are now a lease, and the caller pins the
    /// entry once for them. Under the shard lock.
    pub(crate) fn close(&self) -> u32 {
        let mut w = self.word.load(Relaxed);
        loop {
            if w & OPEN == 0 {
                return 0;
            }
            let pins = w & PINS;
            let next = (w & !OPEN) | if pins > 0 { LEASED } else { 0 };
            // Acquire: the releases before this are seen, with their
            // `last_use`.
            match self.word.compare_exchange_weak(w, next, AcqRel, Acquire) {
                Ok(_) => return pins as u32,
                Err(now) => w = now,
            }
        }
    }

    /// Tick of the last release (or link).
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Relaxed)
    }

    /// Closed with no pin and no lease: nothing holds the value through
    /// the cell.
    pub(crate) fn is_idle(&self) -> bool {
        self.word.load(Acquire) & (OPEN | LEASED | PINS) == 0
    }

    /// Take the value out of a cell nobody can pin any more (closed,
    /// idle, and out of the index or about to be), so that the value's
    /// memory goes with the entry's and not when the last reader of the
    /// index lets go of the cell. Under the shard lock.
    pub(crate) fn take_value(&self) -> Option<Arc<V>> {
        if !self.is_idle() {
            return None;
        }
        // SAFETY: closed and idle: every `try_pin` fails and no holder of
        // a pin is left to read the value; the shard lock keeps out any
        // other writer.
        unsafe { (*self.value.get()).take() }
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn is_open(&self) -> bool {
        self.word.load(Relaxed) & OPEN != 0
    }

    #[cfg(test)]
    pub(crate) fn pins(&self) -> u32 {
        (self.word.load(Relaxed) & PINS) as u32
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn is_leased(&self) -> bool {
        self.word.load(Relaxed) & LEASED != 0
    }
}

/// The buffer's cells by key, read without a lock. Written only under the
/// lock of the key's shard.
pub(crate) struct HitIndex<K, V> {
    map: papaya::HashMap<K, Arc<HitCell<V>>, KeyHash>,
}

impl<K: Hash + Eq, V> HitIndex<K, V> {
    pub(crate) fn new(hash: KeyHash) -> Self {
        HitIndex {
            map: papaya::HashMap::builder()
                .hasher(hash)
                // Grown in place by the writers, under their shard lock,
                // rather than copied a little by every reader.
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
        }
    }

    /// Pin `key` through its cell: the cell, now holding one more pin, or
    /// `None` (no cell, or closed: take the shard's path).
    #[inline]
    pub(crate) fn pin<Q>(&self, key: &Q) -> Option<Arc<HitCell<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = self.map.guard();
        let cell = self.map.get(key, &guard)?;
        cell.try_pin().then(|| Arc::clone(cell))
    }

    /// The cell of `key`. Under the key's shard lock.
    pub(crate) fn get(&self, key: &K) -> Option<Arc<HitCell<V>>> {
        self.map.pin().get(key).map(Arc::clone)
    }

    /// Give `key` its cell. Under the key's shard lock.
    pub(crate) fn publish(&self, key: K, cell: Arc<HitCell<V>>) {
        self.map.pin().insert(key, cell);
    }

    /// Take `key`'s cell out. Under the key's shard lock.
    pub(crate) fn withdraw(&self, key: &K) {
        self.map.pin().remove(key);
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests;
