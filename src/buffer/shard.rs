//! The single-threaded core of one index shard: key → slot map, a slab of
//! entries ([`entry`](super::entry)) and their LRU lists
//! ([`lru`](super::lru)). It does no IO and takes no lock; the buffer puts
//! each shard behind a read-write lock.
//!
//! The shard also keeps its entries' [`HitPins`] in step with its lists: a
//! lookup under the read lock ([`Shard::hit`]) pins only an entry on a
//! list, and taking one off its list while pinned there leases the entry
//! one pin (see [`crate::buffer::hit`]).
//!
//! Every operation applies entry transitions, adds up the gauge changes
//! they make (taken by [`Shard::take_delta`] and applied before the lock
//! is released), and returns in an [`After`] what must happen once the
//! lock is released: values to drop, a write to queue, a record to
//! release, waiters to answer. The buffer acts on it (`Inner::act`).
//!
//! This file holds the shard's state, its index and lists, inserts and
//! removals; the other transitions are grouped by concern: [`pins`]
//! (pins taken and released), [`spill`] (eviction and the outcome of
//! writes), [`unspill`] (lookups, reads back and prefetch).

mod pins;
mod spill;
#[cfg(test)]
mod tests;
mod unspill;
#[cfg(any(test, feature = "testing"))]
mod validate;

use crate::buffer::accounting::Delta;
use crate::buffer::detached::{Detached, Removed};
use crate::buffer::entry::{ListKind, Node, State};
use crate::buffer::hash::KeyHash;
use crate::buffer::hit::{HitContext, HitPins, PinAt};
use crate::buffer::lru::{Lists, Slab};
use crate::buffer::pinned::Waiter;
use crate::buffer::spill_queue::SpillJob;
use crate::store::compact::Relocated;
use crate::store::DiskLoc;
use crate::sync::Arc;
use hashbrown::HashTable;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// Readers to answer after unlocking.
pub(crate) enum Wake<V> {
    /// The key is gone: they get `None`.
    Gone(Vec<Waiter<V>>),
    /// The value is in memory and already pinned once per waiter.
    Pinned {
        waiters: Vec<Waiter<V>>,
        slot: u32,
        version: u64,
        value: Arc<V>,
    },
    /// The read failed: they get the error.
    Failed(Vec<Waiter<V>>),
}

/// What an operation leaves to do after the shard lock is released.
pub(crate) struct After<K, V> {
    /// A value that left the entry (evicted, replaced, removed, written).
    pub drop: Option<Arc<V>>,
    /// A clean value was dropped without IO (counts a clean eviction).
    pub clean_eviction: bool,
    /// A record no entry owns any more.
    pub release: Option<DiskLoc>,
    /// A value to write.
    pub write: Option<SpillJob<K, V>>,
    pub wake: Option<Wake<V>>,
}

impl<K, V> Default for After<K, V> {
    fn default() -> Self {
        After {
            drop: None,
            clean_eviction: false,
            release: None,
            write: None,
            wake: None,
        }
    }
}

/// What a lookup for a read found.
pub(crate) enum Found<K, V> {
    Missing,
    /// In memory: pinned for the caller.
    Hit {
        slot: u32,
        version: u64,
        value: Arc<V>,
    },
    /// Not in memory and no waiter was given.
    NotResident,
    /// A read is in flight; the waiter was queued on it.
    Joined,
    /// The caller must run (or queue) the read of `key`'s record at `loc`.
    /// The key is the entry's own (the lookup may have used a borrowed
    /// form of it).
    Read {
        key: K,
        version: u64,
        loc: DiskLoc,
    },
}

/// A bucket of a shard's index: a key, its slot, and the entry's hit pins
/// while it is on a list. The key is a copy of its node's, so that a hit
/// reads the bucket and the hit pins, not the node.
struct Bucket<K, V> {
    key: K,
    hits: Option<Arc<HitPins<V>>>,
    slot: u32,
}

pub(crate) struct Shard<K, V> {
    /// The live nodes' buckets, found by key hash.
    map: HashTable<Bucket<K, V>>,
    hash: KeyHash,
    slab: Slab<K, V>,
    free: Vec<u32>,
    lists: Lists,
    /// Values of removed or replaced entries that pins or writes still
    /// hold, by their entry's version (which pins and write jobs carry).
    detached: HashMap<u64, Detached<V>>,
    /// Gauge changes made since the last [`Shard::take_delta`].
    delta: Delta,
    /// What the entries' [`HitPins`] share.
    ctx: Arc<HitContext<V>>,
    /// This shard's number, for its entries' [`PinAt`].
    number: u32,
    /// The newest tick an entry was relinked at for a pin taken under the
    /// read lock (eviction moving it up), since the last [`Shard::take_repaired`]:
    /// the buffer raises the shard's clock to it, so later links come
    /// after it.
    repaired: u64,
    /// Pins of a value in memory that took this shard's write lock.
    locked_pins: u64,
}

impl<K: Hash + Eq + Clone, V> Shard<K, V> {
    /// Shard `number`, whose table hashes keys with `hash` (the buffer's,
    /// so that a key is hashed once for its shard and its slot), its
    /// entries' [`HitPins`] sharing `ctx`.
    pub(crate) fn new_in(hash: KeyHash, ctx: Arc<HitContext<V>>, number: u32) -> Self {
        Shard {
            map: HashTable::new(),
            hash,
            slab: Vec::new(),
            free: Vec::new(),
            lists: Lists::new(),
            detached: HashMap::new(),
            delta: Delta::ZERO,
            ctx,
            number,
            repaired: 0,
            locked_pins: 0,
        }
    }

    /// A shard of its own, whose pins call back nobody.
    #[cfg(test)]
    pub(crate) fn new() -> Self
    where
        K: Send + Sync + 'static,
        V: Send + Sync + 'static,
    {
        use crate::buffer::hit::PinOwner;
        use crate::sync::Weak;
        let owner: Weak<dyn PinOwner<V>> = Weak::<tests::NoOwner>::new();
        Self::new_in(KeyHash::new(), Arc::new(HitContext::new(owner)), 0)
    }

    // ----- the index ----------------------------------------------------

    /// The slot of `key`, or of any borrowed form of it: `K: Borrow<Q>`
    /// promises that `Q` hashes and compares as `K` does, and the key hash
    /// hashes through `Hash`, so both find the same slot.
    pub(crate) fn find<Q>(&self, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find_hashed(self.hash.of(key), key)
    }

    /// [`Shard::find`] for a key whose hash the caller already has.
    pub(crate) fn find_hashed<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.bucket_of(hash, key).map(|b| b.slot)
    }

    /// The bucket of `key`, whose hash is `hash`.
    #[inline]
    fn bucket_of<Q>(&self, hash: u64, key: &Q) -> Option<&Bucket<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.find(hash, |b| b.key.borrow() == key)
    }

    /// The slot of `key` and its hit pins (if it is on a list), from one
    /// look-up.
    pub(crate) fn find_with_hits<Q>(
        &self,
        hash: u64,
        key: &Q,
    ) -> Option<(u32, Option<&Arc<HitPins<V>>>)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.bucket_of(hash, key).map(|b| (b.slot, b.hits.as_ref()))
    }

    /// The bucket of the live slot `idx`.
    fn bucket_mut(&mut self, idx: u32) -> &mut Bucket<K, V> {
        let hash = self.hash.of(&self.node(idx).key);
        self.map
            .find_mut(hash, |b| b.slot == idx)
            .expect("a live slot is in the table")
    }

    /// The hit pins of the live slot `idx`, if it is on a list.
    pub(crate) fn hits_of(&self, idx: u32) -> Option<&Arc<HitPins<V>>> {
        let hash = self.hash.of(&self.node(idx).key);
        self.map.find(hash, |b| b.slot == idx)?.hits.as_ref()
    }

    pub(crate) fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key).is_some()
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn node(&self, idx: u32) -> &Node<K, V> {
        self.slab[idx as usize].as_ref().expect("live slot")
    }

    fn node_mut(&mut self, idx: u32) -> &mut Node<K, V> {
        self.slab[idx as usize].as_mut().expect("live slot")
    }

    /// The slot of `key` if it holds `version`.
    pub(crate) fn find_version(&self, key: &K, version: u64) -> Option<u32> {
        self.find(key).filter(|&i| self.node(i).version == version)
    }

    /// Every live node.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = (u32, &Node<K, V>)> {
        self.slab
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i as u32, n)))
    }

    /// The gauge changes made since the last call.
    pub(crate) fn take_delta(&mut self) -> Delta {
        std::mem::replace(&mut self.delta, Delta::ZERO)
    }

    fn add(&mut self, d: Delta) {
        self.delta = self.delta.plus(d);
    }

    fn put(&mut self, node: Node<K, V>) -> u32 {
        let hash = self.hash.of(&node.key);
        let idx = match self.free.pop() {
            Some(i) => {
                self.slab[i as usize] = Some(node);
                i
            }
            None => {
                self.slab.push(Some(node));
                (self.slab.len() - 1) as u32
            }
        };
        let key = self.node(idx).key.clone();
        let bucket = Bucket {
            key,
            hits: None,
            slot: idx,
        };
        let h = self.hash;
        self.map.insert_unique(hash, bucket, |b| h.of(&b.key));
        idx
    }

    /// Take a node out entirely, with the gauge changes of its removal. A
    /// value still held by pins or a write is kept as detached.
    fn take(&mut self, idx: u32) -> Removed<V> {
        self.unlink(idx);
        let hash = self.hash.of(&self.node(idx).key);
        match self.map.find_entry(hash, |b| b.slot == idx) {
            Ok(slot) => drop(slot.remove()),
            Err(_) => debug_assert!(false, "live slot {idx} missing from the table"),
        }
        let node = self.slab[idx as usize].take().expect("live slot");
        self.free.push(idx);
        let version = node.version;
        let (mut removed, d) = node.removed();
        self.add(d);
        if let Some(det) = removed.detached.take() {
            self.detached.insert(version, det);
        }
        removed
    }

    /// Values of removed or replaced entries still held, by version.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn detached(&self) -> impl Iterator<Item = (u64, &Detached<V>)> {
        self.detached.iter().map(|(v, d)| (*v, d))
    }

    /// A holder of the detached value of `version` let go (`f` says
    /// how); returns the value to drop if that was the last one.
    fn release_detached(
        &mut self,
        version: u64,
        f: impl FnOnce(&mut Detached<V>) -> (Option<Arc<V>>, Delta),
    ) -> Option<Arc<V>> {
        let det = self.detached.get_mut(&version)?;
        let (value, d) = f(det);
        self.add(d);
        if value.is_some() {
            self.detached.remove(&version);
        }
        value
    }

    // ----- the LRU lists and the hit pins --------------------------------

    /// Link `idx` as most recently used, at `tick`: lookups under the read
    /// lock may pin it.
    fn link_front(&mut self, idx: u32, kind: ListKind, tick: u64) {
        self.lists.link_front(&mut self.slab, idx, kind, tick);
        self.hits_linked(idx, tick);
    }

    /// Link `idx` as the first to go.
    fn link_back(&mut self, idx: u32, kind: ListKind) {
        self.lists.link_back(&mut self.slab, idx, kind);
        self.hits_linked(idx, 0);
    }

    /// `idx` went on a list at `tick`: lookups under the read lock may pin
    /// it, through hit pins of its own.
    fn hits_linked(&mut self, idx: u32, tick: u64) {
        let n = self.node(idx);
        let at = PinAt {
            shard: self.number,
            slot: idx,
            version: n.version,
        };
        let value = n.state().value().expect("a listed entry is in memory");
        let hits = HitPins::new(Arc::clone(&self.ctx), at, Arc::clone(value), tick);
        let bucket = self.bucket_mut(idx);
        debug_assert!(bucket.hits.is_none(), "linked twice");
        bucket.hits = Some(Arc::new(hits));
    }

    /// Take `idx` off its list, if it is on one: no more pins under the
    /// read lock. Pins held through its hit pins become the entry's lease
    /// (one pin), and the entry lets go of them. Returns the last use its
    /// hit pins recorded (0 if leased).
    fn unlink(&mut self, idx: u32) -> Option<u64> {
        self.node(idx).list?;
        self.lists.unlink(&mut self.slab, idx);
        let hits = self.bucket_mut(idx).hits.take();
        let hits = hits.expect("a listed entry has hit pins");
        if !HitPins::pinned(&hits) {
            return Some(hits.last_use());
        }
        match Arc::into_inner(hits) {
            // Every pin was released since the look: no lease.
            Some(hits) => Some(hits.last_use()),
            None => {
                let d = self.node_mut(idx).pin();
                self.add(d);
                Some(0)
            }
        }
    }

    /// For [`crate::Stats`]: pins of a value in memory that took this
    /// shard's write lock.
    pub(crate) fn locked_pins(&self) -> u64 {
        self.locked_pins
    }

    /// The newest tick an entry was moved up to since the last call.
    pub(crate) fn take_repaired(&mut self) -> u64 {
        std::mem::take(&mut self.repaired)
    }

    /// The least recently used entry of `kind` and its tick.
    pub(crate) fn tail(&self, kind: ListKind) -> Option<(u32, u64)> {
        self.lists.tail(&self.slab, kind)
    }

    /// Tick of the tail of `kind`, or `u64::MAX` when the list is empty.
    pub(crate) fn tail_tick(&self, kind: ListKind) -> u64 {
        self.tail(kind).map_or(u64::MAX, |(_, t)| t)
    }

    /// Whether a list's tail moved since the last call.
    pub(crate) fn take_tails_moved(&mut self) -> bool {
        self.lists.take_tails_moved()
    }

    /// Insert a new node (made by [`Node::inserted`]), replacing any entry
    /// of the same key: readers waiting on the old value's disk read get
    /// the new one. A resident-dirty node is linked at `tick()`.
    pub(crate) fn insert(
        &mut self,
        node: Node<K, V>,
        delta: Delta,
        tick: impl FnOnce() -> u64,
    ) -> After<K, V> {
        let mut after = After::default();
        let old = self.find(&node.key).map(|i| self.take(i));
        let (version, value) = (node.version, node.state().value().map(Arc::clone));
        let oversized = matches!(node.state(), State::Spilling { .. });
        let key = oversized.then(|| node.key.clone());
        let idx = self.put(node);
        self.add(delta);
        if !oversized {
            self.link_front(idx, ListKind::Dirty, tick());
        }
        if let Some(old) = old {
            let Removed {
                disk,
                drop: old_value,
                waiters,
                ..
            } = old;
            (after.release, after.drop) = (disk, old_value);
            if !waiters.is_empty() {
                for _ in 0..waiters.len() {
                    let d = self.node_mut(idx).pin();
                    self.add(d);
                }
                self.unlink(idx);
                after.wake = Some(Wake::Pinned {
                    waiters,
                    slot: idx,
                    version,
                    value: Arc::clone(value.as_ref().expect("a new value is in memory")),
                });
            }
        }
        if let (Some(key), Some(value)) = (key, value) {
            after.write = Some(SpillJob {
                key,
                version,
                value,
            });
        }
        after
    }

    /// Insert `key` as the on-disk entry of a received record at `loc`
    /// (see [`Node::received`]), replacing any entry of the same key.
    /// Returns what to do, and whether the caller must start a read of
    /// `loc` (readers were waiting on the replaced value's).
    pub(crate) fn insert_received(
        &mut self,
        key: K,
        loc: DiskLoc,
        weight: usize,
        version: u64,
    ) -> (After<K, V>, bool) {
        let mut after = After::default();
        let mut waiters = Vec::new();
        if let Some(old) = self.find(&key).map(|i| self.take(i)) {
            after.release = old.disk;
            after.drop = old.drop;
            waiters = old.waiters;
        }
        let read = !waiters.is_empty();
        let (node, delta) = Node::received(key, loc, weight, version, waiters);
        self.put(node);
        self.add(delta);
        (after, read)
    }

    /// Remove `key`: its value to drop, its record to release, its readers
    /// told it is gone.
    /// With `version`, only if the entry still holds that version (not
    /// replaced since).
    pub(crate) fn remove<Q>(&mut self, key: &Q, version: Option<u64>) -> Option<After<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let idx = self.find(key)?;
        if version.is_some_and(|v| v != self.node(idx).version) {
            return None;
        }
        let Removed {
            disk,
            drop: value,
            waiters,
            ..
        } = self.take(idx);
        Some(After {
            drop: value,
            release: disk,
            wake: (!waiters.is_empty()).then_some(Wake::Gone(waiters)),
            ..After::default()
        })
    }

    /// Compaction copied `key`'s record `old` to `new`.
    pub(crate) fn relocate(&mut self, key: &K, old: DiskLoc, new: DiskLoc) -> Relocated {
        match self.find(key) {
            Some(idx) => self.node_mut(idx).relocate(old, new),
            None => Relocated::Stale,
        }
    }
}
