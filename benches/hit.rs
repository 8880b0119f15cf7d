//! The hit path: `try_pin` and `get` of resident keys, one and two threads
//! (each on its own keys), next to a plain `HashMap` lookup with an `Arc`
//! clone and a `memcpy` of the value, and the same lookup on one and two
//! threads that share nothing: the two-thread scaling the machine allows.

#[path = "common/mod.rs"]
mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rand::Rng;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const KEYS: u64 = 10_000;
const VALUE: usize = 64;

/// `threads` threads each run `iters` pins of their own keys; the time is
/// the slowest thread's.
fn run(b: &common::Buf, threads: usize, iters: u64, get: bool) -> Duration {
    common::slowest(threads, |t, go| {
        let order = common::own_keys(KEYS, t, threads, 0);
        let start = go();
        for i in 0..iters as usize {
            let k = &order[i & 4095];
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
    let b = common::buffer(dir.path(), usize::MAX / 2);
    for k in 0..KEYS {
        b.insert(k, vec![k as f64; VALUE / 8]).unwrap();
    }
    let mut g = c.benchmark_group("hit");
    for threads in [1usize, 2] {
        // Bytes of values handed out per second, over all threads.
        g.throughput(Throughput::Bytes((VALUE * threads) as u64));
        g.bench_function(format!("try_pin/{threads}-threads"), |bn| {
            bn.iter_custom(|iters| run(&b, threads, iters, false))
        });
        g.bench_function(format!("get/{threads}-threads"), |bn| {
            bn.iter_custom(|iters| run(&b, threads, iters, true))
        });
        g.bench_function(
            format!("raw/parallel-hashmap-get-arc-clone/{threads}-threads"),
            |bn| bn.iter_custom(|iters| common::parallel_floor(KEYS, threads, iters as usize, 0)),
        );
    }
    g.throughput(Throughput::Bytes(VALUE as u64));
    let map: HashMap<u64, Arc<Vec<f64>>> = (0..KEYS)
        .map(|k| (k, Arc::new(vec![k as f64; VALUE / 8])))
        .collect();
    let mut rng = common::rng(9);
    let order: Vec<u64> = (0..4096).map(|_| rng.gen_range(0..KEYS)).collect();
    g.bench_function("raw/hashmap-get-arc-clone", |bn| {
        let mut i = 0usize;
        bn.iter(|| {
            i = i.wrapping_add(1);
            black_box(map.get(&order[i & 4095]).cloned())
        })
    });
    let src = [1u8; VALUE];
    let mut dst = [0u8; VALUE];
    g.bench_function("raw/memcpy", |bn| {
        bn.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = hit }
criterion_main!(benches);
