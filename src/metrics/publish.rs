//! [`Stats`] published through the `metrics` facade (feature `metrics`):
//! one series per field, named after Prometheus' conventions, labelled with
//! the buffer's name (`buffer`), so that whatever recorder the host
//! installed (a Prometheus exporter, a StatsD bridge, …) receives them
//! without the host polling `stats()`.
//!
//! Values are pushed as snapshots, never counted where they change: the
//! hit path and the insert path do no more work with the feature on. A
//! snapshot is published on every `stats()` call and from the IO pool at
//! most once per interval — after a job, or when a thread has waited that
//! long for one (so that changes made without IO, like inserts under the
//! target, show too). Counters are set to their absolute value.
//!
//! Each publication registers its series again with the recorder current
//! at the time (a lookup in the recorder, no allocation here), so a
//! recorder installed after the buffer was built still gets every value;
//! only the descriptions (unit, help) go to the recorder installed when
//! the buffer is built.

use super::Stats;
use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit};
use parking_lot::Mutex;

/// Where the series come from, for recorders that filter on it.
static META: Metadata<'static> = Metadata::new("spillbuffer", Level::INFO, Some(module_path!()));

/// How a series is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The state now: set to the field's value.
    Gauge,
    /// A count since the buffer was built: set to the field's value
    /// (`Counter::absolute`).
    Counter,
    /// A time since the buffer was built, in seconds. The facade's counters
    /// are integers, and seconds rounded to integers would be useless, so
    /// these monotone totals go out as gauges; `rate()` over them gives
    /// busy threads, as over a counter.
    SecondsTotal,
}

/// Where a series takes its value from.
#[derive(Clone, Copy)]
pub(crate) enum Field {
    Int(fn(&Stats) -> u64),
    Float(fn(&Stats) -> f64),
}

/// One published series: the documented contract of a metric.
pub(crate) struct Def {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    /// The `cause` label, for the series that split one total by cause.
    pub cause: Option<&'static str>,
    pub help: &'static str,
    pub field: Field,
}

const fn def(name: &'static str, kind: Kind, unit: Unit, help: &'static str, field: Field) -> Def {
    Def {
        name,
        kind,
        unit,
        cause: None,
        help,
        field,
    }
}

const SPILL_ERRORS_HELP: &str =
    "Spills that failed, by cause (encode, io, max_spill); the value stayed in memory.";

/// Every series, in the order of the fields of [`Stats`]. docs/stats.md
/// has the same table for users; a test holds the two together.
pub(crate) const SERIES: &[Def] = &[
    def(
        "spillbuffer_memory_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Weight of every value held in memory: resident, being written, pinned and detached.",
        Field::Int(|s| s.memory_bytes),
    ),
    def(
        "spillbuffer_memory_values",
        Kind::Gauge,
        Unit::Count,
        "Values held in memory.",
        Field::Int(|s| s.memory_count),
    ),
    def(
        "spillbuffer_spilling_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Weight of resident values queued for or in the middle of a write.",
        Field::Int(|s| s.spilling_bytes),
    ),
    def(
        "spillbuffer_detached_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Weight of values no key holds any more that are still alive (pinned, being written or freed).",
        Field::Int(|s| s.detached_bytes),
    ),
    def(
        "spillbuffer_detached_values",
        Kind::Gauge,
        Unit::Count,
        "Values that spillbuffer_detached_bytes covers.",
        Field::Int(|s| s.detached_count),
    ),
    def(
        "spillbuffer_set_aside_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Weight of values kept in memory because their encode failed.",
        Field::Int(|s| s.set_aside_bytes),
    ),
    def(
        "spillbuffer_spilled_weight_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Weight of the live keys whose values are not in memory (as inserted, not as stored).",
        Field::Int(|s| s.spilled_weight_bytes),
    ),
    def(
        "spillbuffer_disk_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Bytes of the live records on disk, as stored (after compression).",
        Field::Int(|s| s.disk_bytes),
    ),
    def(
        "spillbuffer_disk_records",
        Kind::Gauge,
        Unit::Count,
        "Live records on disk.",
        Field::Int(|s| s.disk_count),
    ),
    def(
        "spillbuffer_file_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Disk space the spill files occupy, dead ranges included.",
        Field::Int(|s| s.file_bytes),
    ),
    def(
        "spillbuffer_spilled_bytes_total",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of records written by spills, as stored.",
        Field::Int(|s| s.spilled_bytes_total),
    ),
    def(
        "spillbuffer_spilled_records_total",
        Kind::Counter,
        Unit::Count,
        "Records written by spills.",
        Field::Int(|s| s.spill_count_total),
    ),
    def(
        "spillbuffer_unspilled_bytes_total",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of records read back from disk, as stored.",
        Field::Int(|s| s.unspilled_bytes_total),
    ),
    def(
        "spillbuffer_unspilled_records_total",
        Kind::Counter,
        Unit::Count,
        "Records read back from disk.",
        Field::Int(|s| s.unspill_count_total),
    ),
    def(
        "spillbuffer_clean_evictions_total",
        Kind::Counter,
        Unit::Count,
        "Evictions that needed no write because a valid disk copy existed.",
        Field::Int(|s| s.clean_evictions_total),
    ),
    Def {
        cause: Some("encode"),
        ..def(
            "spillbuffer_spill_errors_total",
            Kind::Counter,
            Unit::Count,
            SPILL_ERRORS_HELP,
            Field::Int(|s| s.spill_errors_encode_total),
        )
    },
    Def {
        cause: Some("io"),
        ..def(
            "spillbuffer_spill_errors_total",
            Kind::Counter,
            Unit::Count,
            SPILL_ERRORS_HELP,
            Field::Int(|s| s.spill_errors_io_total),
        )
    },
    Def {
        cause: Some("max_spill"),
        ..def(
            "spillbuffer_spill_errors_total",
            Kind::Counter,
            Unit::Count,
            SPILL_ERRORS_HELP,
            Field::Int(|s| s.spill_budget_refusals_total),
        )
    },
    def(
        "spillbuffer_compacted_records_total",
        Kind::Counter,
        Unit::Count,
        "Records copied by compaction (not counted as spills).",
        Field::Int(|s| s.compacted_count_total),
    ),
    def(
        "spillbuffer_records_sent_total",
        Kind::Counter,
        Unit::Count,
        "Records handed out by `record` or written by `send_record` or `write_record_to` for a transfer, encoded or as stored.",
        Field::Int(|s| s.records_sent_total),
    ),
    def(
        "spillbuffer_records_sent_encoded_total",
        Kind::Counter,
        Unit::Count,
        "Of the records sent, those encoded from memory (no disk copy existed).",
        Field::Int(|s| s.records_sent_encoded_total),
    ),
    def(
        "spillbuffer_records_sent_bytes_total",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of the records sent, frame headers included.",
        Field::Int(|s| s.records_sent_bytes_total),
    ),
    def(
        "spillbuffer_records_received_total",
        Kind::Counter,
        Unit::Count,
        "Records inserted by `insert_record`, `insert_record_blocking`, `insert_record_from` or `receive_record`, written as they came.",
        Field::Int(|s| s.records_received_total),
    ),
    def(
        "spillbuffer_records_received_bytes_total",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of the records received, frame headers included.",
        Field::Int(|s| s.records_received_bytes_total),
    ),
    def(
        "spillbuffer_locked_pins_total",
        Kind::Counter,
        Unit::Count,
        "Pins of a value in memory that took the shard's lock in write mode (pins under the read lock are not counted).",
        Field::Int(|s| s.locked_pins_total),
    ),
    def(
        "spillbuffer_spill_seconds_total",
        Kind::SecondsTotal,
        Unit::Seconds,
        "Time IO threads spent in spill jobs, summed over threads (a monotone total published as a gauge).",
        Field::Float(|s| s.spill_seconds_total),
    ),
    def(
        "spillbuffer_unspill_seconds_total",
        Kind::SecondsTotal,
        Unit::Seconds,
        "Time spent reading records back, summed over threads (a monotone total published as a gauge).",
        Field::Float(|s| s.unspill_seconds_total),
    ),
    def(
        "spillbuffer_io_busy_seconds_total",
        Kind::SecondsTotal,
        Unit::Seconds,
        "Wall-clock time during which at least one IO thread ran a job (a monotone total published as a gauge).",
        Field::Float(|s| s.io_busy_seconds_total),
    ),
];

/// Publishes one buffer's series.
pub(crate) struct Publisher {
    /// The key of each of [`SERIES`], with this buffer's label.
    keys: Vec<Key>,
    /// What was published last. Its lock is held from reading a snapshot to
    /// writing it out, so that of two threads publishing at once, the one
    /// with the newer snapshot writes last.
    last: Mutex<Option<Stats>>,
}

impl Publisher {
    pub(crate) fn new(buffer: &str) -> Publisher {
        let keys = SERIES
            .iter()
            .map(|d| {
                let mut labels = vec![Label::new("buffer", SharedString::from(buffer.to_owned()))];
                if let Some(cause) = d.cause {
                    labels.push(Label::new("cause", cause));
                }
                Key::from_parts(d.name, labels)
            })
            .collect();
        metrics::with_recorder(describe);
        Publisher {
            keys,
            last: Mutex::new(None),
        }
    }

    /// Take a snapshot with `read` and write it to the recorder: always
    /// when `force`, else only if it differs from the last one written.
    pub(crate) fn publish(&self, read: impl FnOnce() -> Stats, force: bool) -> Stats {
        let mut last = self.last.lock();
        let stats = read();
        if force || last.as_ref() != Some(&stats) {
            metrics::with_recorder(|r| self.write(r, &stats, false));
            *last = Some(stats.clone());
        }
        stats
    }

    /// Write every series of `stats`; with `retired`, the gauges as zero:
    /// a buffer that is gone holds nothing.
    fn write(&self, r: &dyn Recorder, stats: &Stats, retired: bool) {
        for (d, key) in SERIES.iter().zip(&self.keys) {
            match (d.kind, d.field) {
                (Kind::Counter, Field::Int(get)) => {
                    r.register_counter(key, &META).absolute(get(stats))
                }
                (Kind::Gauge, Field::Int(get)) => {
                    let v = if retired { 0 } else { get(stats) };
                    r.register_gauge(key, &META).set(v as f64)
                }
                (_, Field::Float(get)) => r.register_gauge(key, &META).set(get(stats)),
                (Kind::SecondsTotal, Field::Int(get)) => {
                    r.register_gauge(key, &META).set(get(stats) as f64)
                }
            }
        }
    }
}

impl Drop for Publisher {
    /// The buffer is gone: its memory and disk gauges fall to zero; its
    /// totals keep their last values.
    fn drop(&mut self) {
        let last = self.last.get_mut().take().unwrap_or_default();
        metrics::with_recorder(|r| self.write(r, &last, true));
    }
}

/// Give `r` the unit and help text of every series.
fn describe(r: &dyn Recorder) {
    for d in SERIES {
        let name = KeyName::from_const_str(d.name);
        let help = SharedString::const_str(d.help);
        match d.kind {
            Kind::Counter => r.describe_counter(name, Some(d.unit), help),
            Kind::Gauge | Kind::SecondsTotal => r.describe_gauge(name, Some(d.unit), help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each field of `Stats` reaches exactly one series (the error total
    /// through its three causes), and each series reads a distinct field.
    #[test]
    fn every_field_is_published_once() {
        let stats = Stats {
            memory_bytes: 1,
            memory_count: 2,
            spilling_bytes: 3,
            detached_bytes: 4,
            detached_count: 5,
            set_aside_bytes: 6,
            disk_bytes: 7,
            disk_count: 8,
            file_bytes: 9,
            spilled_bytes_total: 10,
            spill_count_total: 11,
            unspilled_bytes_total: 12,
            unspill_count_total: 13,
            clean_evictions_total: 14,
            spill_errors_total: 15 + 16 + 17,
            spill_errors_encode_total: 15,
            spill_errors_io_total: 16,
            spill_budget_refusals_total: 17,
            compacted_count_total: 18,
            spill_seconds_total: 19.5,
            unspill_seconds_total: 20.5,
            io_busy_seconds_total: 21.5,
            records_sent_total: 22,
            records_sent_encoded_total: 23,
            records_sent_bytes_total: 24,
            records_received_total: 25,
            records_received_bytes_total: 26,
            locked_pins_total: 27,
            spilled_weight_bytes: 28,
        };
        let mut seen: Vec<f64> = SERIES
            .iter()
            .map(|d| match d.field {
                Field::Int(get) => get(&stats) as f64,
                Field::Float(get) => get(&stats),
            })
            .collect();
        seen.sort_by(f64::total_cmp);
        let mut want: Vec<f64> = (1..=18).chain(22..=28).map(f64::from).collect();
        want.extend([19.5, 20.5, 21.5]);
        want.sort_by(f64::total_cmp);
        assert_eq!(seen, want);
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        for d in SERIES {
            assert!(d.name.starts_with("spillbuffer_"), "{}", d.name);
            assert!(
                d.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                d.name
            );
            let total = d.name.ends_with("_total");
            assert_eq!(
                total,
                d.kind != Kind::Gauge,
                "{}: _total iff a total",
                d.name
            );
            match d.unit {
                Unit::Bytes => assert!(d.name.contains("_bytes"), "{}", d.name),
                Unit::Seconds => assert!(d.name.contains("_seconds"), "{}", d.name),
                Unit::Count => {}
                other => panic!("{}: unexpected unit {other:?}", d.name),
            }
            match (d.kind, d.field) {
                (Kind::SecondsTotal, Field::Float(_)) => {}
                (Kind::Gauge | Kind::Counter, Field::Int(_)) => {}
                _ => panic!("{}: kind and field type disagree", d.name),
            }
        }
    }

    /// docs/stats.md documents every series: its name, type and unit on
    /// one row of the metrics table.
    #[test]
    fn docs_list_every_series() {
        let doc = include_str!("../../docs/stats.md");
        for d in SERIES {
            let kind = match d.kind {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
                Kind::SecondsTotal => "gauge (monotone)",
            };
            let unit = d.unit.as_str();
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{}", d.name)))
                .unwrap_or_else(|| panic!("docs/stats.md has no row for {}", d.name));
            assert!(
                row.contains(&format!("| {kind} | {unit} |")),
                "docs/stats.md row for {} should say `| {kind} | {unit} |`: {row}",
                d.name
            );
            if let Some(cause) = d.cause {
                assert!(
                    doc.contains(&format!("`{cause}`")),
                    "docs/stats.md does not name cause {cause}"
                );
            }
        }
    }
}
