//! Unspill throughput: `get` of spilled keys (target 0: each read goes to
//! disk, and the value is freed when its pin drops), in key order and in
//! zipf-random order; next to `pread()` of the same bytes from a plain file
//! in the same directory (page cache warm in both) and a `memcpy`. The
//! `-pipelined` functions `pin` the same keys on a current-thread runtime
//! with 4 pins in flight, so that the reads run on the IO pool's 2 threads;
//! `raw/pread-2threads` is their hardware limit: two threads, each reading
//! half of the keys into its own buffer.

#[path = "common/mod.rs"]
mod common;

use common::RawRead;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

/// Pins in flight in the pipelined functions (as `examples/bench.rs`).
const WINDOW: usize = 4;

fn unspill(c: &mut Criterion) {
    let dir = common::dir();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("unspill");
    for (name, size, count) in [("4MiB", 4usize << 20, 16usize), ("4KiB", 4 << 10, 4096)] {
        let mut rng = common::rng(13);
        let values: Vec<Vec<f64>> = (0..count)
            .map(|_| common::random_f64(&mut rng, size))
            .collect();
        let raw = common::raw_file(dir.path(), &values);
        let b = common::buffer(dir.path(), 0);
        for (k, v) in values.iter().enumerate() {
            b.insert(k as u64, v.clone()).unwrap();
        }
        b.flush_blocking().unwrap();
        for (order, keys) in [
            ("seq", (0..count).collect::<Vec<_>>()),
            ("zipf", common::zipf(&mut rng, count, count)),
        ] {
            g.throughput(Throughput::Bytes((keys.len() * size) as u64));
            g.bench_function(format!("spillbuffer/{name}/{order}"), |bn| {
                bn.iter(|| {
                    for &k in &keys {
                        black_box(b.get(&(k as u64)).unwrap().unwrap());
                    }
                })
            });
            g.bench_function(format!("spillbuffer/{name}/{order}-pipelined"), |bn| {
                bn.iter(|| black_box(rt.block_on(common::pin_window(&b, &keys, WINDOW))))
            });
            let mut buf = vec![0u8; size];
            g.bench_function(format!("raw/pread/{name}/{order}"), |bn| {
                bn.iter(|| {
                    for &k in &keys {
                        common::raw_read(&raw, k, &mut buf);
                    }
                    black_box(&buf);
                })
            });
            g.bench_function(format!("raw/pread-2threads/{name}/{order}"), |bn| {
                // Wall time of the reads only: the pool's threads already run.
                bn.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| common::raw_read_threads(&raw, &keys, size, RawRead::Reused, 2))
                        .sum::<Duration>()
                })
            });
            g.bench_function(format!("raw/memcpy/{name}/{order}"), |bn| {
                bn.iter(|| {
                    for &k in &keys {
                        buf.copy_from_slice(common::bytes(&values[k]));
                    }
                    black_box(&buf);
                })
            });
        }
    }
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = unspill }
criterion_main!(benches);
