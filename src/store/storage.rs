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
    /// Fill all of `buf` from `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// Segment files on the local file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

impl Storage for FsStorage {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(FsFile(file)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

struct FsFile(File);

#[cfg(unix)]
impl SegmentFile for FsFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }
}

#[cfg(windows)]
impl SegmentFile for FsFile {
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        use std::os::windows::fs::FileExt;
        while !buf.is_empty() {
            match self.0.seek_write(buf, offset)? {
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
            match self.0.seek_read(buf, offset)? {
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
