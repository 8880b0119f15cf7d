//! Eviction policy: blocking `get` in zipf(1) order over 4,096 values of
//! 4 KiB inserted once, with memory for 10%, 25% and 50% of them. The time
//! per batch of reads is measured; the disk reads of one pass are printed
//! next to the misses of an exact LRU of the same byte capacity on the
//! same sequence (`examples/bench.rs --workload policy` gives the full
//! table, with a scan mix).

#[path = "common/mod.rs"]
mod common;

use common::policy;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const KEYS: usize = 4096;
const VALUE: usize = 4096;
const READS: usize = 20_000;

fn zipf_gets(c: &mut Criterion) {
    let seq = policy::zipf_reads(KEYS, READS, 5);
    let mut g = c.benchmark_group("policy");
    g.throughput(Throughput::Elements(READS as u64));
    for fraction in [0.10, 0.25, 0.50] {
        let name = format!("zipf-get/{}pct", (fraction * 100.0) as u32);
        let first = policy::run(common::dir().path(), KEYS, VALUE, fraction, &seq);
        println!(
            "{name}: disk reads {} vs exact LRU {} ({:.3}x)",
            first.disk_reads,
            first.lru_misses,
            first.disk_reads as f64 / first.lru_misses.max(1) as f64
        );
        g.bench_function(&name, |b| {
            b.iter_custom(|iters| {
                let mut total = std::time::Duration::ZERO;
                for _ in 0..iters {
                    let dir = common::dir();
                    let r = policy::run(dir.path(), KEYS, VALUE, fraction, &seq);
                    total += std::time::Duration::from_secs_f64(r.secs);
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = zipf_gets
}
criterion_main!(benches);
