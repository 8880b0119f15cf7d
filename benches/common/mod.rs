//! Helpers shared by the benches: seeded values, the spill directory, and
//! the raw baselines (`write()`/`pread()` of the same bytes to a plain file
//! in the same directory, and a `memcpy`), so that each bench file reports
//! the crate's figure next to the hardware's in the same run.
#![allow(dead_code)]

use criterion::Criterion;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillbuffer::{Compression, SpillBuffer};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
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
