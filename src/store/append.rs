//! Appending records to segments: space allocated at the end of the open
//! segment of a directory (a new segment when it is full, a file of its
//! own for a record larger than a segment), then the bytes written outside
//! the store's lock.

use super::storage::SegmentFile;
use super::{segment_name, DiskLoc, Segment, Segments, Store};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a directory that failed a write is passed over.
const DIR_BACKOFF: Duration = Duration::from_secs(1);

impl<K: Clone + Debug> Store<K> {
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
