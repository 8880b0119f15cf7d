//! The `metrics` feature: with a recorder installed, a buffer's published
//! series equal its `stats()`, per buffer (`buffer` label), without the host
//! calling `stats()`; a dropped buffer's gauges fall to zero; spill errors
//! are split by cause; every series is described with its unit.
//!
//! The recorder is a small one of this file's own, installed once for the
//! test binary; each test labels its buffers with a name of its own. The
//! one wait on time is for the publication the contract puts on a timer
//! (`published_without_io_on_the_timer`), bounded by a deadline.
#![cfg(feature = "metrics")]

mod common;

use common::{value, Val};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use spillbuffer::testing::{FaultyStorage, WriteFault};
use spillbuffer::{Compression, SpillBuffer, Stats};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One series' value: a counter's count, or a gauge's `f64` bits.
#[derive(Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, n: u64) {
        self.0.fetch_add(n, SeqCst);
    }

    fn absolute(&self, n: u64) {
        self.0.fetch_max(n, SeqCst);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, v: f64) {
        self.set(f64::from_bits(self.0.load(SeqCst)) + v);
    }

    fn decrement(&self, v: f64) {
        self.set(f64::from_bits(self.0.load(SeqCst)) - v);
    }

    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), SeqCst);
    }
}

/// (name, sorted labels) → (is a counter, value).
type Series = BTreeMap<(String, Vec<(String, String)>), (bool, Arc<Cell>)>;

/// How a series was described: (as a counter, unit, help).
type Description = (bool, Option<Unit>, String);

#[derive(Default)]
struct Registry {
    series: Mutex<Series>,
    /// name → how it was described.
    described: Mutex<BTreeMap<String, Description>>,
}

impl Registry {
    fn cell(&self, key: &Key, counter: bool) -> Arc<Cell> {
        let mut labels: Vec<_> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let mut series = self.series.lock().unwrap();
        let (was_counter, cell) = series
            .entry((key.name().to_owned(), labels))
            .or_insert_with(|| (counter, Arc::default()));
        assert_eq!(
            *was_counter,
            counter,
            "{} registered as both kinds",
            key.name()
        );
        Arc::clone(cell)
    }

    /// The value of `name` for buffer `buffer` (and `cause`, if given).
    fn get(&self, name: &str, buffer: &str, cause: Option<&str>) -> Option<f64> {
        let mut labels = vec![("buffer".to_owned(), buffer.to_owned())];
        if let Some(c) = cause {
            labels.push(("cause".to_owned(), c.to_owned()));
        }
        labels.sort();
        let series = self.series.lock().unwrap();
        let (counter, cell) = series.get(&(name.to_owned(), labels))?;
        let bits = cell.0.load(SeqCst);
        Some(if *counter {
            bits as f64
        } else {
            f64::from_bits(bits)
        })
    }

    /// The `buffer` labels seen so far.
    fn buffers(&self) -> Vec<String> {
        let series = self.series.lock().unwrap();
        let mut names: Vec<String> = series
            .keys()
            .flat_map(|(_, labels)| labels.iter())
            .filter(|(k, _)| k == "buffer")
            .map(|(_, v)| v.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

struct Global(&'static Registry);

impl Recorder for Global {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        let d = (true, unit, help.into_owned());
        self.0
            .described
            .lock()
            .unwrap()
            .insert(key.as_str().to_owned(), d);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        let d = (false, unit, help.into_owned());
        self.0
            .described
            .lock()
            .unwrap()
            .insert(key.as_str().to_owned(), d);
    }

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {
        panic!("spillbuffer publishes no histogram");
    }

    fn register_counter(&self, key: &Key, meta: &Metadata<'_>) -> Counter {
        assert_eq!(meta.target(), "spillbuffer");
        Counter::from_arc(self.0.cell(key, true))
    }

    fn register_gauge(&self, key: &Key, meta: &Metadata<'_>) -> Gauge {
        assert_eq!(meta.target(), "spillbuffer");
        Gauge::from_arc(self.0.cell(key, false))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        panic!("spillbuffer publishes no histogram: {}", key.name());
    }
}

/// The recorder, installed before the first buffer is built.
fn recorder() -> &'static Registry {
    static REG: OnceLock<&'static Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let reg: &'static Registry = Box::leak(Box::default());
        metrics::set_global_recorder(Global(reg)).expect("no other recorder in this test binary");
        reg
    })
}

/// Every series name with the `Stats` field it carries: the contract of
/// docs/stats.md, spelled out once more here.
fn expected(st: &Stats) -> Vec<(&'static str, Option<&'static str>, f64)> {
    vec![
        ("spillbuffer_memory_bytes", None, st.memory_bytes as f64),
        ("spillbuffer_memory_values", None, st.memory_count as f64),
        ("spillbuffer_spilling_bytes", None, st.spilling_bytes as f64),
        ("spillbuffer_detached_bytes", None, st.detached_bytes as f64),
        (
            "spillbuffer_detached_values",
            None,
            st.detached_count as f64,
        ),
        (
            "spillbuffer_set_aside_bytes",
            None,
            st.set_aside_bytes as f64,
        ),
        (
            "spillbuffer_spilled_weight_bytes",
            None,
            st.spilled_weight_bytes as f64,
        ),
        ("spillbuffer_disk_bytes", None, st.disk_bytes as f64),
        ("spillbuffer_disk_records", None, st.disk_count as f64),
        ("spillbuffer_file_bytes", None, st.file_bytes as f64),
        (
            "spillbuffer_spilled_bytes_total",
            None,
            st.spilled_bytes_total as f64,
        ),
        (
            "spillbuffer_spilled_records_total",
            None,
            st.spill_count_total as f64,
        ),
        (
            "spillbuffer_unspilled_bytes_total",
            None,
            st.unspilled_bytes_total as f64,
        ),
        (
            "spillbuffer_unspilled_records_total",
            None,
            st.unspill_count_total as f64,
        ),
        (
            "spillbuffer_clean_evictions_total",
            None,
            st.clean_evictions_total as f64,
        ),
        (
            "spillbuffer_spill_errors_total",
            Some("encode"),
            st.spill_errors_encode_total as f64,
        ),
        (
            "spillbuffer_spill_errors_total",
            Some("io"),
            st.spill_errors_io_total as f64,
        ),
        (
            "spillbuffer_spill_errors_total",
            Some("max_spill"),
            st.spill_budget_refusals_total as f64,
        ),
        (
            "spillbuffer_compacted_records_total",
            None,
            st.compacted_count_total as f64,
        ),
        (
            "spillbuffer_locked_pins_total",
            None,
            st.locked_pins_total as f64,
        ),
        (
            "spillbuffer_spill_seconds_total",
            None,
            st.spill_seconds_total,
        ),
        (
            "spillbuffer_unspill_seconds_total",
            None,
            st.unspill_seconds_total,
        ),
        (
            "spillbuffer_io_busy_seconds_total",
            None,
            st.io_busy_seconds_total,
        ),
    ]
}

/// Differences between what `reg` holds for `buffer` and `st`.
fn mismatches(reg: &Registry, buffer: &str, st: &Stats) -> Vec<String> {
    expected(st)
        .into_iter()
        .filter_map(|(name, cause, want)| {
            let got = reg.get(name, buffer, cause);
            (got != Some(want))
                .then(|| format!("{name} {cause:?}: published {got:?}, stats {want}"))
        })
        .collect()
}

const W: usize = 4096;

fn build(name: &str, target: usize, interval: Duration) -> SpillBuffer<u64, Vec<u8>> {
    SpillBuffer::builder(std::env::temp_dir())
        .name(name)
        .memory_target(target)
        .segment_size(64 * 1024)
        .metrics_interval(interval)
        .build()
        .unwrap()
}

/// Spill, read back, remove (so compaction runs), flush: with the pool
/// publishing after every job, what the recorder holds equals the stats
/// read afterwards, before any `stats()` call publishes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_values_equal_stats() {
    let reg = recorder();
    let b = build("equal", 16 * W, Duration::ZERO);
    for k in 0..200u64 {
        b.insert(k, value(k, W)).unwrap();
    }
    b.flush().await.unwrap();
    for k in 0..40u64 {
        let v = b.pin(&k).await.unwrap().unwrap();
        assert_eq!(*v, value(k, W));
    }
    for k in (50..200u64).filter(|k| k % 4 != 0) {
        assert!(b.remove(&k));
    }
    b.flush().await.unwrap();
    let published_first = reg.get("spillbuffer_spilled_bytes_total", "equal", None);
    let st = b.stats();
    assert!(
        st.spill_count_total > 0 && st.unspill_count_total >= 40,
        "{st:?}"
    );
    assert!(st.compacted_count_total > 0, "no compaction ran: {st:?}");
    assert_eq!(published_first, Some(st.spilled_bytes_total as f64));
    // `stats()` published the same snapshot again: compare all of it.
    let bad = mismatches(reg, "equal", &st);
    assert!(bad.is_empty(), "{bad:#?}");
}

/// A stricter form of the above: when the last change was a job's,
/// every series was already right before the host asked. (Pins are held
/// to the end: dropping one may evict on this thread, a change the pool
/// publishes only on its timer.)
#[tokio::test(flavor = "current_thread")]
async fn the_pool_publishes_without_stats_calls() {
    let reg = recorder();
    let b = build("pool", 8 * W, Duration::ZERO);
    for k in 0..64u64 {
        b.insert(k, value(k, W)).unwrap();
    }
    b.flush().await.unwrap();
    let mut pins = Vec::new();
    for k in 0..4u64 {
        pins.push(b.pin(&k).await.unwrap().unwrap());
    }
    b.flush().await.unwrap();
    let before: Vec<_> = expected(&Stats::default())
        .into_iter()
        .map(|(name, cause, _)| reg.get(name, "pool", cause))
        .collect();
    let st = b.stats();
    let want: Vec<_> = expected(&st).into_iter().map(|(_, _, v)| Some(v)).collect();
    assert_eq!(before, want, "published before stats() vs stats() after");
    assert!(
        st.spill_count_total > 0 && st.unspill_count_total >= 4,
        "{st:?}"
    );
    drop(pins);
}

/// Changes made without any IO (inserts under the target) reach the
/// recorder on the idle timer; a `stats()` call publishes at once.
#[test]
fn published_without_io_on_the_timer() {
    let reg = recorder();
    let b = build("timer", 1 << 30, Duration::from_millis(20));
    for k in 0..3u64 {
        b.insert(k, value(k, W)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while reg.get("spillbuffer_memory_bytes", "timer", None) != Some(3.0 * W as f64) {
        assert!(Instant::now() < deadline, "the idle timer did not publish");
        std::thread::sleep(Duration::from_millis(5));
    }
    b.insert(3, value(3, W)).unwrap();
    let st = b.stats();
    assert_eq!(st.memory_bytes, 4 * W as u64);
    let bad = mismatches(reg, "timer", &st);
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Two buffers in one process keep separate series under their names.
#[test]
fn two_buffers_keep_their_own_series() {
    let reg = recorder();
    let a = build("left", 4 * W, Duration::ZERO);
    let b = build("right", 1 << 30, Duration::ZERO);
    for k in 0..20u64 {
        a.insert(k, value(k, W)).unwrap();
    }
    b.insert(1, value(1, 3 * W)).unwrap();
    // Both flushed: each buffer's pool runs a start-up sweep, and a tick
    // after it publishes that job's busy time, after any `stats()` taken
    // while it still runs.
    a.flush_blocking().unwrap();
    b.flush_blocking().unwrap();
    let (sa, sb) = (a.stats(), b.stats());
    assert_ne!(sa.memory_bytes, sb.memory_bytes);
    assert!(sa.spill_count_total > 0 && sb.spill_count_total == 0);
    for (name, st) in [("left", &sa), ("right", &sb)] {
        let bad = mismatches(reg, name, st);
        assert!(bad.is_empty(), "{name}: {bad:#?}");
    }
}

/// Buffers built without a name get distinct labels.
#[test]
fn unnamed_buffers_get_distinct_labels() {
    let reg = recorder();
    let build_unnamed = || -> SpillBuffer<u64, Vec<u8>> {
        SpillBuffer::builder(std::env::temp_dir()).build().unwrap()
    };
    let numbered = || -> Vec<String> {
        reg.buffers()
            .into_iter()
            .filter(|n| n.parse::<u64>().is_ok())
            .collect()
    };
    let before = numbered();
    let (a, b) = (build_unnamed(), build_unnamed());
    a.insert(1, value(1, W)).unwrap();
    b.insert(1, value(1, 2 * W)).unwrap();
    let (sa, sb) = (a.stats(), b.stats());
    let new: Vec<String> = numbered()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(new.len(), 2, "{new:?}");
    let mems: Vec<f64> = new
        .iter()
        .map(|n| reg.get("spillbuffer_memory_bytes", n, None).unwrap())
        .collect();
    assert!(mems.contains(&(sa.memory_bytes as f64)) && mems.contains(&(sb.memory_bytes as f64)));
}

/// A dropped buffer holds nothing: its gauges fall to zero, its totals
/// stay.
#[test]
fn dropping_a_buffer_zeroes_its_gauges() {
    let reg = recorder();
    let b = build("dropped", 2 * W, Duration::from_secs(3600));
    for k in 0..10u64 {
        b.insert(k, value(k, W)).unwrap();
    }
    b.flush_blocking().unwrap();
    let st = b.stats();
    assert!(st.memory_bytes > 0 && st.disk_bytes > 0 && st.file_bytes > 0);
    drop(b);
    for name in [
        "spillbuffer_memory_bytes",
        "spillbuffer_memory_values",
        "spillbuffer_disk_bytes",
        "spillbuffer_disk_records",
        "spillbuffer_file_bytes",
    ] {
        assert_eq!(reg.get(name, "dropped", None), Some(0.0), "{name}");
    }
    assert_eq!(
        reg.get("spillbuffer_spilled_bytes_total", "dropped", None),
        Some(st.spilled_bytes_total as f64)
    );
}

/// Spill failures are published by cause, each equal to its `Stats` field.
#[test]
fn spill_errors_are_published_by_cause() {
    let reg = recorder();
    let storage = FaultyStorage::new();
    let faults = storage.faults();
    let b: SpillBuffer<u64, Val> = SpillBuffer::builder(std::env::temp_dir())
        .name("errors")
        .memory_target(2 * W)
        .compression(Compression::None)
        .metrics_interval(Duration::ZERO)
        .storage(Arc::new(storage))
        .build()
        .unwrap();
    let val = |k: u64, bad| Val {
        bytes: value(k, W),
        bad,
    };
    b.insert(0, val(0, true)).unwrap();
    for k in 1..4u64 {
        b.insert(k, val(k, false)).unwrap();
    }
    b.flush_blocking().unwrap();
    faults.fail_all_writes(WriteFault::Error);
    for k in 4..8u64 {
        b.insert(k, val(k, false)).unwrap();
    }
    b.flush_blocking().unwrap();
    let st = b.stats();
    assert!(
        st.spill_errors_encode_total >= 1 && st.spill_errors_io_total >= 1,
        "{st:?}"
    );
    let bad = mismatches(reg, "errors", &st);
    assert!(bad.is_empty(), "{bad:#?}");
    let sum: f64 = ["encode", "io", "max_spill"]
        .iter()
        .map(|c| {
            reg.get("spillbuffer_spill_errors_total", "errors", Some(c))
                .unwrap()
        })
        .sum();
    assert_eq!(sum, st.spill_errors_total as f64);
    faults.clear();
}

/// Every series is described to the recorder, with its kind and unit.
#[test]
fn every_series_is_described_with_its_unit() {
    let reg = recorder();
    let _b = build("described", 1 << 20, Duration::from_secs(3600));
    let described = reg.described.lock().unwrap();
    for (name, _, _) in expected(&Stats::default()) {
        let (counter, unit, help) = described
            .get(name)
            .unwrap_or_else(|| panic!("{name} not described"));
        assert!(!help.is_empty(), "{name}");
        let want_unit = if name.ends_with("_bytes") || name.ends_with("_bytes_total") {
            Unit::Bytes
        } else if name.contains("_seconds") {
            Unit::Seconds
        } else {
            Unit::Count
        };
        assert_eq!(*unit, Some(want_unit), "{name}");
        // Integer totals are counters; the seconds totals are gauges (the
        // facade's counters are integers).
        let want_counter = name.ends_with("_total") && !name.contains("_seconds");
        assert_eq!(*counter, want_counter, "{name}");
    }
}
