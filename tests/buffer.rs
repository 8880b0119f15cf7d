//! The public API, one behaviour per test.

mod common;

use common::{buffer, files_under, start_each, value, with_faults, Buf};
use spillbuffer::{Compression, Error, SpillBuffer};
use std::pin::pin;

#[test]
fn values_spill_past_the_target_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 10_000);
    for k in 0..50u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.memory_bytes <= 10_000, "{s:?}");
    assert_eq!(s.memory_count + s.disk_count, 50);
    assert!(s.spill_count_total >= 40);
    assert_eq!(b.len(), 50);
    for k in 0..50u64 {
        assert_eq!(
            *b.get(&k).unwrap().expect("present"),
            value(k, 1000),
            "key {k}"
        );
    }
    b.validate().unwrap();
}

#[test]
fn least_recently_used_spill_first() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 3000);
    for k in 0..3u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    // Touch 0 so that 1 becomes the least recently used.
    drop(b.try_pin(&0).unwrap());
    b.insert(3, value(3, 1000)).unwrap();
    b.flush_blocking().unwrap();
    assert!(b.try_pin(&1).is_none(), "1 was least recently used");
    for k in [0, 2, 3] {
        assert!(b.try_pin(&k).is_some(), "{k} should be resident");
    }
}

#[test]
fn pinned_entries_survive_any_memory_pressure() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 2000);
    b.insert(0, value(0, 1000)).unwrap();
    let pin = b.try_pin(&0).unwrap();
    for k in 1..100u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.evict(1 << 30);
    b.set_memory_target(0);
    b.flush_blocking().unwrap();
    assert!(b.try_pin(&0).is_some(), "pinned value was evicted");
    assert_eq!(*pin, value(0, 1000));
    b.validate().unwrap();
    drop(pin);
    b.flush_blocking().unwrap();
    assert!(
        b.try_pin(&0).is_none(),
        "unpinned value stays over a zero target"
    );
    assert_eq!(*b.get(&0).unwrap().unwrap(), value(0, 1000));
}

/// A value just read back is not thrown out before an older dirty value
/// nobody uses: eviction follows use, not cleanliness alone.
#[test]
fn a_value_read_back_outlives_an_older_dirty_one() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 3000);
    for k in [0, 1, 2, 3] {
        b.insert(k, value(k, 1000)).unwrap(); // 3 makes 0 spill
    }
    b.flush_blocking().unwrap();
    assert_eq!(b.stats().spill_count_total, 1);
    assert!(b.try_pin(&0).is_none(), "0 was the least recently used");
    // Read 0 back: clean and the most recently used. Once unpinned, memory
    // is over the target: the least recently used value, dirty 1, goes.
    drop(b.get(&0).unwrap().unwrap());
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 1, "{s:?}");
    assert_eq!(s.spill_count_total, 2, "1 was written: {s:?}");
    assert_eq!(s.clean_evictions_total, 0, "{s:?}");
    assert_eq!(s.memory_count, 3, "{s:?}");
    // Checked without touching the order: 0 reads back with no disk read.
    assert_eq!(*b.get(&0).unwrap().unwrap(), value(0, 1000));
    assert_eq!(b.stats().unspill_count_total, 1, "0 stayed in memory");
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(1, 1000));
    assert_eq!(b.stats().unspill_count_total, 2, "1 was on disk");
    b.validate().unwrap();
}

/// A clean value goes before a dirty one that is not much older (here
/// used just before it): dropping it costs no write.
#[test]
fn a_clean_value_goes_before_a_dirty_one_of_about_its_age() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 5000);
    b.insert(0, value(0, 1000)).unwrap();
    b.evict(1);
    b.flush_blocking().unwrap();
    b.insert(1, value(1, 1000)).unwrap(); // dirty, used just before 0
    drop(b.get(&0).unwrap().unwrap()); // read back: clean
    for k in 2..5 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert_eq!(b.stats().spill_count_total, 1, "all within the target");
    // Over the target: 1 is the least recently used, but only by one use
    // in five, so the clean 0 goes, without a write.
    b.insert(5, value(5, 1000)).unwrap();
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(s.spill_count_total, 1, "no second write: {s:?}");
    assert_eq!(s.clean_evictions_total, 1, "{s:?}");
    b.validate().unwrap();
}

#[test]
fn consume_of_a_clean_value_frees_it_without_a_write() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 1 << 20);
    b.insert(7, value(7, 4000)).unwrap();
    b.evict(1);
    b.flush_blocking().unwrap();
    let p = b.get(&7).unwrap().unwrap();
    assert_eq!(b.stats().memory_bytes, 4000);
    let writes = b.stats().spill_count_total;
    p.consume();
    let s = b.stats();
    assert_eq!(s.memory_bytes, 0, "{s:?}");
    assert_eq!(s.spill_count_total, writes);
    assert_eq!(s.clean_evictions_total, 1);
    assert!(b.contains_key(&7));
    b.validate().unwrap();
}

#[test]
fn consume_of_a_dirty_value_puts_it_first_in_line() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 3000);
    for k in 0..3u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.try_pin(&2).unwrap().consume();
    b.insert(3, value(3, 1000)).unwrap();
    b.flush_blocking().unwrap();
    assert!(b.try_pin(&2).is_none(), "consumed value spills first");
    assert!(b.try_pin(&0).is_some());
}

#[test]
fn a_value_heavier_than_the_target_goes_straight_to_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 1000);
    b.insert(1, value(1, 500)).unwrap();
    b.insert(2, value(2, 5000)).unwrap();
    b.flush_blocking().unwrap();
    assert!(b.try_pin(&2).is_none());
    assert!(
        b.try_pin(&1).is_some(),
        "the small value was not pushed out"
    );
    let p = b.get(&2).unwrap().unwrap();
    assert_eq!(*p, value(2, 5000));
    drop(p);
    assert_eq!(b.stats().memory_bytes, 500, "not promoted beyond its pin");
    b.validate().unwrap();
}

#[test]
fn insert_replaces_in_either_tier() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 1000);
    b.insert(1, value(1, 800)).unwrap();
    b.insert(2, value(2, 800)).unwrap();
    b.flush_blocking().unwrap();
    assert!(b.try_pin(&1).is_none());
    b.insert(1, value(100, 300)).unwrap(); // replaces the on-disk value
    b.insert(2, value(200, 300)).unwrap(); // replaces the resident value
    b.flush_blocking().unwrap();
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(100, 300));
    assert_eq!(*b.get(&2).unwrap().unwrap(), value(200, 300));
    assert_eq!(b.len(), 2);
    b.validate().unwrap();
    assert_eq!(b.stats().disk_count, 0, "old records were released");
}

#[test]
fn remove_frees_memory_and_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 10_000);
    for k in 0..200u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(b.stats().file_bytes > 100_000);
    for k in 0..200u64 {
        assert!(b.remove(&k));
        assert!(!b.remove(&k));
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(
        (s.memory_bytes, s.disk_bytes, s.disk_count),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(s.file_bytes <= 64 * 1024, "at most one open segment: {s:?}");
    assert!(b.is_empty());
    b.validate().unwrap();
}

#[test]
fn stats_track_spill_and_unspill() {
    let tmp = tempfile::tempdir().unwrap();
    let b: SpillBuffer<u64, Vec<u8>> = SpillBuffer::builder(tmp.path())
        .memory_target(0)
        .compression(Compression::None)
        .build()
        .unwrap();
    b.insert(1, value(1, 1000)).unwrap();
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(s.spill_count_total, 1);
    assert_eq!(s.spilled_bytes_total, 1032, "header + payload");
    assert_eq!(s.disk_bytes, 1032);
    assert_eq!(s.disk_count, 1);
    drop(b.get(&1).unwrap());
    let s = b.stats();
    assert_eq!(s.unspill_count_total, 1);
    assert_eq!(s.unspilled_bytes_total, 1032);
    assert!(s.spill_seconds_total > 0.0 && s.unspill_seconds_total > 0.0);
}

#[test]
fn compression_shrinks_compressible_records() {
    let tmp = tempfile::tempdir().unwrap();
    let b: SpillBuffer<u64, Vec<u8>> = SpillBuffer::builder(tmp.path())
        .memory_target(0)
        .build()
        .unwrap();
    b.insert(1, vec![0u8; 100_000]).unwrap();
    b.insert(2, value(2, 100_000)).unwrap();
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(
        s.disk_bytes < 100_000 + 32 + 2_000,
        "zeros compressed: {s:?}"
    );
    assert_eq!(*b.get(&1).unwrap().unwrap(), vec![0u8; 100_000]);
    assert_eq!(*b.get(&2).unwrap().unwrap(), value(2, 100_000));
}

#[test]
fn strings_and_pod_vectors_work_as_values() {
    let tmp = tempfile::tempdir().unwrap();
    let s: SpillBuffer<String, String> = SpillBuffer::builder(tmp.path())
        .memory_target(0)
        .build()
        .unwrap();
    s.insert("k".into(), "spilled ✓".into()).unwrap();
    s.flush_blocking().unwrap();
    assert_eq!(&**s.get(&"k".to_string()).unwrap().unwrap(), "spilled ✓");
    let f = SpillBuffer::<u32, Vec<f64>>::builder(tmp.path())
        .memory_target(0)
        .build()
        .unwrap();
    f.insert(1, vec![1.5, 2.5]).unwrap();
    f.flush_blocking().unwrap();
    assert_eq!(*f.get(&1).unwrap().unwrap(), vec![1.5, 2.5]);
}

#[test]
fn unusable_directory_fails_build_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = SpillBuffer::<u64, Vec<u8>>::builder(file.join("spill"))
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

#[test]
fn dropping_the_buffer_leaves_no_file_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 1000);
    let clone = b.clone();
    for k in 0..100u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    let dirs = b.spill_dirs();
    assert!(dirs[0].starts_with(tmp.path()));
    drop(b);
    assert!(dirs[0].exists(), "a clone still holds the buffer");
    let pin = clone.get(&99).unwrap().unwrap();
    drop(clone); // IO may still be in flight
    assert_eq!(*pin, value(99, 1000), "a pin outlives the buffer");
    assert!(!dirs[0].exists());
    assert_eq!(files_under(tmp.path()), 0);
}

#[test]
fn two_buffers_in_one_directory_do_not_share_files() {
    let tmp = tempfile::tempdir().unwrap();
    let a = buffer(tmp.path(), 0);
    let b = buffer(tmp.path(), 0);
    a.insert(1, value(1, 100)).unwrap();
    b.insert(1, value(2, 100)).unwrap();
    a.flush_blocking().unwrap();
    b.flush_blocking().unwrap();
    assert_ne!(a.spill_dirs(), b.spill_dirs());
    drop(a);
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(2, 100));
}

#[tokio::test(flavor = "current_thread")]
async fn pin_reads_back_without_blocking_and_shares_one_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = with_faults(SpillBuffer::builder(tmp.path()).memory_target(0));
    b.insert(1, value(1, 100_000)).unwrap();
    b.flush().await.unwrap();
    assert!(b.try_pin(&1).is_none());
    // Hold the read until all three pins wait on it.
    faults.hold_reads(true);
    let (mut x, mut y, mut z) = (pin!(b.pin(&1)), pin!(b.pin(&1)), pin!(b.pin(&1)));
    start_each(&mut [x.as_mut(), y.as_mut(), z.as_mut()]).await;
    faults.wait_until_held(1);
    faults.hold_reads(false);
    let (x, y, z) = tokio::join!(x, y, z);
    for p in [x, y, z] {
        assert_eq!(*p.unwrap().unwrap(), value(1, 100_000));
    }
    assert_eq!(b.stats().unspill_count_total, 1, "one shared read");
    assert!(b.pin(&2).await.unwrap().is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn remove_during_a_read_answers_none() {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer(tmp.path(), 0);
    b.insert(1, value(1, 1000)).unwrap();
    b.flush().await.unwrap();
    let fut = b.pin(&1);
    let (res, removed) = tokio::join!(fut, async { b.remove(&1) });
    assert!(removed);
    // Either the read won the race or the removal did; never a stale value
    // after a removal, never an error.
    if let Some(p) = res.unwrap() {
        assert_eq!(*p, value(1, 1000));
    }
    b.flush().await.unwrap();
    assert!(b.pin(&1).await.unwrap().is_none());
    b.validate().unwrap();
}

#[test]
fn buffer_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Buf>();
    check::<spillbuffer::Pinned<Vec<u8>>>();
}

/// Inserting past the target writes exactly the excess, the least
/// recently inserted values, however the pool's writes end meanwhile: a
/// write that ends looks at the target again, and must not evict for an
/// excess that the inserting thread is already evicting.
#[test]
fn inserts_past_the_target_write_exactly_the_excess_while_writes_end() {
    const FIT: u64 = 10;
    const N: u64 = 200;
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..100 {
        let b = SpillBuffer::builder(tmp.path())
            .memory_target(FIT as usize * 1000)
            .io_threads(2)
            .build()
            .unwrap();
        for k in 0..N {
            b.insert(k, value(k, 1000)).unwrap();
        }
        b.flush_blocking().unwrap();
        let s = b.stats();
        assert_eq!(s.spill_count_total, N - FIT, "round {round}: {s:?}");
        for k in N - FIT..N {
            assert!(
                b.try_pin(&k).is_some(),
                "round {round}: key {k} is not in memory"
            );
        }
    }
}
