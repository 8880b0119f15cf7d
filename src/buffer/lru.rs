//! The two intrusive LRU lists of a shard (clean and dirty), over the
//! shard's slab of entries. Only unpinned resident entries are on a list.
//!
//! Each list is split into one chain per [`WAYS`]: a use links the entry
//! at the head of the using thread's chain, and the list's least recently
//! used entry is the oldest of the chains' tails. Moving an entry writes
//! its neighbours in the chain; split this way, those are entries the same
//! thread used just before or after it, whose cache lines that core
//! already holds, rather than entries another core has just written.
//! Ticks rise along every chain, so the oldest tail is the list's least
//! recently used entry, exactly as with a single chain.

use crate::buffer::entry::{ListKind, Node, NIL};
use crate::buffer::way::WAYS;

/// The slab the lists link through: slot → entry.
pub(crate) type Slab<K, V> = Vec<Option<Node<K, V>>>;

#[derive(Clone, Copy)]
struct Chain {
    head: u32, // most recently used
    tail: u32, // least recently used
}

const EMPTY: Chain = Chain {
    head: NIL,
    tail: NIL,
};

/// The chains of one way, on cache lines of their own.
#[derive(Clone, Copy)]
#[repr(align(128))]
struct Way {
    chains: [Chain; 2],
}

/// Bytes of the chain heads of one shard (for the per-shard cost).
#[cfg(test)]
pub(crate) const CHAIN_HEADS_BYTES: usize = std::mem::size_of::<[Way; WAYS]>();

/// The chain heads of a shard's two lists.
pub(crate) struct Lists {
    ways: Box<[Way; WAYS]>,
    /// A list's tail (or its tick) changed since [`Lists::take_tails_moved`]
    /// last looked.
    tails_moved: bool,
}

fn node<K, V>(slab: &Slab<K, V>, idx: u32) -> &Node<K, V> {
    slab[idx as usize].as_ref().expect("live slot")
}

fn node_mut<K, V>(slab: &mut Slab<K, V>, idx: u32) -> &mut Node<K, V> {
    slab[idx as usize].as_mut().expect("live slot")
}

impl Lists {
    pub(crate) fn new() -> Self {
        Lists {
            ways: Box::new([Way { chains: [EMPTY; 2] }; WAYS]),
            tails_moved: false,
        }
    }

    fn chain(&mut self, way: usize, kind: ListKind) -> &mut Chain {
        &mut self.ways[way].chains[kind as usize]
    }

    /// Make `idx` the most recently used entry of `kind` in the chain of
    /// `way`, used at `tick` (no older than any tick this shard has seen).
    pub(crate) fn link_front<K, V>(
        &mut self,
        slab: &mut Slab<K, V>,
        way: usize,
        idx: u32,
        kind: ListKind,
        tick: u64,
    ) {
        self.unlink(slab, idx);
        let old_head = std::mem::replace(&mut self.chain(way, kind).head, idx);
        let n = node_mut(slab, idx);
        (n.tick, n.prev, n.next) = (tick, NIL, old_head);
        (n.list, n.way) = (Some(kind), way as u8);
        if old_head == NIL {
            self.chain(way, kind).tail = idx;
            self.tails_moved = true;
        } else {
            node_mut(slab, old_head).prev = idx;
        }
    }

    /// Link `idx` on `kind` in the chain of `way` at the place of `tick`,
    /// which may be older than the chain's head: for an entry whose last
    /// use came through its hit cell, found when eviction reached it.
    /// Walks from the head, where such a recent tick lands.
    pub(crate) fn link_sorted<K, V>(
        &mut self,
        slab: &mut Slab<K, V>,
        way: usize,
        idx: u32,
        kind: ListKind,
        tick: u64,
    ) {
        self.unlink(slab, idx);
        let mut prev = NIL;
        let mut next = self.chain(way, kind).head;
        while next != NIL && node(slab, next).tick > tick {
            prev = next;
            next = node(slab, next).next;
        }
        let n = node_mut(slab, idx);
        (n.tick, n.prev, n.next) = (tick, prev, next);
        (n.list, n.way) = (Some(kind), way as u8);
        if prev == NIL {
            self.chain(way, kind).head = idx;
        } else {
            node_mut(slab, prev).next = idx;
        }
        if next == NIL {
            self.chain(way, kind).tail = idx;
            self.tails_moved = true;
        } else {
            node_mut(slab, next).prev = idx;
        }
    }

    /// Make `idx` the first entry of `kind` to be evicted. Its tick is 0, so
    /// it also comes before every other shard's entries.
    pub(crate) fn link_back<K, V>(
        &mut self,
        slab: &mut Slab<K, V>,
        way: usize,
        idx: u32,
        kind: ListKind,
    ) {
        self.unlink(slab, idx);
        let old_tail = std::mem::replace(&mut self.chain(way, kind).tail, idx);
        let n = node_mut(slab, idx);
        (n.tick, n.prev, n.next) = (0, old_tail, NIL);
        (n.list, n.way) = (Some(kind), way as u8);
        if old_tail == NIL {
            self.chain(way, kind).head = idx;
        } else {
            node_mut(slab, old_tail).next = idx;
        }
        self.tails_moved = true;
    }

    /// Take `idx` off its list, if it is on one.
    pub(crate) fn unlink<K, V>(&mut self, slab: &mut Slab<K, V>, idx: u32) {
        let n = node_mut(slab, idx);
        let Some(kind) = n.list.take() else { return };
        let (way, prev, next) = (n.way as usize, n.prev, n.next);
        (n.prev, n.next) = (NIL, NIL);
        if prev != NIL {
            node_mut(slab, prev).next = next;
        } else {
            self.chain(way, kind).head = next;
        }
        if next != NIL {
            node_mut(slab, next).prev = prev;
        } else {
            self.chain(way, kind).tail = prev;
            self.tails_moved = true;
        }
    }

    /// Whether a list's tail moved since the last call: the shard
    /// republishes its tail ticks only then.
    pub(crate) fn take_tails_moved(&mut self) -> bool {
        std::mem::take(&mut self.tails_moved)
    }

    /// The least recently used entry of `kind` and its tick: the oldest
    /// of the chains' tails.
    pub(crate) fn tail<K, V>(&self, slab: &Slab<K, V>, kind: ListKind) -> Option<(u32, u64)> {
        self.ways
            .iter()
            .map(|w| w.chains[kind as usize].tail)
            .filter(|&t| t != NIL)
            .map(|t| (t, node(slab, t).tick))
            .min_by_key(|&(_, tick)| tick)
    }

    /// The entries of `kind` in eviction order: the chains merged from
    /// their tails by tick.
    #[cfg(test)]
    pub(crate) fn order<K, V>(&self, slab: &Slab<K, V>, kind: ListKind) -> Vec<u32> {
        let mut at: Vec<u32> = self
            .ways
            .iter()
            .map(|w| w.chains[kind as usize].tail)
            .collect();
        let mut out = Vec::new();
        while let Some(w) = (0..WAYS)
            .filter(|&w| at[w] != NIL)
            .min_by_key(|&w| node(slab, at[w]).tick)
        {
            out.push(at[w]);
            at[w] = node(slab, at[w]).prev;
        }
        out
    }

    /// Check one chain: links, ticks falling from head to tail, and the
    /// nodes' marks. Returns its length.
    #[cfg(any(test, feature = "testing"))]
    fn validate_chain<K, V>(
        &self,
        slab: &Slab<K, V>,
        kind: ListKind,
        w: usize,
    ) -> Result<usize, String> {
        let chain = self.ways[w].chains[kind as usize];
        let mut seen = 0usize;
        let mut prev = NIL;
        let mut cur = chain.head;
        let mut last_tick = u64::MAX;
        while cur != NIL {
            let n = slab
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
            if seen > slab.len() {
                return Err(format!("{kind:?} chain {w} has a cycle"));
            }
            prev = cur;
            cur = n.next;
        }
        if chain.tail != prev {
            return Err(format!("{kind:?} chain {w}: tail is not the last node"));
        }
        Ok(seen)
    }

    /// Each chain is a proper doubly-linked chain with ticks falling from
    /// head to tail, and a list's chains hold exactly the nodes that say
    /// they are on it.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate<K, V>(&self, slab: &Slab<K, V>) -> Result<(), String> {
        for kind in [ListKind::Clean, ListKind::Dirty] {
            let mut seen = 0usize;
            for w in 0..WAYS {
                seen += self.validate_chain(slab, kind, w)?;
            }
            let claimed = slab
                .iter()
                .flatten()
                .filter(|n| n.list == Some(kind))
                .count();
            if claimed != seen {
                return Err(format!("{kind:?} list: {seen} linked, {claimed} claim it"));
            }
        }
        Ok(())
    }
}
