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
//! To keep within its budget of cells, the shard also *retires* cells of
//! entries that stay on their list: [`HitCell::retire`] closes a cell only
//! while it holds no pin, and the cell leaves the index
//! (`shard::cells`).
//!
//! A hit's guard ([`CellPin`]) holds its cell by the pin alone, writing no
//! reference count: an open cell is held by the index, which gives it up
//! only once the shard has closed it; closing a pinned cell makes a lease,
//! and the lease holds the cell (one count of its `Arc`, taken by
//! [`HitCell::close`]) until the release that ends it gives that count
//! back. When the buffer goes, the index closes every cell first, so pins
//! still held become leases that hold their cells.

use crate::buffer::hash::KeyHash;
use crate::buffer::pinned::{PinAt, PinOwner};
use crate::buffer::tick::Ticks;
use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::hash::Hash;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
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
/// Hits refuse to pin past this many pins (they take the shard's path),
/// and a guard cloned past it aborts, as an `Arc` cloned past its limit
/// does: the pins must never carry into the flags.
const MAX_PINS: u64 = 1 << 31;
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
            if w & OPEN == 0 || w & PINS >= MAX_PINS {
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
        let before = self.word.fetch_add(1, Relaxed);
        if before & PINS >= MAX_PINS {
            // Some 2^31 clones of guards of one key: the count would
            // reach the flags next.
            std::process::abort();
        }
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
    /// entry once for them. The lease holds the cell (one count of `this`)
    /// until the release that ends it. Under the shard lock.
    pub(crate) fn close(this: &Arc<Self>) -> u32 {
        // Taken before the close: the lease may end, and give its count
        // back, as soon as the close is done.
        let held = Arc::clone(this);
        let pins = this.close_word();
        if pins > 0 {
            std::mem::forget(held);
        }
        pins
    }

    /// [`HitCell::close`] on the word alone.
    fn close_word(&self) -> u32 {
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

    /// Close the cell if nothing holds it through the cell (no pin, no
    /// lease), for the shard that retires it to keep its cells within
    /// their budget: whether it is now closed and idle. A hit racing with
    /// this either pins first (and the cell stays) or finds it closed.
    /// Under the shard lock.
    pub(crate) fn retire(&self) -> bool {
        let mut w = self.word.load(Relaxed);
        loop {
            if w & (PINS | LEASED) != 0 {
                return false;
            }
            if w & OPEN == 0 {
                return true;
            }
            // Acquire: as for a close, the releases before are seen.
            match self
                .word
                .compare_exchange_weak(w, w & !OPEN, AcqRel, Acquire)
            {
                Ok(_) => return true,
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

#[cfg(test)]
impl<V> Drop for HitCell<V> {
    fn drop(&mut self) {
        // A hit's guard would read freed memory.
        let w = self.word.load(Relaxed);
        assert_eq!(w & (PINS | LEASED), 0, "a hit cell freed while pinned");
    }
}

/// A cell pin held by a hit's guard. It holds the cell by the pin alone
/// (module docs): a hit writes no reference count.
pub(crate) struct CellPin<V> {
    cell: NonNull<HitCell<V>>,
}

// SAFETY: a `CellPin` gives shared access to its cell, which is `Sync`
// for such `V`, and its release may run on any thread.
unsafe impl<V: Send + Sync> Send for CellPin<V> {}
// SAFETY: as for `Send`; `&CellPin` only reads the cell.
unsafe impl<V: Send + Sync> Sync for CellPin<V> {}

impl<V> CellPin<V> {
    /// The pin just taken on `cell`.
    ///
    /// # Safety
    ///
    /// `cell.try_pin()` succeeded while `cell` was held (by the index,
    /// under a guard of it): the pin now holds it.
    unsafe fn taken(cell: &Arc<HitCell<V>>) -> Self {
        // From the `Arc`, not the cell: the lease's end reaches the counts
        // next to the cell through this pointer.
        let ptr = Arc::as_ptr(cell).cast_mut();
        CellPin {
            // SAFETY: an `Arc`'s pointer is never null.
            cell: unsafe { NonNull::new_unchecked(ptr) },
        }
    }

    pub(crate) fn cell(&self) -> &HitCell<V> {
        // SAFETY: the pin holds the cell (module docs) until `release`.
        unsafe { self.cell.as_ref() }
    }

    /// One more pin of the same cell (a guard cloned).
    pub(crate) fn repin(&self) -> Self {
        self.cell().repin();
        CellPin { cell: self.cell }
    }

    /// Give the pin back: consuming (the entry goes first in line) or as a
    /// use. The release that ends a lease gives the buffer its lease back
    /// and then the lease's count of the cell.
    pub(crate) fn release(self, consume: bool) {
        ManuallyDrop::new(self).give_back(consume);
    }

    fn give_back(&self, consume: bool) {
        let cell = self.cell();
        // The owner is upgraded only when the shard has work to do: a
        // hit's release writes no count but the cell's.
        let released = match consume.then(|| cell.owner()).flatten() {
            Some(owner) => owner.consume_cell(cell),
            None => {
                let released = cell.release();
                if released == Released::EndLease {
                    // The buffer may be gone: the lease ends here then.
                    if let Some(owner) = cell.owner() {
                        owner.end_lease(cell);
                    }
                }
                released
            }
        };
        if released == Released::EndLease {
            // SAFETY: the lease held one count of the cell's `Arc` (taken
            // by `HitCell::close`, from an `Arc` of this allocation), and
            // it ended here; nothing touches the cell after.
            unsafe { Arc::decrement_strong_count(self.cell.as_ptr()) }
        }
    }
}

impl<V> Drop for CellPin<V> {
    fn drop(&mut self) {
        self.give_back(false);
    }
}

type CellMap<K, V> = papaya::HashMap<K, Arc<HitCell<V>>, KeyHash>;

/// The buffer's cells by key, read without a lock. Written only under the
/// lock of the key's shard.
pub(crate) struct HitIndex<K, V> {
    map: CellMap<K, V>,
    /// [`close_all`] for this key type, for `drop` (which cannot ask for
    /// the bounds it needs).
    close_all: fn(&CellMap<K, V>),
}

/// Close every cell of `map`: pins still held become leases, which hold
/// their cells once the map's counts are gone.
fn close_all<K: Hash + Eq, V>(map: &CellMap<K, V>) {
    let guard = map.guard();
    for (_, cell) in map.iter(&guard) {
        HitCell::close(cell);
    }
}

impl<K, V> Drop for HitIndex<K, V> {
    fn drop(&mut self) {
        (self.close_all)(&self.map);
    }
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
            close_all: close_all::<K, V>,
        }
    }

    /// Pin `key` through its cell: the pin, or `None` (no cell, or closed:
    /// take the shard's path).
    #[inline]
    pub(crate) fn pin<Q>(&self, key: &Q) -> Option<CellPin<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = self.map.guard();
        let cell = self.map.get(key, &guard)?;
        // SAFETY: the index holds the cell while the guard lives, and the
        // pin holds it from the moment `try_pin` succeeds.
        cell.try_pin().then(|| unsafe { CellPin::taken(cell) })
    }

    /// The cell of `key`. Under the key's shard lock.
    pub(crate) fn get(&self, key: &K) -> Option<Arc<HitCell<V>>> {
        self.map.pin().get(key).map(Arc::clone)
    }

    /// Give `key` its cell, unless it has one: the index never lets go of
    /// a cell the shard has not closed. Returns whether it took the cell.
    /// Under the key's shard lock.
    pub(crate) fn publish(&self, key: K, cell: Arc<HitCell<V>>) -> bool {
        let taken = self.map.pin().try_insert(key, cell).is_ok();
        debug_assert!(taken, "a key's cell published over another");
        taken
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
