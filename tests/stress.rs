//! Concurrency stress: threads and tokio tasks doing random operations on
//! shared keys, every read checked against a per-key version log; and
//! dropping the buffer while IO is in flight, which must neither panic nor
//! leak IO threads or files.
//!
//! The tests in this file run one at a time (they count the process's IO
//! threads), under `SERIAL`.

mod common;

use common::files_under;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillbuffer::{Pinned, SpillBuffer};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

type Buf = SpillBuffer<u64, Vec<u8>>;

static SERIAL: Mutex<()> = Mutex::new(());

const KEYS: u64 = 24;

/// The value of version `version` of `key`: a header naming both, then
/// bytes derived from them, so that garbage or a mix-up never passes.
fn value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(16));
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    let mut x = (key << 32 ^ version).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while v.len() < len.max(16) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// Check a value read under `key` and return its version.
fn version_of(key: u64, v: &[u8]) -> u64 {
    assert!(v.len() >= 16, "key {key}: value of {} bytes", v.len());
    let k = u64::from_le_bytes(v[0..8].try_into().unwrap());
    let ver = u64::from_le_bytes(v[8..16].try_into().unwrap());
    assert_eq!(k, key, "read key {k}'s value under key {key}");
    assert!(
        v == value(key, ver, v.len()).as_slice(),
        "key {key} version {ver}: garbage"
    );
    ver
}

/// A write to one key, with the logical times it started and ended
/// (`u64::MAX` while in progress).
#[derive(Clone, Copy, Debug)]
struct Write {
    version: Option<u64>, // None: a removal
    start: u64,
    end: u64,
}

/// Per-key history of writes, and a logical clock.
struct Log {
    clock: AtomicU64,
    versions: Vec<AtomicU64>,
    writes: Vec<Mutex<Vec<Write>>>,
}

impl Log {
    fn new() -> Log {
        Log {
            clock: AtomicU64::new(1),
            versions: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            writes: (0..KEYS).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.fetch_add(1, SeqCst)
    }

    fn next_version(&self, key: u64) -> u64 {
        self.versions[key as usize].fetch_add(1, SeqCst) + 1
    }

    /// A write to `key` begins: logged at once (with no end yet), and its
    /// start taken under the log's lock, so that a read checked later
    /// cannot miss a write that began before the read ended.
    fn begin(&self, key: u64, version: Option<u64>) -> usize {
        let mut w = self.writes[key as usize].lock();
        w.push(Write {
            version,
            start: self.now(),
            end: u64::MAX,
        });
        w.len() - 1
    }

    fn finish(&self, key: u64, at: usize) {
        let mut w = self.writes[key as usize].lock();
        w[at].end = self.now();
    }

    /// A read of `key` that ran from `start` to `end` saw `seen` (a version,
    /// or absence). Fails if that can have been current at no moment of the
    /// read: a write that began after it was made and ended before the read
    /// began had replaced it. Only definite violations are flagged.
    fn check_read(&self, key: u64, seen: Option<u64>, start: u64, end: u64) {
        let writes = self.writes[key as usize].lock().clone();
        match seen {
            Some(ver) => {
                assert!(
                    ver <= self.versions[key as usize].load(SeqCst),
                    "key {key}: version {ver} was never written"
                );
                // When logged, the write that made it must not have been
                // superseded before the read began.
                if let Some(w) = writes.iter().find(|w| w.version == Some(ver)) {
                    assert!(
                        w.start < end,
                        "key {key}: read version {ver} before it was written"
                    );
                    if let Some(later) = writes.iter().find(|x| x.start > w.end && x.end < start) {
                        panic!(
                            "key {key}: read stale version {ver} ({w:?}) after {later:?} \
                             completed; read ran {start}..{end}"
                        );
                    }
                }
            }
            None => {
                // Absent: fails if some insert completed before the read
                // began and no removal could be ordered after it.
                for w in writes
                    .iter()
                    .filter(|w| w.version.is_some() && w.end < start)
                {
                    let removable = writes
                        .iter()
                        .any(|r| r.version.is_none() && r.end > w.start && r.start < end);
                    assert!(
                        removable,
                        "key {key}: read found nothing, but {w:?} completed before the \
                         read ({start}..{end}) and no removal can follow it"
                    );
                }
            }
        }
    }
}

fn buffer(dir: &std::path::Path, target: usize) -> Buf {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .memory_limit(target * 2)
        .segment_size(16 * 1024)
        .shards(4)
        .io_threads(2)
        .build()
        .expect("build")
}

/// One thread's worth of random blocking operations.
fn thread_ops(buf: &Buf, log: &Log, seed: u64, n: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut held: Vec<(u64, Pinned<Vec<u8>>)> = Vec::new();
    for _ in 0..n {
        let key = rng.gen_range(0..KEYS);
        match rng.gen_range(0..100) {
            0..=34 => {
                let ver = log.next_version(key);
                let len = rng.gen_range(16..3000);
                let at = log.begin(key, Some(ver));
                buf.insert(key, value(key, ver, len)).unwrap();
                log.finish(key, at);
            }
            35..=64 => {
                let start = log.now();
                let got = buf.get(&key).expect("get");
                let end = log.now();
                let seen = got.as_ref().map(|p| version_of(key, p));
                log.check_read(key, seen, start, end);
                if let Some(p) = got {
                    if rng.gen_bool(0.2) {
                        held.push((key, p));
                    } else if rng.gen_bool(0.3) {
                        p.consume();
                    }
                }
            }
            65..=74 => {
                let start = log.now();
                if let Some(p) = buf.try_pin(&key) {
                    let end = log.now();
                    log.check_read(key, Some(version_of(key, &p)), start, end);
                }
            }
            75..=84 => {
                let at = log.begin(key, None);
                buf.remove(&key);
                log.finish(key, at);
            }
            85..=89 => buf.prefetch((0..3).map(|_| rng.gen_range(0..KEYS))),
            90..=93 => {
                buf.evict(rng.gen_range(0..20_000));
            }
            94..=95 => buf.set_memory_target(rng.gen_range(4_000..64_000)),
            _ => {
                if !held.is_empty() {
                    let (k, p) = held.swap_remove(rng.gen_range(0..held.len()));
                    version_of(k, &p);
                    if rng.gen_bool(0.5) {
                        p.consume();
                    }
                }
            }
        }
        if held.len() > 4 {
            held.remove(0);
        }
    }
}

/// One tokio task's worth of async operations.
async fn task_ops(buf: Buf, log: Arc<Log>, seed: u64, n: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..n {
        let key = rng.gen_range(0..KEYS);
        match rng.gen_range(0..10) {
            0..=3 => {
                let ver = log.next_version(key);
                let len = rng.gen_range(16..3000);
                let at = log.begin(key, Some(ver));
                buf.insert_async(key, value(key, ver, len)).await.unwrap();
                log.finish(key, at);
            }
            4..=8 => {
                let start = log.now();
                let got = buf.pin(&key).await.expect("pin");
                let end = log.now();
                let seen = got.as_ref().map(|p| version_of(key, p));
                log.check_read(key, seen, start, end);
                if let Some(p) = got {
                    if rng.gen_bool(0.5) {
                        p.consume();
                    }
                }
            }
            _ => {
                let at = log.begin(key, None);
                buf.remove(&key);
                log.finish(key, at);
            }
        }
    }
}

#[test]
fn threads_and_tasks_on_shared_keys_read_only_current_versions() {
    let _serial = SERIAL.lock();
    let dir = tempfile::tempdir().unwrap();
    let buf = buffer(dir.path(), 16 * 1024);
    let log = Arc::new(Log::new());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (buf, log) = (&buf, &*log);
            s.spawn(move || thread_ops(buf, log, 100 + t, 30_000));
        }
        rt.block_on(async {
            let tasks: Vec<_> = (0..4u64)
                .map(|t| tokio::spawn(task_ops(buf.clone(), Arc::clone(&log), 200 + t, 10_000)))
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    });
    buf.flush_blocking().unwrap();
    buf.validate().unwrap();
    // Quiescent: each key now reads back its last write exactly.
    let end = log.now();
    for key in 0..KEYS {
        let got = buf.get(&key).unwrap();
        let seen = got.as_ref().map(|p| version_of(key, p));
        log.check_read(key, seen, end, log.now());
    }
    let st = buf.stats();
    assert!(
        st.spill_count_total > 0 && st.unspill_count_total > 0,
        "{st:?}"
    );
    buf.validate().unwrap();
}

/// Threads named `spillbuffer-io-*` in this process.
fn io_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|rd| {
            rd.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("spillbuffer-io"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Poll, bounded, until `n` IO threads show. A spawned thread sets its own
/// name as it starts, and a joined one can linger in /proc for a moment
/// after `join` returns (the kernel reaps it just after waking the joiner):
/// neither is something the buffer could synchronise with.
fn io_threads_settle_to(n: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let now = io_threads();
        if now == n || std::time::Instant::now() > deadline {
            return now;
        }
        std::thread::yield_now();
    }
}

#[test]
fn dropping_the_buffer_with_io_in_flight_leaks_nothing() {
    let _serial = SERIAL.lock();
    let before = io_threads();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for round in 0..20u64 {
        let buf = buffer(dir.path(), 8 * 1024);
        // A new thread names itself as it starts: wait for both.
        assert_eq!(io_threads_settle_to(before + 2), before + 2);
        // Plenty of spills queued, some reads and prefetches behind them.
        for i in 0..200u64 {
            buf.insert(i % 64, value(i % 64, round * 1000 + i, 2048))
                .unwrap();
        }
        buf.prefetch(0..64);
        let pin = rt.spawn({
            let buf = buf.clone();
            async move { buf.pin(&3).await.map(|p| p.map(|p| p.len())) }
        });
        let kept = buf.try_pin(&63);
        // A held pin may outlive the buffer; a pending pin finishes (with a
        // value or `Closed`) because its task holds a handle.
        assert!(rt.block_on(pin).unwrap().is_ok());
        drop(buf);
        if let Some(p) = kept {
            assert_eq!(version_of(63, &p), round * 1000 + 191);
        }
        assert_eq!(
            io_threads_settle_to(before),
            before,
            "round {round}: IO threads leaked"
        );
        assert_eq!(
            files_under(dir.path()),
            0,
            "round {round}: files left behind"
        );
    }
}

#[test]
fn dropping_a_clone_in_a_task_while_pins_wait_is_clean() {
    let _serial = SERIAL.lock();
    let before = io_threads();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let buf = buffer(dir.path(), 4 * 1024);
    for i in 0..64u64 {
        buf.insert(i, value(i, 1, 1024)).unwrap();
    }
    // Many concurrent pins of spilled keys, then the last handle goes while
    // reads may still be queued: every pin resolves, none panics.
    let tasks: Vec<_> = (0..32u64)
        .map(|i| {
            let buf = buf.clone();
            rt.spawn(async move {
                match buf.pin(&(i % 8)).await {
                    Ok(Some(p)) => assert_eq!(version_of(i % 8, &p), 1),
                    Ok(None) => panic!("key {} lost", i % 8),
                    Err(e) => panic!("pin failed: {e}"),
                }
            })
        })
        .collect();
    drop(buf);
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    assert_eq!(io_threads_settle_to(before), before, "IO threads leaked");
    assert_eq!(files_under(dir.path()), 0, "files left behind");
}

/// Found by the `faults` fuzz target ("Clean list: ticks not falling"):
/// unspills, unpins and failed spills took their LRU tick before taking
/// the shard lock, so two IO threads finishing reads at once could link
/// their entries in the opposite order of their ticks, breaking the LRU
/// order `validate()` checks. Racy by nature: many rounds of concurrent
/// read-backs into one shard, then validate.
#[test]
fn concurrent_read_backs_keep_each_lru_list_in_tick_order() {
    let _serial = SERIAL.lock();
    let dir = tempfile::tempdir().unwrap();
    let buf: Buf = SpillBuffer::builder(dir.path())
        .memory_target(256 * 1024)
        .shards(1)
        .io_threads(2)
        .build()
        .unwrap();
    for round in 0..300u64 {
        for k in 0..64u64 {
            buf.insert(k, value(k, round, 512)).unwrap();
        }
        buf.evict(usize::MAX);
        buf.flush_blocking().unwrap();
        buf.prefetch(0..64);
        // Pins dropped from several threads at once take the unpin path.
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let buf = &buf;
                s.spawn(move || {
                    for k in (t..64).step_by(3) {
                        drop(buf.get(&k).unwrap());
                    }
                });
            }
        });
        buf.validate()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
}
