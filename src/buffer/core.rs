//! The single-threaded core of one index shard: key → slot map, a slab of
//! entries, and two intrusive LRU lists (clean and dirty) of the entries
//! that may be evicted. It does no IO and takes no lock; the buffer puts
//! each core behind its shard's mutex. Kept apart so that it can be tested
//! and validated on its own.
//!
//! Each list is split into one chain per [`WAYS`]: a use links the entry
//! at the head of the using thread's chain, and the list's least recently
//! used entry is the oldest of the chains' tails. Moving an entry writes
//! its neighbours in the chain; split this way, those are entries the same
//! thread used just before or after it, whose cache lines that core
//! already holds, rather than entries another core has just written.
//! Ticks rise along every chain, so the oldest tail is the list's least
//! recently used entry, exactly as with a single chain.

use crate::buffer::hash::KeyHash;
use crate::buffer::pinned::Waiter;
use crate::buffer::way::{self, WAYS};
use crate::store::DiskLoc;
use hashbrown::HashTable;
use std::hash::Hash;
use std::sync::Arc;

pub(crate) const NIL: u32 = u32::MAX;

/// The two eviction lists. Clean entries (a valid disk copy exists) go first
/// because dropping them costs no IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    Clean = 0,
    Dirty = 1,
}

/// Where an entry's value is. See docs/design.md for the transitions.
pub(crate) enum State<V> {
    /// In memory. `disk` is the record of a valid disk copy (clean) or
    /// `None` (dirty).
    Resident {
        value: Arc<V>,
        disk: Option<DiskLoc>,
    },
    /// In memory, with a write queued or running; still readable.
    Spilling { value: Arc<V> },
    /// Only on disk.
    OnDisk { loc: DiskLoc },
    /// On disk with a read in flight; `waiters` get the value when it lands.
    /// `prefetch` reads hold a reservation of `weight` bytes. The waiters
    /// are boxed so that this rare state does not make every entry larger
    /// (it would be the widest variant: 56 bytes against 40).
    Unspilling {
        loc: DiskLoc,
        #[expect(
            clippy::box_collection,
            reason = "one pointer instead of three keeps every entry 8 bytes smaller"
        )]
        waiters: Box<Vec<Waiter<V>>>,
        prefetch: bool,
    },
}

impl<V> State<V> {
    /// The value, when it is in memory.
    pub(crate) fn value(&self) -> Option<&Arc<V>> {
        match self {
            State::Resident { value, .. } | State::Spilling { value } => Some(value),
            _ => None,
        }
    }

    /// The record this entry owns on disk, if any.
    pub(crate) fn disk(&self) -> Option<DiskLoc> {
        match self {
            State::Resident { disk, .. } => *disk,
            State::OnDisk { loc } | State::Unspilling { loc, .. } => Some(*loc),
            State::Spilling { .. } => None,
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            State::Resident { disk: None, .. } => "resident-dirty",
            State::Resident { disk: Some(_), .. } => "resident-clean",
            State::Spilling { .. } => "spilling",
            State::OnDisk { .. } => "on-disk",
            State::Unspilling { .. } => "unspilling",
        }
    }
}

pub(crate) struct Node<K, V> {
    pub key: K,
    pub state: State<V>,
    pub weight: usize,
    /// Unique per insert across the buffer; IO results and pins carry it so
    /// that they never act on a newer value of the same key.
    pub version: u64,
    pub pins: u32,
    /// The host consumed it: when the last pin goes, it is first in line.
    pub consumed: bool,
    tick: u64,
    prev: u32,
    next: u32,
    list: Option<ListKind>,
    /// The chain of the list it is on.
    way: u8,
}

impl<K, V> Node<K, V> {
    pub(crate) fn new(key: K, state: State<V>, weight: usize, version: u64) -> Self {
        Node {
            key,
            state,
            weight,
            version,
            pins: 0,
            consumed: false,
            tick: 0,
            prev: NIL,
            next: NIL,
            list: None,
            way: 0,
        }
    }

    /// The list this entry belongs in when unpinned and resident.
    pub(crate) fn wanted_list(&self) -> Option<ListKind> {
        match &self.state {
            State::Resident { disk: Some(_), .. } if self.pins == 0 => Some(ListKind::Clean),
            State::Resident { disk: None, .. } if self.pins == 0 => Some(ListKind::Dirty),
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
struct List {
    head: u32, // most recently used
    tail: u32, // least recently used
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

/// The chains of one way, on cache lines of their own.
#[derive(Clone, Copy)]
#[repr(align(128))]
struct Way {
    lists: [List; 2],
}

/// Bytes of the chain heads of one core (for the per-shard cost).
#[cfg(test)]
pub(crate) const CHAIN_HEADS_BYTES: usize = std::mem::size_of::<[Way; WAYS]>();

pub(crate) struct Core<K, V> {
    /// Slots of the live nodes, found by key hash. The key itself lives in
    /// the node only: 4 bytes a bucket rather than a copy of the key.
    map: HashTable<u32>,
    hash: KeyHash,
    slab: Vec<Option<Node<K, V>>>,
    free: Vec<u32>,
    ways: Box<[Way; WAYS]>,
    /// A list's tail (or its tick) changed since [`Core::take_tails_moved`]
    /// last looked.
    tails_moved: bool,
}

impl<K: Hash + Eq + Clone, V> Core<K, V> {
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_hash(KeyHash::new())
    }

    /// A core whose table hashes keys with `hash` (the buffer's, so that a
    /// key is hashed once for its shard and its slot).
    pub(crate) fn with_hash(hash: KeyHash) -> Self {
        Core {
            map: HashTable::new(),
            hash,
            slab: Vec::new(),
            free: Vec::new(),
            ways: Box::new([Way { lists: [EMPTY; 2] }; WAYS]),
            tails_moved: false,
        }
    }

    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        self.find_hashed(self.hash.of(key), key)
    }

    /// [`Core::find`] for a key whose hash the caller already has.
    pub(crate) fn find_hashed(&self, hash: u64, key: &K) -> Option<u32> {
        let slab = &self.slab;
        self.map
            .find(hash, |&i| {
                slab[i as usize].as_ref().is_some_and(|n| n.key == *key)
            })
            .copied()
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        self.find(key).is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn node(&self, idx: u32) -> &Node<K, V> {
        self.slab[idx as usize].as_ref().expect("live slot")
    }

    pub(crate) fn node_mut(&mut self, idx: u32) -> &mut Node<K, V> {
        self.slab[idx as usize].as_mut().expect("live slot")
    }

    /// The node at `idx` if it still holds `version`.
    pub(crate) fn get_version(&mut self, idx: u32, version: u64) -> Option<&mut Node<K, V>> {
        self.slab
            .get_mut(idx as usize)?
            .as_mut()
            .filter(|n| n.version == version)
    }

    /// The slot of `key` if it holds `version`.
    pub(crate) fn find_version(&self, key: &K, version: u64) -> Option<u32> {
        self.find(key).filter(|&i| self.node(i).version == version)
    }

    /// Add a node for a key that is not present. Returns its slot.
    pub(crate) fn insert(&mut self, node: Node<K, V>) -> u32 {
        let hash = self.hash.of(&node.key);
        debug_assert!(
            self.find_hashed(hash, &node.key).is_none(),
            "insert of a present key"
        );
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
        let Core {
            map, slab, hash: h, ..
        } = self;
        map.insert_unique(hash, idx, |&i| {
            h.of(&slab[i as usize].as_ref().expect("live slot").key)
        });
        idx
    }

    /// Take a node out entirely.
    pub(crate) fn remove(&mut self, idx: u32) -> Node<K, V> {
        self.unlink(idx);
        let hash = self.hash.of(&self.node(idx).key);
        match self.map.find_entry(hash, |&i| i == idx) {
            Ok(slot) => drop(slot.remove()),
            Err(_) => debug_assert!(false, "live slot {idx} missing from the table"),
        }
        let node = self.slab[idx as usize].take().expect("live slot");
        self.free.push(idx);
        node
    }

    /// Make `idx` the most recently used entry of `kind`, used at `tick`
    /// (no older than any tick this core has seen).
    pub(crate) fn link_front(&mut self, idx: u32, kind: ListKind, tick: u64) {
        self.link_front_in(way::this_thread(), idx, kind, tick);
    }

    /// [`Core::link_front`] into the chain of `way`.
    fn link_front_in(&mut self, way: usize, idx: u32, kind: ListKind, tick: u64) {
        self.unlink(idx);
        let old_head = std::mem::replace(&mut self.chain(way, kind).head, idx);
        let n = self.node_mut(idx);
        (n.tick, n.prev, n.next) = (tick, NIL, old_head);
        (n.list, n.way) = (Some(kind), way as u8);
        if old_head == NIL {
            self.chain(way, kind).tail = idx;
            self.tails_moved = true;
        } else {
            self.node_mut(old_head).prev = idx;
        }
    }

    /// Make `idx` the first entry of `kind` to be evicted. Its tick is 0, so
    /// it also comes before every other shard's entries.
    pub(crate) fn link_back(&mut self, idx: u32, kind: ListKind) {
        self.link_back_in(way::this_thread(), idx, kind);
    }

    /// [`Core::link_back`] into the chain of `way`.
    fn link_back_in(&mut self, way: usize, idx: u32, kind: ListKind) {
        self.unlink(idx);
        let old_tail = std::mem::replace(&mut self.chain(way, kind).tail, idx);
        let n = self.node_mut(idx);
        (n.tick, n.prev, n.next) = (0, old_tail, NIL);
        (n.list, n.way) = (Some(kind), way as u8);
        if old_tail == NIL {
            self.chain(way, kind).head = idx;
        } else {
            self.node_mut(old_tail).next = idx;
        }
        self.tails_moved = true;
    }

    /// Take `idx` off its list, if it is on one.
    pub(crate) fn unlink(&mut self, idx: u32) {
        let n = self.node_mut(idx);
        let Some(kind) = n.list.take() else { return };
        let (way, prev, next) = (n.way as usize, n.prev, n.next);
        (n.prev, n.next) = (NIL, NIL);
        if prev != NIL {
            self.node_mut(prev).next = next;
        } else {
            self.chain(way, kind).head = next;
        }
        if next != NIL {
            self.node_mut(next).prev = prev;
        } else {
            self.chain(way, kind).tail = prev;
            self.tails_moved = true;
        }
    }

    /// The chain of `kind` that `way` links into.
    fn chain(&mut self, way: usize, kind: ListKind) -> &mut List {
        &mut self.ways[way].lists[kind as usize]
    }

    /// Whether a list's tail moved since the last call: the shard
    /// republishes its tail ticks only then.
    pub(crate) fn take_tails_moved(&mut self) -> bool {
        let moved = self.tails_moved;
        if moved {
            self.tails_moved = false;
        }
        moved
    }

    /// The least recently used entry of `kind` and its tick: the oldest
    /// of the chains' tails.
    pub(crate) fn tail(&self, kind: ListKind) -> Option<(u32, u64)> {
        self.ways
            .iter()
            .map(|w| w.lists[kind as usize].tail)
            .filter(|&t| t != NIL)
            .map(|t| (t, self.node(t).tick))
            .min_by_key(|&(_, tick)| tick)
    }

    /// Tick of the tail of `kind`, or `u64::MAX` when the list is empty.
    pub(crate) fn tail_tick(&self, kind: ListKind) -> u64 {
        self.tail(kind).map_or(u64::MAX, |(_, t)| t)
    }

    /// Every live node.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = (u32, &Node<K, V>)> {
        self.slab
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i as u32, n)))
    }

    /// Check one chain of `kind` (way `w`): links, ticks falling from head
    /// to tail, and the nodes' marks. Returns its length.
    fn validate_chain(&self, kind: ListKind, w: usize, list: List) -> Result<usize, String> {
        let mut seen = 0usize;
        let mut prev = NIL;
        let mut cur = list.head;
        let mut last_tick = u64::MAX;
        while cur != NIL {
            let n = self
                .slab
                .get(cur as usize)
                .and_then(|n| n.as_ref())
                .ok_or_else(|| format!("{kind:?} chain {w} points at empty slot {cur}"))?;
            if n.list != Some(kind) || n.way as usize != w {
                return Err(format!(
                    "slot {cur} on {kind:?} chain {w} says {:?} chain {}",
                    n.list, n.way
                ));
            }
            if n.prev != prev {
                return Err(format!("slot {cur}: prev link broken"));
            }
            if n.tick > last_tick {
                return Err(format!(
                    "{kind:?} chain {w}: ticks not falling at slot {cur}"
                ));
            }
            last_tick = n.tick;
            seen += 1;
            if seen > self.slab.len() {
                return Err(format!("{kind:?} chain {w} has a cycle"));
            }
            prev = cur;
            cur = n.next;
        }
        if list.tail != prev {
            return Err(format!("{kind:?} chain {w}: tail is not the last node"));
        }
        Ok(seen)
    }

    /// Check the lists and the map against the nodes: each chain is a
    /// proper doubly-linked chain with ticks falling from head to tail, a
    /// list's chains hold exactly the nodes that say they are on it, and
    /// each node is on the list its state asks for.
    pub(crate) fn validate(&self) -> Result<(), String> {
        for kind in [ListKind::Clean, ListKind::Dirty] {
            let mut seen = 0usize;
            for (w, way) in self.ways.iter().enumerate() {
                seen += self.validate_chain(kind, w, way.lists[kind as usize])?;
            }
            let claimed = self.nodes().filter(|(_, n)| n.list == Some(kind)).count();
            if claimed != seen {
                return Err(format!("{kind:?} list: {seen} linked, {claimed} claim it"));
            }
        }
        for (i, n) in self.nodes() {
            if self.find(&n.key) != Some(i) {
                return Err(format!("slot {i} is not the map's slot for its key"));
            }
            if n.list != n.wanted_list() {
                return Err(format!(
                    "slot {i} ({}, pins {}) on list {:?}, wants {:?}",
                    n.state.name(),
                    n.pins,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident(v: u32) -> State<u32> {
        State::Resident {
            value: Arc::new(v),
            disk: None,
        }
    }

    fn core_with(keys: &[u32]) -> Core<u32, u32> {
        let mut c = Core::new();
        for (t, &k) in keys.iter().enumerate() {
            let i = c.insert(Node::new(k, resident(k), 1, k as u64));
            c.link_front(i, ListKind::Dirty, t as u64 + 1);
        }
        c
    }

    /// Keys of `kind` in eviction order: the chains merged from their
    /// tails by tick, as taking the tail again and again would give.
    fn order(c: &Core<u32, u32>, kind: ListKind) -> Vec<u32> {
        let mut at: Vec<u32> = c.ways.iter().map(|w| w.lists[kind as usize].tail).collect();
        let mut out = Vec::new();
        while let Some(w) = (0..WAYS)
            .filter(|&w| at[w] != NIL)
            .min_by_key(|&w| c.node(at[w]).tick)
        {
            out.push(c.node(at[w]).key);
            at[w] = c.node(at[w]).prev;
        }
        out
    }

    /// Take the tail out again and again: the keys in eviction order.
    fn drain(c: &mut Core<u32, u32>, kind: ListKind) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some((i, _)) = c.tail(kind) {
            out.push(c.remove(i).key);
            c.validate().unwrap();
        }
        out
    }

    #[test]
    fn the_tail_is_the_oldest_use_over_every_way() {
        let mut c = Core::new();
        // Keys used in order 1..=8, by threads of alternating ways.
        for k in 1..=8u32 {
            let i = c.insert(Node::new(k, resident(k), 1, k as u64));
            c.link_front_in(k as usize % 2, i, ListKind::Dirty, k as u64);
        }
        // Key 5 used again (way 3), key 6 consumed (first in line, way 1).
        let i = c.find(&5).unwrap();
        c.link_front_in(3, i, ListKind::Dirty, 9);
        let i = c.find(&6).unwrap();
        c.link_back_in(1, i, ListKind::Dirty);
        c.validate().unwrap();
        assert_eq!(order(&c, ListKind::Dirty), vec![6, 1, 2, 3, 4, 7, 8, 5]);
        assert_eq!(drain(&mut c, ListKind::Dirty), vec![6, 1, 2, 3, 4, 7, 8, 5]);
    }

    #[test]
    fn lru_order_follows_use() {
        let mut c = core_with(&[1, 2, 3]);
        assert_eq!(order(&c, ListKind::Dirty), vec![1, 2, 3]);
        let i = c.find(&1).unwrap();
        c.link_front(i, ListKind::Dirty, 10);
        assert_eq!(order(&c, ListKind::Dirty), vec![2, 3, 1]);
        let i = c.find(&3).unwrap();
        c.link_back(i, ListKind::Dirty);
        assert_eq!(order(&c, ListKind::Dirty), vec![3, 2, 1]);
        assert_eq!(
            c.tail(ListKind::Dirty).map(|(i, t)| (c.node(i).key, t)),
            Some((3, 0))
        );
        c.validate().unwrap();
    }

    #[test]
    fn remove_unlinks_and_frees_the_slot() {
        let mut c = core_with(&[1, 2, 3]);
        let i = c.find(&2).unwrap();
        let n = c.remove(i);
        assert_eq!(n.key, 2);
        assert_eq!(order(&c, ListKind::Dirty), vec![1, 3]);
        assert!(!c.contains(&2));
        let j = c.insert(Node::new(9, resident(9), 1, 99));
        assert_eq!(j, i, "freed slot is reused");
        c.link_front(j, ListKind::Dirty, 50);
        c.validate().unwrap();
        assert!(c.get_version(j, 2).is_none());
        assert!(c.get_version(j, 99).is_some());
    }

    #[test]
    fn validate_catches_a_node_on_the_wrong_list() {
        let mut c = core_with(&[1]);
        let i = c.find(&1).unwrap();
        c.link_front(i, ListKind::Clean, 5); // dirty state on the clean list
        assert!(c.validate().is_err());
    }

    #[test]
    fn pinned_nodes_belong_on_no_list() {
        let mut c = core_with(&[1, 2]);
        let i = c.find(&1).unwrap();
        c.node_mut(i).pins = 1;
        assert!(c.validate().is_err());
        c.unlink(i);
        c.validate().unwrap();
        assert_eq!(order(&c, ListKind::Dirty), vec![2]);
    }
}
#[cfg(test)]
mod size {
    /// The per-key metadata target (<= 128 bytes per key, measured by
    /// `cargo run --release --example bench -- --workload metadata`) rests
    /// on the entry staying this small: the rare unspilling state boxes its
    /// waiters, and `DiskLoc`'s non-zero length gives the state a niche.
    #[test]
    fn an_entry_stays_within_88_bytes() {
        assert!(std::mem::size_of::<super::State<Vec<f64>>>() <= 40);
        assert!(std::mem::size_of::<Option<super::Node<u64, Vec<f64>>>>() <= 88);
    }
}
