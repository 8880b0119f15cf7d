//! The operation generator shared by the property tests (`tests/model.rs`)
//! and the `ops` / `faults` fuzz targets: an [`Op`] enum with bounded
//! arguments, a byte decoder ([`ops_from_bytes`]) so that a fuzzer's input
//! maps onto operations, and a [`Runner`] that applies each operation to a
//! [`SpillBuffer`] and to a `HashMap` model, checking after every step that
//! they agree and that [`SpillBuffer::validate`] holds.
//!
//! Over [`FaultyStorage`] the runner also injects failures on the Nth
//! write, read or file creation, and bit flips on reads. It then checks the
//! promise of DESIGN.md: nothing inserted is lost. A read while a read
//! fault is armed may fail with `Io` or `Corrupt` but never returns a wrong
//! value; once the faults are cleared every key reads back as inserted.

use crate::testing::{Faults, FaultyStorage, WriteFault};
use crate::{Compression, Error, Pinned, SpillBuffer};
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Keys are drawn from `0..KEYS`: few enough that operations collide.
pub const KEYS: u8 = 16;
/// Largest value the generator makes, in bytes.
pub const MAX_LEN: u16 = 6000;
/// Most pins the runner holds at once; a new pin past this drops the oldest.
pub const MAX_PINS: usize = 8;
/// Segment size of the buffers under test: the builder's minimum, so that
/// values up to [`MAX_LEN`] both share segments and get files of their own.
pub const SEGMENT_SIZE: u64 = 4096;
/// How long an awaited operation may take before the runner calls it a hang.
pub const HANG: Duration = Duration::from_secs(5);

/// Memory targets the generator picks from: tiny, so that almost every
/// operation spills or unspills.
pub const TARGETS: [usize; 8] = [0, 256, 512, 1024, 2048, 4096, 8192, 16384];

/// One operation. Arguments are bounded so that any value is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `insert(key, value)`; `compressible` picks a repetitive value that
    /// lz4 shrinks.
    Insert {
        /// Key, `0..KEYS`.
        key: u8,
        /// Value length, `0..=MAX_LEN`.
        len: u16,
        /// Repetitive content.
        compressible: bool,
    },
    /// `insert_async(key, value).await`.
    InsertAsync {
        /// Key, `0..KEYS`.
        key: u8,
        /// Value length, `0..=MAX_LEN`.
        len: u16,
        /// Repetitive content.
        compressible: bool,
    },
    /// Blocking `get`; the pin is dropped at once.
    Get {
        /// Key, `0..KEYS`.
        key: u8,
    },
    /// `pin(key).await`; the pin is kept.
    Pin {
        /// Key, `0..KEYS`.
        key: u8,
    },
    /// `try_pin(key)`; a pin is kept.
    TryPin {
        /// Key, `0..KEYS`.
        key: u8,
    },
    /// Drop held pin number `slot % pins`.
    DropPin {
        /// Which held pin.
        slot: u8,
    },
    /// `consume` held pin number `slot % pins`.
    ConsumePin {
        /// Which held pin.
        slot: u8,
    },
    /// Clone held pin number `slot % pins` (a second pin on the entry).
    ClonePin {
        /// Which held pin.
        slot: u8,
    },
    /// `prefetch(keys)`.
    Prefetch {
        /// Up to four keys, `0..KEYS`.
        keys: Vec<u8>,
    },
    /// `remove(key)`.
    Remove {
        /// Key, `0..KEYS`.
        key: u8,
    },
    /// `evict(bytes)`.
    Evict {
        /// Bytes to evict, `0..=16384`.
        bytes: u16,
    },
    /// `set_memory_target(TARGETS[choice % 8])`.
    SetTarget {
        /// Index into [`TARGETS`].
        choice: u8,
    },
    /// `flush().await`.
    Flush,
    /// Fail the `nth` write from now (faults only).
    FailWrite {
        /// 1 = the next write.
        nth: u8,
        /// 0 error, 1 no space, 2 short (torn) write.
        kind: u8,
    },
    /// Fail the `nth` read from now (faults only).
    FailRead {
        /// 1 = the next read.
        nth: u8,
    },
    /// Fail the `nth` file creation from now (faults only).
    FailCreate {
        /// 1 = the next creation.
        nth: u8,
    },
    /// Flip a bit in every read until cleared (faults only).
    FlipBits,
    /// Stop all faults, then read every key back (faults only).
    ClearFaults,
}

/// Settings of the buffer under test, decoded from one byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Memory target.
    pub target: usize,
    /// `memory_limit` twice the target, or left to follow it.
    pub limit_double: bool,
    /// lz4 on or off.
    pub lz4: bool,
    /// 1 or 2 IO threads.
    pub io_threads: usize,
    /// 1 or 4 shards.
    pub shards: usize,
    /// Disk budget of 24 KiB instead of unlimited.
    pub small_disk: bool,
    /// Compact a segment below this live fraction.
    pub compact_below: f64,
}

impl Config {
    /// Settings from one byte; every byte is valid.
    pub fn from_byte(b: u8) -> Config {
        Config {
            target: TARGETS[(b & 7) as usize],
            lz4: b & 8 != 0,
            limit_double: b & 16 != 0,
            io_threads: if b & 32 != 0 { 2 } else { 1 },
            shards: if b & 64 != 0 { 4 } else { 1 },
            small_disk: b & 0xC0 == 0xC0,
            compact_below: if b & 128 != 0 { 0.9 } else { 0.5 },
        }
    }
}

/// Reads bytes off the front of a fuzzer input; zeros once it runs dry.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn key(&mut self) -> u8 {
        self.u8() % KEYS
    }

    fn len(&mut self) -> u16 {
        self.u16() % (MAX_LEN + 1)
    }
}

/// Decode a fuzzer's bytes into operations: one opcode byte, then the
/// operation's arguments. Every input decodes; at most 256 operations.
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    let mut b = Bytes(data);
    let mut ops = Vec::new();
    while !b.0.is_empty() && ops.len() < 256 {
        let op = match b.u8() % 20 {
            0..=2 => {
                let (key, len, c) = (b.key(), b.len(), b.u8() & 1 != 0);
                Op::Insert {
                    key,
                    len,
                    compressible: c,
                }
            }
            3 => {
                let (key, len, c) = (b.key(), b.len(), b.u8() & 1 != 0);
                Op::InsertAsync {
                    key,
                    len,
                    compressible: c,
                }
            }
            4 | 5 => Op::Get { key: b.key() },
            6 => Op::Pin { key: b.key() },
            7 => Op::TryPin { key: b.key() },
            8 => Op::DropPin { slot: b.u8() },
            9 => Op::ConsumePin { slot: b.u8() },
            10 => Op::ClonePin { slot: b.u8() },
            11 => {
                let n = b.u8() % 4 + 1;
                Op::Prefetch {
                    keys: (0..n).map(|_| b.key()).collect(),
                }
            }
            12 => Op::Remove { key: b.key() },
            13 => Op::Evict {
                bytes: b.u16() % 16385,
            },
            14 => Op::SetTarget { choice: b.u8() % 8 },
            15 => Op::Flush,
            16 => {
                let (nth, kind) = (b.u8() % 8 + 1, b.u8() % 3);
                Op::FailWrite { nth, kind }
            }
            17 => match b.u8() % 4 {
                0 => Op::FailCreate {
                    nth: b.u8() % 4 + 1,
                },
                1 => Op::FlipBits,
                _ => Op::FailRead {
                    nth: b.u8() % 8 + 1,
                },
            },
            18 => Op::ClearFaults,
            _ => Op::Get { key: b.key() },
        };
        ops.push(op);
    }
    ops
}

/// The content of the `serial`th value the runner inserts: distinct for
/// every insert, so that a value read back under the wrong key or from a
/// stale record never compares equal to what the model holds.
pub fn value_for(key: u8, serial: u64, len: u16, compressible: bool) -> Vec<u8> {
    let mut x = (serial << 8 | key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut step = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    };
    let mut v: Vec<u8> = if compressible {
        let pattern: Vec<u8> = (0..7).map(|_| step()).collect();
        (0..len as usize).map(|i| pattern[i % 7]).collect()
    } else {
        (0..len).map(|_| step()).collect()
    };
    // Stamp key and serial at the front so mix-ups show even for
    // compressible values.
    for (d, s) in v
        .iter_mut()
        .zip([key].into_iter().chain(serial.to_le_bytes()))
    {
        *d = s;
    }
    v
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Run a future to completion on this thread, with no runtime: the
/// buffer's futures are runtime-agnostic. Panics if it takes longer than
/// `limit` (a hang, for a test).
pub fn block_on<F: Future>(fut: F, limit: Duration) -> F::Output {
    let deadline = Instant::now() + limit;
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let now = Instant::now();
        assert!(now < deadline, "operation did not finish within {limit:?}");
        std::thread::park_timeout(deadline - now);
    }
}

/// A pin the runner holds: its key, the guard, and the value it must show.
type HeldPin = (u8, Pinned<Vec<u8>>, Arc<Vec<u8>>);

/// Applies operations to a buffer and to a model, checking after each.
pub struct Runner {
    buf: SpillBuffer<u8, Vec<u8>>,
    cfg: Config,
    model: HashMap<u8, Arc<Vec<u8>>>,
    pins: Vec<HeldPin>,
    faults: Option<Arc<Faults>>,
    /// A read fault (failure or bit flip) has been armed since the last
    /// clear: reads may fail, but never return a wrong value.
    read_faults: bool,
    serial: u64,
    step: usize,
    /// Call `validate()` (which waits for the pool to go idle) after every
    /// step, or only on `Flush` and at the end so that IO overlaps with the
    /// following operations.
    validate_every_step: bool,
    /// Reads that failed under an armed read fault.
    pub failed_reads: u64,
}

impl Runner {
    /// A buffer configured by `cfg` in a private sub-directory of `dir`;
    /// with `faults`, over [`FaultyStorage`] and obeying the fault ops
    /// (which are ignored otherwise).
    pub fn new(dir: &Path, cfg: Config, faults: bool) -> Runner {
        let mut b = SpillBuffer::builder(dir)
            .memory_target(cfg.target)
            .compression(if cfg.lz4 {
                Compression::Lz4
            } else {
                Compression::None
            })
            .io_threads(cfg.io_threads)
            .shards(cfg.shards)
            .segment_size(SEGMENT_SIZE)
            .compact_below(cfg.compact_below);
        if cfg.limit_double {
            b = b.memory_limit(cfg.target * 2);
        }
        if cfg.small_disk {
            b = b.max_spill(24 * 1024);
        }
        let mut fault_switches = None;
        if faults {
            let storage = FaultyStorage::new();
            fault_switches = Some(storage.faults());
            b = b.storage(Arc::new(storage));
        }
        Runner {
            buf: b.build().expect("build the buffer under test"),
            cfg,
            model: HashMap::new(),
            pins: Vec::new(),
            faults: fault_switches,
            read_faults: false,
            serial: 0,
            step: 0,
            validate_every_step: true,
            failed_reads: 0,
        }
    }

    /// Validate only on `Flush` and at the end, so that spills, reads and
    /// compaction run while the next operations are applied. Values, `len`
    /// and `contains_key` are still checked after every step.
    pub fn overlapping(mut self) -> Runner {
        self.validate_every_step = false;
        self
    }

    /// The buffer under test.
    pub fn buffer(&self) -> &SpillBuffer<u8, Vec<u8>> {
        &self.buf
    }

    /// Run `ops`, then [`Runner::finish`]. Panics on the first disagreement,
    /// naming the step.
    pub fn run(mut self, ops: &[Op]) {
        for op in ops {
            self.apply(op);
        }
        self.finish();
    }

    fn fail(&self, op: &Op, what: String) -> ! {
        panic!(
            "step {} ({op:?}, config {:?}): {what}\nstats: {:?}",
            self.step,
            self.cfg,
            self.buf.stats()
        )
    }

    /// Check a read's outcome against the model.
    fn check_read(
        &mut self,
        op: &Op,
        key: u8,
        got: crate::Result<Option<Pinned<Vec<u8>>>>,
        keep: bool,
    ) {
        let want = self.model.get(&key).cloned();
        match (got, want) {
            (Ok(Some(p)), Some(w)) => {
                if **p != *w {
                    self.fail(op, format!("key {key}: read a wrong value"));
                }
                if keep {
                    self.hold(key, p, w);
                }
            }
            (Ok(None), None) => {}
            (Ok(Some(_)), None) => self.fail(op, format!("key {key}: read a removed key")),
            (Ok(None), Some(_)) => self.fail(op, format!("key {key}: lost")),
            (Err(e), want) => {
                let allowed = self.read_faults
                    && want.is_some()
                    && matches!(e, Error::Io { .. } | Error::Corrupt { .. });
                if !allowed {
                    self.fail(op, format!("key {key}: read failed: {e}"));
                }
                self.failed_reads += 1;
            }
        }
    }

    fn hold(&mut self, key: u8, p: Pinned<Vec<u8>>, want: Arc<Vec<u8>>) {
        if self.pins.len() == MAX_PINS {
            self.pins.remove(0);
        }
        self.pins.push((key, p, want));
    }

    fn insert_value(&mut self, key: u8, len: u16, compressible: bool) -> Vec<u8> {
        self.serial += 1;
        let v = value_for(key, self.serial, len, compressible);
        self.model.insert(key, Arc::new(v.clone()));
        v
    }

    /// Apply one operation to both sides and check them.
    pub fn apply(&mut self, op: &Op) {
        self.step += 1;
        match *op {
            Op::Insert {
                key,
                len,
                compressible,
            } => {
                let v = self.insert_value(key, len, compressible);
                if let Err(e) = self.buf.insert(key, v) {
                    self.fail(op, format!("insert failed: {e}"));
                }
            }
            Op::InsertAsync {
                key,
                len,
                compressible,
            } => {
                let v = self.insert_value(key, len, compressible);
                if let Err(e) = block_on(self.buf.insert_async(key, v), HANG) {
                    self.fail(op, format!("insert_async failed: {e}"));
                }
            }
            Op::Get { key } => {
                // A blocking get is a short read: its pin is dropped at once.
                let got = self.buf.get(&key);
                self.check_read(op, key, got, false);
            }
            Op::Pin { key } => {
                let got = block_on(self.buf.pin(&key), HANG);
                self.check_read(op, key, got, true);
            }
            Op::TryPin { key } => {
                // A miss is fine: the value may be on disk.
                if let Some(p) = self.buf.try_pin(&key) {
                    self.check_read(op, key, Ok(Some(p)), true);
                }
            }
            Op::DropPin { slot } => {
                if !self.pins.is_empty() {
                    let i = slot as usize % self.pins.len();
                    self.pins.remove(i);
                }
            }
            Op::ConsumePin { slot } => {
                if !self.pins.is_empty() {
                    let i = slot as usize % self.pins.len();
                    let (_, p, _) = self.pins.remove(i);
                    p.consume();
                }
            }
            Op::ClonePin { slot } => {
                if !self.pins.is_empty() {
                    let i = slot as usize % self.pins.len();
                    let (k, p, w) = &self.pins[i];
                    let (k, p, w) = (*k, p.clone(), Arc::clone(w));
                    self.hold(k, p, w);
                }
            }
            Op::Prefetch { ref keys } => self.buf.prefetch(keys.iter().copied()),
            Op::Remove { key } => {
                let was = self.model.remove(&key).is_some();
                if self.buf.remove(&key) != was {
                    self.fail(op, format!("remove({key}) disagrees: model had it: {was}"));
                }
            }
            Op::Evict { bytes } => {
                self.buf.evict(bytes as usize);
            }
            Op::SetTarget { choice } => {
                self.buf.set_memory_target(TARGETS[choice as usize % 8]);
            }
            Op::Flush => {
                if let Err(e) = block_on(self.buf.flush(), HANG) {
                    self.fail(op, format!("flush failed: {e}"));
                }
            }
            Op::FailWrite { nth, kind } => {
                if let Some(f) = &self.faults {
                    let kind = match kind % 3 {
                        0 => WriteFault::Error,
                        1 => WriteFault::NoSpace,
                        _ => WriteFault::Short,
                    };
                    f.fail_nth_write(nth.max(1) as u64, kind);
                }
            }
            Op::FailRead { nth } => {
                if let Some(f) = &self.faults {
                    f.fail_nth_read(nth.max(1) as u64);
                    self.read_faults = true;
                }
            }
            Op::FailCreate { nth } => {
                if let Some(f) = &self.faults {
                    f.fail_nth_create(nth.max(1) as u64);
                }
            }
            Op::FlipBits => {
                if let Some(f) = &self.faults {
                    f.flip_bits_on_read(true);
                    self.read_faults = true;
                }
            }
            Op::ClearFaults => {
                if self.faults.is_some() {
                    self.clear_faults();
                    self.check_all_values(op);
                }
            }
        }
        self.check(op);
    }

    fn clear_faults(&mut self) {
        if let Some(f) = &self.faults {
            // Let IO that may still meet an armed fault finish first.
            self.buf.flush_blocking().expect("flush");
            f.clear();
            self.read_faults = false;
        }
    }

    /// Every key of the model reads back equal (pins are dropped at once).
    fn check_all_values(&mut self, op: &Op) {
        let mut keys: Vec<u8> = self.model.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let got = self.buf.get(&key);
            let want = &self.model[&key];
            match got {
                Ok(Some(p)) if **p == **want => {}
                Ok(Some(_)) => self.fail(op, format!("key {key}: wrong value after faults")),
                Ok(None) => self.fail(op, format!("key {key}: lost")),
                Err(e) => self.fail(op, format!("key {key}: unreadable after faults: {e}")),
            }
        }
    }

    /// The checks run after every step.
    fn check(&self, op: &Op) {
        if self.buf.len() != self.model.len() {
            self.fail(
                op,
                format!("len {} != model {}", self.buf.len(), self.model.len()),
            );
        }
        for key in 0..KEYS {
            if self.buf.contains_key(&key) != self.model.contains_key(&key) {
                self.fail(op, format!("contains_key({key}) disagrees with the model"));
            }
        }
        for (key, p, want) in &self.pins {
            if ***p != **want {
                self.fail(op, format!("a held pin of key {key} changed"));
            }
        }
        if self.validate_every_step || *op == Op::Flush {
            self.validate(op);
        }
    }

    fn validate(&self, op: &Op) {
        if let Err(e) = self.buf.validate() {
            self.fail(op, format!("validate: {e}"));
        }
    }

    /// Clear faults, read every key back, then remove everything and check
    /// that memory and disk are empty (invariant 4) and that dropping the
    /// buffer leaves no file behind (invariant 5).
    pub fn finish(mut self) {
        let op = Op::ClearFaults;
        self.clear_faults();
        self.check_all_values(&op);
        self.pins.clear();
        let keys: Vec<u8> = self.model.keys().copied().collect();
        for key in keys {
            self.model.remove(&key);
            if !self.buf.remove(&key) {
                self.fail(&op, format!("final remove({key}) found nothing"));
            }
        }
        self.buf.flush_blocking().expect("flush");
        self.check(&op);
        self.validate(&op);
        let st = self.buf.stats();
        if st.memory_bytes != 0 || st.memory_count != 0 || st.spilling_bytes != 0 {
            self.fail(&op, "memory not empty after removing every key".into());
        }
        if st.disk_bytes != 0 || st.disk_count != 0 {
            self.fail(&op, "disk records left after removing every key".into());
        }
        if st.file_bytes > SEGMENT_SIZE {
            self.fail(
                &op,
                format!("{} file bytes left, more than one segment", st.file_bytes),
            );
        }
        let dirs = self.buf.spill_dirs();
        drop(self);
        for d in dirs {
            assert!(!d.exists(), "{} left behind after drop", d.display());
        }
    }
}

/// Run one fuzzer input: byte 0 picks the [`Config`], bit 0 of byte 1 makes
/// the run [`Runner::overlapping`], the rest decode into operations. The
/// fuzz targets and the corpus replay in `tests/model.rs` both use this, so
/// a committed input means the same thing in both.
pub fn run_input(dir: &Path, data: &[u8], faults: bool) {
    let [cfg, mode, rest @ ..] = data else {
        return;
    };
    let runner = Runner::new(dir, Config::from_byte(*cfg), faults);
    let runner = if mode & 1 != 0 {
        runner.overlapping()
    } else {
        runner
    };
    runner.run(&ops_from_bytes(rest));
}
