//! The single-threaded core of one index shard: key → slot map, a slab of
//! entries ([`entry`](super::entry)) and their LRU lists
//! ([`lru`](super::lru)). It does no IO and takes no lock; the buffer puts
//! each shard behind a read-write lock.
//!
//! The shard also keeps its entries' [`HitPins`] in step with its lists:
//! an entry's are open exactly while it is on a list, so that a lookup
//! under the read lock ([`Shard::hit`]) can pin it, and closing them while
//! pinned leases the entry one pin (see [`crate::buffer::hit`]).
//!
//! Every operation applies entry transitions, adds up the gauge changes
//! they make (taken by [`Shard::take_delta`] and applied before the lock
//! is released), and returns in an [`After`] what must happen once the
//! lock is released: values to drop, a write to queue, a record to
//! release, waiters to answer. The buffer acts on it (`Inner::act`).

use crate::buffer::accounting::Delta;
use crate::buffer::entry::{Detached, Evicted, ListKind, Node, Removed, State, Unpinned};
use crate::buffer::hash::KeyHash;
use crate::buffer::hit::{HitContext, HitPins, PinAt, Released};
use crate::buffer::lru::{Lists, Slab};
use crate::buffer::pinned::Waiter;
use crate::buffer::spill_queue::SpillJob;
use crate::store::compact::Relocated;
use crate::store::DiskLoc;
use hashbrown::HashTable;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

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

pub(crate) struct Shard<K, V> {
    /// Slots of the live nodes, found by key hash. The key itself lives in
    /// the node only: 4 bytes a bucket rather than a copy of the key.
    map: HashTable<u32>,
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
        use std::sync::Weak;
        let owner: Weak<dyn PinOwner<V>> = Weak::<tests::NoOwner>::new();
        Self::new_in(KeyHash::new(), Arc::new(HitContext::new(owner, 1)), 0)
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
        let slab = &self.slab;
        self.map
            .find(hash, |&i| {
                slab[i as usize]
                    .as_ref()
                    .is_some_and(|n| n.key.borrow() == key)
            })
            .copied()
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
        let Shard {
            map, slab, hash: h, ..
        } = self;
        map.insert_unique(hash, idx, |&i| {
            h.of(&slab[i as usize].as_ref().expect("live slot").key)
        });
        idx
    }

    /// Take a node out entirely, with the gauge changes of its removal. A
    /// value still held by pins or a write is kept as detached.
    fn take(&mut self, idx: u32) -> Removed<V> {
        self.unlink(idx);
        self.drop_hits(idx);
        let hash = self.hash.of(&self.node(idx).key);
        match self.map.find_entry(hash, |&i| i == idx) {
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

    /// Link `idx` as most recently used, at `tick`; its hit pins open.
    fn link_front(&mut self, idx: u32, kind: ListKind, tick: u64) {
        self.lists.link_front(&mut self.slab, idx, kind, tick);
        self.hits_of(idx).open(tick);
    }

    /// Link `idx` as the first to go; its hit pins open.
    fn link_back(&mut self, idx: u32, kind: ListKind) {
        self.lists.link_back(&mut self.slab, idx, kind);
        self.hits_of(idx).open(0);
    }

    /// The hit pins of `idx`, made if it has none yet (it is going on a
    /// list).
    fn hits_of(&mut self, idx: u32) -> &HitPins<V> {
        let (ctx, number) = (&self.ctx, self.number);
        let n = self.slab[idx as usize].as_mut().expect("live slot");
        let at = PinAt {
            shard: number,
            slot: idx,
            version: n.version,
        };
        let weight = n.weight;
        let value = n.state().value().expect("a listed entry is in memory");
        let value = Arc::clone(value);
        n.hits
            .get_or_insert_with(|| Arc::new(HitPins::new(Arc::clone(ctx), at, value, weight)))
    }

    /// Take `idx` off its list, if it is on one; its hit pins close, and
    /// pins held through them become the entry's lease (one pin). Returns
    /// the hit pins it closed.
    fn unlink(&mut self, idx: u32) -> Option<Arc<HitPins<V>>> {
        self.node(idx).list?;
        self.lists.unlink(&mut self.slab, idx);
        let hits = Arc::clone(
            self.node(idx)
                .hits
                .as_ref()
                .expect("a listed entry has hit pins"),
        );
        if hits.close() > 0 {
            let d = self.node_mut(idx).pin();
            self.add(d);
        }
        Some(hits)
    }

    /// `idx`'s value is leaving memory, or the entry the index: it lets go
    /// of its hit pins (closed already). Pins still held through them keep
    /// them until their lease ends.
    fn drop_hits(&mut self, idx: u32) {
        self.node_mut(idx).hits = None;
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

    // ----- operations -------------------------------------------------------

    /// Pin `key`'s value under the read lock, if it is in memory and on its
    /// list: the pin is counted on its hit pins, and the entry stays where
    /// it is (its release records the use).
    #[inline]
    pub(crate) fn hit<Q>(&self, hash: u64, key: &Q) -> Option<Arc<HitPins<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let n = self.node(self.find_hashed(hash, key)?);
        let hits = n.hits.as_ref()?;
        hits.try_pin().then(|| Arc::clone(hits))
    }

    /// Find `key` for a read. A value in memory is pinned; with a waiter,
    /// a value on disk gets a read started or joined.
    pub(crate) fn lookup<Q>(&mut self, hash: u64, key: &Q, waiter: Option<Waiter<V>>) -> Found<K, V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(idx) = self.find_hashed(hash, key) else {
            return Found::Missing;
        };
        let n = self.node(idx);
        let version = n.version;
        if let Some(value) = n.state().value() {
            let value = Arc::clone(value);
            self.unlink(idx);
            let d = self.node_mut(idx).pin();
            self.add(d);
            self.locked_pins += 1;
            return Found::Hit {
                slot: idx,
                version,
                value,
            };
        }
        let Some(w) = waiter else {
            return Found::NotResident;
        };
        match self.node_mut(idx).start_read(w) {
            Ok(Some(loc)) => Found::Read {
                key: self.node(idx).key.clone(),
                version,
                loc,
            },
            Ok(None) => Found::Joined,
            Err(_) => Found::NotResident,
        }
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

    /// Evict the tail of `kind` if its tick is `expect_tick` (when given):
    /// a clean value is dropped, a dirty one queued for writing. Returns
    /// its weight and what to do. A tail pinned or used under the read
    /// lock since it was linked is not evicted (weight 0, nothing to do):
    /// it is leased, or moved up to its last use.
    pub(crate) fn evict_tail(
        &mut self,
        kind: ListKind,
        expect_tick: Option<u64>,
    ) -> Option<(usize, After<K, V>)> {
        let (idx, tick) = self.tail(kind)?;
        if expect_tick.is_some_and(|t| t != tick) {
            return None;
        }
        if self.settle(idx, tick, kind).is_none() {
            return Some((0, After::default()));
        }
        let n = self.node_mut(idx);
        let (w, key, version) = (n.weight, n.key.clone(), n.version);
        let (evicted, d) = n.evict()?;
        self.add(d);
        let after = match evicted {
            Evicted::Dropped(value) => {
                // The value left memory: so do its hit pins.
                self.drop_hits(idx);
                After {
                    drop: Some(value),
                    clean_eviction: true,
                    ..After::default()
                }
            }
            Evicted::Write(value) => After {
                write: Some(SpillJob {
                    key,
                    version,
                    value,
                }),
                ..After::default()
            },
        };
        Some((w, after))
    }

    /// Take the tail `idx` of `kind` (placed at `tick`) off its list, for
    /// eviction. `None` if it must not go: pinned under the read lock
    /// (leased now, and relinked by the last release), or used since it
    /// was placed (moved up to its last use, and back on its list).
    /// Otherwise it is off its list, with its hit pins (closed).
    fn settle(&mut self, idx: u32, tick: u64, kind: ListKind) -> Option<Arc<HitPins<V>>> {
        let hits = self.unlink(idx).expect("a list's tail is on it");
        if self.node(idx).pins() > 0 {
            return None;
        }
        let used = hits.last_use();
        if used > tick {
            self.node_mut(idx).used_again();
            self.lists.link_sorted(&mut self.slab, idx, kind, used);
            hits.open(used);
            self.repaired = self.repaired.max(used);
            return None;
        }
        Some(hits)
    }

    /// When writes are held back: lease the tail of `kind` if it is pinned
    /// under the read lock, or move it up if it was used since it was
    /// placed, so that the pinned gauge and the order are true; a tail
    /// that would be evicted stays. Returns whether it did either.
    pub(crate) fn settle_tail(&mut self, kind: ListKind) -> bool {
        let Some((idx, tick)) = self.tail(kind) else {
            return false;
        };
        let Some(hits) = &self.node(idx).hits else {
            return false;
        };
        // Under the write lock no pin is added from none: a tail seen
        // unpinned and unused here stays so.
        if hits.pins() == 0 && hits.last_use() <= tick {
            return false;
        }
        match self.settle(idx, tick, kind) {
            None => true,
            Some(hits) => {
                // Its pins were released meanwhile: back in its place.
                self.lists.link_sorted(&mut self.slab, idx, kind, tick);
                hits.open(tick);
                false
            }
        }
    }

    /// One pin of slot `idx` (of `version`) released. Returns a value to
    /// drop: one the entry dropped (a clean eviction: `true`), or the
    /// value of a removed or replaced entry that this pin was the last to
    /// hold (`false`).
    pub(crate) fn unpin(
        &mut self,
        idx: u32,
        version: u64,
        consume: bool,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<(Arc<V>, bool)> {
        let n = match self.slab.get_mut(idx as usize) {
            Some(Some(n)) if n.version == version => n,
            _ => {
                let value = self.release_detached(version, Detached::unpin)?;
                return Some((value, false));
            }
        };
        let (next, d) = n.unpin(consume, target);
        self.add(d);
        match next {
            Unpinned::Nothing => None,
            Unpinned::Freed(value) => {
                self.drop_hits(idx);
                Some((value, true))
            }
            Unpinned::Link {
                kind,
                first_out: true,
            } => {
                self.link_back(idx, kind);
                None
            }
            Unpinned::Link { kind, .. } => {
                self.link_front(idx, kind, tick());
                None
            }
        }
    }

    /// One more pin of slot `idx` (a guard cloned).
    pub(crate) fn repin(&mut self, idx: u32, version: u64) {
        match self.slab.get_mut(idx as usize) {
            Some(Some(n)) if n.version == version => n.repin(),
            _ => {
                if let Some(det) = self.detached.get_mut(&version) {
                    det.repin();
                }
            }
        }
    }

    /// The last pin of a lease of `hits` was released: the entry's lease
    /// pin goes, as [`Shard::unpin`] (consuming, if `consume`); for an
    /// entry removed or replaced meanwhile, the detached value's pin.
    pub(crate) fn lease_ended(
        &mut self,
        hits: &HitPins<V>,
        consume: bool,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<(Arc<V>, bool)> {
        hits.lease_returned();
        let at = hits.at();
        self.unpin(at.slot, at.version, consume, target, tick)
    }

    /// A holder of a pin of `hits` consumed it: that pin goes, and the
    /// entry is first in line once no pin is left. The entry comes off its
    /// list first (the pins of `hits` become a lease) so that the release
    /// is the shard's to order.
    pub(crate) fn consume_hit(
        &mut self,
        hits: &HitPins<V>,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<(Arc<V>, bool)> {
        let live = self.live(hits.at());
        if let Some(idx) = live {
            self.unlink(idx);
        }
        match hits.release(false) {
            Released::EndLease => self.lease_ended(hits, true, target, tick),
            Released::Done => {
                if let Some(idx) = live {
                    self.node_mut(idx).mark_consumed();
                }
                None
            }
        }
    }

    /// The slot at `at`, if it still holds that version.
    fn live(&self, at: PinAt) -> Option<u32> {
        match self.slab.get(at.slot as usize) {
            Some(Some(n)) if n.version == at.version => Some(at.slot),
            _ => None,
        }
    }

    /// `key`'s write finished at `loc`. Returns what to do and whether the
    /// entry stayed in memory (it was pinned meanwhile).
    pub(crate) fn spill_done(&mut self, key: &K, version: u64, loc: DiskLoc) -> After<K, V> {
        let Some(idx) = self.find_version(key, version) else {
            // Removed or replaced meanwhile: the record is dead, and the
            // write no longer holds the value.
            return After {
                release: Some(loc),
                drop: self.release_detached(version, Detached::write_ended),
                ..After::default()
            };
        };
        let (freed, d) = self.node_mut(idx).spill_done(loc);
        self.add(d);
        if freed.is_some() {
            self.drop_hits(idx);
        }
        After {
            drop: freed,
            ..After::default()
        }
    }

    /// `key`'s write failed: the value stays, relinked as most recently
    /// used at `tick()` so that the next eviction tries another one; or,
    /// `set_aside` (its encode failed), left on no list. If the entry was
    /// removed or replaced meanwhile, returns its value when the write was
    /// its last holder (to drop after unlocking).
    pub(crate) fn spill_failed(
        &mut self,
        key: &K,
        version: u64,
        set_aside: bool,
        tick: impl FnOnce() -> u64,
    ) -> Option<Arc<V>> {
        let Some(idx) = self.find_version(key, version) else {
            return self.release_detached(version, Detached::write_ended);
        };
        let n = self.node_mut(idx);
        let d = n.spill_failed(set_aside);
        let unpinned = n.pins() == 0;
        self.add(d);
        if unpinned && !set_aside {
            self.link_front(idx, ListKind::Dirty, tick());
        }
        None
    }

    /// Is the write of `key` at `version` still wanted (the entry not
    /// removed or replaced since it was queued)? If not, the job is about
    /// to drop its value without writing: it no longer holds it, and the
    /// value is returned when that was its last holder.
    pub(crate) fn write_wanted(&mut self, key: &K, version: u64) -> (bool, Option<Arc<V>>) {
        if self.find_version(key, version).is_some() {
            return (true, None);
        }
        (false, self.release_detached(version, Detached::write_ended))
    }

    /// Make every set-aside entry a candidate for eviction again, linked
    /// as most recently used. Returns how many there were.
    pub(crate) fn retry_spills(&mut self, mut tick: impl FnMut() -> u64) -> usize {
        let idxs: Vec<u32> = self
            .nodes()
            .filter(|(_, n)| n.set_aside())
            .map(|(i, _)| i)
            .collect();
        for &idx in &idxs {
            let n = self.node_mut(idx);
            let (_, d) = n.retry_spill();
            let unpinned = n.pins() == 0;
            self.add(d);
            if unpinned {
                self.link_front(idx, ListKind::Dirty, tick());
            }
        }
        idxs.len()
    }

    /// Start a prefetch of `key` if it is on disk, was not consumed since
    /// its last pin, and `admit` grants its weight (taking the
    /// reservation itself, atomically against the target).
    pub(crate) fn start_prefetch(
        &mut self,
        key: &K,
        admit: impl FnOnce(usize) -> bool,
    ) -> Option<(u64, DiskLoc)> {
        let idx = self.find(key)?;
        let n = self.node_mut(idx);
        // Consumed since its last pin: the host is done with it, and a hint
        // for it is stale. Reading it back would be a second read of the
        // same record for nothing.
        if !matches!(n.state(), State::OnDisk { .. }) || n.consumed() || !admit(n.weight) {
            return None;
        }
        let version = n.version;
        let (loc, d) = n.start_prefetch()?;
        // `admit` took the reservation already.
        self.add(Delta { reserved: 0, ..d });
        Some((version, loc))
    }

    /// `key`'s read finished. `value` is `None` for a failed read; a value
    /// heavier than `target` read for nobody (a prefetch) is not kept. A
    /// kept value is pinned once per waiter, or linked as clean at
    /// `tick()` when nobody waits.
    pub(crate) fn read_done(
        &mut self,
        key: &K,
        version: u64,
        value: Option<Arc<V>>,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<Wake<V>> {
        // Removed or replaced meanwhile: its waiters were answered then.
        let idx = self.find_version(key, version)?;
        let n = self.node_mut(idx);
        let keep = value.filter(|_| !(n.reading_for_nobody() && n.weight > target));
        let landed = keep.clone();
        let (waiters, _, d) = n.read_done(keep);
        self.add(d);
        let Some(value) = landed else {
            return (!waiters.is_empty()).then_some(Wake::Failed(waiters));
        };
        if waiters.is_empty() {
            self.link_front(idx, ListKind::Clean, tick());
            return None;
        }
        for _ in 0..waiters.len() {
            let d = self.node_mut(idx).pin();
            self.add(d);
        }
        Some(Wake::Pinned {
            waiters,
            slot: idx,
            version,
            value,
        })
    }

    /// Compaction copied `key`'s record `old` to `new`.
    pub(crate) fn relocate(&mut self, key: &K, old: DiskLoc, new: DiskLoc) -> Relocated {
        match self.find(key) {
            Some(idx) => self.node_mut(idx).relocate(old, new),
            None => Relocated::Stale,
        }
    }

    /// Check the lists and the map against the nodes: see
    /// [`Lists::validate`]; and each node is on the list its state asks
    /// for.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.lists.validate(&self.slab)?;
        for (i, n) in self.nodes() {
            if self.find(&n.key) != Some(i) {
                return Err(format!("slot {i} is not the map's slot for its key"));
            }
            self.validate_hits(i, n)?;
            if n.list != n.wanted_list() {
                return Err(format!(
                    "slot {i} ({}, pins {}) on list {:?}, wants {:?}",
                    n.state().name(),
                    n.pins(),
                    n.list,
                    n.wanted_list()
                ));
            }
        }
        if self.map.len() != self.nodes().count() {
            return Err("map and slab disagree on the number of keys".into());
        }
        Ok(())
    }

    /// A node's hit pins are open exactly when the node is on a list
    /// (which only an entry in memory is), and a leased one holds a pin of
    /// the node.
    #[cfg(any(test, feature = "testing"))]
    fn validate_hits(&self, i: u32, n: &Node<K, V>) -> Result<(), String> {
        let Some(hits) = &n.hits else {
            return match n.list {
                Some(_) => Err(format!("slot {i} is on a list without hit pins")),
                None => Ok(()),
            };
        };
        if n.state().value().is_none() {
            return Err(format!("slot {i} has hit pins but is {}", n.state().name()));
        }
        if hits.at().slot != i || hits.at().version != n.version {
            return Err(format!("slot {i}: its hit pins are for {:?}", hits.at()));
        }
        if hits.is_open() != n.list.is_some() {
            return Err(format!(
                "slot {i}: hit pins open {}, on list {:?}",
                hits.is_open(),
                n.list
            ));
        }
        if hits.is_leased() && n.pins() == 0 {
            return Err(format!("slot {i}: hit pins leased, entry unpinned"));
        }
        Ok(())
    }

    /// Keys of `kind` in eviction order.
    #[cfg(test)]
    pub(crate) fn order(&self, kind: ListKind) -> Vec<K> {
        self.lists
            .order(&self.slab, kind)
            .into_iter()
            .map(|i| self.node(i).key.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests;
