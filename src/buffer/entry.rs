//! An entry of the index and its state machine: the [`State`] enum, the
//! [`Node`] that holds it, and one method per row of the transition table
//! in docs/design.md. Each transition returns the [`Delta`] it makes to the
//! memory gauges; the shard adds them up and the buffer applies them
//! before the shard lock is released. Nothing else writes an entry's state
//! or a gauge, so a new state or gauge is added here, in one place.
//!
//! No method here does IO, takes a lock or drops a value: values that
//! leave the entry are handed back to the caller, who lets go of them
//! after unlocking.

use crate::buffer::accounting::Delta;
use crate::buffer::detached::{Detached, Removed};
use crate::buffer::pinned::Waiter;
use crate::store::compact::Relocated;
use crate::store::DiskLoc;
use crate::sync::Arc;

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

    #[cfg(any(test, feature = "testing"))]
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

pub(crate) const NIL: u32 = u32::MAX;

/// The host consumed it: when the last pin goes, it is first in line.
const CONSUMED: u8 = 1;
/// Its encode failed: resident-dirty but on no list, so eviction does not
/// try it again until the host asks (`retry_spill`) or replaces it.
const SET_ASIDE: u8 = 2;

/// The two eviction lists: entries with a valid disk copy (dropping them
/// costs no IO) and entries without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    Clean = 0,
    Dirty = 1,
}

/// An entry: its key, its state and its pins, and its links on an LRU
/// list. The link fields belong to `buffer::lru`; they are flat here
/// rather than a struct of their own because padding would make every
/// entry eight bytes larger.
pub(crate) struct Node<K, V> {
    pub key: K,
    state: State<V>,
    pub weight: usize,
    /// Unique per insert across the buffer; IO results and pins carry it so
    /// that they never act on a newer value of the same key.
    pub version: u64,
    /// Pins the shard counts: taken under the write lock, plus one for a
    /// lease of its hit pins (see [`crate::buffer::hit`]).
    pins: u32,
    /// [`CONSUMED`], [`SET_ASIDE`]: one byte, so that the node stays 96
    /// bytes.
    flags: u8,
    pub(super) tick: u64,
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) list: Option<ListKind>,
}

/// What the last unpin of an entry asks for.
pub(crate) enum Unpinned<V> {
    /// Other pins remain, or the value is not resident: nothing.
    Nothing,
    /// The value is resident and evictable: link it on `kind`, at the
    /// back (first to go) if `first_out`, else as most recently used.
    Link { kind: ListKind, first_out: bool },
    /// Clean and done with (consumed, or heavier than the target): the
    /// value was dropped from the entry, which is now on disk.
    Freed(Arc<V>),
}

/// What evicting a resident entry did.
pub(crate) enum Evicted<V> {
    /// Clean: the value left the entry, which is now on disk.
    Dropped(Arc<V>),
    /// Dirty: the entry is spilling; the value must be written.
    Write(Arc<V>),
}

impl<K, V> Node<K, V> {
    /// (absent) → resident-dirty, or → spilling for a value heavier than
    /// the target (`oversized`), which is written at once.
    pub(crate) fn inserted(
        key: K,
        value: Arc<V>,
        weight: usize,
        version: u64,
        oversized: bool,
    ) -> (Self, Delta) {
        let w = weight as isize;
        let (state, delta) = if oversized {
            let d = Delta {
                spilling: w,
                ..Delta::enter(w)
            };
            (State::Spilling { value }, d)
        } else {
            (State::Resident { value, disk: None }, Delta::enter(w))
        };
        let node = Node::with_state(key, state, weight, version);
        let d = Delta {
            len: 1,
            live_weight: w,
            ..delta
        };
        (node, d)
    }

    /// (absent) → on-disk: a record received from another buffer
    /// (`insert_record`), already written as it came; nothing enters
    /// memory. Readers that waited on the read of the value it replaces
    /// (`waiters`) wait on this record instead: → unspilling, and the
    /// caller starts its read.
    pub(crate) fn received(
        key: K,
        loc: DiskLoc,
        weight: usize,
        version: u64,
        waiters: Vec<Waiter<V>>,
    ) -> (Self, Delta) {
        let state = if waiters.is_empty() {
            State::OnDisk { loc }
        } else {
            State::Unspilling {
                loc,
                waiters: Box::new(waiters),
                prefetch: false,
            }
        };
        let node = Node::with_state(key, state, weight, version);
        (
            node,
            Delta {
                len: 1,
                live_weight: weight as isize,
                ..Delta::ZERO
            },
        )
    }

    pub(crate) fn with_state(key: K, state: State<V>, weight: usize, version: u64) -> Self {
        Node {
            key,
            state,
            weight,
            version,
            pins: 0,
            flags: 0,
            tick: 0,
            prev: NIL,
            next: NIL,
            list: None,
        }
    }

    pub(crate) fn state(&self) -> &State<V> {
        &self.state
    }

    pub(crate) fn pins(&self) -> u32 {
        self.pins
    }

    pub(crate) fn consumed(&self) -> bool {
        self.flags & CONSUMED != 0
    }

    pub(crate) fn set_aside(&self) -> bool {
        self.flags & SET_ASIDE != 0
    }

    /// A pin under the read lock used it after it was consumed: no longer
    /// first in line.
    pub(crate) fn used_again(&mut self) {
        self.set_flag(CONSUMED, false);
    }

    /// Consumed by a holder of a pin taken under the read lock, while other
    /// pins remain: the last of them puts it first in line.
    pub(crate) fn mark_consumed(&mut self) {
        self.set_flag(CONSUMED, true);
    }

    fn set_flag(&mut self, flag: u8, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }

    fn w(&self) -> isize {
        self.weight as isize
    }

    fn is_spilling(&self) -> bool {
        matches!(self.state, State::Spilling { .. })
    }

    #[cfg(any(test, feature = "testing"))]
    /// The list this entry belongs on: resident and unpinned ones only.
    pub(crate) fn wanted_list(&self) -> Option<ListKind> {
        match &self.state {
            State::Resident { disk: Some(_), .. } if self.pins == 0 => Some(ListKind::Clean),
            State::Resident { disk: None, .. } if self.pins == 0 && !self.set_aside() => {
                Some(ListKind::Dirty)
            }
            _ => None,
        }
    }

    /// Move to `next`, handing back the old state. Each transition
    /// rebuilds the state from the parts of the old one it keeps.
    fn swap(&mut self, next: State<V>) -> State<V> {
        std::mem::replace(&mut self.state, next)
    }

    /// A pin of a value in memory (resident or spilling). The caller has
    /// checked `state().value()`; the entry leaves its list.
    pub(crate) fn pin(&mut self) -> Delta {
        self.pins += 1;
        self.set_flag(CONSUMED, false);
        if self.pins > 1 {
            return Delta::ZERO;
        }
        Delta {
            pinned: self.w(),
            pinned_spilling: if self.is_spilling() { self.w() } else { 0 },
            ..Delta::ZERO
        }
    }

    /// One more pin of an entry already pinned (a guard cloned).
    pub(crate) fn repin(&mut self) {
        if self.pins > 0 {
            self.pins += 1;
        }
    }

    /// A pin released. The last one of a clean entry that is `consumed`
    /// (or `consume`d now) or heavier than `target` drops the value
    /// (resident-clean → on-disk); otherwise a resident value goes back on
    /// its list.
    pub(crate) fn unpin(&mut self, consume: bool, target: usize) -> (Unpinned<V>, Delta) {
        if self.pins == 0 {
            return (Unpinned::Nothing, Delta::ZERO);
        }
        self.pins -= 1;
        if consume {
            self.set_flag(CONSUMED, true);
        }
        if self.pins > 0 {
            return (Unpinned::Nothing, Delta::ZERO);
        }
        let unpinned = Delta {
            pinned: -self.w(),
            pinned_spilling: if self.is_spilling() { -self.w() } else { 0 },
            ..Delta::ZERO
        };
        let free_now = self.consumed() || self.weight > target;
        let next = match &self.state {
            State::Resident {
                disk: Some(loc), ..
            } if free_now => {
                let (value, d) = self.drop_clean(*loc);
                return (Unpinned::Freed(value), unpinned.plus(d));
            }
            // Set aside: on no list until retried.
            State::Resident { disk: None, .. } if self.set_aside() => Unpinned::Nothing,
            State::Resident { disk, .. } => Unpinned::Link {
                kind: if disk.is_some() {
                    ListKind::Clean
                } else {
                    ListKind::Dirty
                },
                first_out: self.consumed(),
            },
            _ => Unpinned::Nothing,
        };
        (next, unpinned)
    }

    /// resident-clean → on-disk: the value leaves memory, no IO.
    /// The caller has matched the state as resident-clean with record
    /// `loc`.
    fn drop_clean(&mut self, loc: DiskLoc) -> (Arc<V>, Delta) {
        let State::Resident { value, .. } = self.swap(State::OnDisk { loc }) else {
            unreachable_state("drop_clean")
        };
        (value, Delta::leave(self.w()))
    }

    /// Eviction of an unpinned resident entry: resident-clean → on-disk
    /// (the value is dropped), resident-dirty → spilling (the value must be
    /// written). `None` for any other state (lists hold only resident
    /// entries; validate() checks it).
    pub(crate) fn evict(&mut self) -> Option<(Evicted<V>, Delta)> {
        match &self.state {
            State::Resident {
                disk: Some(loc), ..
            } => {
                let (value, d) = self.drop_clean(*loc);
                Some((Evicted::Dropped(value), d))
            }
            State::Resident { value, disk: None } => {
                let value = Arc::clone(value);
                self.state = State::Spilling {
                    value: Arc::clone(&value),
                };
                let d = Delta {
                    spilling: self.w(),
                    ..Delta::ZERO
                };
                Some((Evicted::Write(value), d))
            }
            _ => None,
        }
    }

    /// Its write finished at `loc`: spilling → on-disk, handing back the
    /// value to drop; or, pinned meanwhile, spilling → resident-clean.
    pub(crate) fn spill_done(&mut self, loc: DiskLoc) -> (Option<Arc<V>>, Delta) {
        let State::Spilling { value } = &self.state else {
            return (None, Delta::ZERO);
        };
        let value = Arc::clone(value);
        let written = Delta {
            spilling: -self.w(),
            pinned_spilling: if self.pins > 0 { -self.w() } else { 0 },
            ..Delta::ZERO
        };
        if self.pins > 0 {
            self.state = State::Resident {
                value,
                disk: Some(loc),
            };
            return (None, written);
        }
        self.state = State::OnDisk { loc };
        (Some(value), written.plus(Delta::leave(self.w())))
    }

    /// Its write failed: spilling → resident-dirty, the value kept. The
    /// caller relinks it as most recently used when unpinned, unless it is
    /// `set_aside` (its encode failed: trying it again cannot succeed
    /// until the value or the host's codec changes).
    pub(crate) fn spill_failed(&mut self, set_aside: bool) -> Delta {
        let State::Spilling { value } = &self.state else {
            return Delta::ZERO;
        };
        self.state = State::Resident {
            value: Arc::clone(value),
            disk: None,
        };
        self.set_flag(SET_ASIDE, set_aside);
        Delta {
            spilling: -self.w(),
            pinned_spilling: if self.pins > 0 { -self.w() } else { 0 },
            set_aside: if set_aside { self.w() } else { 0 },
            ..Delta::ZERO
        }
    }

    /// A set-aside entry becomes a candidate for eviction again. Returns
    /// whether it was set aside; the caller links it when unpinned.
    pub(crate) fn retry_spill(&mut self) -> (bool, Delta) {
        if !self.set_aside() {
            return (false, Delta::ZERO);
        }
        self.set_flag(SET_ASIDE, false);
        let d = Delta {
            set_aside: -self.w(),
            ..Delta::ZERO
        };
        (true, d)
    }

    /// A demand read: on-disk → unspilling with `waiter`, returning the
    /// record to read; or `waiter` joins the read in flight (`None`). The
    /// waiter comes back when the value is in memory (the caller pins it).
    pub(crate) fn start_read(&mut self, waiter: Waiter<V>) -> Result<Option<DiskLoc>, Waiter<V>> {
        match &mut self.state {
            State::OnDisk { loc } => {
                let loc = *loc;
                self.state = State::Unspilling {
                    loc,
                    waiters: Box::new(vec![waiter]),
                    prefetch: false,
                };
                Ok(Some(loc))
            }
            State::Unspilling { waiters, .. } => {
                waiters.push(waiter);
                Ok(None)
            }
            _ => Err(waiter),
        }
    }

    /// A prefetch read: on-disk → unspilling, its weight reserved. The
    /// caller has checked that the reservation fits.
    pub(crate) fn start_prefetch(&mut self) -> Option<(DiskLoc, Delta)> {
        let State::OnDisk { loc } = self.state else {
            return None;
        };
        self.state = State::Unspilling {
            loc,
            waiters: Box::default(),
            prefetch: true,
        };
        Some((
            loc,
            Delta {
                reserved: self.w(),
                ..Delta::ZERO
            },
        ))
    }

    /// The read finished: unspilling → resident-clean with `value` (when
    /// given: the caller passes `None` for a failed read, or for a
    /// prefetch of a value it will not keep), else back to on-disk. Hands
    /// back the waiters and whether it was a prefetch.
    pub(crate) fn read_done(&mut self, value: Option<Arc<V>>) -> (Vec<Waiter<V>>, bool, Delta) {
        let State::Unspilling { loc, .. } = self.state else {
            return (Vec::new(), false, Delta::ZERO);
        };
        let next = match value {
            Some(value) => State::Resident {
                value,
                disk: Some(loc),
            },
            None => State::OnDisk { loc },
        };
        let kept = matches!(next, State::Resident { .. });
        let State::Unspilling {
            waiters, prefetch, ..
        } = self.swap(next)
        else {
            unreachable_state("read_done")
        };
        let mut d = Delta::ZERO;
        if kept {
            d = d.plus(Delta::enter(self.w()));
        }
        if prefetch {
            d.reserved = -self.w();
        }
        (*waiters, prefetch, d)
    }

    /// Would the read now in flight be a prefetch with no waiter?
    pub(crate) fn reading_for_nobody(&self) -> bool {
        matches!(&self.state, State::Unspilling { waiters, .. } if waiters.is_empty())
    }

    /// Compaction copied the record at `old` to `new`: point at the copy
    /// if the entry still owns `old` and no read of it is in flight.
    pub(crate) fn relocate(&mut self, old: DiskLoc, new: DiskLoc) -> Relocated {
        match &mut self.state {
            State::Resident { disk: Some(l), .. } | State::OnDisk { loc: l } if *l == old => {
                *l = new;
                Relocated::Moved
            }
            State::Unspilling { loc, .. } if *loc == old => Relocated::Busy,
            _ => Relocated::Stale,
        }
    }

    /// Any state → (absent): the entry leaves the index. A value in
    /// memory that a pin or a write still holds becomes [`Detached`] and
    /// stays counted (in `detached`, no longer in `resident`) until they
    /// let it go; otherwise it is handed back to drop. Also hands back the
    /// record to release and the readers waiting on it (to answer).
    pub(crate) fn removed(self) -> (Removed<V>, Delta) {
        let w = self.w();
        let mut d = Delta {
            len: -1,
            live_weight: -w,
            set_aside: if self.set_aside() { -w } else { 0 },
            ..Delta::ZERO
        };
        let disk = self.state.disk();
        let pinned = self.pins > 0;
        let mut out = Removed {
            disk,
            drop: None,
            waiters: Vec::new(),
            detached: None,
        };
        match self.state {
            State::Resident { value, .. } => {
                d = d.plus(Delta::leave(w));
                if pinned {
                    d.pinned = -w;
                    out.detached = Some(Detached::new(value, self.weight, self.pins, false));
                } else {
                    out.drop = Some(value);
                }
            }
            State::Spilling { value } => {
                // Its write is queued or running, and holds the value until
                // it reports (`Detached::write_ended`).
                d = d.plus(Delta::leave(w));
                d.spilling = -w;
                if pinned {
                    d.pinned = -w;
                    d.pinned_spilling = -w;
                }
                out.detached = Some(Detached::new(value, self.weight, self.pins, true));
            }
            State::Unspilling {
                waiters, prefetch, ..
            } => {
                if prefetch {
                    d.reserved = -w;
                }
                out.waiters = *waiters;
            }
            State::OnDisk { .. } => {}
        }
        if let Some(det) = &out.detached {
            d = d.plus(det.entered());
        }
        (out, d)
    }
}

/// A transition was asked of a state that does not have it: a bug in the
/// buffer, which the state machine tests and `validate()` are there to
/// catch. Kept in one place rather than an `unreachable!` per call site.
#[cold]
fn unreachable_state(transition: &str) -> ! {
    unreachable!("{transition} on an entry in the wrong state")
}

#[cfg(test)]
mod tests;
