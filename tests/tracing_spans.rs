//! The `tracing` feature: spill, unspill and compaction jobs run inside
//! spans that carry the buffer's name, what the job moved and the segment
//! file; the key only at TRACE; a failed spill records its error on the
//! span and its warning is emitted inside it.
//!
//! A small subscriber of this file's own captures spans and events; it is
//! the global default (the jobs run on the buffer's threads). Tests take
//! one lock, since one of them turns TRACE on; each filters what it
//! captured by its buffer's name.
#![cfg(feature = "tracing")]

mod common;

use common::value;
use spillbuffer::testing::{FaultyStorage, WriteFault};
use spillbuffer::SpillBuffer;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// A span as captured: its name and fields (values in their `Debug`
/// form, strings unquoted).
#[derive(Debug, Clone)]
struct SpanRec {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl SpanRec {
    fn field(&self, f: &str) -> Option<&str> {
        self.fields.get(f).map(String::as_str)
    }

    fn num(&self, f: &str) -> u64 {
        self.field(f)
            .unwrap_or_else(|| panic!("{} has no {f}: {:?}", self.name, self.fields))
            .parse()
            .unwrap_or_else(|e| panic!("{} field {f}: {e}", self.name))
    }
}

/// An event as captured, with the span it was emitted in.
#[derive(Debug, Clone)]
struct EventRec {
    level: Level,
    fields: BTreeMap<String, String>,
    span: Option<u64>,
}

#[derive(Default)]
struct State {
    next_id: AtomicU64,
    spans: Mutex<BTreeMap<u64, SpanRec>>,
    events: Mutex<Vec<EventRec>>,
    trace: AtomicBool,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

thread_local! {
    /// The spans entered on this thread, innermost last.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

struct Capture(Arc<State>);

impl Subscriber for Capture {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Asked again on every use: TRACE is switched at run time.
        Interest::sometimes()
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        let max = if self.0.trace.load(SeqCst) {
            Level::TRACE
        } else {
            Level::DEBUG
        };
        meta.target().starts_with("spillbuffer") && *meta.level() <= max
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.0.next_id.fetch_add(1, SeqCst) + 1;
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let rec = SpanRec {
            name: attrs.metadata().name(),
            fields,
        };
        self.0.spans.lock().unwrap().insert(id, rec);
        Id::from_u64(id)
    }

    fn record(&self, id: &Id, values: &Record<'_>) {
        if let Some(s) = self.0.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut s.fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let rec = EventRec {
            level: *event.metadata().level(),
            fields,
            span: STACK.with(|s| s.borrow().last().copied()),
        };
        self.0.events.lock().unwrap().push(rec);
    }

    fn enter(&self, id: &Id) {
        STACK.with(|s| s.borrow_mut().push(id.into_u64()));
    }

    fn exit(&self, id: &Id) {
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(i) = s.iter().rposition(|&x| x == id.into_u64()) {
                s.remove(i);
            }
        });
    }
}

/// The captured state, and the lock every test holds.
fn capture() -> (&'static State, MutexGuard<'static, ()>) {
    static STATE: OnceLock<Arc<State>> = OnceLock::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let state = STATE.get_or_init(|| {
        let state = Arc::new(State::default());
        tracing::subscriber::set_global_default(Capture(Arc::clone(&state)))
            .expect("no other subscriber in this test binary");
        state
    });
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    (state, guard)
}

impl State {
    /// Spans named `name` of buffer `buffer`, in creation order.
    fn spans(&self, name: &str, buffer: &str) -> Vec<SpanRec> {
        self.spans
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.name == name && s.field("buffer") == Some(buffer))
            .cloned()
            .collect()
    }

    fn span(&self, id: u64) -> Option<SpanRec> {
        self.spans.lock().unwrap().get(&id).cloned()
    }
}

/// Large values are written one job each, small ones packed.
const LARGE: usize = 256 << 10;
const SMALL: usize = 4 << 10;

fn build(name: &str, target: usize) -> SpillBuffer<u64, Vec<u8>> {
    SpillBuffer::builder(std::env::temp_dir())
        .name(name)
        .memory_target(target)
        .segment_size(64 << 10)
        .build()
        .unwrap()
}

#[test]
fn spill_unspill_and_compact_run_in_spans_with_their_fields() {
    let (cap, _one) = capture();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(jobs_in_spans(cap));
}

async fn jobs_in_spans(cap: &State) {
    let b = build("jobs", 2 * LARGE);
    let dir = b.spill_dirs()[0].display().to_string();
    for k in 0..4u64 {
        b.insert(k, value(k, LARGE)).unwrap();
    }
    for k in 100..400u64 {
        b.insert(k, value(k, SMALL)).unwrap();
    }
    b.flush().await.unwrap();
    let st = b.stats();

    let spills = cap.spans("spill", "jobs");
    // A packed batch (perhaps of one record) counts its failed records.
    let (batch, single): (Vec<_>, Vec<_>) =
        spills.iter().partition(|s| s.field("failed").is_some());
    assert!(!single.is_empty() && !batch.is_empty(), "{spills:#?}");
    for s in &single {
        assert_eq!(s.num("weight"), LARGE as u64, "{s:?}");
        assert!(s.num("bytes") > 0, "{s:?}");
        let seg = s.field("segment").expect("segment");
        assert!(seg.starts_with(&dir), "segment {seg} outside {dir}");
        assert!(s.field("key").is_none(), "key recorded below TRACE: {s:?}");
        assert!(s.field("error").is_none(), "{s:?}");
    }
    for s in &batch {
        assert_eq!(s.num("weight"), s.num("records") * SMALL as u64, "{s:?}");
        assert_eq!(s.num("failed"), 0, "{s:?}");
    }
    // The spans account for every record and byte written.
    let records: u64 = spills.iter().map(|s| s.num("records")).sum();
    let bytes: u64 = spills.iter().map(|s| s.num("bytes")).sum();
    assert_eq!(records, st.spill_count_total, "{st:?}");
    assert_eq!(bytes, st.spilled_bytes_total, "{st:?}");

    // Read back two values: one unspill span each.
    for k in [0u64, 100] {
        assert!(b.pin(&k).await.unwrap().is_some());
    }
    let reads = cap.spans("unspill", "jobs");
    assert_eq!(
        reads.len() as u64,
        b.stats().unspill_count_total,
        "{reads:#?}"
    );
    assert!(reads.len() >= 2, "{reads:#?}");
    for r in &reads {
        assert!(r.num("bytes") > 0);
        assert!(r.field("segment").unwrap().starts_with(&dir), "{r:?}");
        assert!(
            r.field("error").is_none() && r.field("key").is_none(),
            "{r:?}"
        );
    }

    // Remove most small values: their sparse segments are compacted.
    for k in (100..400u64).filter(|k| k % 8 != 0) {
        b.remove(&k);
    }
    b.flush().await.unwrap();
    let compactions = cap.spans("compact", "jobs");
    assert!(
        !compactions.is_empty(),
        "no compaction span: {:?}",
        b.stats()
    );
    let moved: u64 = compactions.iter().map(|c| c.num("moved")).sum();
    assert_eq!(moved, b.stats().compacted_count_total);
    for c in &compactions {
        assert!(c.field("segment").unwrap().starts_with(&dir), "{c:?}");
        assert!(c.num("retry") <= 1);
    }
}

#[test]
fn keys_are_recorded_only_at_trace() {
    let (cap, _one) = capture();
    cap.trace.store(true, SeqCst);
    tracing::callsite::rebuild_interest_cache();
    let b = build("trace", LARGE);
    b.insert(7, value(7, LARGE)).unwrap();
    b.insert(8, value(8, LARGE)).unwrap();
    b.flush_blocking().unwrap();
    assert!(b.get(&7).unwrap().is_some());
    b.flush_blocking().unwrap();
    cap.trace.store(false, SeqCst);
    let spill = cap.spans("spill", "trace");
    assert!(
        spill.iter().any(|s| s.field("key") == Some("7")),
        "{spill:#?}"
    );
    let unspill = cap.spans("unspill", "trace");
    assert!(
        unspill.iter().any(|s| s.field("key") == Some("7")),
        "{unspill:#?}"
    );
}

#[test]
fn a_failed_spill_warns_inside_its_span() {
    let (cap, _one) = capture();
    let storage = FaultyStorage::new();
    let faults = storage.faults();
    faults.fail_all_writes(WriteFault::Error);
    let b: SpillBuffer<u64, Vec<u8>> = SpillBuffer::builder(std::env::temp_dir())
        .name("failing")
        .memory_target(LARGE)
        .storage(Arc::new(storage))
        .metrics_interval(Duration::ZERO)
        .build()
        .unwrap();
    b.insert(1, value(1, LARGE)).unwrap();
    b.insert(2, value(2, LARGE)).unwrap();
    b.flush_blocking().unwrap();
    faults.clear();
    assert!(b.stats().spill_errors_io_total >= 1);
    let failed: Vec<SpanRec> = cap
        .spans("spill", "failing")
        .into_iter()
        .filter(|s| s.field("error").is_some())
        .collect();
    assert!(!failed.is_empty(), "no spill span recorded an error");
    assert!(failed.iter().all(|s| s.field("bytes").is_none()));
    let events = cap.events.lock().unwrap().clone();
    let warned = events.iter().any(|e| {
        e.level == Level::WARN
            && e.fields
                .get("message")
                .is_some_and(|m| m.contains("spill failed"))
            && e.span
                .and_then(|id| cap.span(id))
                .is_some_and(|s| s.name == "spill" && s.field("buffer") == Some("failing"))
    });
    assert!(warned, "no spill warning inside a spill span: {events:#?}");
}
