//! The two intrusive LRU lists of a shard (clean and dirty), over the
//! shard's slab of entries. Only unpinned resident entries are on a list,
//! most recently used at the head; each entry carries the tick it was
//! placed at, and ticks fall from head to tail.

use crate::buffer::entry::{ListKind, Node, NIL};

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

/// The heads and tails of a shard's two lists.
pub(crate) struct Lists {
    chains: [Chain; 2],
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
            chains: [EMPTY; 2],
            tails_moved: false,
        }
    }

    fn chain(&mut self, kind: ListKind) -> &mut Chain {
        &mut self.chains[kind as usize]
    }

    /// Make `idx` the most recently used entry of `kind`, used at `tick`
    /// (no older than any tick this shard has seen).
    pub(crate) fn link_front<K, V>(
        &mut self,
        slab: &mut Slab<K, V>,
        idx: u32,
        kind: ListKind,
        tick: u64,
    ) {
        self.unlink(slab, idx);
        let old_head = std::mem::replace(&mut self.chain(kind).head, idx);
        let n = node_mut(slab, idx);
        (n.tick, n.prev, n.next) = (tick, NIL, old_head);
        n.list = Some(kind);
        if old_head == NIL {
            self.chain(kind).tail = idx;
            self.tails_moved = true;
        } else {
            node_mut(slab, old_head).prev = idx;
        }
    }

    /// Link `idx` on `kind` at the place of `tick`, which may be older
    /// than the list's head: for an entry whose last use was a pin under
    /// the read lock, found when eviction reached it.
    /// Walks from the head, where such a recent tick lands.
    pub(crate) fn link_sorted<K, V>(
        &mut self,
        slab: &mut Slab<K, V>,
        idx: u32,
        kind: ListKind,
        tick: u64,
    ) {
        self.unlink(slab, idx);
        let mut prev = NIL;
        let mut next = self.chain(kind).head;
        while next != NIL && node(slab, next).tick > tick {
            prev = next;
            next = node(slab, next).next;
        }
        let n = node_mut(slab, idx);
        (n.tick, n.prev, n.next) = (tick, prev, next);
        n.list = Some(kind);
        if prev == NIL {
            self.chain(kind).head = idx;
        } else {
            node_mut(slab, prev).next = idx;
        }
        if next == NIL {
            self.chain(kind).tail = idx;
            self.tails_moved = true;
        } else {
            node_mut(slab, next).prev = idx;
        }
    }

    /// Make `idx` the first entry of `kind` to be evicted. Its tick is 0, so
    /// it also comes before every other shard's entries.
    pub(crate) fn link_back<K, V>(&mut self, slab: &mut Slab<K, V>, idx: u32, kind: ListKind) {
        self.unlink(slab, idx);
        let old_tail = std::mem::replace(&mut self.chain(kind).tail, idx);
        let n = node_mut(slab, idx);
        (n.tick, n.prev, n.next) = (0, old_tail, NIL);
        n.list = Some(kind);
        if old_tail == NIL {
            self.chain(kind).head = idx;
        } else {
            node_mut(slab, old_tail).next = idx;
        }
        self.tails_moved = true;
    }

    /// Take `idx` off its list, if it is on one.
    pub(crate) fn unlink<K, V>(&mut self, slab: &mut Slab<K, V>, idx: u32) {
        let n = node_mut(slab, idx);
        let Some(kind) = n.list.take() else { return };
        let (prev, next) = (n.prev, n.next);
        (n.prev, n.next) = (NIL, NIL);
        if prev != NIL {
            node_mut(slab, prev).next = next;
        } else {
            self.chain(kind).head = next;
        }
        if next != NIL {
            node_mut(slab, next).prev = prev;
        } else {
            self.chain(kind).tail = prev;
            self.tails_moved = true;
        }
    }

    /// Whether a list's tail moved since the last call: the shard
    /// republishes its tail ticks only then.
    pub(crate) fn take_tails_moved(&mut self) -> bool {
        std::mem::take(&mut self.tails_moved)
    }

    /// The least recently used entry of `kind` and its tick.
    pub(crate) fn tail<K, V>(&self, slab: &Slab<K, V>, kind: ListKind) -> Option<(u32, u64)> {
        let t = self.chains[kind as usize].tail;
        (t != NIL).then(|| (t, node(slab, t).tick))
    }

    /// The entries of `kind` in eviction order.
    #[cfg(test)]
    pub(crate) fn order<K, V>(&self, slab: &Slab<K, V>, kind: ListKind) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = self.chains[kind as usize].tail;
        while at != NIL {
            out.push(at);
            at = node(slab, at).prev;
        }
        out
    }

    /// Check one list: links, ticks falling from head to tail, and the
    /// nodes' marks. Returns its length.
    #[cfg(any(test, feature = "testing"))]
    fn validate_list<K, V>(&self, slab: &Slab<K, V>, kind: ListKind) -> Result<usize, String> {
        let chain = self.chains[kind as usize];
        let mut seen = 0usize;
        let mut prev = NIL;
        let mut cur = chain.head;
        let mut last_tick = u64::MAX;
        while cur != NIL {
            let n = slab
                .get(cur as usize)
                .and_then(|n| n.as_ref())
                .ok_or_else(|| format!("{kind:?} list points at empty slot {cur}"))?;
            if n.list != Some(kind) {
                return Err(format!("slot {cur} on the {kind:?} list says {:?}", n.list));
            }
            if n.prev != prev {
                return Err(format!("slot {cur}: prev link broken"));
            }
            if n.tick > last_tick {
                return Err(format!("{kind:?} list: ticks not falling at slot {cur}"));
            }
            last_tick = n.tick;
            seen += 1;
            if seen > slab.len() {
                return Err(format!("{kind:?} list has a cycle"));
            }
            prev = cur;
            cur = n.next;
        }
        if chain.tail != prev {
            return Err(format!("{kind:?} list: tail is not the last node"));
        }
        Ok(seen)
    }

    /// Each list is a proper doubly-linked list with ticks falling from
    /// head to tail, and holds exactly the nodes that say they are on it.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate<K, V>(&self, slab: &Slab<K, V>) -> Result<(), String> {
        for kind in [ListKind::Clean, ListKind::Dirty] {
            let seen = self.validate_list(slab, kind)?;
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
