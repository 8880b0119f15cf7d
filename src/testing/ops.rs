//! The operation generator shared by the property tests (`tests/model.rs`)
//! and the `ops` / `faults` fuzz targets: an [`Op`] enum with bounded
//! arguments, a byte decoder ([`ops_from_bytes`]) so that a fuzzer's input
//! maps onto operations, and a [`Runner`] that applies each operation to a
//! [`SpillBuffer`](crate::SpillBuffer) and to a `HashMap` model, checking
//! after every step that they agree and that `SpillBuffer::validate` holds.
//!
//! Over [`FaultyStorage`](crate::testing::FaultyStorage) the runner also injects failures on the Nth
//! write, read or file creation, and bit flips on reads. It then checks the
//! promise of DESIGN.md: nothing inserted is lost. A read while a read
//! fault is armed may fail with `Io` or `Corrupt` but never returns a wrong
//! value; once the faults are cleared every key reads back as inserted.

use std::future::Future;
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
    /// `take(key).await`: the value handed back must be the model's, and
    /// the key leaves the model (it stays if the read-back failed under an
    /// armed read fault).
    Take {
        /// Key, `0..KEYS`.
        key: u8,
    },
    /// `take_blocking(key)`, checked as [`Op::Take`].
    TakeBlocking {
        /// Key, `0..KEYS`.
        key: u8,
    },
    /// `keys()`, sorted, must equal the model's keys.
    Keys,
    /// `retry_spills()`.
    RetrySpills,
    /// Insert a [`Value`] whose `encode` fails: it is set aside in memory,
    /// and with `wait` (`insert_async`) it may be refused once such values
    /// fill memory past the limit.
    InsertBad {
        /// Key, `0..KEYS`.
        key: u8,
        /// Value length, `0..=MAX_LEN`.
        len: u16,
        /// `insert_async` rather than `insert`.
        wait: bool,
    },
    /// Make the storage a small disk of `blocks` × 4 KiB (0: unlimited),
    /// so that writes fail with ENOSPC and full-disk recovery (punched
    /// holes, in-place packing) runs; `refuse_punch` makes it a file system
    /// without hole punching (faults only; not undone by `ClearFaults`).
    SetCapacity {
        /// 4 KiB blocks, `0..=MAX_BLOCKS`; 0 is no limit.
        blocks: u8,
        /// Punching a hole fails as unsupported.
        refuse_punch: bool,
    },
    /// `record(from)` (or `record_blocking`), then
    /// `insert_record(to, record)` (or its blocking form) into the same
    /// buffer: `to` must then read back as `from`'s value. `streamed`: the
    /// record goes through a byte stream instead, `send_record` and
    /// `receive_record` (blocking: `write_record_to` and
    /// `insert_record_from`). Not drawn by
    /// [`ops_from_bytes`] (whose opcodes keep the committed corpora's
    /// meaning); the property tests draw it.
    Transfer {
        /// Key sent, `0..KEYS`.
        from: u8,
        /// Key inserted, `0..KEYS` (may be `from`).
        to: u8,
        /// Use the blocking calls.
        blocking: bool,
        /// Through a byte stream rather than a [`crate::Record`].
        streamed: bool,
    },
}

/// Largest disk [`Op::SetCapacity`] makes, in 4 KiB blocks.
pub const MAX_BLOCKS: u8 = 12;

/// The value type of the buffers under test: bytes, and a flag that makes
/// `encode` fail (a value the buffer cannot spill, which it must set
/// aside in memory). Values compare by their bytes, which the runner makes
/// distinct for every insert ([`value_for`]); a value read back from disk
/// never has the flag (only values that encode are written).
#[derive(Debug, Clone)]
pub struct Value {
    /// The content.
    pub bytes: Vec<u8>,
    /// `encode` fails (and `as_encoded` gives `None`, so that it is called).
    pub fails_encode: bool,
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        self.bytes == other.bytes
    }
}

impl crate::Spill for Value {
    fn weight(&self) -> usize {
        self.bytes.len()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), crate::error::BoxError> {
        if self.fails_encode {
            return Err("this test value is marked to fail its encode".into());
        }
        out.extend_from_slice(&self.bytes);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Value, crate::error::BoxError> {
        Ok(Value {
            bytes: bytes.to_vec(),
            fails_encode: false,
        })
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        (!self.fails_encode).then_some(self.bytes.as_slice())
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), crate::error::BoxError>,
    ) -> Option<Result<Value, crate::error::BoxError>> {
        <Vec<u8> as crate::Spill>::decode_in_place(len, fill).map(|r| {
            r.map(|bytes| Value {
                bytes,
                fails_encode: false,
            })
        })
    }
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
///
/// Opcode 19 (once a second `Get`) is followed by a byte that picks one
/// of the operations added later (take, keys, retry, values that fail to
/// encode, disk capacity): the other opcodes keep their meaning, so that
/// the committed corpora mostly decode as they did when they were grown.
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
            _ => match b.u8() % 8 {
                0 | 1 => Op::Take { key: b.key() },
                2 => Op::TakeBlocking { key: b.key() },
                3 => Op::Keys,
                4 => Op::RetrySpills,
                5 | 6 => {
                    let (key, len, wait) = (b.key(), b.len(), b.u8() & 1 != 0);
                    Op::InsertBad { key, len, wait }
                }
                _ => {
                    let x = b.u8();
                    Op::SetCapacity {
                        blocks: x % (MAX_BLOCKS + 1),
                        refuse_punch: x & 0x80 != 0,
                    }
                }
            },
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

mod runner;
pub use runner::{run_input, Runner};
