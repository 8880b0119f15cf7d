//! The cost of publishing `Stats` through the `metrics` facade (feature
//! `metrics`): a `stats()` call reads the snapshot and sets every series
//! in the recorder. Measured with a recorder that keeps its series in a
//! hash map behind a lock, as exporters do, and with none installed (the
//! facade's no-op recorder): the difference is the publication. The IO
//! pool publishes at most once per `metrics_interval` (1 s by default), so
//! its cost per second is one of these calls.
//!
//! `cargo bench --bench publish --features metrics`

#[path = "common/mod.rs"]
mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    fn absolute(&self, n: u64) {
        self.0.fetch_max(n, Relaxed);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, _: f64) {}

    fn decrement(&self, _: f64) {}

    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Relaxed);
    }
}

/// Series in a hash map: a read lock and a lookup per registration, a
/// write lock the first time.
#[derive(Default)]
struct MapRecorder(RwLock<HashMap<Key, Arc<Cell>>>);

impl MapRecorder {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        if let Some(c) = self.0.read().get(key) {
            return Arc::clone(c);
        }
        Arc::clone(self.0.write().entry(key.clone()).or_default())
    }
}

impl Recorder for MapRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn publish(c: &mut Criterion) {
    let dir = common::dir();
    let b = common::buffer(dir.path(), 1 << 20);
    for k in 0..1000u64 {
        b.insert(k, vec![k as f64; 512]).unwrap();
    }
    b.flush_blocking().unwrap();
    let recorder = MapRecorder::default();
    let mut g = c.benchmark_group("publish");
    g.bench_function("stats/no-recorder", |bn| bn.iter(|| black_box(b.stats())));
    g.bench_function("stats/map-recorder", |bn| {
        metrics::with_local_recorder(&recorder, || bn.iter(|| black_box(b.stats())))
    });
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = publish }
criterion_main!(benches);
