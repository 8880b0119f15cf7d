//! The hit cells' index: per shard, a table of the cells' places, read by
//! hits without a lock and written only under the shard's lock.
//!
//! Every cell lives in a *place* of the index's pool, next to the key it
//! is for. Places are never freed while the index lives: a place whose
//! cell is retired or dropped is marked free in its chunk and given to a
//! later key that gets a cell. So a hit needs no guard against a
//! cell freed under it, and cells turning over allocate and free nothing.
//! A hit may therefore reach a place that was given to another key since
//! it read the table; it tells so by the key, read once it holds a pin
//! (the key is written only while the cell is closed and holds no pin),
//! and then gives the pin back and takes the shard's path.
//!
//! A table is open addressing with linear probing on the key's hash, at
//! most half full plus one (see [`HitIndex::give_in`]), with seven bits
//! of each hash in its slot (in the low bits of the place's pointer,
//! which the place's alignment leaves free) so that a hit reads no other
//! key's place, and finds a slot's tag and pointer in one word; a
//! removal shifts the places after it back, so the table never fills
//! with deleted slots however many cells turn over. A hit that races a
//! removal or a growth may miss a key that is there: it then takes the
//! shard's path, which is always right. Tables replaced by larger ones
//! stay until the index goes, as a hit may still be reading them.
//!
//! A shard gives places a chunk at a time, and each *way* (`buffer::way`)
//! fills a chunk of its own: a cell goes in the next free place of the
//! chunk its way is filling, the way of the thread that gave it, which is
//! the thread that pinned the key through the shard. The places one
//! thread's hits write thus lie together, rather than on lines next to
//! another thread's: two threads whose places alternated spent about a
//! third more CPU per hit (the CPU fetches lines next to the ones it
//! misses, and took them from the other core).
//!
//! A freed place is marked free in its chunk, and a chunk is filled
//! again only once a way is done with it (it is full). A way whose chunk
//! is full fills next a chunk whose every place is free, of any way;
//! else, while fewer than `WAYS * CHUNK` of the shard's places are free,
//! a new chunk; else the chunk with most free places. So cells given
//! together lie together after cells have turned over too (new cells
//! put in single places among older cells' cost two threads pinning
//! through one buffer up to a seventh of their calls), and a shard holds
//! at most `(WAYS + 1) * CHUNK` places beyond the most cells it had at
//! once.

use super::{CellPin, Common, HitCell};
use crate::buffer::hash::{shard_of, KeyHash};
use crate::buffer::pinned::{PinAt, PinOwner};
use crate::buffer::tick::Ticks;
use crate::buffer::way::{self, WAYS};
use parking_lot::Mutex;
use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::hash::Hash;
use std::ops::Deref;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Weak};

#[cfg(not(all(test, shuttle)))]
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

#[cfg(all(test, shuttle))]
use shuttle::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Places allocated at a time.
pub(super) const CHUNK: usize = 64;

/// Slots of a shard's first table.
const FIRST_SLOTS: usize = 8;

/// A cell's place: the cell, and the key it is for.
///
/// Laid out for the hit path: what a hit reads or writes (the hash, the
/// key, and the cell's word, tick, value and clock) comes first,
/// on one cache line for keys of up to 24 bytes; the rest, touched only
/// under the shard lock, on the next. Aligned to two lines, so a hit
/// writes no line that holds another place's data (and the lines next to
/// those it writes, which a core's prefetcher may fetch, are other
/// places' cold lines, which no hit writes either).
#[repr(C, align(128))]
struct Place<K, V> {
    /// The key's hash, read by hits before they pin.
    hash: AtomicU64,
    /// The key. Written under the shard lock while the cell is closed and
    /// holds no pin; read by holders of a pin and under the lock.
    key: UnsafeCell<Option<K>>,
    cell: HitCell<V>,
    /// Under the shard lock: in its table. A place taken out while its
    /// cell is leased is marked free when the lease ends.
    listed: UnsafeCell<bool>,
    /// Under the shard lock: how many times the place was given, which
    /// tells one entry's cell from a later one in the same place.
    gen: UnsafeCell<u64>,
    /// Where the place lies in its shard's chunks: `chunk * CHUNK + i`,
    /// for the `i`th place of the shard's chunk number `chunk`.
    spot: usize,
}

/// Handles on places: the pool lives as long as any of them can be used.
/// `CellRef` is the shard's handle on a cell (see its docs).
///
/// SAFETY: the non-`Sync` parts of a place (`key`, `listed`, `gen`, and
/// the cell's own) are written only under the shard lock while no hit
/// reads them (the cell closed and idle), and read by holders of a pin
/// or under that lock.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Place<K, V> {}
// SAFETY: as for `Send`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Place<K, V> {}

impl<K, V> Place<K, V> {
    /// A pin of the cell if it is open and `key`'s. A pin taken on
    /// another key's cell (the place was given to it since the table was
    /// read) is given back.
    #[inline]
    fn pin<Q>(&self, key: &Q) -> Option<CellPin<V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        if !self.cell.try_pin() {
            return None;
        }
        // SAFETY: pinned, and the place is the pool's, which outlives
        // every pin (module docs of `cell`).
        let pin = unsafe { CellPin::taken(&self.cell) };
        // SAFETY: pinned: the key is not written until the cell is closed
        // and idle.
        let mine = unsafe { &*self.key.get() }
            .as_ref()
            .is_some_and(|k| k.borrow() == key);
        if mine {
            Some(pin)
        } else {
            pin.abandon();
            None
        }
    }
}

/// Every place of an index, in chunks allocated as shards need them and
/// freed only when the index and every lease are gone (a lease holds a
/// count of the pool: `HitCell::close`).
struct Pool<K, V> {
    /// What the cells share.
    common: Common<V>,
    chunks: Mutex<Vec<Places<K, V>>>,
}

/// A chunk of places, allocated as a boxed slice.
type Places<K, V> = NonNull<[Place<K, V>]>;

// SAFETY: the chunks are owned by the pool; places are `Send + Sync`.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Pool<K, V> {}
// SAFETY: as for `Send`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for Pool<K, V> {}

impl<K, V> Pool<K, V> {
    /// A new chunk of closed, empty places, for a shard's chunk number
    /// `chunk`: its first place.
    fn grow(&self, chunk: usize) -> NonNull<Place<K, V>> {
        let common = NonNull::from(&self.common);
        let places: Box<[Place<K, V>]> = (0..CHUNK)
            .map(|i| Place {
                // SAFETY: `common` lives in the pool, as the cell does.
                cell: unsafe { HitCell::new(common) },
                hash: AtomicU64::new(0),
                key: UnsafeCell::new(None),
                listed: UnsafeCell::new(false),
                gen: UnsafeCell::new(0),
                spot: chunk * CHUNK + i,
            })
            .collect();
        // SAFETY: `Box::into_raw` is never null.
        let places = unsafe { NonNull::new_unchecked(Box::into_raw(places)) };
        let first = places.cast::<Place<K, V>>();
        for i in 0..CHUNK {
            // SAFETY: in bounds of the chunk just allocated, which no one
            // else can reach yet.
            unsafe {
                let place = first.add(i);
                let cell = NonNull::new_unchecked(ptr::addr_of_mut!((*place.as_ptr()).cell));
                HitCell::<V>::set_home(cell, place.cast());
            }
        }
        self.chunks.lock().push(places);
        first
    }
}

impl<K, V> Drop for Pool<K, V> {
    fn drop(&mut self) {
        for chunk in self.chunks.get_mut().drain(..) {
            // SAFETY: allocated by `grow` with `Box::into_raw`, freed once;
            // nothing holds a place any more (the index and every lease
            // are gone).
            drop(unsafe { Box::from_raw(chunk.as_ptr()) });
        }
    }
}

/// One table's slots: pointers to places, null where empty, each with
/// seven bits of its place's hash (its *tag*) in the low bits a place's
/// alignment leaves free (a slot holding a place is never null, whatever
/// its tag: the place's address is not 0). A hit reads a place only where
/// the tag is its key's: probing past other keys' places reads no line of
/// theirs (the lines another thread's hits write), and a probe reads no
/// line of tags apart from its pointers.
struct Slots<K, V> {
    mask: usize,
    slots: Box<[AtomicPtr<Place<K, V>>]>,
}

/// The bits of a slot that hold the tag.
const TAG: usize = 0x7f;

// A place's alignment leaves the tag's bits of its address free.
const _: () = assert!(std::mem::align_of::<Place<u8, u8>>() > TAG);

/// The tag of a hash: its top seven bits, all 128 values of them, so
/// that a probe reads another key's place (whose hot line another thread
/// may be writing) for one in 128 of the slots it passes.
#[inline]
pub(super) fn tag(hash: u64) -> usize {
    (hash >> 57) as usize
}

/// A slot's word for `place`, of hash `hash`.
#[inline]
fn tagged<K, V>(place: NonNull<Place<K, V>>, hash: u64) -> *mut Place<K, V> {
    place.as_ptr().map_addr(|a| a | tag(hash))
}

/// The place a slot's word points to (null for an empty slot).
#[inline]
fn untagged<K, V>(slot: *mut Place<K, V>) -> *mut Place<K, V> {
    slot.map_addr(|a| a & !TAG)
}

impl<K, V> Slots<K, V> {
    fn with_len(len: usize) -> NonNull<Self> {
        let slots = Box::new(Slots {
            mask: len - 1,
            slots: (0..len).map(|_| AtomicPtr::new(ptr::null_mut())).collect(),
        });
        // SAFETY: `Box::into_raw` is never null.
        unsafe { NonNull::new_unchecked(Box::into_raw(slots)) }
    }

    /// The place in slot `i`, if any. Under the shard lock.
    fn place(&self, i: usize) -> Option<NonNull<Place<K, V>>> {
        NonNull::new(untagged(self.slots[i].load(Relaxed)))
    }

    /// Every place in the table. Under the shard lock.
    fn places(&self) -> impl Iterator<Item = NonNull<Place<K, V>>> + '_ {
        (0..self.slots.len()).filter_map(|i| self.place(i))
    }

    /// Put `place` (of hash `hash`) in the first empty slot of its probe.
    /// Under the shard lock, with an empty slot left.
    fn put(&self, hash: u64, place: NonNull<Place<K, V>>) {
        let mut i = hash as usize & self.mask;
        while !self.slots[i].load(Relaxed).is_null() {
            i = (i + 1) & self.mask;
        }
        // Release: the place was filled before.
        self.slots[i].store(tagged(place, hash), Release);
    }

    /// Take slot `i` out, shifting back the places after it that probed
    /// past it. Under the shard lock.
    fn take(&self, mut i: usize) {
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let q = self.slots[j].load(Relaxed);
            if q.is_null() {
                break;
            }
            // SAFETY: places in a table are the pool's.
            let home = unsafe { &*untagged(q) }.hash.load(Relaxed) as usize & self.mask;
            // `q` stays if its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.slots[i].store(q, Release);
                i = j;
            }
        }
        self.slots[i].store(ptr::null_mut(), Release);
    }
}

/// A shard's table, and its books under the shard lock.
struct Table<K, V> {
    /// The current slots, read by hits. Owned by `books`.
    slots: AtomicPtr<Slots<K, V>>,
    books: Mutex<Books<K, V>>,
}

struct Books<K, V> {
    current: NonNull<Slots<K, V>>,
    /// Slots replaced by larger ones: a hit may still be reading them.
    old: Vec<NonNull<Slots<K, V>>>,
    /// Places in the table.
    live: usize,
    /// The shard's chunks of places, by number (module docs).
    chunks: Vec<Chunk<K, V>>,
    /// The chunk each way gives places from, until it is full.
    filling: [Option<usize>; WAYS],
    /// Chunks whose every place is free, that no way is filling.
    empty: Vec<usize>,
    /// Free places, over every chunk.
    spare: usize,
}

/// A shard's books on one of its chunks of places.
struct Chunk<K, V> {
    first: NonNull<Place<K, V>>,
    /// Bit `i` set: the chunk's `i`th place is free (its cell closed and
    /// idle, empty, in no table).
    free: u64,
}

/// Every place of a chunk free.
const ALL_FREE: u64 = u64::MAX;

// A chunk's free places are the bits of a word.
const _: () = assert!(CHUNK == u64::BITS as usize);

// SAFETY: the books own their slots; places are the pool's and
// `Send + Sync`.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for Books<K, V> {}

impl<K, V> Books<K, V> {
    fn slots(&self) -> &Slots<K, V> {
        // SAFETY: owned by the books, freed only when they go.
        unsafe { self.current.as_ref() }
    }
}

impl<K, V> Drop for Books<K, V> {
    fn drop(&mut self) {
        for slots in self.old.drain(..).chain([self.current]) {
            // SAFETY: allocated by `Slots::with_len`, freed once, with the
            // index (no hit can be reading them).
            drop(unsafe { Box::from_raw(slots.as_ptr()) });
        }
    }
}

impl<K, V> Table<K, V> {
    fn new() -> Self {
        let current = Slots::with_len(FIRST_SLOTS);
        Table {
            slots: AtomicPtr::new(current.as_ptr()),
            books: Mutex::new(Books {
                current,
                old: Vec::new(),
                live: 0,
                chunks: Vec::new(),
                filling: [None; WAYS],
                empty: Vec::new(),
                spare: 0,
            }),
        }
    }

    #[inline]
    fn pin<Q>(&self, hash: u64, key: &Q) -> Option<CellPin<V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // SAFETY: slots are freed only with the index, which `self`
        // borrows.
        let slots = unsafe { &*self.slots.load(Acquire) };
        let mut i = hash as usize & slots.mask;
        let want = tag(hash);
        // Bounded: a table is at most half full plus one, but a hit may
        // be reading slots that a removal is shifting (the place may then
        // have been given to another key since: it is checked by its hash,
        // then its key).
        for _ in 0..=slots.mask {
            let slot = slots.slots[i].load(Acquire);
            if slot.is_null() {
                return None;
            }
            if slot.addr() & TAG == want {
                // SAFETY: a non-null slot points to a place of the pool,
                // which lives as long as the index.
                let place = unsafe { &*untagged(slot) };
                if place.hash.load(Relaxed) == hash {
                    return place.pin(key);
                }
            }
            i = (i + 1) & slots.mask;
        }
        None
    }
}

/// The shard's handle on a cell it gave: the cell, and which gift of its
/// place it is. Valid as long as the index that gave it (the shard that
/// holds one holds the index too).
pub(crate) struct CellRef<K, V> {
    place: NonNull<Place<K, V>>,
}

// SAFETY: a handle on a place, which is `Send + Sync` for such `K`, `V`.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for CellRef<K, V> {}
// SAFETY: as for `Send`.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for CellRef<K, V> {}

impl<K, V> Clone for CellRef<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, V> Copy for CellRef<K, V> {}

impl<K, V> CellRef<K, V> {
    fn place(&self) -> &Place<K, V> {
        // SAFETY: the pool outlives the index, which outlives the shard
        // that holds this handle.
        unsafe { self.place.as_ref() }
    }

    /// How many times the place had been given when this cell was: equal
    /// for the same entry's cell, different for a later one. Under the
    /// shard lock.
    pub(crate) fn gen(&self) -> u64 {
        // SAFETY: written only under the shard lock, which the caller holds.
        unsafe { *self.place().gen.get() }
    }

    pub(crate) fn same(&self, other: &Self) -> bool {
        self.place == other.place
    }

    /// A hit on this place for `key`, as one that read its slot finds it.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn place_pin<Q>(&self, key: &Q) -> Option<CellPin<V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.place().pin(key)
    }
}

impl<K, V> Deref for CellRef<K, V> {
    type Target = HitCell<V>;

    fn deref(&self) -> &HitCell<V> {
        &self.place().cell
    }
}

/// The buffer's hit cells, by key: a table per shard, and the pool of
/// places. Read without a lock; written only under the lock of the key's
/// shard.
pub(crate) struct HitIndex<K, V> {
    tables: Box<[Table<K, V>]>,
    hash: KeyHash,
    pool: Arc<Pool<K, V>>,
}

impl<K: Hash + Eq + Send + Sync + 'static, V: Send + Sync + 'static> HitIndex<K, V> {
    /// An index for `shards` shards (the buffer's split of keys), whose
    /// cells call back `owner`.
    pub(crate) fn new(
        hash: KeyHash,
        shards: usize,
        owner: Weak<dyn PinOwner<V>>,
        ticks: Arc<Ticks>,
    ) -> Self {
        let pool = Common::within(owner, ticks, |common| Pool {
            common,
            chunks: Mutex::new(Vec::new()),
        });
        HitIndex {
            tables: (0..shards.max(1)).map(|_| Table::new()).collect(),
            hash,
            pool,
        }
    }
}

impl<K: Hash + Eq, V> HitIndex<K, V> {
    fn table(&self, hash: u64) -> &Table<K, V> {
        &self.tables[shard_of(hash, self.tables.len())]
    }

    /// Pin `key` (of hash `hash`) through its cell: the pin, or `None` (no
    /// cell, or closed: take the shard's path).
    #[inline]
    pub(crate) fn pin<Q>(&self, hash: u64, key: &Q) -> Option<CellPin<V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.table(hash).pin(hash, key)
    }

    /// The cell of `key`. Under the key's shard lock.
    pub(crate) fn get(&self, key: &K) -> Option<CellRef<K, V>> {
        let hash = self.hash.of(key);
        let books = self.table(hash).books.lock();
        Self::find(&books, hash, key).map(|(_, place)| CellRef { place })
    }

    /// The slot and place of `key`. Under the shard lock.
    fn find(books: &Books<K, V>, hash: u64, key: &K) -> Option<(usize, NonNull<Place<K, V>>)> {
        let slots = books.slots();
        let mut i = hash as usize & slots.mask;
        loop {
            let place = slots.place(i)?;
            // SAFETY: places in a table are the pool's; the key is read
            // under the shard lock, which every writer of it holds.
            let p = unsafe { place.as_ref() };
            if p.hash.load(Relaxed) == hash && unsafe { &*p.key.get() }.as_ref() == Some(key) {
                return Some((i, place));
            }
            i = (i + 1) & slots.mask;
        }
    }

    /// Give `key` (which has none) a cell holding `value`, for the entry
    /// at `at`, in a place of the calling thread's way. The cell is
    /// closed: the shard opens it when it links the entry. Under the key's
    /// shard lock.
    pub(crate) fn give(&self, key: K, value: Arc<V>, at: PinAt) -> CellRef<K, V> {
        self.give_in(way::this_thread(), key, value, at)
    }

    /// [`HitIndex::give`], in a place of `way`.
    pub(crate) fn give_in(&self, way: usize, key: K, value: Arc<V>, at: PinAt) -> CellRef<K, V> {
        let hash = self.hash.of(&key);
        let table = self.table(hash);
        let mut books = table.books.lock();
        debug_assert!(
            Self::find(&books, hash, &key).is_none(),
            "a key given a second cell"
        );
        let place = self.take_place(&mut books, way);
        // SAFETY: a free place: closed, idle and out of every table; its
        // key and books are written under the shard lock, held here.
        let p = unsafe { place.as_ref() };
        unsafe {
            *p.key.get() = Some(key);
            *p.listed.get() = true;
            *p.gen.get() += 1;
        }
        p.hash.store(hash, Relaxed);
        p.cell.assign(value, at);
        // Half full plus one: a shard at its budget gives a cell before it
        // retires one, and a table doubled for that one cell would stay
        // twice the size (at the default budget, of 1,024 cells a shard,
        // 32 KiB of slots rather than 16).
        if books.live * 2 > books.slots().slots.len() {
            Self::grow(table, &mut books);
        }
        books.slots().put(hash, place);
        books.live += 1;
        CellRef { place }
    }

    /// The next free place of the chunk `way` is filling; once that is
    /// full, of the next chunk it fills (module docs).
    fn take_place(&self, books: &mut Books<K, V>, way: usize) -> NonNull<Place<K, V>> {
        loop {
            if let Some(chunk) = books.filling[way].map(|c| &mut books.chunks[c]) {
                if chunk.free != 0 {
                    let i = chunk.free.trailing_zeros() as usize;
                    chunk.free &= chunk.free - 1;
                    // SAFETY: in bounds of the chunk.
                    let place = unsafe { chunk.first.add(i) };
                    books.spare -= 1;
                    if chunk.free == 0 {
                        // Places freed in it from now on wait until the
                        // whole chunk is.
                        books.filling[way] = None;
                    }
                    return place;
                }
            }
            let next = match Self::chunk_to_fill(books) {
                Some(c) => c,
                None => {
                    let c = books.chunks.len();
                    books.chunks.push(Chunk {
                        first: self.pool.grow(c),
                        free: ALL_FREE,
                    });
                    books.spare += CHUNK;
                    c
                }
            };
            books.filling[way] = Some(next);
        }
    }

    /// The chunk a way whose chunk is full fills next: an empty one; else,
    /// with a chunk's worth of free places per way, the one with most free
    /// places that no way is filling (a scan of the shard's chunks, once
    /// per chunk a way starts); else `None` (allocate one).
    fn chunk_to_fill(books: &mut Books<K, V>) -> Option<usize> {
        if let Some(c) = books.empty.pop() {
            return Some(c);
        }
        if books.spare < WAYS * CHUNK {
            return None;
        }
        books
            .chunks
            .iter()
            .enumerate()
            .filter(|&(c, chunk)| chunk.free != 0 && !books.filling.contains(&Some(c)))
            .max_by_key(|(_, chunk)| chunk.free.count_ones())
            .map(|(c, _)| c)
    }

    /// Twice the slots, the places put again; the old slots stay (a hit
    /// may be reading them).
    fn grow(table: &Table<K, V>, books: &mut Books<K, V>) {
        let old = books.current;
        let len = 2 * books.slots().slots.len();
        let new = Slots::with_len(len);
        // SAFETY: just allocated, owned by the books from here.
        let new_ref = unsafe { new.as_ref() };
        for place in books.slots().places() {
            // SAFETY: places in a table are the pool's.
            new_ref.put(unsafe { place.as_ref() }.hash.load(Relaxed), place);
        }
        books.current = new;
        books.old.push(old);
        table.slots.store(new.as_ptr(), Release);
    }

    /// Take `cell` out of the index: no hit finds it any more. Closed
    /// already; its place is given again once no lease holds it (now, or
    /// when the lease ends: [`HitIndex::lease_ended`]). Under the shard
    /// lock.
    pub(crate) fn withdraw(&self, cell: CellRef<K, V>) {
        let p = cell.place();
        let hash = p.hash.load(Relaxed);
        let mut books = self.table(hash).books.lock();
        let slots = books.slots();
        let mut i = hash as usize & slots.mask;
        loop {
            let Some(here) = slots.place(i) else {
                debug_assert!(false, "a listed cell missing from its table");
                return;
            };
            if here == cell.place {
                slots.take(i);
                break;
            }
            i = (i + 1) & slots.mask;
        }
        books.live -= 1;
        // SAFETY: under the shard lock.
        unsafe { *p.listed.get() = false };
        if !p.cell.is_lent() {
            Self::free(&mut books, cell.place);
        }
    }

    /// The shard took back `cell`'s lease: if its place was taken out of
    /// the index meanwhile, it is free now. Under the shard lock.
    pub(crate) fn lease_ended(&self, cell: &HitCell<V>) {
        if !cell.lease_returned() {
            return;
        }
        // SAFETY: every cell the index hands out lives in a place of its
        // pool, which set `home`.
        let place = cell.home().cast::<Place<K, V>>();
        // SAFETY: places are the pool's; `listed` is read under the lock.
        let p = unsafe { place.as_ref() };
        if unsafe { *p.listed.get() } {
            return;
        }
        let mut books = self.table(p.hash.load(Relaxed)).books.lock();
        Self::free(&mut books, place);
    }

    /// Empty a place out of every table, closed and idle, and mark it
    /// free in its chunk.
    fn free(books: &mut Books<K, V>, place: NonNull<Place<K, V>>) {
        // SAFETY: places are the pool's; closed and idle, no hit reads the
        // key or value, and the shard lock is held.
        let p = unsafe { place.as_ref() };
        debug_assert!(p.cell.is_idle(), "a place freed while its cell is held");
        drop(p.cell.take_value());
        drop(unsafe { (*p.key.get()).take() });
        let (c, i) = (p.spot / CHUNK, p.spot % CHUNK);
        let chunk = &mut books.chunks[c];
        chunk.free |= 1 << i;
        books.spare += 1;
        if chunk.free == ALL_FREE && !books.filling.contains(&Some(c)) {
            books.empty.push(c);
        }
    }

    #[cfg(test)]
    pub(crate) fn hash_of(&self, key: &K) -> u64 {
        self.hash.of(key)
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn len(&self) -> usize {
        self.tables.iter().map(|t| t.books.lock().live).sum()
    }

    /// Places allocated so far, in use or free.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn places(&self) -> usize {
        self.pool.chunks.lock().len() * CHUNK
    }

    /// Slots of the current tables, over every shard.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.tables
            .iter()
            .map(|t| t.books.lock().slots().slots.len())
            .sum()
    }

    /// Free places, over every shard.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn free_places(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|t| {
                let books = t.books.lock();
                books
                    .chunks
                    .iter()
                    .map(|c| c.free.count_ones() as usize)
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// The address of `cell`'s place.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn address(cell: &CellRef<K, V>) -> usize {
        cell.place.as_ptr() as usize
    }
}

impl<K, V> Drop for HitIndex<K, V> {
    /// Close every cell: pins still held become leases, which hold the
    /// pool once the index is gone. Cells with no pin give their values
    /// up now.
    fn drop(&mut self) {
        for table in self.tables.iter() {
            let books = table.books.lock();
            for place in books.slots().places() {
                // SAFETY: places in a table are the pool's, alive here.
                let p = unsafe { place.as_ref() };
                if p.cell.close() == 0 {
                    drop(p.cell.take_value());
                }
            }
        }
    }
}

// Shuttle's atomics are larger than std's.
#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::Place;
    use std::mem::{align_of, offset_of, size_of};

    /// `Builder::hit_cells` documents about 160 bytes per cell: the place
    /// (this) and its share of the table's slots (8 bytes each, 2 to 4
    /// slots per place). Two cache lines, on a boundary of two.
    #[test]
    fn a_place_of_a_u64_key_takes_two_lines() {
        type P = Place<u64, Vec<f64>>;
        assert_eq!(size_of::<P>(), 128);
        assert_eq!(align_of::<P>(), 128);
        assert_eq!(size_of::<Place<String, Vec<f64>>>(), 128);
    }

    /// What a hit reads and writes lies on the place's first line, for
    /// keys of up to 24 bytes (three words, or a `String`).
    #[test]
    fn a_hit_touches_one_line_of_its_place() {
        fn hot_end<K>() -> usize {
            type C = super::HitCell<Vec<f64>>;
            let cell = offset_of!(Place<K, Vec<f64>>, cell);
            [
                offset_of!(Place<K, Vec<f64>>, hash) + 8,
                offset_of!(Place<K, Vec<f64>>, key) + size_of::<Option<K>>(),
                cell + offset_of!(C, word) + 8,
                cell + offset_of!(C, last_use) + 8,
                cell + offset_of!(C, value) + 8,
                cell + offset_of!(C, ticks) + 8,
            ]
            .into_iter()
            .max()
            .unwrap()
        }
        assert!(hot_end::<u64>() <= 64, "{} bytes", hot_end::<u64>());
        assert!(hot_end::<String>() <= 64, "{} bytes", hot_end::<String>());
        assert!(hot_end::<(u64, u64)>() <= 64);
    }
}
