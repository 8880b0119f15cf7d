//! Insert into memory (target far above the data, so nothing spills):
//! 4 KiB and 4 MiB values, next to a std `HashMap` insert of the same
//! values and a `memcpy` of their bytes.

#[path = "common/mod.rs"]
mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Values are made before the clock starts, at most this many bytes at a
/// time (zeroed allocations: their pages are not touched).
const ROUND: usize = 256 << 20;

fn rounds(iters: u64, size: usize, mut insert: impl FnMut(Vec<Vec<f64>>) -> Duration) -> Duration {
    let per_round = (ROUND / size).max(1) as u64;
    let mut left = iters;
    let mut total = Duration::ZERO;
    while left > 0 {
        let n = left.min(per_round);
        let values: Vec<Vec<f64>> = (0..n).map(|_| vec![0f64; size / 8]).collect();
        total += insert(values);
        left -= n;
    }
    total
}

fn insert(c: &mut Criterion) {
    let dir = common::dir();
    let mut g = c.benchmark_group("insert");
    for (name, size) in [("4KiB", 4usize << 10), ("4MiB", 4 << 20)] {
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("spillbuffer/{name}"), |bn| {
            bn.iter_custom(|iters| {
                rounds(iters, size, |values| {
                    let b = common::buffer(dir.path(), usize::MAX / 2);
                    let start = Instant::now();
                    for (k, v) in values.into_iter().enumerate() {
                        b.insert(k as u64, v).unwrap();
                    }
                    let took = start.elapsed();
                    drop(b);
                    took
                })
            })
        });
        g.bench_function(format!("raw/hashmap/{name}"), |bn| {
            bn.iter_custom(|iters| {
                rounds(iters, size, |values| {
                    let mut m = HashMap::new();
                    let start = Instant::now();
                    for (k, v) in values.into_iter().enumerate() {
                        m.insert(k as u64, v);
                    }
                    let took = start.elapsed();
                    drop(m);
                    took
                })
            })
        });
        let src = vec![1u8; size];
        let mut dst = vec![0u8; size];
        g.bench_function(format!("raw/memcpy/{name}"), |bn| {
            bn.iter(|| dst.copy_from_slice(black_box(&src)))
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = insert }
criterion_main!(benches);
