//! The hit path: a pin of a resident key that takes no lock and writes
//! nothing shared but the key's own cell.
//!
//! A key whose value is in memory and was pinned twice before has a
//! [`HitCell`]: one word holding its *cell pins* and two flags, the time
//! of its last release, and a handle on the value. The cells live in
//! places of a [`HitIndex`] (`index`): per shard, a table read without a
//! lock and a pool of places that are reused, never freed while the buffer
//! lives, so that a hit needs no guard against a cell freed under it.
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
//! The shard opens, closes and fills cells only under its lock, and a cell
//! is open exactly when its entry is on a list (`validate()` checks it).
//! To keep within its budget of cells, the shard also *retires* cells of
//! entries that stay on their list: [`HitCell::retire`] closes a cell only
//! while it holds no pin, and the cell leaves the index (`shard::cells`).
//!
//! A hit's guard ([`CellPin`]) holds its cell by the pin alone, writing no
//! reference count: a place is given to another key only once its cell
//! is closed and holds no pin and no lease. A lease holds the pool the
//! cell lives in (one count of it, taken by [`HitCell::close`]) until the
//! release that ends it gives that count back, so that pins still held
//! when the buffer goes keep their cells. When the buffer goes, the index
//! closes every cell first, so those pins become leases.
//!
//! What every cell of a pool would hold alike (the buffer to call back,
//! its clock, the pool's own `Arc`) is kept once, in the pool
//! ([`Common`]); a cell points to it (and to the clock, which every
//! release reads), so that a place stays within two cache lines, the
//! hit's fields on the first.

use crate::buffer::pinned::{PinAt, PinOwner};
use crate::buffer::tick::Ticks;
use std::cell::UnsafeCell;
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

/// What keeps cells alive: the pool they live in, held by the index and
/// by every lease, whatever its type.
pub(crate) trait Life: Send + Sync {}

impl<T: Send + Sync> Life for T {}

/// One key's hit cell. See the module docs for its protocol.
///
/// In C order: what a hit touches first (the word, the tick, the value
/// and the clock), then what only the shard, a consume and a lease's end
/// need (see the place's layout in `index`).
#[repr(C)]
pub(crate) struct HitCell<V> {
    word: AtomicU64,
    /// Tick of the latest release of a cell pin (or of the last link).
    last_use: AtomicU64,
    /// The entry's value while it is in memory, and where the entry is.
    /// Written only under the shard lock while the cell is closed and
    /// holds no pin; read by hits that hold a cell pin.
    value: UnsafeCell<Option<Arc<V>>>,
    /// The buffer's clock (`common`'s), here too so that a release
    /// reaches it in one step.
    ticks: NonNull<Ticks>,
    /// What the cells of its pool share, which lives in that pool.
    common: NonNull<Common<V>>,
    at: UnsafeCell<PinAt>,
    /// Under the shard lock: a lease was taken ([`HitCell::close`] found
    /// pins) and not given back yet ([`HitCell::lease_returned`]). Its last
    /// pin may be released already, its releaser waiting for the lock.
    lent: UnsafeCell<bool>,
    /// The place the cell lives in, set once by the pool (a pointer with
    /// the whole place's provenance, which a `&HitCell` lacks).
    home: NonNull<u8>,
}

// SAFETY: `value` and `at` are written only by the shard, under its lock,
// while no hit can read them (the cell is closed and holds no pin, so
// every `try_pin` fails), and read only by holders of a pin or under the
// lock; the word's acquire/release updates order the two. `common` and
// `ticks` are read only, and `Sync`. Everything else is `Send + Sync` already.
unsafe impl<V: Send + Sync> Send for HitCell<V> {}
// SAFETY: as for `Send`.
unsafe impl<V: Send + Sync> Sync for HitCell<V> {}

/// Where a cell not yet given to an entry says it is.
const NOWHERE: PinAt = PinAt {
    shard: u32::MAX,
    slot: u32::MAX,
    version: 0,
};

/// What the cells of one pool share, kept once in the pool rather than in
/// every cell: the buffer they call back, its clock, and the pool itself
/// (the `Arc` a lease holds a count of).
pub(crate) struct Common<V> {
    /// The buffer, for the release that ends a lease or a consume. Weak:
    /// a hit writes no reference count but the cell's own.
    owner: Weak<dyn PinOwner<V>>,
    ticks: Arc<Ticks>,
    /// The `Arc` this lives in, as its pointer: a lease holds one count
    /// of it ([`HitCell::close`]).
    life: NonNull<dyn Life>,
}

// SAFETY: `life` is an `Arc`'s pointer to a `Send + Sync` value, only
// used to count references; the rest is `Send + Sync`.
unsafe impl<V> Send for Common<V> {}
// SAFETY: as for `Send`.
unsafe impl<V> Sync for Common<V> {}

impl<V> Common<V> {
    /// `make(common)` in a new `Arc`, `common` (for cells calling back
    /// `owner`) naming that `Arc` as the one a lease holds a count of.
    /// `make` keeps `common` in what it builds: cells made from it rely on
    /// that ([`HitCell::new`]).
    pub(crate) fn within<T: Life + 'static>(
        owner: Weak<dyn PinOwner<V>>,
        ticks: Arc<Ticks>,
        make: impl FnOnce(Self) -> T,
    ) -> Arc<T> {
        Arc::new_cyclic(|me: &Weak<T>| {
            let life = me.as_ptr() as *const dyn Life;
            make(Common {
                owner,
                ticks,
                // SAFETY: `Weak::as_ptr` of `Arc::new_cyclic` points into
                // the new allocation: never null.
                life: unsafe { NonNull::new_unchecked(life.cast_mut()) },
            })
        })
    }
}

impl<V> HitCell<V> {
    /// A closed, empty cell sharing `common`.
    ///
    /// # Safety
    ///
    /// `common` outlives the cell, in the value [`Common::within`] built
    /// it for: the pool the cell lives in, or an `Arc` that outlives the
    /// cell some other way.
    pub(crate) unsafe fn new(common: NonNull<Common<V>>) -> Self {
        HitCell {
            word: AtomicU64::new(0),
            last_use: AtomicU64::new(0),
            value: UnsafeCell::new(None),
            at: UnsafeCell::new(NOWHERE),
            lent: UnsafeCell::new(false),
            // SAFETY: `common` outlives the cell, and holds the clock.
            ticks: NonNull::from(&*unsafe { common.as_ref() }.ticks),
            common,
            home: NonNull::dangling(),
        }
    }

    fn ticks(&self) -> &Ticks {
        // SAFETY: `common` holds the clock and outlives the cell.
        unsafe { self.ticks.as_ref() }
    }

    fn common(&self) -> &Common<V> {
        // SAFETY: `common` outlives the cell (`HitCell::new`).
        unsafe { self.common.as_ref() }
    }

    /// The place this cell lives in (dangling for a cell made outside a
    /// pool).
    pub(crate) fn home(&self) -> NonNull<u8> {
        self.home
    }

    /// Set where the cell lives, before it is shared.
    ///
    /// # Safety
    ///
    /// `cell` points to a cell no one else can reach yet.
    pub(crate) unsafe fn set_home(cell: NonNull<Self>, home: NonNull<u8>) {
        // SAFETY: as the caller promises.
        unsafe { (*cell.as_ptr()).home = home };
    }

    /// Give the cell to the entry at `at`, holding `value`. Under the
    /// shard lock, with the cell closed and idle (no pin, no lease).
    pub(crate) fn assign(&self, value: Arc<V>, at: PinAt) {
        debug_assert!(self.is_idle(), "a cell given while held");
        // SAFETY: closed and idle: no hit reads these (see `take_value`),
        // and the shard lock keeps out any other writer.
        unsafe {
            *self.value.get() = Some(value);
            *self.at.get() = at;
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
        self.last_use.store(self.ticks().next(0), Relaxed);
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
        self.common().owner.upgrade()
    }

    /// Where the entry is, for a holder of a pin or the shard.
    pub(crate) fn at(&self) -> PinAt {
        // SAFETY: written only while closed and idle, under the shard
        // lock (`assign`): the caller holds a pin or that lock.
        unsafe { *self.at.get() }
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
    /// entry once for them. The lease holds the cell's pool (one count of
    /// `life`) until the release that ends it. Under the shard lock, while
    /// something else holds the pool too (the index).
    pub(crate) fn close(&self) -> u32 {
        // Taken before the close: the lease may end, and give its count
        // back, as soon as the close is done.
        let life = self.common().life;
        // SAFETY: `life` is an `Arc`'s pointer, alive while the cell is.
        unsafe { Arc::increment_strong_count(life.as_ptr()) };
        let pins = self.close_word();
        if pins == 0 {
            // SAFETY: the count taken above; another holds the pool, so
            // this is not the last.
            unsafe { Arc::decrement_strong_count(life.as_ptr()) };
        } else {
            // SAFETY: under the shard lock.
            unsafe { *self.lent.get() = true };
        }
        pins
    }

    /// The shard took back the lease (under its lock): whether one was
    /// out.
    pub(crate) fn lease_returned(&self) -> bool {
        // SAFETY: under the shard lock.
        unsafe { std::mem::replace(&mut *self.lent.get(), false) }
    }

    /// A lease is out (under the shard lock): the cell's pins, or the
    /// release of its last one, still need the cell.
    pub(crate) fn is_lent(&self) -> bool {
        // SAFETY: under the shard lock.
        unsafe { *self.lent.get() }
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

    /// Cell pins held now (a racing hit may change it at once).
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
    /// `cell.try_pin()` succeeded while `cell` was alive (in the index's
    /// pool): the pin now holds it.
    pub(crate) unsafe fn taken(cell: &HitCell<V>) -> Self {
        CellPin {
            cell: NonNull::from(cell),
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
        ManuallyDrop::new(self).give_back(Use::Used { consume });
    }

    /// Give back a pin taken on a cell that turned out to be another
    /// key's (its place was given to that key meanwhile): no use to
    /// record, but a lease it was the last pin of still ends.
    pub(crate) fn abandon(self) {
        ManuallyDrop::new(self).give_back(Use::None);
    }

    fn give_back(&self, how: Use) {
        let cell = self.cell();
        // Read now: the lease's end below may be the last use of the cell.
        // The common part itself is read only then: a hit's release does
        // not touch its line.
        let common = cell.common;
        // The owner is upgraded only when the shard has work to do: a
        // hit's release writes no count but the cell's.
        let consume = how == Use::Used { consume: true };
        let released = match consume.then(|| cell.owner()).flatten() {
            Some(owner) => owner.consume_cell(cell),
            None => {
                let released = match how {
                    Use::None => cell.unpin(),
                    Use::Used { .. } => cell.release(),
                };
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
            // SAFETY: the lease held one count of the pool (taken by
            // `HitCell::close`), and it ended here; `common` lives in that
            // pool, alive until this count goes, and nothing touches the
            // cell after.
            unsafe { Arc::decrement_strong_count(common.as_ref().life.as_ptr()) }
        }
    }
}

/// How a pin is given back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Used (consumed or not).
    Used { consume: bool },
    /// Never used: taken on another key's cell.
    None,
}

impl<V> Drop for CellPin<V> {
    fn drop(&mut self) {
        self.give_back(Use::Used { consume: false });
    }
}

mod index;
#[cfg(test)]
mod tests;

pub(crate) use index::{CellRef, HitIndex};
