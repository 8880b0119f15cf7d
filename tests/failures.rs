//! The failure contract of spilling (docs/failures.md): a value whose
//! encode fails is set aside and does not stop the others from spilling; a
//! full disk or an exhausted `max_spill` makes `insert_async` refuse values
//! once memory is over `memory_limit`, handing each back with an error that
//! names the cause; memory stays bounded, nothing is lost, and spilling
//! resumes when space comes back.
//!
//! No test sleeps: every wait is on the buffer (`flush`, `insert_async`).

mod common;

use common::{value, Val};
use spillbuffer::testing::{FaultyStorage, WriteFault};
use spillbuffer::{Compression, Error, Spill, SpillBuffer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const W: usize = 1000;

impl Val {
    fn good(k: u64) -> Val {
        Val {
            bytes: value(k, W),
            bad: false,
        }
    }

    fn bad(k: u64) -> Val {
        Val {
            bytes: value(k, W),
            bad: true,
        }
    }
}

/// A guard against a hang: a correctness bound, not a timing test.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 30 s"))
}

fn build<V: Spill>(
    dir: &std::path::Path,
    target: usize,
    limit: usize,
    max_spill: Option<u64>,
) -> (SpillBuffer<u64, V>, FaultyStorage) {
    let storage = FaultyStorage::new();
    let mut b = SpillBuffer::builder(dir)
        .memory_target(target)
        .memory_limit(limit)
        .segment_size(16 * 1024)
        .compression(Compression::None)
        .io_threads(2)
        .storage(Arc::new(storage.clone()));
    if let Some(max) = max_spill {
        b = b.max_spill(max);
    }
    (b.build().unwrap(), storage)
}

/// Every key of `model` reads back equal.
async fn all_read_back<V: Spill + PartialEq + std::fmt::Debug>(
    b: &SpillBuffer<u64, V>,
    model: &BTreeMap<u64, V>,
) {
    for (k, v) in model {
        let got = within("pin", b.pin(k)).await.unwrap();
        assert_eq!(got.as_deref(), Some(v), "key {k}");
    }
    assert_eq!(b.len(), model.len());
}

/// One value that cannot be encoded is tried once, set aside, and does not
/// hold up the others: every later insert spills as before (no write
/// back-off), every `insert_async` succeeds, and memory stays within the
/// limit next to the bad value.
#[tokio::test(flavor = "current_thread")]
async fn a_bad_value_is_set_aside_and_good_values_keep_spilling() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, _storage) = build::<Val>(tmp.path(), 4 * W, 4 * W, None);
    let mut model = BTreeMap::new();
    // The bad value is the oldest, so the first to be evicted.
    b.insert(0, Val::bad(0)).unwrap();
    model.insert(0, Val::bad(0));
    let mut max_memory = 0;
    for k in 1..60u64 {
        within("insert_async", b.insert_async(k, Val::good(k)))
            .await
            .unwrap_or_else(|e| panic!("good value {k} refused: {e}"));
        model.insert(k, Val::good(k));
        max_memory = max_memory.max(b.stats().memory_bytes);
    }
    b.flush().await.unwrap();
    let st = b.stats();
    assert_eq!(st.spill_errors_encode_total, 1, "tried once: {st:?}");
    assert_eq!(st.spill_errors_total, 1, "{st:?}");
    assert_eq!(st.spill_errors_io_total, 0, "{st:?}");
    assert_eq!(st.set_aside_bytes, W as u64, "{st:?}");
    // 59 good values, at most four of them (with the bad one) in memory.
    assert!(st.spill_count_total >= 55, "{st:?}");
    assert!(st.memory_bytes <= 4 * W as u64, "{st:?}");
    assert!(max_memory <= 5 * W as u64, "memory peaked at {max_memory}");
    let failure = b.last_spill_error().expect("the encode failure is kept");
    assert_eq!(failure.key, 0);
    match &failure.error {
        Error::Encode { key, .. } => assert_eq!(key, "0"),
        e => panic!("expected an encode error, got {e}"),
    }
    assert!(
        failure.to_string().contains("cannot be encoded"),
        "{failure}"
    );
    b.validate().unwrap();
    all_read_back(&b, &model).await;

    // Set aside: even an explicit eviction does not try it again.
    b.evict(usize::MAX);
    b.flush().await.unwrap();
    assert_eq!(b.stats().spill_errors_encode_total, 1);
    // The host asks for a retry: it is tried (and fails) once more.
    assert_eq!(b.retry_spills(), 1);
    b.evict(usize::MAX);
    b.flush().await.unwrap();
    let st = b.stats();
    assert_eq!(st.spill_errors_encode_total, 2, "{st:?}");
    assert_eq!(st.set_aside_bytes, W as u64, "{st:?}");
    b.validate().unwrap();
    // Replaced by a value that encodes: no longer set aside, and it spills.
    b.insert(0, Val::good(0)).unwrap();
    model.insert(0, Val::good(0));
    assert_eq!(b.stats().set_aside_bytes, 0);
    b.evict(usize::MAX);
    b.flush().await.unwrap();
    let st = b.stats();
    assert_eq!(st.memory_bytes, 0, "everything spilled: {st:?}");
    assert_eq!(st.spill_errors_encode_total, 2, "{st:?}");
    b.validate().unwrap();
    all_read_back(&b, &model).await;
}

/// When the values that cannot be encoded fill memory past the limit,
/// `insert_async` refuses new ones with the encode error of the last bad
/// key and hands each back; memory stays bounded and the inserted values
/// are all there.
#[tokio::test(flavor = "current_thread")]
async fn bad_values_over_the_limit_are_refused_with_their_encode_error() {
    let tmp = tempfile::tempdir().unwrap();
    let limit = 8 * W;
    let (b, _storage) = build::<Val>(tmp.path(), 4 * W, limit, None);
    let mut model = BTreeMap::new();
    let (mut refused, mut max_memory) = (0, 0);
    let mut at_first_refusal = None;
    for k in 0..40u64 {
        match within("insert_async", b.insert_async(k, Val::bad(k))).await {
            Ok(()) => {
                model.insert(k, Val::bad(k));
            }
            Err(e) => {
                refused += 1;
                assert!(
                    matches!(e.cause(), Error::Encode { .. }),
                    "cause: {}",
                    e.cause()
                );
                assert!(matches!(e.error, Error::MemoryLimit { .. }), "{e}");
                assert!(e.to_string().contains("memory_limit"), "{e}");
                let (key, value) = e.into_inner();
                assert_eq!((key, value), (k, Val::bad(k)), "handed back intact");
                at_first_refusal.get_or_insert(b.stats().memory_bytes);
            }
        }
        max_memory = max_memory.max(b.stats().memory_bytes);
    }
    b.flush().await.unwrap();
    let st = b.stats();
    assert!(refused >= 30, "{refused} refused: {st:?}");
    // Encode failures are the values' own, not the disk's: a value is
    // admitted over the limit while another one's write is in flight (it
    // might succeed), so the peak can pass the limit by two values here.
    // Once refusals start, memory does not grow at all.
    assert!(
        max_memory <= (limit + 2 * W) as u64,
        "memory peaked at {max_memory}"
    );
    assert_eq!(
        at_first_refusal,
        Some(max_memory),
        "grew after refusals began"
    );
    assert_eq!(st.set_aside_bytes, st.memory_bytes, "{st:?}");
    // Each bad value was tried once; none started a write back-off.
    assert_eq!(st.spill_errors_encode_total, model.len() as u64, "{st:?}");
    assert_eq!(st.spill_errors_io_total + st.spill_budget_refusals_total, 0);
    b.validate().unwrap();
    all_read_back(&b, &model).await;
    // A good value is refused too while memory is over the limit: nothing
    // can be written to make room for it.
    let e = within("insert_async", b.insert_async(100, Val::good(100)))
        .await
        .unwrap_err();
    assert!(matches!(e.cause(), Error::Encode { .. }), "{e}");
    // Removing bad values makes room again.
    for k in 0..4u64 {
        assert!(b.remove(&k));
        model.remove(&k);
    }
    within("insert_async", b.insert_async(100, Val::good(100)))
        .await
        .unwrap();
    model.insert(100, Val::good(100));
    all_read_back(&b, &model).await;
}

/// With `max_spill` reached, `insert_async` refuses values once memory is
/// over the limit, naming the budget; memory stays within the limit plus
/// one value; everything accepted reads back; removing keys frees budget
/// and spilling resumes by itself.
#[tokio::test(flavor = "current_thread")]
async fn max_spill_refuses_over_the_limit_and_resumes_when_keys_go() {
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let limit = 8 * W;
    // About twenty 1000-byte records (plus headers) fit.
    let (b, _storage) = build::<Vec<u8>>(tmp.path(), 4 * W, limit, Some(21_000));
    let mut model = BTreeMap::new();
    let (mut refused, mut max_memory) = (0, 0);
    for k in 0..100u64 {
        match within("insert_async", b.insert_async(k, value(k, W))).await {
            Ok(()) => {
                model.insert(k, value(k, W));
            }
            Err(e) => {
                refused += 1;
                assert!(
                    matches!(e.cause(), Error::DiskBudget { budget: 21_000, .. }),
                    "{e}"
                );
                assert!(e.to_string().contains("max_spill"), "{e}");
                assert_eq!(e.into_inner(), (k, value(k, W)));
            }
        }
        max_memory = max_memory.max(b.stats().memory_bytes);
    }
    b.flush().await.unwrap();
    let st = b.stats();
    assert!(refused >= 60, "{refused} refused: {st:?}");
    assert!(
        max_memory <= (limit + W) as u64,
        "memory peaked at {max_memory}"
    );
    assert!(st.spill_budget_refusals_total > 0, "{st:?}");
    assert_eq!(st.spill_errors_encode_total + st.spill_errors_io_total, 0);
    assert!(st.disk_bytes <= 21_000, "{st:?}");
    assert!(matches!(
        b.last_spill_error().map(|f| f.error),
        Some(Error::DiskBudget { .. })
    ));
    b.validate().unwrap();
    all_read_back(&b, &model).await;

    // Free budget: remove the ten oldest keys (on disk).
    let oldest: Vec<u64> = model.keys().copied().take(10).collect();
    for k in &oldest {
        assert!(b.remove(k));
        model.remove(k);
    }
    let spilled = b.stats().spill_count_total;
    for k in 200..205u64 {
        within(
            "insert_async after removals",
            b.insert_async(k, value(k, W)),
        )
        .await
        .unwrap_or_else(|e| panic!("key {k} refused after removals: {e}"));
        model.insert(k, value(k, W));
    }
    b.flush().await.unwrap();
    let st = b.stats();
    assert!(st.spill_count_total > spilled, "spilling resumed: {st:?}");
    assert!(st.memory_bytes <= limit as u64, "{st:?}");
    b.validate().unwrap();
    all_read_back(&b, &model).await;
    // Busy time is wall time: at most the buffer's age, at most the
    // summed thread time plus the other jobs.
    let st = b.stats();
    assert!(st.io_busy_seconds_total > 0.0, "{st:?}");
    assert!(
        st.io_busy_seconds_total <= start.elapsed().as_secs_f64(),
        "{st:?}"
    );
}

/// A full disk: once memory is over the limit `insert_async` refuses values
/// with an error that says the disk is full and names the spill directory;
/// memory stays bounded, nothing is lost; once space comes back (the fault
/// switched off, keys removed) spilling resumes by itself.
#[tokio::test(flavor = "current_thread")]
async fn a_full_disk_refuses_over_the_limit_and_resumes_when_space_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let limit = 8 * W;
    let (b, storage) = build::<Vec<u8>>(tmp.path(), 4 * W, limit, None);
    let dir = b.spill_dirs()[0].clone();
    let mut model = BTreeMap::new();
    for k in 0..20u64 {
        within("insert_async", b.insert_async(k, value(k, W)))
            .await
            .unwrap();
        model.insert(k, value(k, W));
    }
    b.flush().await.unwrap();
    storage.faults().fail_all_writes(WriteFault::NoSpace);
    let (mut refused, mut max_memory) = (0, 0);
    for k in 100..200u64 {
        match within("insert_async", b.insert_async(k, value(k, W))).await {
            Ok(()) => {
                model.insert(k, value(k, W));
            }
            Err(e) => {
                refused += 1;
                assert!(e.cause().is_disk_full(), "{e}");
                assert!(e.error.is_disk_full(), "{e}");
                let text = e.to_string();
                assert!(
                    text.contains(dir.to_str().unwrap()),
                    "names the directory: {text}"
                );
                assert_eq!(e.into_inner(), (k, value(k, W)));
            }
        }
        max_memory = max_memory.max(b.stats().memory_bytes);
    }
    b.flush().await.unwrap();
    let st = b.stats();
    assert!(refused >= 90, "{refused} refused: {st:?}");
    assert!(
        max_memory <= (limit + W) as u64,
        "memory peaked at {max_memory}"
    );
    assert!(st.spill_errors_io_total > 0, "{st:?}");
    assert_eq!(st.spill_errors_encode_total, 0, "{st:?}");
    assert!(b.last_spill_error().unwrap().error.is_disk_full());
    b.validate().unwrap();
    all_read_back(&b, &model).await;

    // Space comes back: the fault is switched off and the host removes a
    // key. The back-off ends, and the next insert spills at once.
    storage.faults().clear();
    let gone = *model.keys().next().unwrap();
    assert!(b.remove(&gone));
    model.remove(&gone);
    let spilled = b.stats().spill_count_total;
    for k in 300..310u64 {
        within(
            "insert_async after space returned",
            b.insert_async(k, value(k, W)),
        )
        .await
        .unwrap_or_else(|e| panic!("key {k} refused after space returned: {e}"));
        model.insert(k, value(k, W));
    }
    b.flush().await.unwrap();
    let st = b.stats();
    assert!(st.spill_count_total > spilled, "spilling resumed: {st:?}");
    assert!(
        st.memory_bytes <= 4 * W as u64,
        "back under the target: {st:?}"
    );
    b.validate().unwrap();
    all_read_back(&b, &model).await;
}

/// `retry_spills` ends the write back-off at once: with the disk fixed and
/// no key removed, the host's retry lets the next insert spill.
#[tokio::test(flavor = "current_thread")]
async fn retry_spills_ends_the_back_off_when_the_disk_is_fixed() {
    let tmp = tempfile::tempdir().unwrap();
    let limit = 8 * W;
    let (b, storage) = build::<Vec<u8>>(tmp.path(), 4 * W, limit, None);
    storage.faults().fail_all_writes(WriteFault::Error);
    let mut model = BTreeMap::new();
    let mut refused = None;
    for k in 0..30u64 {
        match within("insert_async", b.insert_async(k, value(k, W))).await {
            Ok(()) => {
                model.insert(k, value(k, W));
            }
            Err(e) => {
                assert!(e.cause().is_io() && !e.cause().is_disk_full(), "{e}");
                refused = Some(e.into_inner());
                break;
            }
        }
    }
    let (k, v) = refused.expect("refused once over the limit");
    storage.faults().clear();
    assert_eq!(b.retry_spills(), 0, "nothing was set aside");
    within("insert_async after retry", b.insert_async(k, v.clone()))
        .await
        .unwrap();
    model.insert(k, v);
    b.flush().await.unwrap();
    let st = b.stats();
    assert!(st.memory_bytes <= 4 * W as u64, "{st:?}");
    b.validate().unwrap();
    all_read_back(&b, &model).await;
}

/// Pins are the host's working set, not a spill failure: with a write
/// failure on record, a value is still admitted while only pins keep
/// memory over the limit, and refused (naming the write failure) once the
/// unpinned values the disk cannot take pass the target.
#[tokio::test(flavor = "current_thread")]
async fn pins_over_the_limit_are_not_refused_for_an_old_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let (target, limit) = (4 * W, 4 * W);
    let (b, storage) = build::<Vec<u8>>(tmp.path(), target, limit, None);
    storage.faults().fail_all_writes(WriteFault::Error);
    let mut model = BTreeMap::new();
    for k in 0..5u64 {
        b.insert(k, value(k, W)).unwrap();
        model.insert(k, value(k, W));
    }
    b.flush().await.unwrap();
    assert!(b.stats().spill_errors_io_total > 0, "a write failed");
    let pins: Vec<_> = (1..5u64).map(|k| b.try_pin(&k).unwrap()).collect();
    // 5 values in memory, 4 of them pinned: over the limit, but what is
    // unpinned is within the target.
    within(
        "insert_async over the limit by pins",
        b.insert_async(10, value(10, W)),
    )
    .await
    .unwrap();
    model.insert(10, value(10, W));
    let mut refused = None;
    for k in 11..30u64 {
        match within("insert_async", b.insert_async(k, value(k, W))).await {
            Ok(()) => {
                model.insert(k, value(k, W));
            }
            Err(e) => {
                assert!(e.cause().is_io(), "{e}");
                refused = Some(k);
                break;
            }
        }
    }
    assert!(
        refused.is_some(),
        "refused once unpinned values pass the target"
    );
    let st = b.stats();
    let pinned = (pins.len() * W) as u64;
    assert!(
        st.memory_bytes <= pinned + (target + W) as u64,
        "pins + target + one value: {st:?}"
    );
    drop(pins);
    storage.faults().clear();
    b.retry_spills();
    b.flush().await.unwrap();
    b.validate().unwrap();
    all_read_back(&b, &model).await;
}
