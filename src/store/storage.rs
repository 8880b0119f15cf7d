//! The small storage trait the segment store writes through. The real one
//! is plain files with positioned IO; tests and fuzzing swap in
//! [`crate::testing::FaultyStorage`], which fails on demand.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Creates and removes segment files. Implementations must be safe to call
/// from several IO threads at once.
pub trait Storage: Send + Sync + 'static {
    /// Create a new, empty file at `path` for reading and writing.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>>;
    /// Delete the file at `path` (open handles may still read it).
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// One open segment file. Writes and reads are positioned, so several
/// threads can use one file at once on disjoint ranges.
pub trait SegmentFile: Send + Sync + 'static {
    /// Write all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Write the pieces one after another from `offset`, as one record.
    /// Lets a large value be written from its own memory behind a header
    /// that lives elsewhere. Defaults to: one `write_all_at` per piece.
    fn write_pieces_at(&self, pieces: &[&[u8]], mut offset: u64) -> io::Result<()> {
        for p in pieces {
            self.write_all_at(p, offset)?;
            offset += p.len() as u64;
        }
        Ok(())
    }

    /// Fill all of `buf` from `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// Segment files on the local file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

impl Storage for FsStorage {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create_new(true);
        // Private to this user: the umask can only take bits away from 0600.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(path)?;
        Ok(Arc::new(FsFile {
            file,
            #[cfg(unix)]
            map: parking_lot::RwLock::new(None),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// Reads shorter than this copy out of the map; longer ones use `pread()`,
/// which costs the same per byte once the syscall is amortised, and leaves
/// no file pages mapped into the process (mapped pages count in its RSS,
/// which hosts watch).
#[cfg(unix)]
const MAP_BELOW: usize = 64 << 10;

/// A segment file. On Unix, small reads copy out of a read-only shared map of
/// the file rather than calling `pread()`: on this class of machine a
/// syscall costs ~0.8 µs, several times the copy of a 4 KiB record (see
/// docs/read-path.md for the measurements). Writes stay `pwrite()`.
struct FsFile {
    file: File,
    /// The file mapped up to its length when last mapped; re-mapped when a
    /// read reaches past it (the file grows as records are appended).
    #[cfg(unix)]
    map: parking_lot::RwLock<Option<Arc<memmap2::Mmap>>>,
}

#[cfg(unix)]
impl FsFile {
    /// A map covering `end`, mapping the file again if it has grown.
    /// `None` when the file is shorter than `end` or mapping fails; the
    /// caller then falls back to `pread()`, which reports the error.
    fn map_covering(&self, end: u64) -> Option<Arc<memmap2::Mmap>> {
        if let Some(m) = self.map.read().as_ref() {
            if m.len() as u64 >= end {
                return Some(Arc::clone(m));
            }
        }
        let mut slot = self.map.write();
        if let Some(m) = slot.as_ref() {
            if m.len() as u64 >= end {
                return Some(Arc::clone(m));
            }
        }
        let len = self.file.metadata().ok()?.len();
        if len < end || len == 0 {
            return None;
        }
        let len = usize::try_from(len).ok()?;
        // SAFETY: a map is only sound while the mapped bytes neither change
        // under a reader nor disappear. Segment files are private to this
        // buffer (a fresh sub-directory nobody else writes) and append-only:
        // the store never truncates or shrinks them, and writes go only to
        // ranges allocated past every existing record, which no reader
        // touches until that write has completed (a record becomes visible
        // to readers through the index only afterwards). Failed writes leave
        // ranges nothing points at. Deleting the file (unlink) keeps the
        // mapped pages valid until the map is dropped. The map is read-only
        // and covers only bytes the file already had when it was made.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&self.file) }.ok()?;
        let map = Arc::new(map);
        *slot = Some(Arc::clone(&map));
        Some(map)
    }
}

#[cfg(unix)]
impl SegmentFile for FsFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|_| buf.len() < MAP_BELOW);
        if let Some(map) = end.and_then(|end| self.map_covering(end)) {
            let at = offset as usize;
            buf.copy_from_slice(&map[at..at + buf.len()]);
            return Ok(());
        }
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
}

#[cfg(windows)]
impl SegmentFile for FsFile {
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        use std::os::windows::fs::FileExt;
        while !buf.is_empty() {
            match self.file.seek_write(buf, offset)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        use std::os::windows::fs::FileExt;
        while !buf.is_empty() {
            match self.file.seek_read(buf, offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_follow_a_growing_file_and_fail_past_its_end() {
        let tmp = tempfile::tempdir().unwrap();
        let f = FsStorage.create(&tmp.path().join("seg")).unwrap();
        f.write_all_at(b"first record", 0).unwrap();
        let mut buf = [0u8; 6];
        f.read_exact_at(&mut buf, 6).unwrap();
        assert_eq!(&buf, b"record");
        // Appended after the file was mapped: the map is renewed.
        f.write_all_at(b"second", 12).unwrap();
        f.read_exact_at(&mut buf, 12).unwrap();
        assert_eq!(&buf, b"second");
        // Past the end: an error, not a fault.
        let err = f.read_exact_at(&mut buf, 15).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // A large read takes the pread path.
        let big = vec![7u8; 100 << 10];
        f.write_all_at(&big, 18).unwrap();
        let mut back = vec![0u8; big.len()];
        f.read_exact_at(&mut back, 18).unwrap();
        assert_eq!(back, big);
    }
}
