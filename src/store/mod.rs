//! The slow tier: append-only segment files in the buffer's private
//! sub-directories, holding checksummed records (see [`record`]).
//!
//! Small records are packed into shared segments; a record larger than a
//! segment gets a file of its own. Every segment counts its live bytes:
//! a sealed segment with none left is deleted (on the IO pool), and one that
//! falls below the compaction threshold is handed to compaction, which
//! rewrites its live records elsewhere so that file space stays within a
//! bounded factor of live data.
//!
//! The store owns the bytes end to end: values are encoded, compressed
//! ([`codec`]) and sealed into records by [`put`], read back, checked and
//! decoded by [`get`], through per-thread [`scratch`] buffers; records
//! are placed in segments by [`append`], the disk budget and returning
//! space are tracked by [`space`], and space is reclaimed by [`compact`].
//! The buffer hands it values and locations and never looks inside a
//! record.
//!
//! The store's mutex guards only metadata; file creation, reads and writes
//! happen outside it.

mod append;
pub(crate) mod checksum;
pub(crate) mod codec;
pub(crate) mod compact;
pub(crate) mod dirs;
#[cfg(any(test, feature = "testing"))]
pub mod faulty;
pub(crate) mod get;
pub(crate) mod put;
pub(crate) mod record;
pub(crate) mod scratch;
mod space;
pub(crate) mod spare;
mod stitch;
pub mod storage;
pub(crate) mod transfer;
#[cfg(any(test, feature = "testing"))]
mod validate;

use crate::error::{Error, Result};
use codec::Compression;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Debug;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use storage::{SegmentFile, Storage};

/// Where a record lives. The length is never zero (a record has at least
/// its header), which gives `Option<DiskLoc>` and the entry state a niche:
/// eight bytes less per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskLoc {
    pub seg: u32,
    pub offset: u64,
    len: NonZeroU64,
}

impl DiskLoc {
    pub(crate) fn new(seg: u32, offset: u64, len: u64) -> DiskLoc {
        DiskLoc {
            seg,
            offset,
            // Records are never empty; the fallback only keeps this total.
            len: NonZeroU64::new(len).unwrap_or(NonZeroU64::MIN),
        }
    }

    /// Bytes of the record, header included.
    pub(crate) fn len(&self) -> u64 {
        self.len.get()
    }
}

/// A segment that holds no live record any more; deleting its file is left
/// to the IO pool ([`Store::delete`]).
pub(crate) struct DeadSegment {
    path: PathBuf,
    /// Bytes the file occupies.
    occupied: u64,
    _file: Arc<dyn SegmentFile>,
}

struct Segment<K> {
    file: Arc<dyn SegmentFile>,
    path: PathBuf,
    dir: usize,
    /// Bytes allocated in the file (written or being written).
    end: u64,
    live: u64,
    /// Bytes of `0..end` given back to the file system as holes: the file
    /// occupies `end - punched` (what `file_bytes` counts).
    punched: u64,
    /// The holes punched so far: disjoint, sorted, [`PUNCH_BLOCK`]-aligned
    /// ranges that no live record touches.
    holes: Vec<(u64, u64)>,
    /// Bytes of `0..end` whose write failed and that no hole has covered
    /// yet: counted in `end` (the range stays allocated, dead), but not
    /// space the file system gives back when the file goes or a hole is
    /// punched over them, so not "space freed" (see [`Store::delete`] and
    /// `Store::punch`, which takes them to be the first bytes it covers).
    failed: u64,
    /// Dead bytes (`end - live`) when holes were last punched: a full disk
    /// asks for another pass only once enough more has died.
    dead_seen: u64,
    /// Live records by offset: (length, key). Compaction walks these.
    records: HashMap<u64, (u64, K)>,
    /// Writes reserved but not finished.
    writes: u32,
    /// No further records will be appended.
    sealed: bool,
    compacting: bool,
    /// Transfers sending records of this segment piece by piece
    /// ([`transfer::Hold`]): while any is, no byte of the file is written
    /// over or punched out (compaction in place waits), so a record they
    /// found live stays as it was even if it dies meanwhile.
    held: u32,
    /// A compaction passed the segment over for a hold: the last hold's
    /// drop queues it again.
    after_hold: bool,
    /// Waiting in `Segments::deferred`.
    deferred: bool,
}

impl<K> Segment<K> {
    fn is_dead(&self) -> bool {
        self.sealed && self.writes == 0 && self.records.is_empty()
    }
}

struct Segments<K> {
    next_id: u32,
    /// Per directory: the segment small records are appended to.
    open: Vec<Option<u32>>,
    /// Per directory: passed over until this instant after a failure.
    failed_until: Vec<Option<Instant>>,
    next_dir: usize,
    segs: HashMap<u32, Segment<K>>,
    /// Sealed while sparse and the store over its bound; handed to the
    /// buffer to compact.
    to_compact: Vec<u32>,
    /// Sealed segments found sparse while the store as a whole was within
    /// its space bound; compacted later if the bound is passed.
    deferred: Vec<u32>,
    /// Segments whose copying stopped for lack of space: queued again when
    /// space comes back.
    stalled: Vec<u32>,
}

/// Settings of the slow tier.
pub(crate) struct StoreConfig {
    pub segment_size: u64,
    pub max_spill: u64,
    /// Compact a sealed segment when live / allocated falls below this.
    pub compact_below: f64,
    pub compression: Compression,
}

pub(crate) struct Store<K> {
    /// The buffer's private sub-directories (owned by the buffer).
    dirs: Vec<PathBuf>,
    storage: Arc<dyn Storage>,
    cfg: StoreConfig,
    inner: Mutex<Segments<K>>,
    /// Live bytes plus bytes of writes in flight: what `max_spill` bounds.
    reserved: AtomicU64,
    disk_bytes: AtomicU64,
    disk_count: AtomicU64,
    file_bytes: AtomicU64,
    /// A write failed for lack of space, and none has succeeded since nor
    /// has space been freed: dead ranges are punched eagerly.
    disk_full: AtomicBool,
    /// Size of the last record `max_spill` refused; 0 once it would fit.
    refused: AtomicU64,
    /// Bytes still to be freed, after a write failed for lack of space,
    /// before the buffer is told that space came back (0: not waiting).
    awaiting_space: AtomicU64,
    /// Space came back after a refusal or a full disk (see
    /// [`Store::take_space_returned`]).
    space_returned: AtomicBool,
    /// How many times space came back (each time `space_returned` was
    /// set); never reset. See [`Store::space_epoch`].
    space_epoch: AtomicU64,
    /// The file system punches holes; cleared at the first `Unsupported`.
    punch_ok: AtomicBool,
}

impl<K: Clone + Debug> Store<K> {
    pub(crate) fn new(dirs: Vec<PathBuf>, storage: Arc<dyn Storage>, cfg: StoreConfig) -> Self {
        let n = dirs.len();
        Store {
            dirs,
            storage,
            cfg,
            inner: Mutex::new(Segments {
                next_id: 0,
                open: vec![None; n],
                failed_until: vec![None; n],
                next_dir: 0,
                segs: HashMap::new(),
                to_compact: Vec::new(),
                deferred: Vec::new(),
                stalled: Vec::new(),
            }),
            reserved: AtomicU64::new(0),
            disk_bytes: AtomicU64::new(0),
            disk_count: AtomicU64::new(0),
            file_bytes: AtomicU64::new(0),
            disk_full: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            awaiting_space: AtomicU64::new(0),
            space_returned: AtomicBool::new(false),
            space_epoch: AtomicU64::new(0),
            punch_ok: AtomicBool::new(true),
        }
    }

    pub(crate) fn segment_size(&self) -> u64 {
        self.cfg.segment_size
    }

    pub(crate) fn compression(&self) -> Compression {
        self.cfg.compression
    }

    pub(crate) fn disk_bytes(&self) -> u64 {
        self.disk_bytes.load(Relaxed)
    }

    pub(crate) fn disk_count(&self) -> u64 {
        self.disk_count.load(Relaxed)
    }

    pub(crate) fn file_bytes(&self) -> u64 {
        self.file_bytes.load(Relaxed)
    }

    /// Path of the file holding `loc` (for tests, and the `segment` field
    /// of the tracing spans).
    pub(crate) fn path_of(&self, loc: DiskLoc) -> PathBuf {
        let g = self.inner.lock();
        match g.segs.get(&loc.seg) {
            Some(s) => s.path.clone(),
            None => self.dirs[0].join(segment_name(loc.seg)),
        }
    }

    /// The open file holding `loc`, and its path, for a reader that reads
    /// the record piece by piece. The handle keeps the file readable even
    /// if the segment is released meanwhile.
    pub(crate) fn file(&self, loc: DiskLoc) -> Result<(Arc<dyn SegmentFile>, PathBuf)> {
        let g = self.inner.lock();
        match g.segs.get(&loc.seg) {
            Some(s) => Ok((Arc::clone(&s.file), s.path.clone())),
            None => Err(Error::io(
                "read record",
                self.dirs[0].join(segment_name(loc.seg)),
                std::io::Error::new(std::io::ErrorKind::NotFound, "segment released"),
            )),
        }
    }

    /// The record at `loc` is dead (removed, replaced or moved). O(1).
    /// Returns the segment if it died with it: delete it on the IO pool. A
    /// segment left sparse is queued for compaction
    /// ([`Store::take_compaction_requests`]).
    pub(crate) fn release(&self, loc: DiskLoc) -> Option<DeadSegment> {
        let mut g = self.inner.lock();
        let seg = g.segs.get_mut(&loc.seg)?;
        seg.records.remove(&loc.offset)?;
        seg.live -= loc.len();
        self.disk_bytes.fetch_sub(loc.len(), Relaxed);
        self.disk_count.fetch_sub(1, Relaxed);
        let used = self.reserved.fetch_sub(loc.len(), Relaxed) - loc.len();
        let refused = self.refused.load(Relaxed);
        if refused != 0 && used.saturating_add(refused) <= self.cfg.max_spill {
            self.refused.store(0, Relaxed);
            self.note_space_returned();
        }
        if seg.is_dead() {
            let seg = g.segs.remove(&loc.seg).expect("segment present");
            drop(g);
            return Some(self.forget(seg));
        }
        self.consider(&mut g, loc.seg);
        None
    }

    fn forget(&self, seg: Segment<K>) -> DeadSegment {
        self.file_bytes.fetch_sub(seg.end - seg.punched, Relaxed);
        DeadSegment {
            // What deleting the file gives back: a failed write's range
            // never held a block (or not one the caller could count on),
            // and counting it as freed would tell the buffer space came
            // back each time a segment that only failed is dropped: on a
            // full disk, a loop of create, fail, delete, retry.
            occupied: (seg.end - seg.punched).saturating_sub(seg.failed),
            path: seg.path,
            _file: seg.file,
        }
    }

    /// Delete a dead segment's file. Runs on the IO pool: an unlink can
    /// stall while the kernel drops the file's dirty pages.
    pub(crate) fn delete(&self, dead: DeadSegment) {
        if let Err(e) = self.storage.remove(&dead.path) {
            tracing::warn!(path = %dead.path.display(), error = %e, "could not delete spill segment");
        }
        // The space is the file system's again once the last handle goes
        // (a reader may still hold one for a moment).
        let bytes = dead.occupied;
        drop(dead);
        if self.disk_full.load(Relaxed) || self.awaiting_space.load(Relaxed) > 0 {
            self.space_freed(&mut self.inner.lock(), bytes);
        }
    }
}

fn segment_name(id: u32) -> String {
    format!("seg-{id:08}.spill")
}

#[cfg(test)]
mod tests;
