//! Host-runtime integration (issue 3): pins under memory pressure, clean
//! copies and `consume`, back-pressure of `insert_async`, prefetch within
//! the target, heavy values freed off the caller's thread, and an event
//! loop that keeps ticking while the IO pool is saturated.
//!
//! No test sleeps to wait for the buffer: the IO pool is frozen at a known
//! point with `Faults::hold_writes` / `hold_reads` and released by the test.

mod common;

use common::value;
use spillbuffer::testing::{FaultyStorage, WriteFault};
use spillbuffer::{BoxError, Compression, Spill, SpillBuffer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Buf = SpillBuffer<u64, Vec<u8>>;

fn faulty(dir: &std::path::Path, target: usize, threads: usize) -> (Buf, FaultyStorage) {
    let storage = FaultyStorage::new();
    let b = SpillBuffer::builder(dir)
        .memory_target(target)
        .segment_size(64 * 1024)
        .io_threads(threads)
        .storage(Arc::new(storage.clone()))
        .build()
        .unwrap();
    (b, storage)
}

/// A generous guard against a hang: a correctness bound, not a timing test.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 30 s"))
}

#[tokio::test(flavor = "current_thread")]
async fn pinned_entries_survive_any_memory_pressure() {
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = SpillBuffer::builder(tmp.path())
        .memory_target(4000)
        .segment_size(64 * 1024)
        .build()
        .unwrap();
    // One pin on a dirty value, one on a value read back from disk (clean).
    b.insert(0, value(0, 1000)).unwrap();
    let dirty = b.pin(&0).await.unwrap().unwrap();
    b.insert(1, value(1, 1000)).unwrap();
    b.evict(1 << 30);
    b.flush().await.unwrap();
    let clean = b.pin(&1).await.unwrap().unwrap();
    for k in 2..200u64 {
        within("insert_async", b.insert_async(k, value(k, 1000)))
            .await
            .unwrap();
    }
    b.evict(1 << 30);
    b.set_memory_target(0);
    within(
        "insert_async at a zero target",
        b.insert_async(500, value(500, 1000)),
    )
    .await
    .unwrap();
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.memory_bytes, 2000, "only the pinned values stay: {s:?}");
    assert_eq!(*dirty, value(0, 1000));
    assert_eq!(*clean, value(1, 1000));
    assert!(b.try_pin(&0).is_some() && b.try_pin(&1).is_some());
    b.validate().unwrap();
    drop((dirty, clean));
    b.flush().await.unwrap();
    assert_eq!(b.stats().memory_bytes, 0);
    assert_eq!(*b.pin(&0).await.unwrap().unwrap(), value(0, 1000));
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn consume_of_a_clean_entry_frees_memory_without_a_write() {
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = SpillBuffer::builder(tmp.path())
        .memory_target(64 << 20)
        .build()
        .unwrap();
    let big = value(7, 2 << 20);
    b.insert(7, big.clone()).unwrap();
    b.evict(1);
    b.flush().await.unwrap();
    let s0 = b.stats();
    assert_eq!(
        (s0.memory_bytes, s0.spill_count_total, s0.disk_count),
        (0, 1, 1)
    );

    let p = b.pin(&7).await.unwrap().unwrap();
    assert_eq!(*p, big);
    assert_eq!(b.stats().memory_bytes, 2 << 20);
    p.consume();
    let s = b.stats();
    // Out of memory at once; a value this heavy is freed on the IO pool,
    // and counts as detached until it is.
    assert_eq!(s.memory_bytes - s.detached_bytes, 0, "freed at once: {s:?}");
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.memory_bytes, 0, "freed: {s:?}");
    assert_eq!(s.spill_count_total, 1, "no write: {s:?}");
    assert_eq!(s.clean_evictions_total, 1, "{s:?}");
    assert_eq!(s.disk_count, 1, "the record is kept: {s:?}");
    assert!(b.contains_key(&7));

    // Read back again and merely unpinned: it stays, clean, and a later
    // eviction needs no write either.
    drop(b.pin(&7).await.unwrap().unwrap());
    assert_eq!(b.stats().memory_bytes, 2 << 20);
    assert_eq!(b.evict(1), 2 << 20);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(
        (s.memory_bytes, s.spill_count_total, s.clean_evictions_total),
        (0, 1, 2),
        "{s:?}"
    );
    assert_eq!(s.unspill_count_total, 2);
    b.validate().unwrap();

    // The record goes only when the key is overwritten or removed.
    drop(b.pin(&7).await.unwrap().unwrap());
    b.insert(7, value(8, 1000)).unwrap();
    b.flush().await.unwrap();
    assert_eq!(b.stats().disk_count, 0, "overwrite released the record");
    assert_eq!(*b.pin(&7).await.unwrap().unwrap(), value(8, 1000));
    b.insert(9, value(9, 1000)).unwrap();
    b.evict(1 << 30);
    b.flush().await.unwrap();
    assert_eq!(b.stats().disk_count, 2);
    assert!(b.remove(&9));
    assert!(b.remove(&7));
    b.flush().await.unwrap();
    assert_eq!(b.stats().disk_count, 0, "remove released the records");
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn insert_async_waits_for_writes_and_wakes_in_fifo_order() {
    let tmp = tempfile::tempdir().unwrap();
    let limit = 4000;
    let (b, storage) = faulty(tmp.path(), limit, 2);
    let faults = storage.faults();
    for k in 0..4u64 {
        b.insert_async(k, value(k, 1000)).await.unwrap(); // at the limit: no wait
    }
    faults.hold_writes(true);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for k in 10..14u64 {
        let (b, order) = (b.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            b.insert_async(k, value(k, 1000)).await.unwrap();
            let mem = b.stats().memory_bytes;
            order.lock().unwrap().push(k);
            mem
        }));
        // Let this task insert and queue before the next one arrives.
        tokio::task::yield_now().await;
    }
    // A write is stuck (the evicted values may share one batched write or
    // queue behind it); they are still in memory, being written, so every
    // waiter must still be waiting.
    faults.wait_until_held(1);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let s = b.stats();
    assert_eq!(s.memory_bytes, 8000, "{s:?}");
    assert_eq!(s.spilling_bytes, 4000, "{s:?}");
    assert!(order.lock().unwrap().is_empty(), "resolved over the limit");
    assert!(tasks.iter().all(|t| !t.is_finished()));

    faults.hold_writes(false);
    for t in tasks {
        let mem = within("insert_async after release", t).await.unwrap();
        assert!(mem <= limit as u64, "resolved with {mem} bytes resident");
    }
    assert_eq!(*order.lock().unwrap(), vec![10, 11, 12, 13], "FIFO");
    b.flush().await.unwrap();
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn insert_async_is_released_when_memory_cannot_fall() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, storage) = faulty(tmp.path(), 2000, 2);
    // Every resident value pinned: nothing can be evicted.
    let mut pins = Vec::new();
    for k in 0..3u64 {
        b.insert(k, value(k, 1000)).unwrap();
        pins.push(b.try_pin(&k).unwrap());
    }
    within(
        "insert_async with all pinned",
        b.insert_async(3, value(3, 1000)),
    )
    .await
    .unwrap();
    drop(pins);
    b.flush().await.unwrap();
    // Every write failing: waiting would never end, so once memory is over
    // the limit the call returns, refusing the value and handing it back
    // (tests/failures.rs covers that contract in full).
    storage.faults().fail_all_writes(WriteFault::Error);
    let mut inserted = Vec::new();
    for k in 10..15u64 {
        match within(
            "insert_async with writes failing",
            b.insert_async(k, value(k, 1000)),
        )
        .await
        {
            Ok(()) => inserted.push(k),
            Err(e) => {
                assert!(e.cause().is_io(), "{e}");
                assert_eq!(e.into_inner(), (k, value(k, 1000)));
            }
        }
    }
    b.flush().await.unwrap();
    assert!(b.stats().spill_errors_total > 0);
    assert!(!inserted.is_empty() && inserted.len() < 5, "{inserted:?}");
    storage.faults().clear();
    for k in inserted {
        assert_eq!(*b.pin(&k).await.unwrap().unwrap(), value(k, 1000));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn prefetch_reads_in_order_within_the_target_making_room_without_io() {
    let tmp = tempfile::tempdir().unwrap();
    // One IO thread: prefetch jobs then run strictly in the order given.
    let (b, _storage) = faulty(tmp.path(), 10_000, 1);
    for k in 0..30u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush().await.unwrap();
    for k in 25..30u64 {
        b.remove(&k);
    }
    // Resident: 20..25 (dirty), one of them pinned. Room within the target:
    // 10_000 - 4000 unpinned = six values.
    let pin = b.try_pin(&20).unwrap();
    let before = b.stats();
    assert_eq!(before.memory_bytes, 5000);
    let hinted = [3u64, 1, 7, 2, 9, 0, 4, 5, 6, 8];
    b.prefetch(hinted);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 6, "{s:?}");
    assert_eq!(
        s.memory_bytes - 1000,
        10_000,
        "unpinned at the target: {s:?}"
    );
    // The keys of one call do not push each other out: the first six fill
    // the room, the rest are skipped.
    assert_eq!(s.clean_evictions_total, 0, "nothing evicted: {s:?}");
    assert_eq!(s.spill_count_total, before.spill_count_total, "{s:?}");
    b.validate().unwrap();
    for k in hinted.iter().take(6).chain(&[20, 21, 22, 23, 24]) {
        assert!(b.try_pin(k).is_some(), "key {k} should be resident");
    }
    for k in hinted.iter().skip(6) {
        assert!(b.try_pin(k).is_none(), "key {k} should not be resident");
    }
    // A later hint makes room by dropping the least recently used clean
    // values (the try_pins above used them in order: 3 and 1 are the
    // oldest), never a dirty one (which would cost a write), never the
    // pinned one, and stays within the target.
    b.prefetch([10u64, 11]);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 8, "{s:?}");
    assert_eq!(s.clean_evictions_total, 2, "{s:?}");
    assert_eq!(
        s.spill_count_total, before.spill_count_total,
        "no write: {s:?}"
    );
    assert_eq!(s.memory_bytes - 1000, 10_000, "{s:?}");
    b.validate().unwrap();
    for k in [10u64, 11, 7, 2, 9, 0, 20, 21, 22, 23, 24] {
        assert!(b.try_pin(&k).is_some(), "key {k} should be resident");
    }
    for k in [3u64, 1] {
        assert!(b.try_pin(&k).is_none(), "key {k} should have been dropped");
    }
    drop(pin);
}

#[tokio::test(flavor = "current_thread")]
async fn prefetch_drops_nothing_when_only_dirty_values_could_make_room() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, _storage) = faulty(tmp.path(), 5000, 1);
    for k in 0..10u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush().await.unwrap();
    // 0..5 on disk; 5..10 resident, dirty, at the target.
    let before = b.stats();
    assert_eq!(before.memory_bytes, 5000);
    b.prefetch([0u64, 1]);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 0, "{s:?}");
    assert_eq!(s.spill_count_total, before.spill_count_total, "{s:?}");
    assert_eq!(s.memory_bytes, 5000, "{s:?}");
    // One clean value cannot make room for a value twice its weight
    // within the target: the prefetch is skipped, and what it dropped
    // (only clean values) costs no write.
    b.insert(20, value(20, 2000)).unwrap();
    b.evict(1 << 30);
    b.flush().await.unwrap();
    for k in 5..9u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    drop(b.get(&0).unwrap());
    b.flush().await.unwrap();
    let before = b.stats();
    assert_eq!(
        before.memory_bytes, 5000,
        "four dirty, one clean: {before:?}"
    );
    b.prefetch([20u64]);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, before.unspill_count_total, "{s:?}");
    assert_eq!(s.spill_count_total, before.spill_count_total, "{s:?}");
    assert!(s.memory_bytes <= 5000, "{s:?}");
    b.validate().unwrap();
}

/// Six values of 1,000 bytes written out under a target of 4,000, with
/// one IO thread; 0, 1 and 2 read back by blocking `get`s, clean: room
/// for one more.
async fn three_clean_of_six(dir: &std::path::Path) -> (Buf, FaultyStorage) {
    let (b, storage) = faulty(dir, 4000, 1);
    for k in 0..6u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.evict(1 << 30);
    b.flush().await.unwrap();
    for k in 0..3u64 {
        drop(b.get(&k).unwrap());
    }
    (b, storage)
}

#[tokio::test(flavor = "current_thread")]
async fn prefetch_never_drops_what_was_used_after_it_was_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, storage) = three_clean_of_six(tmp.path()).await;
    // The one IO thread is held on the read of 3 while 4 is asked for;
    // then the host uses 0, 1 and 2 again. When 4's turn comes, every
    // clean value was used (or read back) after it was asked for: none is
    // dropped for it, and it is skipped.
    storage.faults().hold_reads(true);
    b.prefetch([3u64]);
    storage.faults().wait_until_held(1);
    b.prefetch([4u64]);
    for k in 0..3u64 {
        drop(b.try_pin(&k).unwrap());
    }
    storage.faults().hold_reads(false);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 4, "{s:?}");
    assert_eq!(s.clean_evictions_total, 0, "{s:?}");
    assert_eq!(s.memory_bytes, 4000, "{s:?}");
    for k in 0..4u64 {
        assert!(b.try_pin(&k).is_some(), "key {k} should be resident");
    }
    assert!(b.try_pin(&4).is_none());
    // Asked again now, it may drop the least recently used clean value.
    b.prefetch([4u64]);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 5, "{s:?}");
    assert_eq!(s.clean_evictions_total, 1, "{s:?}");
    assert_eq!(s.memory_bytes, 4000, "{s:?}");
    assert!(b.try_pin(&0).is_none(), "0 was the least recently used");
    b.validate().unwrap();
}

/// Three clean values used in turn through hits (ticks the host thread
/// has not published), then key 3 read back by `read_back` with room to
/// spare: the value read back counts as used after those hits, so the
/// next eviction drops the least recently hit value, not it.
async fn read_back_lands_after_the_hits_before_it(read_back: impl FnOnce(&Buf)) {
    let tmp = tempfile::tempdir().unwrap();
    // Each of the three was pinned once through its shard when read
    // back: the hits below go through cells.
    let (b, _storage) = three_clean_of_six(tmp.path()).await;
    for _ in 0..4 {
        for k in 0..3u64 {
            drop(b.try_pin(&k).unwrap());
        }
    }
    read_back(&b);
    b.flush().await.unwrap();
    assert_eq!(b.stats().unspill_count_total, 4);
    // A new value passes the target by one: one clean value goes.
    b.insert(10, value(10, 1000)).unwrap();
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.clean_evictions_total, 1, "{s:?}");
    assert!(b.try_pin(&3).is_some(), "3 was read back last");
    assert!(b.try_pin(&0).is_none(), "0 was the least recently used");
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_prefetched_value_lands_after_the_hits_before_it() {
    read_back_lands_after_the_hits_before_it(|b| {
        b.prefetch([3u64]);
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_whose_reader_left_lands_after_the_hits_before_it() {
    read_back_lands_after_the_hits_before_it(|b| {
        // The pin is polled once (its read queued), then dropped.
        let mut pin = Box::pin(b.pin(&3u64));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(pin.as_mut(), &mut cx).is_pending());
        drop(pin);
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn prefetch_never_exceeds_the_target_while_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let target = 20 * 1000;
    let (b, storage) = faulty(tmp.path(), target, 2);
    for k in 0..100u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.evict(1 << 30);
    b.flush().await.unwrap();
    // Freeze the reads so that every reservation is taken before any lands.
    storage.faults().hold_reads(true);
    b.prefetch(0..100u64);
    storage.faults().wait_until_held(2);
    storage.faults().hold_reads(false);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.memory_bytes, target as u64, "{s:?}");
    assert_eq!(s.unspill_count_total, 20, "{s:?}");
    b.validate().unwrap();
    // Memory full of those clean values: a second hint drops them to
    // make room, two reads at a time racing, and still lands at the
    // target exactly with nothing written.
    storage.faults().hold_reads(true);
    b.prefetch(50..100u64);
    storage.faults().wait_until_held(2);
    let s = b.stats();
    assert!(s.memory_bytes <= target as u64, "{s:?}");
    storage.faults().hold_reads(false);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(s.memory_bytes, target as u64, "{s:?}");
    assert_eq!(s.unspill_count_total, 40, "{s:?}");
    assert_eq!(s.clean_evictions_total, 20, "{s:?}");
    assert_eq!(s.spill_count_total, 100, "{s:?}");
    // In order, give or take the thread scheduler: a pool thread
    // preempted between its key's turn and its reservation lets the other
    // thread fill the room with the next key.
    let resident: Vec<u64> = (50..100u64).filter(|k| b.try_pin(k).is_some()).collect();
    assert_eq!(resident.len(), 20, "{resident:?}");
    assert!(resident.iter().all(|&k| k <= 70), "{resident:?}");
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn pin_of_a_key_being_prefetched_joins_its_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, storage) = faulty(tmp.path(), 1 << 20, 2);
    b.insert(1, value(1, 50_000)).unwrap();
    b.evict(1);
    b.flush().await.unwrap();
    let faults = storage.faults();
    faults.hold_reads(true);
    b.prefetch([1u64]);
    faults.wait_until_held(1); // the prefetch read is in flight
    let (b2, b3) = (b.clone(), b.clone());
    let p1 = tokio::spawn(async move { b2.pin(&1).await });
    let p2 = tokio::spawn(async move { b3.pin(&1).await });
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert!(!p1.is_finished() && !p2.is_finished());
    faults.hold_reads(false);
    let (p1, p2) = (
        within("pin", p1).await.unwrap().unwrap().unwrap(),
        within("pin", p2).await.unwrap().unwrap().unwrap(),
    );
    assert_eq!(*p1, value(1, 50_000));
    assert_eq!(*p2, value(1, 50_000));
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 1, "one shared read: {s:?}");
    assert_eq!(faults.reads(), 1);
    drop((p1, p2));
    b.flush().await.unwrap();
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn prefetch_skips_a_value_consumed_since_its_last_pin() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, _storage) = faulty(tmp.path(), 1 << 20, 1);
    for k in 0..2u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.evict(1 << 30);
    b.flush().await.unwrap();
    // A stale hint: the host already read and consumed key 0.
    b.pin(&0).await.unwrap().unwrap().consume();
    b.prefetch([0u64, 1]);
    b.flush().await.unwrap();
    let s = b.stats();
    assert_eq!(
        s.unspill_count_total, 2,
        "0 once by pin, 1 by prefetch: {s:?}"
    );
    assert_eq!(s.memory_bytes, 1000, "{s:?}");
    // Pinned again, it is an ordinary key once more.
    drop(b.pin(&0).await.unwrap().unwrap());
    b.evict(1 << 30);
    b.prefetch([0u64]);
    b.flush().await.unwrap();
    assert_eq!(b.stats().unspill_count_total, 4);
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn draining_keys_in_order_copies_no_record() {
    let tmp = tempfile::tempdir().unwrap();
    let b = common::buffer(tmp.path(), 0); // 64 KiB segments
    for k in 0..200u64 {
        b.insert(k, value(k, 4000)).unwrap();
    }
    b.flush().await.unwrap();
    let written = b.stats().spilled_bytes_total;
    // The reduction pattern: read, consume, and remove a few keys later.
    for k in 0..200u64 {
        let p = b.pin(&k).await.unwrap().unwrap();
        assert_eq!(*p, value(k, 4000));
        p.consume();
        if k >= 8 {
            b.remove(&(k - 8));
        }
        b.flush().await.unwrap(); // let any compaction run
    }
    for k in 192..200u64 {
        b.remove(&k);
    }
    b.flush().await.unwrap();
    let s = b.stats();
    // Two IO threads may append their batches of evicted values to one
    // segment in either order, so key order and disk order can differ at
    // batch edges and a few records get copied. Before compaction waited
    // for the store's space bound, such a drain copied most of its records.
    assert!(
        s.compacted_count_total <= 20,
        "at most a tenth of the records copied: {s:?}"
    );
    assert_eq!(s.spilled_bytes_total, written, "{s:?}");
    assert!(s.file_bytes <= 64 * 1024, "at most one open segment: {s:?}");
    b.validate().unwrap();
}

#[test]
fn compaction_keeps_file_space_within_its_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let b = common::buffer(tmp.path(), 0); // 64 KiB segments, compact below 0.7
    for k in 0..400u64 {
        b.insert(k, value(k, 4000)).unwrap();
    }
    b.flush_blocking().unwrap();
    // Remove two keys in three, spread over every segment.
    for k in (0..400u64).filter(|k| k % 3 != 0) {
        b.remove(&k);
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.compacted_count_total > 0, "{s:?}");
    assert!(
        s.file_bytes as f64 <= s.disk_bytes as f64 / 0.7 + 64.0 * 1024.0,
        "file space past its bound: {s:?}"
    );
    for k in (0..400u64).filter(|k| k % 3 == 0) {
        assert_eq!(*b.get(&k).unwrap().unwrap(), value(k, 4000));
    }
    b.validate().unwrap();
}

// ----- where heavy values are freed ---------------------------------------

/// Which thread dropped each probe, by probe id.
static DROPS: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());

/// A value that claims to weigh 2 MiB and records the thread it dies on.
#[derive(Debug, PartialEq)]
struct Probe(u64);

impl Drop for Probe {
    fn drop(&mut self) {
        let t = std::thread::current();
        DROPS
            .lock()
            .unwrap()
            .push((self.0, t.name().unwrap_or("?").to_string()));
    }
}

impl Spill for Probe {
    fn weight(&self) -> usize {
        2 << 20
    }
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(&self.0.to_le_bytes());
        Ok(())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Probe(u64::from_le_bytes(bytes.try_into()?)))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn heavy_values_are_freed_on_the_io_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let b: SpillBuffer<u64, Probe> = SpillBuffer::builder(tmp.path())
        .memory_target(64 << 20)
        .compression(Compression::None)
        .build()
        .unwrap();
    // remove of a resident value
    b.insert(1, Probe(1)).unwrap();
    b.remove(&1);
    // replace
    b.insert(2, Probe(2)).unwrap();
    b.insert(2, Probe(1002)).unwrap();
    // consume of a clean value
    b.insert(3, Probe(3)).unwrap();
    b.evict(1 << 30);
    b.flush().await.unwrap();
    b.pin(&3).await.unwrap().unwrap().consume();
    // clean eviction from the caller's thread
    drop(b.pin(&3).await.unwrap().unwrap());
    b.evict(1 << 30);
    // the last pin of a removed value
    b.insert(5, Probe(5)).unwrap();
    let p = b.pin(&5).await.unwrap().unwrap();
    b.remove(&5);
    drop(p);
    b.flush().await.unwrap();

    let me = std::thread::current().name().unwrap_or("?").to_string();
    let drops = DROPS.lock().unwrap().clone();
    for id in [1, 2, 3, 5] {
        let seen: Vec<_> = drops.iter().filter(|(i, _)| *i == id).collect();
        assert!(!seen.is_empty(), "probe {id} was never dropped");
        for (_, thread) in seen {
            assert!(
                thread.starts_with("spillbuffer-io"),
                "probe {id} freed on {thread:?} (the caller is {me:?})"
            );
        }
    }
}

/// A value holding a pin of another key of the same buffer (a view into
/// it, say). Its encoding is its bytes; read back, it holds no pin.
#[derive(Debug)]
struct Link {
    bytes: Vec<u8>,
    held: Option<spillbuffer::Pinned<Link>>,
}

impl Spill for Link {
    fn weight(&self) -> usize {
        self.bytes.len()
    }
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(&self.bytes);
        Ok(())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Link {
            bytes: bytes.to_vec(),
            held: None,
        })
    }
}

/// An eviction that drops such a value releases the pin it held, and that
/// release evicts in turn, on the same thread, while the first eviction
/// still runs: it must go through, not wait for itself.
#[test]
fn evicting_a_value_that_holds_a_pin_of_the_same_buffer_releases_it() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = FaultyStorage::new();
    // One shard: the inserts below run on another thread, whose uses are
    // ordered after this thread's exactly only within the same shard
    // (across shards, within the clock's slack), so that key 0, the least
    // recently used, is surely the value that goes.
    let b: SpillBuffer<u64, Link> = SpillBuffer::builder(tmp.path())
        .memory_target(2000)
        .shards(1)
        .segment_size(64 * 1024)
        .storage(Arc::new(storage.clone()))
        .build()
        .unwrap();
    let plain = |k: u64| Link {
        bytes: value(k, 1000),
        held: None,
    };
    b.insert(1, plain(1)).unwrap();
    let held = b.try_pin(&1).unwrap();
    b.insert(
        0,
        Link {
            bytes: value(0, 1000),
            held: Some(held),
        },
    )
    .unwrap();
    // Key 0 written while a pin keeps it in memory: it stays resident,
    // clean, and is the least recently used value once unpinned.
    storage.faults().hold_writes(true);
    b.evict(1000);
    storage.faults().wait_until_held(1);
    let pin = b.try_pin(&0).expect("key 0 is in memory while written");
    storage.faults().hold_writes(false);
    b.flush_blocking().unwrap();
    drop(pin);
    assert_eq!(b.stats().memory_count, 2);
    // Key 3 passes the target: the eviction drops key 0 on this thread, and
    // with it the last pin of key 1, which leaves key 1 over the target.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let b2 = b.clone();
    let t = std::thread::spawn(move || {
        for k in 2..4u64 {
            b2.insert(k, plain(k)).unwrap();
        }
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the inserts did not finish within 30 s");
    t.join().unwrap();
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(s.clean_evictions_total, 1, "{s:?}");
    assert_eq!(s.memory_bytes, 2000, "{s:?}");
    for k in 0..4u64 {
        let v = b.get(&k).unwrap().expect("every key is kept");
        assert_eq!(v.bytes, value(k, 1000), "key {k}");
        assert!(v.held.is_none(), "key {k}");
    }
    b.flush_blocking().unwrap();
    b.validate().unwrap();
}

// ----- the event loop keeps ticking ---------------------------------------

#[test]
fn ticker_stays_on_time_while_the_pool_is_saturated() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let chunk = 1 << 20;
        let b: Buf = SpillBuffer::builder(tmp.path())
            .memory_target(8 * chunk)
            .compression(Compression::None)
            .build()
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                let mut ticks = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let due = Instant::now() + Duration::from_millis(1);
                    tokio::time::sleep_until(due.into()).await;
                    worst = worst.max(Instant::now() - due);
                    ticks += 1;
                }
                (worst, ticks)
            })
        };
        // Writes: far more than the target, through the back-pressure path.
        let n = 192u64;
        for k in 0..n {
            b.insert_async(k, vec![k as u8; chunk]).await.unwrap();
        }
        // Reads and writes at once: pin and consume everything, four pins
        // in flight, while another thread keeps inserting.
        let writer = {
            let b = b.clone();
            std::thread::spawn(move || {
                for k in 1000..1128u64 {
                    b.insert(k, vec![k as u8; chunk]).unwrap();
                }
            })
        };
        let mut inflight = std::collections::VecDeque::new();
        for k in 0..n {
            let b2 = b.clone();
            inflight.push_back(tokio::spawn(async move { b2.pin(&k).await }));
            if inflight.len() >= 4 {
                let p = inflight.pop_front().unwrap().await.unwrap().unwrap();
                p.expect("present").consume();
            }
        }
        for h in inflight {
            h.await.unwrap().unwrap().expect("present").consume();
        }
        // Not a blocking join: that would stall the loop on the test itself.
        while !writer.is_finished() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        writer.join().unwrap();
        b.flush().await.unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (worst, ticks) = ticker.await.unwrap();
        let s = b.stats();
        assert!(
            s.unspill_count_total > 0 && s.spill_count_total > 0,
            "{s:?}"
        );
        assert!(ticks > 0);
        // A correctness bound, not a benchmark: nothing on the loop waited
        // for disk.
        assert!(
            worst < Duration::from_millis(200),
            "ticker late by {worst:?}"
        );
    });
}
