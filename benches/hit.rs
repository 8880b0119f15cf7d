//! The hit path: `try_pin` (and `get`, at 10k keys) of resident keys, a
//! hot key per thread and random keys among 1k to 1M, one and two threads
//! (each on its own keys), next to a plain `HashMap` lookup with an `Arc`
//! clone and a `memcpy` of the value, and the same lookup on one and two
//! threads that share nothing (the two-thread scaling the machine allows)
//! and on one and two threads sharing one map (what sharing one structure
//! costs on this machine).

#[path = "common/mod.rs"]
mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rand::Rng;
use std::time::Duration;

/// Resident keys the pins pick from: a hot key per thread, then random
/// keys of ever larger sets (the larger, the more cache misses per pin).
const KEY_COUNTS: [(&str, u64); 5] = [
    ("hot", 2),
    ("1k", 1_000),
    ("10k", 10_000),
    ("100k", 100_000),
    ("1M", 1_000_000),
];
const VALUE: usize = 64;

/// A run of the floors' loop as criterion asks for it: `iters` lookups
/// per thread of the usual draws.
fn floor_run(keys: u64, threads: usize, iters: u64) -> common::FloorRun {
    common::FloorRun {
        keys,
        threads,
        iters: iters as usize,
        draws: common::HIT_DRAWS,
        seed: 0,
    }
}

/// `threads` threads each run `iters` pins of their own keys among `keys`;
/// the time is the slowest thread's.
fn run(b: &common::Buf, keys: u64, threads: usize, iters: u64, get: bool) -> Duration {
    common::slowest(threads, |t, go| {
        let order = common::own_keys(keys, t, threads, common::HIT_DRAWS, 0);
        let start = go();
        for i in 0..iters as usize {
            let k = &order[i % common::HIT_DRAWS];
            if get {
                black_box(b.get(k).unwrap());
            } else {
                black_box(b.try_pin(k));
            }
        }
        start.elapsed()
    })
}

fn hit(c: &mut Criterion) {
    let dir = common::dir();
    let mut g = c.benchmark_group("hit");
    for (name, keys) in KEY_COUNTS {
        for threads in [1usize, 2] {
            // A buffer for each thread count, so that two threads start
            // from the state one did: no cells that other threads gave.
            let b = common::buffer(dir.path(), usize::MAX / 2);
            for k in 0..keys {
                b.insert(k, common::hit_value(k)).unwrap();
            }
            // Bytes of values handed out per second, over all threads.
            g.throughput(Throughput::Bytes((VALUE * threads) as u64));
            g.bench_function(format!("try_pin/{name}/{threads}-threads"), |bn| {
                bn.iter_custom(|iters| run(&b, keys, threads, iters, false))
            });
            if keys == 10_000 {
                g.bench_function(format!("get/{name}/{threads}-threads"), |bn| {
                    bn.iter_custom(|iters| run(&b, keys, threads, iters, true))
                });
            }
            g.bench_function(
                format!("raw/parallel-hashmap-get-arc-clone/{name}/{threads}-threads"),
                |bn| {
                    bn.iter_custom(|iters| common::parallel_floor(floor_run(keys, threads, iters)))
                },
            );
        }
        let map = common::floor_map(0..keys);
        for threads in [1usize, 2] {
            g.throughput(Throughput::Bytes((VALUE * threads) as u64));
            g.bench_function(
                format!("raw/shared-hashmap-get-arc-clone/{name}/{threads}-threads"),
                |bn| {
                    bn.iter_custom(|iters| {
                        common::shared_floor(&map, floor_run(keys, threads, iters))
                    })
                },
            );
        }
        g.throughput(Throughput::Bytes(VALUE as u64));
        let mut rng = common::rng(9);
        let order: Vec<u64> = (0..4096).map(|_| rng.gen_range(0..keys)).collect();
        g.bench_function(format!("raw/hashmap-get-arc-clone/{name}"), |bn| {
            let mut i = 0usize;
            bn.iter(|| {
                i = i.wrapping_add(1);
                black_box(map.get(&order[i & 4095]).cloned())
            })
        });
    }
    let src = [1u8; VALUE];
    let mut dst = [0u8; VALUE];
    g.bench_function("raw/memcpy", |bn| {
        bn.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = hit }
criterion_main!(benches);
