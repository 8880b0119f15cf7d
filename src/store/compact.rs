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
//! Job ([`Store::compact`]): each live record is read, checked, copied to
//! the open segment, and its entry switched to the copy by the caller's
//! `relocate` (under the entry's shard lock); readers keep using the old
//! copy until then, and a record with a read in flight is retried later.

use super::scratch::with_scratch;
use super::{DiskLoc, Segment, Segments, Store};
use std::fmt::Debug;

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
        seg.sealed && (seg.live as f64) < self.cfg.compact_below * seg.end as f64
    }

    /// Segment `id` was just sealed, or lost a record: queue it for
    /// compaction if sparse and the store is over its bound, else remember
    /// it; when over the bound, take up a deferred one. Under the store's
    /// lock, O(1) amortised.
    pub(super) fn consider(&self, g: &mut Segments<K>, id: u32) {
        let over_bound = self.over_bound();
        if let Some(seg) = g.segs.get_mut(&id) {
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
                if !s.compacting && (s.live as f64) < self.cfg.compact_below * s.end as f64 {
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

    /// Rewrite the live records of sparse segment `seg` elsewhere;
    /// `relocate(key, old, new)` switches the key's entry to the copy.
    /// Runs on the IO pool.
    pub(crate) fn compact(
        &self,
        seg: u32,
        relocate: impl Fn(&K, DiskLoc, DiskLoc) -> Relocated,
    ) -> Compacted {
        let mut out = Compacted {
            moved: 0,
            retry: false,
        };
        for (old, key) in self.live_records(seg) {
            let copy = with_scratch(|sc| {
                self.read_checked(&key, old, &mut sc.a)?;
                self.write(&key, &sc.a)
            });
            let new = match copy {
                Ok(new) => new,
                Err(e) => {
                    tracing::warn!(segment = seg, error = %e, "compaction stopped");
                    break;
                }
            };
            let dead = match relocate(&key, old, new) {
                Relocated::Moved => {
                    out.moved += 1;
                    old
                }
                Relocated::Busy => {
                    out.retry = true;
                    new
                }
                Relocated::Stale => new,
            };
            if let Some(d) = self.release(dead) {
                self.delete(d);
            }
        }
        if let Some(s) = self.inner.lock().segs.get_mut(&seg) {
            s.compacting = false;
        }
        out
    }
}
