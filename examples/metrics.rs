//! A host that exports its buffers' metrics: it installs a recorder of the
//! `metrics` facade, builds two named buffers, makes them spill and read
//! back, and prints what the recorder received in Prometheus' text format
//! — what a scrape of the host would return.
//!
//! A real host installs an exporter instead of the small recorder below,
//! e.g. `metrics_exporter_prometheus::PrometheusBuilder::new().install()`,
//! which serves the same text over HTTP. Nothing else changes: the buffers
//! publish to whichever recorder is installed.
//!
//! Run: `cargo run --release --example metrics --features metrics`

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};
use spillbuffer::SpillBuffer;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A series' value: a counter's count, or a gauge's `f64` bits.
#[derive(Default)]
struct Value {
    counter: bool,
    bits: AtomicU64,
}

impl CounterFn for Value {
    fn increment(&self, n: u64) {
        self.bits.fetch_add(n, Relaxed);
    }

    fn absolute(&self, n: u64) {
        self.bits.fetch_max(n, Relaxed);
    }
}

impl GaugeFn for Value {
    fn increment(&self, v: f64) {
        self.set(f64::from_bits(self.bits.load(Relaxed)) + v);
    }

    fn decrement(&self, v: f64) {
        self.set(f64::from_bits(self.bits.load(Relaxed)) - v);
    }

    fn set(&self, v: f64) {
        self.bits.store(v.to_bits(), Relaxed);
    }
}

/// Series by name, then by labels rendered as `{k="v",…}`.
type Series = BTreeMap<String, BTreeMap<String, Arc<Value>>>;

/// Unit and help text by series name.
type Help = BTreeMap<String, (Option<Unit>, String)>;

/// Collects series and their descriptions; renders them as Prometheus
/// text.
#[derive(Default, Clone)]
struct TextRecorder {
    series: Arc<Mutex<Series>>,
    help: Arc<Mutex<Help>>,
}

impl TextRecorder {
    fn value(&self, key: &Key, counter: bool) -> Arc<Value> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}=\"{}\"", l.key(), l.value()))
            .collect();
        let mut series = self.series.lock().unwrap();
        let v = series
            .entry(key.name().to_owned())
            .or_default()
            .entry(format!("{{{}}}", labels.join(",")))
            .or_insert_with(|| {
                Arc::new(Value {
                    counter,
                    ..Value::default()
                })
            });
        Arc::clone(v)
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        let entry = (unit, help.into_owned());
        self.help
            .lock()
            .unwrap()
            .insert(key.as_str().to_owned(), entry);
    }

    /// The exposition text: per series, its help (with the unit), type
    /// and one line per label set.
    fn render(&self) -> String {
        let series = self.series.lock().unwrap();
        let help = self.help.lock().unwrap();
        let mut out = String::new();
        for (name, by_labels) in series.iter() {
            if let Some((unit, text)) = help.get(name) {
                let unit = unit
                    .map(|u| format!(" ({})", u.as_str()))
                    .unwrap_or_default();
                out += &format!("# HELP {name} {text}{unit}\n");
            }
            let counter = by_labels.values().next().is_some_and(|v| v.counter);
            let kind = if counter { "counter" } else { "gauge" };
            out += &format!("# TYPE {name} {kind}\n");
            for (labels, v) in by_labels {
                let bits = v.bits.load(Relaxed);
                let value = if v.counter {
                    bits.to_string()
                } else {
                    f64::from_bits(bits).to_string()
                };
                out += &format!("{name}{labels} {value}\n");
            }
        }
        out
    }
}

impl Recorder for TextRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(key, unit, help);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(key, unit, help);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe(key, unit, help);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.value(key, true))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.value(key, false))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Installed first, so that the buffers describe their series to it.
    let recorder = TextRecorder::default();
    metrics::set_global_recorder(recorder.clone())?;

    let dir = std::env::temp_dir();
    // Two buffers of one process, told apart by their `buffer` label.
    let shuffle: SpillBuffer<u64, Vec<f64>> = SpillBuffer::builder(&dir)
        .name("shuffle")
        .memory_target(8 << 20)
        .metrics_interval(Duration::from_millis(100))
        .build()?;
    let cache: SpillBuffer<String, String> = SpillBuffer::builder(&dir).name("cache").build()?;

    // 32 MiB through an 8 MiB target: three quarters spill.
    for k in 0..32u64 {
        let chunk: Vec<f64> = (0..(1 << 17)).map(|i| (k * 1000 + i) as f64).collect();
        shuffle.insert_async(k, chunk).await?;
    }
    for k in 0..4u64 {
        let v = shuffle.pin(&k).await?.expect("inserted");
        assert_eq!(v[1], (k * 1000 + 1) as f64);
    }
    cache.insert("config".into(), "small values stay in memory".into())?;
    shuffle.flush().await?;

    // No `stats()` call: the IO pool published after its jobs, and the
    // cache's insert (no IO) shows after one idle interval of its pool.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    print!("{}", recorder.render());
    Ok(())
}
