//! Random reads of spilled values with the page cache dropped: the disk's
//! own speed at a given number of reads in flight, for the crate's `pin`
//! (and, at depth 1, its blocking `get`) and for raw `pread()` threads
//! reading the same bytes at the same depth from a plain file.
//!
//! Each run reads a fresh random set of distinct keys, so no read finds
//! its page in the cache; the cache is dropped (`/proc/sys/vm/drop_caches`,
//! root only) before every timed run, crate and raw alternating which goes
//! first.

use super::{bytes, random_f64, raw_read_threads, Buf, RawRead};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// What one depth of one value size measured: medians over the repeats,
/// and the median of the per-repeat ratios.
pub struct Depth {
    pub size: usize,
    pub values: usize,
    pub reads: usize,
    pub depth: usize,
    /// `pin` with `depth` in flight, bytes/s.
    pub pin: f64,
    /// Blocking `get` on the caller's thread, bytes/s (depth 1 only).
    pub get: Option<f64>,
    /// `pread()` on `depth` threads, bytes/s.
    pub raw: f64,
    pub pin_ratio_paired: f64,
    pub get_ratio_paired: Option<f64>,
    /// ns per `pin`, first poll to value: p50, p99, p999.
    pub pin_lat: Vec<u64>,
    /// Whether the page cache could be dropped (root only).
    pub cold: bool,
}

/// Write back and drop the page cache. False if not allowed (not root).
pub fn drop_caches() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn paired(own: &[f64], raw: &[f64]) -> f64 {
    let mut r: Vec<f64> = own.iter().zip(raw).map(|(c, r)| c / r).collect();
    (median(&mut r) * 1000.0).round() / 1000.0
}

/// `values` values of `size` bytes spilled by `buffer` (a buffer with
/// target 0) and written to a plain file; then, for each depth, `repeat`
/// runs of `reads` random distinct keys read both ways.
pub fn run(
    buffer: &Buf,
    dir: &Path,
    size: usize,
    values: usize,
    reads: usize,
    depths: &[usize],
    repeat: usize,
) -> Vec<Depth> {
    let mut rng = StdRng::seed_from_u64(17);
    let path = dir.join("cold-baseline.bin");
    {
        let mut f = File::create(&path).unwrap();
        for k in 0..values {
            let v = random_f64(&mut rng, size);
            f.write_all(bytes(&v)).unwrap();
            buffer.insert(k as u64, v).unwrap();
        }
    }
    buffer.flush_blocking().unwrap();
    let raw_file = File::open(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let mut keys: Vec<usize> = (0..values).collect();
    let mut out = Vec::new();
    let mut cold = true;
    for &depth in depths {
        let (mut pin, mut get, mut raw, mut lat) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for rep in 0..repeat {
            keys.shuffle(&mut rng);
            let n = reads.min(values / 2);
            let total = (n * size) as f64;
            // Raw and crate read different keys, so neither warms the
            // other's pages; the cache is dropped before each anyway.
            let (a, b) = (&keys[..n], &keys[n..2 * n]);
            let (raw_keys, own_keys) = if rep % 2 == 0 { (a, b) } else { (b, a) };
            let mut turns = vec!["raw", "pin"];
            if depth == 1 {
                turns.push("get");
            }
            if rep % 2 == 1 {
                turns.reverse();
            }
            for turn in turns {
                cold &= drop_caches();
                let secs = match turn {
                    "raw" => raw_read_threads(&raw_file, raw_keys, size, RawRead::Reused, depth)
                        .as_secs_f64(),
                    "pin" => {
                        let start = Instant::now();
                        let l = rt.block_on(pin_depth(buffer, own_keys, depth));
                        let secs = start.elapsed().as_secs_f64();
                        lat.extend(l);
                        secs
                    }
                    _ => {
                        let start = Instant::now();
                        for &k in own_keys {
                            let p = buffer.get(&(k as u64)).unwrap().expect("present");
                            std::hint::black_box(&*p);
                        }
                        start.elapsed().as_secs_f64()
                    }
                };
                let bps = total / secs.max(1e-9);
                match turn {
                    "raw" => raw.push(bps),
                    "pin" => pin.push(bps),
                    _ => get.push(bps),
                }
            }
        }
        lat.sort_unstable();
        let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
        out.push(Depth {
            size,
            values,
            reads: reads.min(values / 2),
            depth,
            pin_ratio_paired: paired(&pin, &raw),
            get_ratio_paired: (!get.is_empty()).then(|| paired(&get, &raw)),
            pin: median(&mut pin),
            get: (!get.is_empty()).then(|| median(&mut get)),
            raw: median(&mut raw),
            pin_lat: vec![at(0.5), at(0.99), at(0.999)],
            cold,
        });
    }
    drop(raw_file);
    let _ = std::fs::remove_file(path);
    out
}

/// Pin `keys` with `depth` pins in flight at all times: a new pin starts
/// as soon as any one arrives (in whatever order), as each raw thread
/// starts its next `pread()` as soon as its last one returns. Returns,
/// per pin, the ns from its first poll to its value.
async fn pin_depth(b: &Buf, keys: &[usize], depth: usize) -> Vec<u64> {
    let mut in_flight = tokio::task::JoinSet::new();
    let mut lat = Vec::with_capacity(keys.len());
    let mut next = keys.iter();
    loop {
        while in_flight.len() < depth.max(1) {
            let Some(&k) = next.next() else { break };
            let b = b.clone();
            in_flight.spawn(async move {
                let t0 = Instant::now();
                let p = b.pin(&(k as u64)).await.unwrap().expect("present");
                std::hint::black_box(&*p);
                t0.elapsed().as_nanos() as u64
            });
        }
        match in_flight.join_next().await {
            Some(l) => lat.push(l.unwrap()),
            None => return lat,
        }
    }
}
