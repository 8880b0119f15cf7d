//! A [`Storage`] that wraps the real one and misbehaves on request: it fails
//! the Nth write or read, writes only part of a record before failing,
//! reports a full disk, flips a bit in what it reads, or holds writes and
//! reads until the test lets them go. With a capacity
//! ([`Faults::set_capacity`]) it is a small disk: blocks are counted as
//! writes allocate them, punched holes and deleted files give them back,
//! and a write that would pass the capacity fails with ENOSPC. Used by the fault tests and the
//! `faults` fuzz target; public so that hosts can test their own error
//! handling (and their back-pressure) the same way.

use super::storage::{FsStorage, SegmentFile, Storage, PUNCH_BLOCK};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// What a write that is told to fail does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// Fail with an I/O error before writing anything.
    Error,
    /// Fail with "no space left on device" (ENOSPC) before writing.
    NoSpace,
    /// Write the first half of the buffer, then fail: a torn record.
    Short,
}

/// Shared switches; clone the `Arc` to flip them while the buffer runs.
#[derive(Debug, Default)]
pub struct Faults {
    writes: AtomicU64,
    reads: AtomicU64,
    creates: AtomicU64,
    fail_write_at: AtomicU64,
    fail_read_at: AtomicU64,
    fail_create_at: AtomicU64,
    write_kind: parking_lot::Mutex<Option<WriteFault>>,
    fail_all_writes: AtomicBool,
    flip_reads: AtomicBool,
    gate: Gate,
    /// Bytes the files may occupy; 0 is no limit.
    capacity: AtomicU64,
    /// Bytes the files occupy, in whole 4 KiB blocks.
    used: AtomicU64,
    no_punch: AtomicBool,
}

/// Holds writes and reads at the storage layer until released, so that a
/// test can freeze the IO pool at a known point without sleeping.
#[derive(Debug, Default)]
struct Gate {
    /// (hold writes, hold reads, calls now waiting at the gate)
    state: parking_lot::Mutex<(bool, bool, usize)>,
    cv: parking_lot::Condvar,
}

impl Gate {
    fn pass(&self, write: bool) {
        let mut g = self.state.lock();
        let held = |g: &(bool, bool, usize)| if write { g.0 } else { g.1 };
        if !held(&g) {
            return;
        }
        g.2 += 1;
        self.cv.notify_all();
        while held(&g) {
            self.cv.wait(&mut g);
        }
        g.2 -= 1;
        self.cv.notify_all();
    }
}

impl Faults {
    /// Make the `n`th write from now (1 = the next one) fail as `kind`.
    pub fn fail_nth_write(&self, n: u64, kind: WriteFault) {
        *self.write_kind.lock() = Some(kind);
        self.fail_write_at
            .store(self.writes.load(SeqCst) + n, SeqCst);
    }

    /// Make every write fail as `kind` until [`Faults::clear`].
    pub fn fail_all_writes(&self, kind: WriteFault) {
        *self.write_kind.lock() = Some(kind);
        self.fail_all_writes.store(true, SeqCst);
    }

    /// Make the `n`th read from now (1 = the next one) fail with an I/O error.
    pub fn fail_nth_read(&self, n: u64) {
        self.fail_read_at.store(self.reads.load(SeqCst) + n, SeqCst);
    }

    /// Make the `n`th file creation from now fail.
    pub fn fail_nth_create(&self, n: u64) {
        self.fail_create_at
            .store(self.creates.load(SeqCst) + n, SeqCst);
    }

    /// Flip one bit in every buffer read until [`Faults::clear`].
    pub fn flip_bits_on_read(&self, on: bool) {
        self.flip_reads.store(on, SeqCst);
    }

    /// While `on`, every write waits (on the IO thread that makes it) until
    /// a call with `false` lets it and later writes through. Nothing fails;
    /// the data is written once released. Lets a test keep values in the
    /// "being written" state for as long as it needs.
    pub fn hold_writes(&self, on: bool) {
        self.gate.state.lock().0 = on;
        self.gate.cv.notify_all();
    }

    /// While `on`, every read waits until a call with `false` releases it,
    /// like [`Faults::hold_writes`].
    pub fn hold_reads(&self, on: bool) {
        self.gate.state.lock().1 = on;
        self.gate.cv.notify_all();
    }

    /// Block the calling thread until at least `n` writes or reads are
    /// waiting at the hold (see [`Faults::hold_writes`]).
    pub fn wait_until_held(&self, n: usize) {
        let mut g = self.gate.state.lock();
        while g.2 < n {
            self.gate.cv.wait(&mut g);
        }
    }

    /// Writes and reads now waiting at the hold.
    pub fn held(&self) -> usize {
        self.gate.state.lock().2
    }

    /// Stop misbehaving (and release held writes and reads).
    pub fn clear(&self) {
        self.fail_write_at.store(0, SeqCst);
        self.fail_read_at.store(0, SeqCst);
        self.fail_create_at.store(0, SeqCst);
        self.fail_all_writes.store(false, SeqCst);
        self.flip_reads.store(false, SeqCst);
        self.hold_writes(false);
        self.hold_reads(false);
    }

    /// Make the storage a disk of `bytes` (0: unlimited): a write that
    /// needs blocks past it fails with ENOSPC, before writing anything.
    /// Blocks are 4 KiB, taken by writes and given back by
    /// punched holes and by deleted files once their last handle is closed,
    /// as a real file system does. Not reset by [`Faults::clear`].
    pub fn set_capacity(&self, bytes: u64) {
        self.capacity.store(bytes, SeqCst);
    }

    /// Bytes the files occupy now (whole blocks).
    pub fn used_bytes(&self) -> u64 {
        self.used.load(SeqCst)
    }

    /// While `on`, punching a hole fails as unsupported, as on a file
    /// system without `FALLOC_FL_PUNCH_HOLE`.
    pub fn refuse_punch(&self, on: bool) {
        self.no_punch.store(on, SeqCst);
    }

    /// Writes attempted so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(SeqCst)
    }

    /// Reads attempted so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(SeqCst)
    }

    fn write_fault(&self) -> Option<WriteFault> {
        let n = self.writes.fetch_add(1, SeqCst) + 1;
        let hit = self.fail_all_writes.load(SeqCst) || self.fail_write_at.load(SeqCst) == n;
        if hit {
            *self.write_kind.lock()
        } else {
            None
        }
    }
}

/// Real files, with the failures switched on in [`Faults`].
#[derive(Debug, Default, Clone)]
pub struct FaultyStorage {
    faults: Arc<Faults>,
}

impl FaultyStorage {
    /// A storage that behaves until told otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// The switches, to flip from the test.
    pub fn faults(&self) -> Arc<Faults> {
        Arc::clone(&self.faults)
    }
}

impl Storage for FaultyStorage {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        let n = self.faults.creates.fetch_add(1, SeqCst) + 1;
        if self.faults.fail_create_at.load(SeqCst) == n {
            return Err(io::Error::other("injected create failure"));
        }
        let inner = FsStorage.create(path)?;
        Ok(Arc::new(FaultyFile {
            inner,
            faults: Arc::clone(&self.faults),
            blocks: parking_lot::Mutex::new(Vec::new()),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        FsStorage.remove(path)
    }
}

struct FaultyFile {
    inner: Arc<dyn SegmentFile>,
    faults: Arc<Faults>,
    /// Which blocks of the file are allocated (for the capacity).
    blocks: parking_lot::Mutex<Vec<bool>>,
}

impl FaultyFile {
    /// Take the blocks `offset..offset + len` touches that are not yet
    /// allocated, or fail with ENOSPC if they do not fit the capacity.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (first, last) = (offset / PUNCH_BLOCK, (offset + len).div_ceil(PUNCH_BLOCK));
        let mut blocks = self.blocks.lock();
        if blocks.len() < last as usize {
            blocks.resize(last as usize, false);
        }
        let range = first as usize..last as usize;
        let new = blocks[range.clone()].iter().filter(|&&b| !b).count() as u64;
        let cap = self.faults.capacity.load(SeqCst);
        let fits = self
            .faults
            .used
            .fetch_update(SeqCst, SeqCst, |used| {
                let after = used + new * PUNCH_BLOCK;
                (cap == 0 || after <= cap).then_some(after)
            })
            .is_ok();
        if !fits {
            return Err(io::Error::from_raw_os_error(28));
        }
        blocks[range].fill(true);
        Ok(())
    }
}

impl Drop for FaultyFile {
    /// The last handle of a file is closed: a deleted file's blocks are
    /// free again (the store drops a segment's handles only once it is
    /// deleted, or when the buffer goes).
    fn drop(&mut self) {
        let n = self.blocks.get_mut().iter().filter(|&&b| b).count() as u64;
        self.faults.used.fetch_sub(n * PUNCH_BLOCK, SeqCst);
    }
}

impl SegmentFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.faults.gate.pass(true);
        match self.faults.write_fault() {
            None => {
                self.allocate(offset, buf.len() as u64)?;
                self.inner.write_all_at(buf, offset)
            }
            Some(WriteFault::Error) => Err(io::Error::other("injected write failure")),
            Some(WriteFault::NoSpace) => Err(io::Error::from_raw_os_error(28)),
            Some(WriteFault::Short) => {
                self.allocate(offset, (buf.len() / 2) as u64)?;
                self.inner.write_all_at(&buf[..buf.len() / 2], offset)?;
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "injected short write",
                ))
            }
        }
    }

    /// A record written in pieces counts, and fails, as one write.
    fn write_pieces_at(&self, pieces: &[&[u8]], offset: u64) -> io::Result<()> {
        self.write_all_at(&pieces.concat(), offset)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.faults.no_punch.load(SeqCst) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        self.inner.punch_hole(offset, len)?;
        let (first, last) = (offset.div_ceil(PUNCH_BLOCK), (offset + len) / PUNCH_BLOCK);
        let mut blocks = self.blocks.lock();
        let mut freed = 0;
        let last = (last as usize).min(blocks.len());
        for b in blocks.iter_mut().take(last).skip(first as usize) {
            if std::mem::take(b) {
                freed += PUNCH_BLOCK;
            }
        }
        self.faults.used.fetch_sub(freed, SeqCst);
        Ok(())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.faults.gate.pass(false);
        let n = self.faults.reads.fetch_add(1, SeqCst) + 1;
        if self.faults.fail_read_at.load(SeqCst) == n {
            return Err(io::Error::other("injected read failure"));
        }
        self.inner.read_exact_at(buf, offset)?;
        if self.faults.flip_reads.load(SeqCst) && !buf.is_empty() {
            let at = (n as usize * 7919) % buf.len();
            buf[at] ^= 0x10;
        }
        Ok(())
    }
}
