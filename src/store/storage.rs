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

    /// Fill all of `buf` from `offset`. A file that ends before
    /// `offset + buf.len()` is an error of kind `UnexpectedEof`, never a
    /// signal: implementations must not read through a memory map.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Fill all of `first`, then all of `second`, from the bytes that
    /// start at `offset`, as one read: a small record's header lands in
    /// one buffer and its payload in the value's own memory. Errors as
    /// [`SegmentFile::read_exact_at`]. Defaults to: one `read_exact_at` of
    /// the whole range into a temporary buffer, split afterwards (so that a
    /// wrapper which counts or damages reads sees one read per record).
    fn read_split_at(&self, first: &mut [u8], second: &mut [u8], offset: u64) -> io::Result<()> {
        let mut whole = vec![0u8; first.len() + second.len()];
        self.read_exact_at(&mut whole, offset)?;
        let (a, b) = whole.split_at(first.len());
        first.copy_from_slice(a);
        second.copy_from_slice(b);
        Ok(())
    }

    /// Give the bytes `offset..offset + len` back to the file system while
    /// keeping the file's length (a hole: they read as zeros afterwards).
    /// The store calls it only on ranges no live record occupies, aligned
    /// to 4 KiB blocks. Defaults to: `ErrorKind::Unsupported`, after
    /// which the store stops asking and reclaims space by copying only.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// The granule the store punches holes in: a range is given back only in
/// whole blocks of this size, the allocation unit of the common Linux file
/// systems (ext4, xfs, btrfs, tmpfs). On a file system with larger blocks
/// fewer bytes are freed than counted.
pub(crate) const PUNCH_BLOCK: u64 = 4096;

/// Pieces one `pwritev()` takes at most: `IOV_MAX` on Linux, the BSDs
/// and macOS.
#[cfg(unix)]
const IOV_MAX: usize = 1024;

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
        Ok(Arc::new(FsFile { file }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// A segment file. Every read is a positioned `pread()`, never a load from
/// a memory map: a map turns a file shortened underneath the buffer (by
/// another process of the same user, or root) into SIGBUS, which kills the
/// host; `pread()` turns it into a short read, which the store reports as
/// `Error::Corrupt` naming the key and file. Why, and what it costs:
/// docs/read-path.md. Writes are `pwrite()`; dead ranges are given back to
/// the file system with `fallocate(FALLOC_FL_PUNCH_HOLE)` on Linux.
struct FsFile {
    file: File,
}

#[cfg(unix)]
impl SegmentFile for FsFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, buf, offset)
    }

    /// One `pwritev()` per [`IOV_MAX`] pieces (more only after a short
    /// write): small records are written from the values' own memory, two
    /// pieces each (header, payload), so a packed write of a thousand
    /// records costs a couple of system calls rather than a copy of every
    /// value into one buffer.
    fn write_pieces_at(&self, pieces: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for group in pieces.chunks(IOV_MAX) {
            let mut bufs: Vec<io::IoSlice<'_>> =
                group.iter().map(|p| io::IoSlice::new(p)).collect();
            let mut left = &mut bufs[..];
            // Drop empty pieces first: a write of nothing returns 0, which
            // would look like a device that takes no more.
            io::IoSlice::advance_slices(&mut left, 0);
            while !left.is_empty() {
                match rustix::io::pwritev(&self.file, left, at) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        io::IoSlice::advance_slices(&mut left, n);
                        at += n as u64;
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }

    /// One `preadv()` (more only after a short read): on this class of
    /// machine a system call costs several times the copy of a 4 KiB
    /// record, so a small record is read with one (docs/design.md, "Read
    /// path").
    fn read_split_at(&self, first: &mut [u8], second: &mut [u8], offset: u64) -> io::Result<()> {
        let mut bufs = [io::IoSliceMut::new(first), io::IoSliceMut::new(second)];
        let mut left = &mut bufs[..];
        // Drop empty pieces first: a read of nothing returns 0, which
        // would look like the end of the file.
        io::IoSliceMut::advance_slices(&mut left, 0);
        let mut at = offset;
        while !left.is_empty() {
            match rustix::io::preadv(&self.file, left, at) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    io::IoSliceMut::advance_slices(&mut left, n);
                    at += n as u64;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        use rustix::fs::{fallocate, FallocateFlags};
        fallocate(
            &self.file,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            offset,
            len,
        )
        .map_err(io::Error::from)
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
    fn reads_follow_a_growing_file_and_fail_past_its_end_or_after_truncation() {
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
        // Shortened underneath: a short read, not a signal.
        std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path().join("seg"))
            .unwrap()
            .set_len(10)
            .unwrap();
        let err = f.read_exact_at(&mut buf, 6).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// A file with only the required reads, to check the default
    /// `read_split_at` against the `preadv()` one.
    struct OnlyExact(Arc<dyn SegmentFile>);

    impl SegmentFile for OnlyExact {
        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_all_at(buf, offset)
        }
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.0.read_exact_at(buf, offset)
        }
    }

    #[test]
    fn a_split_read_fills_both_pieces_or_fails_at_the_end_of_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("seg");
        let fs = FsStorage.create(&path).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        fs.write_all_at(&data, 0).unwrap();
        let plain = OnlyExact(Arc::clone(&fs));
        for f in [&*fs, &plain as &dyn SegmentFile] {
            for (a, b, at) in [(32, 4096, 7), (32, 0, 0), (0, 10, 4990), (0, 0, 5000)] {
                let (mut x, mut y) = (vec![0u8; a], vec![0u8; b]);
                f.read_split_at(&mut x, &mut y, at as u64).unwrap();
                assert_eq!(x, data[at..at + a]);
                assert_eq!(y, data[at + a..at + a + b]);
            }
            // Past the end, in the first piece or the second.
            for (a, b, at) in [(32, 4096, 4000), (32, 10, 4970), (0, 1, 5000), (1, 0, 5000)] {
                let (mut x, mut y) = (vec![0u8; a], vec![0u8; b]);
                let e = f.read_split_at(&mut x, &mut y, at).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{a} {b} {at}");
            }
        }
        // Shortened underneath: a short read, not a signal.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let (mut x, mut y) = ([0u8; 32], [0u8; 4096]);
        let e = fs.read_split_at(&mut x, &mut y, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[cfg(unix)]
    #[test]
    fn pieces_are_written_back_to_back_past_iov_max_and_around_empty_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let f = FsStorage.create(&tmp.path().join("seg")).unwrap();
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        // Pieces of 0 to 4 bytes, more than one `pwritev()` takes.
        let mut pieces: Vec<&[u8]> = vec![&[]];
        let mut at = 0;
        for i in 0.. {
            let n = (i % 5).min(data.len() - at);
            pieces.push(&data[at..at + n]);
            at += n;
            if at == data.len() {
                break;
            }
        }
        pieces.push(&[]);
        assert!(pieces.len() > 2 * IOV_MAX);
        f.write_pieces_at(&pieces, 10).unwrap();
        let mut back = vec![0u8; data.len()];
        f.read_exact_at(&mut back, 10).unwrap();
        assert_eq!(back, data);
        f.write_pieces_at(&[&[], &[]], 0).unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_punched_hole_reads_as_zeros_and_keeps_the_length() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("seg");
        let f = FsStorage.create(&path).unwrap();
        f.write_all_at(&vec![9u8; 4 * PUNCH_BLOCK as usize], 0)
            .unwrap();
        match f.punch_hole(PUNCH_BLOCK, 2 * PUNCH_BLOCK) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return,
            Err(e) => panic!("{e}"),
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * PUNCH_BLOCK);
        let mut b = vec![1u8; 3 * PUNCH_BLOCK as usize];
        f.read_exact_at(&mut b, 0).unwrap();
        let n = PUNCH_BLOCK as usize;
        assert!(b[..n].iter().all(|&x| x == 9));
        assert!(b[n..].iter().all(|&x| x == 0));
    }
}
