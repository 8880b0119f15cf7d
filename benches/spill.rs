//! Spill throughput: a batch of values inserted over a small target and
//! flushed to disk, for 4 MiB incompressible values (random f64), 4 MiB
//! compressible ones (half zeros) and 4 KiB values; next to `write()` of
//! the same bytes to a plain file in the same directory (one call per
//! value) and a `memcpy` of them. Throughput counts value bytes.

#[path = "common/mod.rs"]
mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use std::time::{Duration, Instant};

/// One spill run of `values` (cloned before the clock starts).
fn spill_once(dir: &std::path::Path, values: &[Vec<f64>], target: usize) -> Duration {
    let values = values.to_vec();
    let b = common::buffer(dir, target);
    let start = Instant::now();
    for (k, v) in values.into_iter().enumerate() {
        b.insert(k as u64, v).unwrap();
    }
    b.flush_blocking().unwrap();
    let took = start.elapsed();
    drop(b);
    took
}

fn spill(c: &mut Criterion) {
    let dir = common::dir();
    let mut rng = common::rng(11);
    let cases: Vec<(&str, Vec<Vec<f64>>)> = vec![
        (
            "4MiB-random",
            (0..16)
                .map(|_| common::random_f64(&mut rng, 4 << 20))
                .collect(),
        ),
        (
            "4MiB-half-zeros",
            (0..16)
                .map(|_| common::half_zeros(&mut rng, 4 << 20))
                .collect(),
        ),
        (
            "4KiB-random",
            (0..4096)
                .map(|_| common::random_f64(&mut rng, 4 << 10))
                .collect(),
        ),
    ];
    let mut g = c.benchmark_group("spill");
    for (name, values) in &cases {
        let size = values[0].len() * 8;
        let total: usize = values.len() * size;
        g.throughput(Throughput::Bytes(total as u64));
        // A target of 1/256 of the batch: all but the last few values go
        // to disk through the eviction path.
        let target = total / 256;
        g.bench_function(format!("spillbuffer/{name}"), |bn| {
            bn.iter_custom(|iters| {
                (0..iters)
                    .map(|_| spill_once(dir.path(), values, target))
                    .sum()
            })
        });
        g.bench_function(format!("raw/write/{name}"), |bn| {
            bn.iter_custom(|iters| {
                (0..iters)
                    .map(|_| common::raw_write(dir.path(), values))
                    .sum()
            })
        });
        let mut dst = vec![0u8; size];
        g.bench_function(format!("raw/memcpy/{name}"), |bn| {
            bn.iter(|| {
                for v in values {
                    dst.copy_from_slice(black_box(common::bytes(v)));
                }
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = spill }
criterion_main!(benches);
