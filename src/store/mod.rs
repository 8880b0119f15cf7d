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
//! decoded by [`get`], through per-thread [`scratch`] buffers; space is
//! reclaimed by [`compact`]. The buffer hands it values and locations and
//! never looks inside a record.
//!
//! The store's mutex guards only metadata; file creation, reads and writes
//! happen outside it.

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
pub(crate) mod spare;
pub mod storage;
pub(crate) mod transfer;

use crate::error::{Error, Result};
use codec::Compression;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Debug;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::Arc;
use std::time::{Duration, Instant};
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

/// How long a directory that failed a write is passed over.
const DIR_BACKOFF: Duration = Duration::from_secs(1);

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

    fn reserve(&self, len: u64) -> Result<()> {
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

    fn note_space_returned(&self) {
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
    fn space_freed(&self, g: &mut Segments<K>, bytes: u64) {
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
    fn note_disk_full(&self, g: &mut Segments<K>) {
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

    /// Append one sealed record for `key`. Runs on the IO pool.
    pub(crate) fn write(&self, key: &K, record: &[u8]) -> Result<DiskLoc> {
        self.write_pieces(key, &[record])
    }

    /// Append one sealed record given in pieces (header, then payload) that
    /// are written one after another. Runs on the IO pool.
    pub(crate) fn write_pieces(&self, key: &K, pieces: &[&[u8]]) -> Result<DiskLoc> {
        let len = pieces.iter().map(|p| p.len() as u64).sum::<u64>();
        let locs = self.write_records(pieces, &[(key, len)])?;
        Ok(locs[0])
    }

    /// Append sealed records laid back to back in `pieces` (written one
    /// after another, with one call per piece): `records` gives each one's
    /// key and length, in order. All are written or none. Runs on the IO
    /// pool.
    pub(crate) fn write_records(
        &self,
        pieces: &[&[u8]],
        records: &[(&K, u64)],
    ) -> Result<Vec<DiskLoc>> {
        self.write_records_with(records, |file, offset| file.write_pieces_at(pieces, offset))
    }

    /// Write a copy of `key`'s sealed record (compaction). Outside the
    /// `max_spill` check: the original dies as soon as the copy is in
    /// place, so a copy moves live bytes rather than adding to them, and a
    /// budget spent to the last byte must not stop the compaction that
    /// gives space back. Runs on the IO pool.
    pub(crate) fn write_copy(&self, key: &K, record: &[u8]) -> Result<DiskLoc> {
        let len = record.len() as u64;
        self.reserved.fetch_add(len, Relaxed);
        let locs = self.append(&[(key, len)], |file, offset| {
            file.write_all_at(record, offset)
        })?;
        Ok(locs[0])
    }

    /// Append records of the given keys and lengths, laid back to back,
    /// whose bytes `write` puts into the file from the offset it is given
    /// (in whatever order and calls it likes). All are written or none.
    /// Runs on the IO pool.
    pub(crate) fn write_records_with(
        &self,
        records: &[(&K, u64)],
        write: impl FnOnce(&dyn SegmentFile, u64) -> std::io::Result<()>,
    ) -> Result<Vec<DiskLoc>> {
        self.reserve(records.iter().map(|r| r.1).sum::<u64>())?;
        self.append(records, write)
    }

    /// Write `key`'s sealed record at `offset` of segment `seg`, over dead
    /// bytes below its end (compaction in place, [`Store::compact`]): the
    /// caller vouches that no live record and no hole lies in the range.
    /// Outside the `max_spill` check, like [`Store::write_copy`]. Runs on
    /// the IO pool.
    pub(crate) fn write_within(
        &self,
        seg: u32,
        offset: u64,
        key: &K,
        record: &[u8],
    ) -> Result<DiskLoc> {
        let len = record.len() as u64;
        let (file, path) = {
            let mut g = self.inner.lock();
            let Some(s) = g.segs.get_mut(&seg) else {
                return Err(Error::io(
                    "compact segment",
                    self.dirs[0].join(segment_name(seg)),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "segment released"),
                ));
            };
            debug_assert!(offset + len <= s.end);
            if s.held > 0 {
                // Dead bytes here may be a record a transfer is sending.
                return Err(Error::io(
                    "compact segment in place",
                    s.path.clone(),
                    std::io::Error::new(
                        std::io::ErrorKind::ResourceBusy,
                        "a transfer is reading the segment",
                    ),
                ));
            }
            // Counted as a write in flight, so the segment is not deleted
            // under it.
            s.writes += 1;
            (Arc::clone(&s.file), s.path.clone())
        };
        self.reserved.fetch_add(len, Relaxed);
        let res = file.write_all_at(record, offset);
        let loc = DiskLoc::new(seg, offset, len);
        let mut dead = None;
        {
            let mut g = self.inner.lock();
            if let Some(s) = g.segs.get_mut(&seg) {
                s.writes -= 1;
                if res.is_ok() {
                    s.live += len;
                    s.records.insert(offset, (len, key.clone()));
                } else if s.is_dead() {
                    dead = g.segs.remove(&seg);
                }
            }
            if let Err(e) = &res {
                if crate::error::is_no_space(e) {
                    self.note_disk_full(&mut g);
                }
            }
        }
        if let Some(seg) = dead {
            self.delete(self.forget(seg));
        }
        match res {
            Ok(()) => {
                self.disk_bytes.fetch_add(len, Relaxed);
                self.disk_count.fetch_add(1, Relaxed);
                Ok(loc)
            }
            Err(e) => {
                self.reserved.fetch_sub(len, Relaxed);
                Err(Error::write("compact segment", path, e))
            }
        }
    }

    /// Allocate, write and account records whose bytes are already
    /// reserved against `max_spill` (given back on failure).
    fn append(
        &self,
        records: &[(&K, u64)],
        write: impl FnOnce(&dyn SegmentFile, u64) -> std::io::Result<()>,
    ) -> Result<Vec<DiskLoc>> {
        let len = records.iter().map(|r| r.1).sum::<u64>();
        let (loc, file, path) = match self.allocate(len) {
            Ok(a) => a,
            Err(e) => {
                self.reserved.fetch_sub(len, Relaxed);
                return Err(e);
            }
        };
        let res = write(&*file, loc.offset);
        let mut locs = Vec::with_capacity(records.len());
        let mut at = loc.offset;
        for &(_, rlen) in records {
            locs.push(DiskLoc::new(loc.seg, at, rlen));
            at += rlen;
        }
        let mut dead = None;
        {
            let mut g = self.inner.lock();
            let Segments {
                segs, failed_until, ..
            } = &mut *g;
            if let Some(seg) = segs.get_mut(&loc.seg) {
                seg.writes -= 1;
                match &res {
                    Ok(()) => {
                        seg.live += len;
                        for (l, &(key, _)) in locs.iter().zip(records) {
                            seg.records.insert(l.offset, (l.len(), key.clone()));
                        }
                    }
                    Err(_) => {
                        seg.failed += len;
                        // The range stays allocated as dead bytes: nothing
                        // points at it, so a torn record is never read.
                        failed_until[seg.dir] = Some(Instant::now() + DIR_BACKOFF);
                        if seg.is_dead() {
                            dead = segs.remove(&loc.seg);
                        }
                    }
                }
            }
            match &res {
                Ok(()) if self.disk_full.load(Relaxed) => self.space_freed(&mut g, 0),
                Err(e) if crate::error::is_no_space(e) => self.note_disk_full(&mut g),
                _ => {}
            }
        }
        if let Some(seg) = dead {
            self.delete(self.forget(seg));
        }
        match res {
            Ok(()) => {
                self.disk_bytes.fetch_add(len, Relaxed);
                self.disk_count.fetch_add(records.len() as u64, Relaxed);
                Ok(locs)
            }
            Err(e) => {
                self.reserved.fetch_sub(len, Relaxed);
                Err(Error::write("write record", path, e))
            }
        }
    }

    /// Reserve `len` bytes in a segment, creating a file when needed.
    fn allocate(&self, len: u64) -> Result<(DiskLoc, Arc<dyn SegmentFile>, PathBuf)> {
        let own_file = len > self.cfg.segment_size;
        loop {
            let (dir, id) = {
                let mut g = self.inner.lock();
                let dir = pick_dir(&mut g);
                if !own_file {
                    if let Some(id) = g.open[dir] {
                        let seg = g.segs.get_mut(&id).expect("open segment is in the table");
                        if seg.end + len <= self.cfg.segment_size {
                            let loc = DiskLoc::new(id, seg.end, len);
                            seg.end += len;
                            seg.writes += 1;
                            self.file_bytes.fetch_add(len, Relaxed);
                            return Ok((loc, Arc::clone(&seg.file), seg.path.clone()));
                        }
                    }
                }
                let id = g.next_id;
                g.next_id = g.next_id.wrapping_add(1);
                (dir, id)
            };
            let path = self.dirs[dir].join(segment_name(id));
            let file = match self.storage.create(&path) {
                Ok(f) => f,
                Err(e) => {
                    let mut g = self.inner.lock();
                    g.failed_until[dir] = Some(Instant::now() + DIR_BACKOFF);
                    if crate::error::is_no_space(&e) {
                        self.note_disk_full(&mut g);
                    }
                    return Err(Error::write("create segment", path, e));
                }
            };
            let mut seg = Segment {
                file: Arc::clone(&file),
                path: path.clone(),
                dir,
                end: 0,
                live: 0,
                punched: 0,
                failed: 0,
                holes: Vec::new(),
                dead_seen: 0,
                records: HashMap::new(),
                writes: 0,
                sealed: own_file,
                compacting: false,
                held: 0,
                after_hold: false,
                deferred: false,
            };
            let mut dead = None;
            {
                let mut g = self.inner.lock();
                if own_file {
                    seg.end = len;
                    seg.writes = 1;
                    g.segs.insert(id, seg);
                    self.file_bytes.fetch_add(len, Relaxed);
                    return Ok((DiskLoc::new(id, 0, len), file, path));
                }
                g.segs.insert(id, seg);
                if let Some(old) = g.open[dir].replace(id) {
                    if let Some(s) = g.segs.get_mut(&old) {
                        s.sealed = true;
                        if s.is_dead() {
                            dead = g.segs.remove(&old);
                        } else {
                            // Records died while it was open: no release
                            // will come to ask for its compaction.
                            self.consider(&mut g, old);
                        }
                    }
                }
            }
            if let Some(seg) = dead {
                self.delete(self.forget(seg));
            }
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

    #[cfg(any(test, feature = "testing"))]
    /// The key of the live record at `loc` (same segment, offset and
    /// length), if there is one. For `validate`.
    pub(crate) fn record_key(&self, loc: DiskLoc) -> Option<K> {
        let g = self.inner.lock();
        let (len, key) = g.segs.get(&loc.seg)?.records.get(&loc.offset)?;
        (*len == loc.len()).then(|| key.clone())
    }

    /// Check the segment table against the counters.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let g = self.inner.lock();
        let (mut live, mut count, mut end) = (0u64, 0u64, 0u64);
        for (id, s) in &g.segs {
            let sum: u64 = s.records.values().map(|(l, _)| l).sum();
            if sum != s.live {
                return Err(format!("segment {id}: live {} != record sum {sum}", s.live));
            }
            if s.live > s.end {
                return Err(format!("segment {id}: live {} > end {}", s.live, s.end));
            }
            for (&off, &(len, _)) in &s.records {
                if off + len > s.end {
                    return Err(format!("segment {id}: record at {off} passes the end"));
                }
                if s.holes.iter().any(|&(a, b)| off < b && a < off + len) {
                    return Err(format!("segment {id}: record at {off} lies in a hole"));
                }
            }
            let holes: u64 = s.holes.iter().map(|(a, b)| b - a).sum();
            let ordered = s.holes.windows(2).all(|w| w[0].1 < w[1].0);
            let aligned = s.holes.iter().all(|&(a, b)| {
                a % storage::PUNCH_BLOCK == 0
                    && b % storage::PUNCH_BLOCK == 0
                    && a < b
                    && b <= s.end
            });
            if holes != s.punched || !ordered || !aligned {
                return Err(format!(
                    "segment {id}: holes {:?} do not add up to {} punched bytes",
                    s.holes, s.punched
                ));
            }
            live += s.live;
            count += s.records.len() as u64;
            end += s.end - s.punched;
        }
        if live != self.disk_bytes() || count != self.disk_count() {
            return Err(format!(
                "disk_bytes/count {}/{} != segments {live}/{count}",
                self.disk_bytes(),
                self.disk_count()
            ));
        }
        if end != self.file_bytes() {
            return Err(format!(
                "file_bytes {} != segments {end}",
                self.file_bytes()
            ));
        }
        Ok(())
    }
}

fn segment_name(id: u32) -> String {
    format!("seg-{id:08}.spill")
}

/// Round-robin over the directories, passing over those that failed
/// recently (unless all did: then try anyway, the fault may have cleared).
fn pick_dir<K>(g: &mut Segments<K>) -> usize {
    let n = g.open.len();
    let now = Instant::now();
    for i in 0..n {
        let d = (g.next_dir + i) % n;
        if g.failed_until[d].is_none_or(|t| t <= now) {
            g.failed_until[d] = None;
            g.next_dir = (d + 1) % n;
            return d;
        }
    }
    let d = g.next_dir;
    g.next_dir = (d + 1) % n;
    d
}

#[cfg(test)]
mod tests;
