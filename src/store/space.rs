//! The disk budget (`max_spill`) and the news that space came back: a
//! record released, a file deleted, holes punched, after a write was
//! refused or failed for want of space.

use super::{Segments, Store};
use crate::error::{Error, Result};
use std::fmt::Debug;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

impl<K: Clone + Debug> Store<K> {
    /// Is a record of `len` bytes within the disk budget now?
    pub(crate) fn check_budget(&self, len: u64) -> Result<()> {
        let used = self.reserved.load(Relaxed);
        if used.saturating_add(len) > self.cfg.max_spill {
            self.refused.store(len, Relaxed);
            return Err(Error::DiskBudget {
                budget: self.cfg.max_spill,
                used,
                record: len,
            });
        }
        Ok(())
    }

    pub(super) fn reserve(&self, len: u64) -> Result<()> {
        let max = self.cfg.max_spill;
        self.reserved
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(len).filter(|&n| n <= max)
            })
            .map(|_| ())
            .map_err(|used| {
                self.refused.store(len, Relaxed);
                Error::DiskBudget {
                    budget: max,
                    used,
                    record: len,
                }
            })
    }

    /// Did space come back since the last call, after a write was refused
    /// by `max_spill` or failed on a full disk? True once per return: the
    /// buffer then lets evictions write again at once, rather than at the
    /// end of its back-off.
    pub(crate) fn take_space_returned(&self) -> bool {
        self.space_returned.load(Relaxed) && self.space_returned.swap(false, Relaxed)
    }

    /// A count of the times space came back (as `take_space_returned`
    /// reports it), never reset. A write that failed for lack of space
    /// compares it with its value from before the write: if it moved, the
    /// space came back while the write was failing, and whoever took the
    /// news may have found nothing to write yet.
    pub(crate) fn space_epoch(&self) -> u64 {
        self.space_epoch.load(SeqCst)
    }

    pub(super) fn note_space_returned(&self) {
        self.space_returned.store(true, Relaxed);
        self.space_epoch.fetch_add(1, SeqCst);
    }

    /// `bytes` were freed (a hole punched, a segment deleted), or a write
    /// succeeded (`bytes` 0): a full disk is no longer assumed, and copies
    /// that stopped for lack of space are queued again. The buffer is told
    /// (`take_space_returned`) once a segment's worth (at most 1 MiB) has
    /// been freed since a write first failed for lack of space, not at
    /// every block: each time it is told it tries every value over the
    /// target again. A successful write does not count: it may be
    /// compaction's, which the buffer's back-off knows nothing of.
    pub(super) fn space_freed(&self, g: &mut Segments<K>, bytes: u64) {
        self.disk_full.store(false, Relaxed);
        if bytes > 0 {
            let waiting = self.awaiting_space.fetch_update(Relaxed, Relaxed, |w| {
                (w > 0).then(|| w.saturating_sub(bytes))
            });
            if waiting.is_ok_and(|w| w <= bytes) {
                self.note_space_returned();
            }
        }
        for id in std::mem::take(&mut g.stalled) {
            if let Some(s) = g.segs.get_mut(&id) {
                if !s.compacting {
                    s.compacting = true;
                    g.to_compact.push(id);
                }
            }
        }
    }

    /// A write or a file creation found the file system full: from now on
    /// dead ranges are punched as soon as a segment has enough of them, and
    /// every segment that already has is queued for it now.
    pub(super) fn note_disk_full(&self, g: &mut Segments<K>) {
        if self.disk_full.swap(true, Relaxed) {
            return;
        }
        // Armed once per wait: a failure while already waiting keeps
        // what has been freed so far.
        let _ = self.awaiting_space.compare_exchange(
            0,
            self.cfg.segment_size.clamp(1, 1 << 20),
            Relaxed,
            Relaxed,
        );
        let ids: Vec<u32> = g.segs.keys().copied().collect();
        for id in ids {
            self.consider(g, id);
        }
    }
}
