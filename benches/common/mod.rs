//! Helpers shared by the benches: seeded values, the spill directory, the
//! raw baselines (`write()`/`pread()` of the same bytes to a plain file in
//! the same directory, and a `memcpy`), so that each bench file reports the
//! crate's figure next to the hardware's in the same run, and the pipelined
//! unspill loop that `examples/bench.rs` and `benches/unspill.rs` share.
#![allow(dead_code)]

pub mod cold;
pub mod policy;

use criterion::{black_box, Criterion};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillbuffer::{Compression, SpillBuffer};
use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

pub type Buf = SpillBuffer<u64, Vec<f64>>;

/// Short runs: the whole suite should finish in a few minutes.
pub fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
}

/// A directory on the same disk as the crate's spill files (not /tmp,
/// which may be a RAM disk elsewhere).
pub fn dir() -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-spill");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Incompressible: random f64.
pub fn random_f64(rng: &mut StdRng, bytes: usize) -> Vec<f64> {
    (0..bytes / 8).map(|_| rng.gen::<f64>()).collect()
}

/// Compressible: runs of zeros between runs of random f64, half and half.
pub fn half_zeros(rng: &mut StdRng, bytes: usize) -> Vec<f64> {
    (0..bytes / 8)
        .map(|i| if (i / 512) % 2 == 0 { 0.0 } else { rng.gen() })
        .collect()
}

pub fn buffer(dir: &Path, target: usize) -> Buf {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .compression(Compression::Lz4)
        .build()
        .unwrap()
}

/// Zipf(1) draws over `n` keys, hot keys spread over the key space.
pub fn zipf(rng: &mut StdRng, n: usize, draws: usize) -> Vec<usize> {
    let mut cdf = Vec::with_capacity(n);
    let mut sum = 0.0;
    for r in 1..=n {
        sum += 1.0 / r as f64;
        cdf.push(sum);
    }
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, rng.gen_range(0..=i));
    }
    (0..draws)
        .map(|_| {
            let u = rng.gen::<f64>() * sum;
            perm[cdf.partition_point(|&c| c < u).min(n - 1)]
        })
        .collect()
}

pub fn bytes(v: &[f64]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Raw baseline: one `write()` per value to a new plain file in `dir`.
/// Returns the time taken; the file is removed afterwards, untimed.
pub fn raw_write(dir: &Path, values: &[Vec<f64>]) -> Duration {
    let path = dir.join("raw-baseline.bin");
    let mut f = File::create(&path).unwrap();
    let start = Instant::now();
    for v in values {
        f.write_all(bytes(v)).unwrap();
    }
    let took = start.elapsed();
    drop(f);
    std::fs::remove_file(path).unwrap();
    took
}

/// A plain file holding `values` back to back, for the raw read baseline.
pub fn raw_file(dir: &Path, values: &[Vec<f64>]) -> File {
    let path = dir.join("raw-read.bin");
    let mut f = File::create(&path).unwrap();
    for v in values {
        f.write_all(bytes(v)).unwrap();
    }
    File::open(&path).unwrap()
}

/// Raw baseline: `pread()` of record `i` of `size` bytes into `buf`.
pub fn raw_read(f: &File, i: usize, buf: &mut [u8]) {
    f.read_exact_at(buf, (i * buf.len()) as u64).unwrap();
}

/// How a raw read baseline treats each record it reads.
#[derive(Clone, Copy)]
pub enum RawRead {
    /// `pread()` into one reused buffer: the hardware's limit.
    Reused,
    /// Into a new `Vec` each time, as a decoded value must be.
    FreshVec,
    /// Into a new `Vec`, with a CRC-32 of each 256 KiB piece while it is in
    /// cache (as the buffer checks its records): the least a read that
    /// checks its data and hands out memory of its own does.
    FreshVecCrc,
}

/// Read records `keys` (each `buf.len()` bytes) from `f` the `how` way;
/// `buf` is the reused buffer of [`RawRead::Reused`].
pub fn raw_reads(f: &File, keys: &[usize], buf: &mut [u8], how: RawRead) {
    let size = buf.len();
    for &i in keys {
        match how {
            RawRead::Reused => raw_read(f, i, buf),
            RawRead::FreshVec => {
                let mut v = vec![0u8; size];
                raw_read(f, i, &mut v);
                black_box(v);
            }
            RawRead::FreshVecCrc => {
                let mut v = vec![0u8; size];
                let mut crc = crc32fast::Hasher::new();
                let mut at = (i * size) as u64;
                for piece in v.chunks_mut(256 << 10) {
                    f.read_exact_at(piece, at).unwrap();
                    crc.update(piece);
                    at += piece.len() as u64;
                }
                black_box((crc.finalize(), v));
            }
        }
    }
    black_box(buf);
}

/// [`raw_reads`] of `keys` (records of `size` bytes) split into `threads`
/// contiguous shares, one thread each, each with its own reused buffer.
/// Returns the wall time from the first thread's start to the last one's
/// end (thread start-up excluded, as the IO pool's threads already run).
/// One thread reads on the caller's thread.
pub fn raw_read_threads(
    f: &File,
    keys: &[usize],
    size: usize,
    how: RawRead,
    threads: usize,
) -> Duration {
    // Written, so that its pages are in place before the clock starts.
    let buffer = || vec![0xa5u8; size];
    if threads <= 1 {
        let mut buf = buffer();
        let start = Instant::now();
        raw_reads(f, keys, &mut buf, how);
        return start.elapsed();
    }
    // Fewer keys than threads make fewer shares: the barrier waits for
    // the threads there are.
    let shares: Vec<&[usize]> = keys.chunks(keys.len().div_ceil(threads).max(1)).collect();
    let barrier = Barrier::new(shares.len());
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let hs: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut buf = buffer();
                    barrier.wait();
                    let start = Instant::now();
                    raw_reads(f, share, &mut buf, how);
                    (start, Instant::now())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = spans.iter().map(|s| s.0).min().unwrap();
    let last = spans.iter().map(|s| s.1).max().unwrap();
    last - first
}

/// Pin `keys` in order with `window` pins in flight, as an async host
/// would: each pin is a task on the current runtime (a value on disk is
/// read on the IO pool, so up to `window` reads run there at once), the
/// tasks are awaited in key order and each pin is dropped as soon as it
/// arrives. Returns, per pin, the ns from the pin's first poll to its
/// value: the latency of one `pin`, queueing on the pool included.
pub async fn pin_window(b: &Buf, keys: &[usize], window: usize) -> Vec<u64> {
    let mut in_flight = VecDeque::with_capacity(window);
    let mut lat = Vec::with_capacity(keys.len());
    let mut arrive = |pinned: (spillbuffer::Pinned<Vec<f64>>, u64)| {
        black_box(&*pinned.0);
        lat.push(pinned.1);
    };
    for &k in keys {
        if in_flight.len() >= window.max(1) {
            let front: tokio::task::JoinHandle<_> = in_flight.pop_front().unwrap();
            arrive(front.await.unwrap());
        }
        let b = b.clone();
        in_flight.push_back(tokio::spawn(async move {
            let t0 = Instant::now();
            let p = b.pin(&(k as u64)).await.unwrap().expect("present");
            (p, t0.elapsed().as_nanos() as u64)
        }));
    }
    for front in in_flight {
        arrive(front.await.unwrap());
    }
    lat
}

/// How many keys a thread of the hit benchmarks draws, and reads in turn
/// (`own_keys`), unless told otherwise: a power of two.
pub const HIT_DRAWS: usize = 4096;

/// The order a thread of the hit benchmarks reads its keys in: `draws`
/// draws (a power of two) from thread `t`'s own share of `0..keys` split
/// over `threads`, seeded by `seed + t`.
pub fn own_keys(keys: u64, t: usize, threads: usize, draws: usize, seed: u64) -> Vec<u64> {
    debug_assert!(draws.is_power_of_two());
    let span = keys / threads as u64;
    let mut rng = rng(seed + t as u64);
    (0..draws)
        .map(|_| t as u64 * span + rng.gen_range(0..span))
        .collect()
}

/// Run `body(t, go)` on `threads` threads started together; `body`
/// prepares, then calls `go` to start its clock, and returns its time.
/// Returns the slowest thread's.
pub fn slowest<F>(threads: usize, body: F) -> Duration
where
    F: Fn(usize, &dyn Fn() -> Instant) -> Duration + Sync,
{
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, body) = (&barrier, &body);
                s.spawn(move || {
                    body(t, &|| {
                        barrier.wait();
                        Instant::now()
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    })
}

/// The value of key `k` in the hit-path workloads: 64 bytes.
pub fn hit_value(k: u64) -> Vec<f64> {
    vec![k as f64; 8]
}

/// The floor of the hit-path workloads: `keys` in a `HashMap`, each with
/// its [`hit_value`] behind an `Arc`.
pub fn floor_map(keys: std::ops::Range<u64>) -> HashMap<u64, Arc<Vec<f64>>> {
    keys.map(|k| (k, Arc::new(hit_value(k)))).collect()
}

/// The floors' loop: `iters` lookups of `order`'s keys in turn (a power
/// of two of them), each cloning, then dropping, the `Arc` it finds.
pub fn floor_lookups(map: &HashMap<u64, Arc<Vec<f64>>>, order: &[u64], iters: usize) {
    debug_assert!(order.len().is_power_of_two());
    let mask = order.len() - 1;
    for i in 0..iters {
        black_box(map.get(&order[i & mask]).cloned());
    }
}

/// A run of the floors' loop: `threads` threads, each looking up `iters`
/// of its [`own_keys`] (`draws` of them, from `seed`) among `keys`.
#[derive(Clone, Copy)]
pub struct FloorRun {
    pub keys: u64,
    pub threads: usize,
    pub iters: usize,
    pub draws: usize,
    pub seed: u64,
}

/// The hardware's ceiling for the hit loop: each thread looks up its keys
/// in a `HashMap` of its own and clones (then drops) the `Arc` it finds,
/// sharing nothing. Returns the slowest thread's time, so its scaling is
/// what the crate's can reach.
pub fn parallel_floor(run: FloorRun) -> Duration {
    let span = run.keys / run.threads as u64;
    floor_threads(run, |t| floor_map(t as u64 * span..(t as u64 + 1) * span))
}

/// The same loop with every thread on one `map` of all the keys, each on
/// its own: what sharing one map costs threads that read different keys
/// of it (each `Arc` clone still writes only its key's count). Returns
/// the slowest thread's time.
pub fn shared_floor(map: &HashMap<u64, Arc<Vec<f64>>>, run: FloorRun) -> Duration {
    floor_threads(run, |_| map)
}

/// The floors' loop, thread `t` on the map `map_of(t)` (made before its
/// clock starts): the slowest thread's time.
fn floor_threads<M: Borrow<HashMap<u64, Arc<Vec<f64>>>>>(
    run: FloorRun,
    map_of: impl Fn(usize) -> M + Sync,
) -> Duration {
    slowest(run.threads, |t, go| {
        let map = map_of(t);
        let order = own_keys(run.keys, t, run.threads, run.draws, run.seed);
        let start = go();
        floor_lookups(map.borrow(), &order, run.iters);
        start.elapsed()
    })
}
