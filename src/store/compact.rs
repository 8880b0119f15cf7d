//! Compaction, policy and job: which sealed segments are rewritten, and
//! the rewrite itself.
//!
//! Policy: a sealed segment whose live bytes fall below `compact_below` of
//! its size is *sparse*. Compaction copies records that may be about to die
//! anyway (a host draining its keys in order leaves one partly drained
//! segment at a time, and copying its rest is pure write amplification),
//! so a sparse segment is compacted only while the store as a whole passes
//! the bound the builder promises: file space within live /
//! `compact_below` plus the open segments. One found sparse before that is
//! deferred and taken up once the bound is passed.
//!
//! Requests go to one queue ([`Store::take_compaction_requests`]), filled
//! when a segment is sealed or a record released, and drained by the
//! buffer after every write and every release.
//!
//! A full disk changes the policy: copying needs free space, and with every
//! segment holding a live record there is none to be had by copying. While
//! a write has failed for lack of space, any segment (the open one too)
//! with [`PUNCH_MIN`] more dead bytes than at its last pass is queued, and
//! its dead ranges are punched out of the file (`fallocate` with
//! `FALLOC_FL_PUNCH_HOLE`), which needs no space at all.
//!
//! Job ([`Store::compact`]), in up to three steps:
//!
//! 1. Punch, on a full disk only: the [`PUNCH_BLOCK`]-aligned insides of
//!    the ranges between live records are given back to the file system.
//! 2. Copy, if the segment is still sparse (counting what it occupies, so
//!    after its holes) and the disk is not full: each live record is read,
//!    checked, copied to the open segment, and its entry switched to the
//!    copy by the caller's `relocate` (under the entry's shard lock);
//!    readers keep using the old copy until then, and a record with a read
//!    in flight is retried later. A copy that finds the disk full stops,
//!    and the segment waits (`stalled`) until space comes back.
//! 3. Pack in place, if the segment is sparse and the disk full: records
//!    are moved down into dead bytes of their own file (which needs no new
//!    space), and the tail left behind them is punched (step 1 again).
//!    This is what frees space when records are smaller than a block and
//!    no dead range holds a whole one.

use super::scratch::with_scratch;
use super::storage::PUNCH_BLOCK;
use super::{DiskLoc, Segment, Segments, Store};
use crate::error::Error;
use std::fmt::Debug;
use std::sync::atomic::Ordering::Relaxed;

/// While the disk is full, a segment is punched again once this many more
/// of its bytes have died (or a quarter of a segment, if less).
const PUNCH_MIN: u64 = 64 << 10;

/// What switching an entry to the copy of its record found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Relocated {
    /// The entry now points at the copy; the old record is dead.
    Moved,
    /// A read of the old record is in flight: try later.
    Busy,
    /// The entry no longer owns that record: the copy is dead.
    Stale,
}

/// The outcome of one compaction pass over a segment.
pub(crate) struct Compacted {
    /// Records moved to copies.
    pub moved: u64,
    /// Some record had a read in flight: compact the segment again later.
    pub retry: bool,
    /// A transfer held the segment while it wanted packing or punching:
    /// it is compacted again once the last hold goes ([`Store::hold`]),
    /// not before, however long the transfer waits on its peer.
    pub held: bool,
}

impl<K: Clone + Debug> Store<K> {
    /// Does file space pass the bound the builder promises: live bytes /
    /// `compact_below`, plus one open segment per directory?
    pub(super) fn over_bound(&self) -> bool {
        (self.file_bytes() as f64)
            > self.disk_bytes() as f64 / self.cfg.compact_below.max(f64::MIN_POSITIVE)
                + (self.dirs.len() as u64 * self.cfg.segment_size) as f64
    }

    fn is_sparse(&self, seg: &Segment<K>) -> bool {
        seg.sealed && self.sparse_at(seg.live, seg.end - seg.punched)
    }

    /// Is `live` of `occupied` bytes below the compaction threshold?
    fn sparse_at(&self, live: u64, occupied: u64) -> bool {
        (live as f64) < self.cfg.compact_below * occupied as f64
    }

    /// The disk is full and enough of `seg` has died since its last punch
    /// to be worth another.
    fn wants_punch(&self, seg: &Segment<K>) -> bool {
        let min = PUNCH_MIN.min(self.cfg.segment_size / 4).max(PUNCH_BLOCK);
        self.disk_full.load(Relaxed)
            && self.punch_ok.load(Relaxed)
            && (seg.end - seg.live).saturating_sub(seg.dead_seen) >= min
    }

    /// Segment `id` was just sealed, or lost a record: queue it for
    /// compaction if sparse and the store is over its bound, else remember
    /// it; when over the bound, take up a deferred one. Under the store's
    /// lock, O(1) amortised.
    pub(super) fn consider(&self, g: &mut Segments<K>, id: u32) {
        let over_bound = self.over_bound();
        if let Some(seg) = g.segs.get_mut(&id) {
            if !seg.compacting && self.wants_punch(seg) {
                seg.compacting = true;
                g.to_compact.push(id);
                return;
            }
            if !seg.compacting && self.is_sparse(seg) {
                if over_bound {
                    seg.compacting = true;
                    g.to_compact.push(id);
                    return;
                }
                if !seg.deferred {
                    seg.deferred = true;
                    g.deferred.push(id);
                    // Ids of segments that died while deferred are dropped
                    // now and then, so the list stays within twice the
                    // live segments.
                    if g.deferred.len() > 2 * g.segs.len() + 16 {
                        let segs = &g.segs;
                        g.deferred.retain(|id| segs.contains_key(id));
                    }
                }
            }
        }
        if over_bound {
            // Each deferred id is popped once: O(1) amortised.
            while let Some(d) = g.deferred.pop() {
                let Some(s) = g.segs.get_mut(&d) else {
                    continue;
                };
                s.deferred = false;
                if !s.compacting && self.sparse_at(s.live, s.end - s.punched) {
                    s.compacting = true;
                    g.to_compact.push(d);
                    return;
                }
            }
        }
    }

    /// The segments waiting to be compacted (the one request queue).
    pub(crate) fn take_compaction_requests(&self) -> Vec<u32> {
        let mut g = self.inner.lock();
        if g.to_compact.is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut g.to_compact)
    }

    /// The live records of a segment being compacted: (location, key).
    pub(crate) fn live_records(&self, seg: u32) -> Vec<(DiskLoc, K)> {
        let g = self.inner.lock();
        let Some(s) = g.segs.get(&seg) else {
            return Vec::new();
        };
        let mut v: Vec<_> = s
            .records
            .iter()
            .map(|(&offset, (len, key))| (DiskLoc::new(seg, offset, *len), key.clone()))
            .collect();
        v.sort_by_key(|(loc, _)| loc.offset);
        v
    }

    /// Reclaim the dead space of segment `seg`: punch holes where that is
    /// called for, then rewrite its live records elsewhere if it is still
    /// sparse; `relocate(key, old, new)` switches the key's entry to the
    /// copy. Runs on the IO pool.
    pub(crate) fn compact(
        &self,
        seg: u32,
        relocate: impl Fn(&K, DiskLoc, DiskLoc) -> Relocated,
    ) -> Compacted {
        let mut out = Compacted {
            moved: 0,
            retry: false,
            held: false,
        };
        if self.punch(seg).is_none() {
            out.held = true;
        }
        let sparse = {
            let g = self.inner.lock();
            g.segs.get(&seg).is_some_and(|s| self.is_sparse(s))
        };
        if sparse && !self.disk_full.load(Relaxed) {
            self.copy_out(seg, &relocate, &mut out);
        }
        if sparse && self.disk_full.load(Relaxed) {
            // No room to copy into: pack the records towards the start of
            // their own file, then give back what is left behind them.
            self.slide(seg, &relocate, &mut out);
            if self.punch(seg).is_none() {
                out.held = true;
            }
        }
        let mut g = self.inner.lock();
        if let Some(s) = g.segs.get_mut(&seg) {
            if out.held && s.held > 0 && !out.retry {
                // Still marked compacting; the last hold's drop queues it.
                s.after_hold = true;
            } else if out.retry || out.held {
                // Still marked compacting, and queued again: a second pass
                // must not start beside this one (two passes sliding one
                // file would each write over what the other moved).
                g.to_compact.push(seg);
            } else {
                s.compacting = false;
            }
        }
        out
    }

    /// Step 2: copy the live records of `seg` elsewhere.
    fn copy_out(
        &self,
        seg: u32,
        relocate: &impl Fn(&K, DiskLoc, DiskLoc) -> Relocated,
        out: &mut Compacted,
    ) {
        for (old, key) in self.live_records(seg) {
            match self.move_record(&key, old, relocate, out, |rec| self.write_copy(&key, rec)) {
                Ok(_) => {}
                Err(Error::DiskFull { .. }) => {
                    // Try again when space comes back.
                    let mut g = self.inner.lock();
                    if g.segs.contains_key(&seg) {
                        g.stalled.push(seg);
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(segment = seg, error = %e, "compaction stopped");
                    return;
                }
            }
        }
    }

    /// Compaction in place, for a full disk: move each live record of
    /// sealed segment `seg` down into the dead bytes before it, in offset
    /// order, so that the dead space gathers behind the last record, where
    /// [`Store::punch`] gives it back. Writing over dead bytes of a file
    /// needs no new space (holes, which would, are skipped). A record is
    /// moved only to a range wholly below it, so no live byte is ever
    /// overwritten; readers of a record keep its old copy until `relocate`
    /// switches the entry, as with any compaction.
    fn slide(
        &self,
        seg: u32,
        relocate: &impl Fn(&K, DiskLoc, DiskLoc) -> Relocated,
        out: &mut Compacted,
    ) {
        let holes = {
            let g = self.inner.lock();
            match g.segs.get(&seg) {
                // Only once every write to it has landed: a range being
                // written looks dead.
                Some(s) if s.sealed && s.writes == 0 => s.holes.clone(),
                _ => return,
            }
        };
        let mut cursor = 0u64;
        for (old, key) in self.live_records(seg) {
            if self.inner.lock().segs.get(&seg).is_some_and(|s| s.held > 0) {
                // A transfer is sending one of its records: pack it later.
                out.held = true;
                return;
            }
            let len = old.len();
            // Skip holes: filling one would need space.
            while let Some(&(_, b)) = holes.iter().find(|&&(a, b)| a < cursor + len && cursor < b) {
                cursor = b;
            }
            if cursor + len > old.offset {
                // No dead range below it is long enough: it stays.
                cursor = cursor.max(old.offset + len);
                continue;
            }
            let to = cursor;
            match self.move_record(&key, old, relocate, out, |rec| {
                self.write_within(seg, to, &key, rec)
            }) {
                Ok(true) => cursor += len,
                // Left where it was: go on behind it.
                Ok(false) => cursor = old.offset + len,
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::ResourceBusy =>
                {
                    // Held since the check above (`write_within`).
                    out.held = true;
                    return;
                }
                Err(e) => {
                    tracing::warn!(segment = seg, error = %e, "compaction in place stopped");
                    return;
                }
            }
        }
    }

    /// Read `key`'s record at `old`, check it, write it with `write` and
    /// switch the entry to the copy. Returns whether it moved (false: the
    /// key is gone, or a read of it is in flight and the copy was dropped).
    fn move_record(
        &self,
        key: &K,
        old: DiskLoc,
        relocate: &impl Fn(&K, DiskLoc, DiskLoc) -> Relocated,
        out: &mut Compacted,
        write: impl FnOnce(&[u8]) -> crate::error::Result<DiskLoc>,
    ) -> crate::error::Result<bool> {
        let copy = with_scratch(|sc| {
            self.read_checked(key, old, &mut sc.a)?;
            write(&sc.a)
        });
        let new = match copy {
            Ok(new) => new,
            // Removed while we read it (its range may have been punched
            // since): nothing to copy.
            Err(_) if self.record_gone(old) => return Ok(false),
            Err(e) => return Err(e),
        };
        let (dead, moved) = match relocate(key, old, new) {
            Relocated::Moved => {
                out.moved += 1;
                (old, true)
            }
            Relocated::Busy => {
                out.retry = true;
                (new, false)
            }
            Relocated::Stale => (new, false),
        };
        if let Some(d) = self.release(dead) {
            self.delete(d);
        }
        Ok(moved)
    }

    /// Is the record at `loc` no longer live?
    fn record_gone(&self, loc: DiskLoc) -> bool {
        let g = self.inner.lock();
        g.segs
            .get(&loc.seg)
            .is_none_or(|s| !s.records.contains_key(&loc.offset))
    }

    /// Step 1: punch the dead ranges of `seg` out of its file, if the disk
    /// is full. Returns the bytes given back, or `None` if the segment was
    /// passed over because a transfer holds it.
    ///
    /// Only then: with space to spare, copying the live records out and
    /// deleting the file frees as much or more (no block half-used by a
    /// live record stays) in no more time: ext4 journals each punch, so a
    /// segment of many small dead records takes far longer to punch than
    /// to copy out.
    fn punch(&self, seg: u32) -> Option<u64> {
        if !self.punch_ok.load(Relaxed) || !self.disk_full.load(Relaxed) {
            return Some(0);
        }
        // A snapshot under the lock; the ranges it finds dead stay dead (a
        // segment only grows at its end, and no write is in flight below
        // `end`), so they can be punched after the lock is released.
        let (file, mut live, end, old_holes, punched) = {
            let g = self.inner.lock();
            let Some(s) = g.segs.get(&seg) else {
                return Some(0);
            };
            if s.held > 0 {
                // Its dead ranges may hold a record a transfer is sending.
                return None;
            }
            if s.writes > 0 {
                return Some(0);
            }
            let live: Vec<(u64, u64)> = s.records.iter().map(|(&o, &(l, _))| (o, l)).collect();
            (
                std::sync::Arc::clone(&s.file),
                live,
                s.end,
                s.holes.clone(),
                s.punched,
            )
        };
        let dead = end - live.iter().map(|r| r.1).sum::<u64>();
        live.sort_unstable();
        let holes = dead_blocks(&live, end);
        let total: u64 = holes.iter().map(|(a, b)| b - a).sum();
        if total <= punched {
            return Some(0);
        }
        let mut done: Vec<(u64, u64)> = Vec::with_capacity(holes.len());
        for &h in &holes {
            if old_holes.binary_search(&h).is_ok() {
                done.push(h);
                continue;
            }
            match file.punch_hole(h.0, h.1 - h.0) {
                Ok(()) => done.push(h),
                Err(e) => {
                    if e.kind() == std::io::ErrorKind::Unsupported {
                        self.punch_ok.store(false, Relaxed);
                    } else {
                        tracing::warn!(segment = seg, error = %e, "could not punch a hole in a spill segment");
                    }
                    break;
                }
            }
        }
        // Old holes inside a range that could not be punched stay holes.
        for &(a, b) in &old_holes {
            if !done.iter().any(|&(c, d)| c <= a && b <= d) {
                done.push((a, b));
            }
        }
        done.sort_unstable();
        let now: u64 = done.iter().map(|(a, b)| b - a).sum();
        let mut g = self.inner.lock();
        let Some(s) = g.segs.get_mut(&seg) else {
            // Deleted meanwhile: its space is counted as freed already.
            return Some(0);
        };
        let freed = now.saturating_sub(s.punched);
        s.punched = now;
        s.holes = done;
        s.dead_seen = dead;
        self.file_bytes.fetch_sub(freed, Relaxed);
        // The ranges of failed writes held no block the file system gives
        // back: counted as freed, each hole punched over a failed write
        // would tell the buffer that space came back, and on a full disk
        // the retried write would fail into a new range to punch, without
        // end. Taken to be the first bytes a punch covers.
        let failed = freed.min(s.failed);
        s.failed -= failed;
        if freed > failed {
            self.space_freed(&mut g, freed - failed);
        }
        Some(freed)
    }
}

/// The [`PUNCH_BLOCK`]-aligned insides of the gaps between the `live`
/// records (offset, length; sorted) of a segment of `end` bytes.
pub(super) fn dead_blocks(live: &[(u64, u64)], end: u64) -> Vec<(u64, u64)> {
    let down = |x: u64| x / PUNCH_BLOCK * PUNCH_BLOCK;
    let up = |x: u64| x.div_ceil(PUNCH_BLOCK) * PUNCH_BLOCK;
    let mut out = Vec::new();
    let mut from = 0;
    for &(off, len) in live.iter().chain(std::iter::once(&(end, 0))) {
        let (a, b) = (up(from), down(off));
        if a < b {
            out.push((a, b));
        }
        from = off + len;
    }
    out
}
