//! A shard's hit cells, given and taken back: an entry gets a cell when it
//! goes back on its list after its second pin (a cell costs more to give
//! than one pin through the shard saves, so keys pinned once never get
//! one), and keeps it while its value is in memory, unless the shard has
//! more cells than its budget. Then the cells not hit for longest are
//! retired (closed and taken out of the index; their entries' next pin
//! takes the shard's path and may give them a cell again), so that the
//! memory cells take (their places in the index) stays bounded however
//! many keys were ever pinned.
//!
//! Once the shard is at its budget, a new cell costs a retirement, so an
//! entry that asks gets one only if a cell it would displace has
//! *outlived* it, or else if it is drawn (one in [`ADMIT_ONE_IN`], at
//! random). A cell has outlived the asker when it has been idle for
//! longer than the asker went between its last two pins, and for at
//! least as many ticks as the buffer has cells (`Builder::hit_cells`):
//! a cell used within that many ticks (that many uses, for one thread)
//! is one an LRU of that many cells would keep. So a new set of keys
//! pinned over and over takes the cells of keys no longer used at its
//! second pin through the shard, while keys pinned in a cycle longer than
//! the budget, each idle for less than its cycle, do not take each
//! other's: with every asker admitted, such keys retire each cell before
//! its next hit (as in any LRU), so every pin pays for a cell given and
//! one retired and none is a hit; drawn, the cells stay with the keys
//! that got them for many cycles and take their share of the hits. An
//! asker looks at the first [`LOOK_AHEAD`] cells of the queue only.
//!
//! Which cell goes is decided by a queue of the cells given, oldest first,
//! each with its `last_use` when it was queued: a cell released since
//! (its `last_use` changed: ticks of different threads' releases are not
//! ordered, so it is compared for a change, not for being newer) is
//! queued again rather than retired, and so is one pinned now. A cell
//! just given counts as not released since, so if every other cell was,
//! it is the one to go: a key drawn while all the others are in use does
//! not push one of them out. A cell taken back for another reason (its
//! value left memory, its entry went) leaves a stale place in the queue,
//! skipped when it comes up and dropped when stale places outnumber live
//! ones.

use super::Shard;
use crate::buffer::cell::CellRef;
use crate::buffer::pinned::PinAt;
use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::Arc;

/// A queued cell: its entry's slot, the cell, which gift of its place it
/// was, and its `last_use` when queued.
struct Queued<K, V> {
    slot: u32,
    cell: CellRef<K, V>,
    gen: u64,
    last_use: u64,
}

/// Once a shard is at its budget, one in this many entries that ask for a
/// cell get one, unless the cell to go has outlived them (see the module
/// docs).
const ADMIT_ONE_IN: u64 = 16;

/// How many places of the queue an asker looks at for the cell to go.
const LOOK_AHEAD: usize = 4;

/// The cells a shard gave, oldest first (see the module docs).
pub(crate) struct Retire<K, V> {
    /// Entries with a cell.
    count: usize,
    queue: VecDeque<Queued<K, V>>,
    /// State of the draws that pick who gets a cell at the budget
    /// (xorshift: never 0). A fixed seed, so a single-threaded caller gets
    /// the same cells run after run.
    draw: u64,
    /// Cells retired so far.
    retired: u64,
}

impl<K, V> Default for Retire<K, V> {
    fn default() -> Self {
        Retire {
            count: 0,
            queue: VecDeque::new(),
            draw: 0x9E37_79B9_7F4A_7C15,
            retired: 0,
        }
    }
}

impl<K, V> Retire<K, V> {
    /// Whether an entry asking for a cell while the shard is at its budget
    /// gets one: true once in [`ADMIT_ONE_IN`] draws.
    fn admit(&mut self) -> bool {
        let mut x = self.draw;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.draw = x;
        x % ADMIT_ONE_IN == 0
    }

    /// Entries with a cell.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Entries with a cell, and cells retired so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.count as u64, self.retired)
    }
}

impl<K: Hash + Eq + Clone, V> Shard<K, V> {
    /// Whether `q` is still the cell of its slot's entry.
    fn current(&self, q: &Queued<K, V>) -> bool {
        match self.slab.get(q.slot as usize) {
            Some(Some(n)) if n.celled() => {}
            _ => return false,
        }
        self.cell(q.slot)
            .is_some_and(|cell| cell.same(&q.cell) && cell.gen() == q.gen)
    }

    /// Give `idx` (resident, about to be linked at `tick`) a hit cell if it
    /// has none and was pinned before, and, should the shard be at its
    /// budget, if a cell has outlived it or it is drawn: the next hits on
    /// it take no lock.
    /// [`Shard::trim_cells`] then keeps the shard within its budget.
    pub(super) fn give_cell(&mut self, idx: u32, tick: u64) {
        if self.cells.budget == 0 || self.node(idx).celled() {
            return;
        }
        if !self.node_mut(idx).mark_pinned() {
            return;
        }
        if self.retire.count >= self.cells.budget {
            let reuse = tick.saturating_sub(self.node(idx).tick);
            if !self.outlived(tick, reuse) && !self.retire.admit() {
                return;
            }
        }
        let n = self.node(idx);
        let Some(value) = n.state().value() else {
            return;
        };
        let at = PinAt {
            shard: self.cells.shard,
            slot: idx,
            version: n.version,
        };
        let cell = self.cells.index.give(n.key.clone(), Arc::clone(value), at);
        self.node_mut(idx).set_celled(true);
        self.retire.count += 1;
        self.retire.queue.push_back(Queued {
            slot: idx,
            cell,
            gen: cell.gen(),
            last_use: tick,
        });
    }

    /// Whether one of the first [`LOOK_AHEAD`] cells of the queue, not
    /// pinned now, has been idle at `now` for longer than `reuse` (how
    /// long the asker went between its last two pins) and for at least
    /// the buffer's budget of ticks. That cell is then marked as not
    /// released since queued, so that [`Shard::trim_cells`] retires it,
    /// or an older idle one, rather than the cell about to be given.
    fn outlived(&mut self, now: u64, reuse: u64) -> bool {
        for i in 0..self.retire.queue.len().min(LOOK_AHEAD) {
            let q = &self.retire.queue[i];
            // The cheap test first: most asks find cells in use.
            let used = q.cell.last_use();
            let idle = now.saturating_sub(used);
            if idle <= reuse || idle < self.cells.total {
                continue;
            }
            if q.cell.pins() == 0 && self.current(q) {
                self.retire.queue[i].last_use = used;
                return true;
            }
        }
        false
    }

    /// `idx`'s value is leaving memory, or the entry the index, or its
    /// cell is retired: its cell (closed) leaves the index. Its handle on
    /// the value goes now if no pin holds it, else when the lease ends
    /// (`lease_ended`). The entry still holds the value, so this is never
    /// the last handle.
    pub(super) fn drop_cell(&mut self, idx: u32) {
        let Some(cell) = self.cell(idx) else { return };
        self.cells.index.withdraw(cell);
        self.node_mut(idx).set_celled(false);
        self.retire.count -= 1;
    }

    /// Retire cells, oldest first, until the shard is within its budget:
    /// one released since it was queued is queued again, and so is one
    /// pinned now. Gives up after going twice round the queue (every cell
    /// hit or pinned meanwhile): the next call goes on.
    pub(super) fn trim_cells(&mut self) {
        let mut tries = 2 * self.retire.queue.len();
        while self.retire.count > self.cells.budget && tries > 0 {
            tries -= 1;
            let Some(mut q) = self.retire.queue.pop_front() else {
                break;
            };
            if !self.current(&q) {
                continue;
            }
            let used = q.cell.last_use();
            if used != q.last_use || !q.cell.retire() {
                q.last_use = used;
                self.retire.queue.push_back(q);
                continue;
            }
            self.drop_cell(q.slot);
            self.retire.retired += 1;
        }
        let live = self.retire.count;
        if self.retire.queue.len() > 2 * live + 64 {
            let mut queue = std::mem::take(&mut self.retire.queue);
            queue.retain(|q| self.current(q));
            self.retire.queue = queue;
        }
    }
}
