//! The slow tier as a storage engine: space reclamation, disk budget,
//! several directories, crash hygiene and injected faults.

mod common;

use common::{files_under, start_each, value, with_faults};
use rand::{Rng, SeedableRng};
use spillbuffer::testing::{FaultyStorage, WriteFault};
use spillbuffer::{Compression, Error, SpillBuffer};
use std::pin::pin;
use std::sync::Arc;

type Buf = SpillBuffer<u64, Vec<u8>>;

const SEG: u64 = 64 * 1024;

fn builder(dir: &std::path::Path) -> spillbuffer::Builder<u64, Vec<u8>> {
    SpillBuffer::builder(dir)
        .segment_size(SEG)
        .compression(Compression::None)
}

#[test]
fn space_is_reclaimed_under_random_inserts_and_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = builder(tmp.path()).memory_target(0).build().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut live = std::collections::HashMap::new();
    let mut worst = 0f64;
    for step in 0..20_000u64 {
        let k = rng.gen_range(0..400u64);
        if rng.gen_bool(0.4) {
            b.remove(&k);
            live.remove(&k);
        } else {
            let len = rng.gen_range(100..6000);
            b.insert(k, value(step, len)).unwrap();
            live.insert(k, (step, len));
        }
        if step % 2000 == 1999 {
            b.flush_blocking().unwrap();
            let s = b.stats();
            assert!(
                s.file_bytes as f64 <= 1.5 * s.disk_bytes as f64 + SEG as f64,
                "step {step}: {s:?}"
            );
            worst = worst.max(s.file_bytes as f64 / s.disk_bytes.max(1) as f64);
        }
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.compacted_count_total > 0, "compaction ran: {s:?}");
    eprintln!("worst file/disk ratio at checkpoints: {worst:.3}; final {s:?}");
    for (k, (seed, len)) in &live {
        assert_eq!(*b.get(k).unwrap().unwrap(), value(*seed, *len), "key {k}");
    }
    b.validate().unwrap();
}

#[test]
fn readers_keep_reading_while_segments_are_compacted() {
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = builder(tmp.path()).memory_target(0).build().unwrap();
    for k in 0..300u64 {
        b.insert(k, value(k, 2000)).unwrap();
    }
    b.flush_blocking().unwrap();
    // Remove two of every three keys: every sealed segment becomes sparse.
    for k in (0..300u64).filter(|k| k % 3 != 0) {
        b.remove(&k);
    }
    // Read the survivors while compaction runs on the pool.
    let reader = {
        let b = b.clone();
        std::thread::spawn(move || {
            for round in 0..3 {
                for k in (0..300u64).filter(|k| k % 3 == 0) {
                    let v = b
                        .get(&k)
                        .unwrap()
                        .unwrap_or_else(|| panic!("key {k} round {round}"));
                    assert_eq!(*v, value(k, 2000));
                    v.consume();
                }
            }
        })
    };
    reader.join().unwrap();
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.compacted_count_total > 0, "{s:?}");
    assert!(
        s.file_bytes as f64 <= 1.5 * s.disk_bytes as f64 + SEG as f64,
        "{s:?}"
    );
    b.validate().unwrap();
}

#[test]
fn disk_budget_keeps_values_in_memory_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = builder(tmp.path())
        .memory_target(0)
        .max_spill(10_000)
        .build()
        .unwrap();
    for k in 0..20u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.disk_bytes <= 10_000, "{s:?}");
    assert!(s.spill_budget_refusals_total > 0, "{s:?}");
    assert_eq!(
        s.spill_errors_total, s.spill_budget_refusals_total,
        "no I/O error: {s:?}"
    );
    assert_eq!(s.memory_count + s.disk_count, 20, "nothing lost: {s:?}");
    for k in 0..20u64 {
        let v = b.get(&k).unwrap().unwrap();
        assert_eq!(*v, value(k, 1000));
        v.consume(); // values read back from disk are dropped again
    }
    // Freeing disk space lets spilling resume: remove the keys on disk.
    // (A large target first, so that probing with try_pin evicts nothing.)
    b.flush_blocking().unwrap();
    b.set_memory_target(1 << 30);
    let on_disk: Vec<u64> = (0..20u64).filter(|k| b.try_pin(k).is_none()).collect();
    assert!(!on_disk.is_empty());
    for k in &on_disk {
        b.remove(k);
    }
    b.flush_blocking().unwrap(); // compaction of the emptied segments ends
    assert_eq!(b.stats().disk_count, 0);
    let before = b.stats().spill_count_total;
    // The refusals started a back-off of target-driven spills; an explicit
    // evict tries at once.
    b.set_memory_target(0);
    b.evict(usize::MAX);
    b.flush_blocking().unwrap();
    assert!(b.stats().spill_count_total > before);
    b.validate().unwrap();
}

#[test]
fn records_spread_over_several_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let (d1, d2) = (tmp.path().join("one"), tmp.path().join("two"));
    let b: Buf = builder(tmp.path())
        .dirs([&d1, &d2])
        .memory_target(0)
        .build()
        .unwrap();
    for k in 0..200u64 {
        b.insert(k, value(k, 1500)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(files_under(&d1) >= 2 && files_under(&d2) >= 2);
    for k in 0..200u64 {
        assert_eq!(*b.get(&k).unwrap().unwrap(), value(k, 1500));
    }
    let dirs = b.spill_dirs();
    assert_eq!(dirs.len(), 2);
    drop(b);
    assert_eq!(files_under(tmp.path()), 0);
}

#[test]
fn one_failing_directory_does_not_stop_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let (d1, d2) = (tmp.path().join("one"), tmp.path().join("two"));
    let b: Buf = builder(tmp.path())
        .dirs([&d1, &d2])
        .memory_target(0)
        .build()
        .unwrap();
    // Break the first directory: its private sub-directory disappears and a
    // file takes its place, so no segment can be created there.
    let broken = b.spill_dirs()[0].clone();
    std::fs::remove_dir_all(&broken).unwrap();
    std::fs::write(&broken, b"not a directory").unwrap();
    for k in 0..300u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    // Values whose write failed stay in memory; the next eviction retries
    // them in the healthy directory.
    b.evict(usize::MAX);
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.disk_count > 250, "{s:?}");
    assert!(files_under(&d2) > 0);
    for k in 0..300u64 {
        assert_eq!(*b.get(&k).unwrap().unwrap(), value(k, 1000), "key {k}");
    }
    std::fs::remove_file(&broken).unwrap();
}

#[test]
fn stale_directories_of_dead_owners_are_swept_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let stale = tmp.path().join("spillbuffer-4000000001-00000000000000aa");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("seg-00000000.spill"), vec![0u8; 4096]).unwrap();
    std::fs::write(stale.join("lock"), b"").unwrap(); // a lock nobody holds
    let live = tmp.path().join(format!(
        "spillbuffer-{}-00000000000000bb",
        std::process::id()
    ));
    std::fs::create_dir(&live).unwrap();
    let b: Buf = builder(tmp.path()).build().unwrap();
    b.flush_blocking().unwrap(); // the sweep runs on the IO pool
    assert!(!stale.exists(), "dead owner's directory removed");
    assert!(live.exists(), "a live process's directory is never touched");
    drop(b);
    std::fs::remove_dir(&live).unwrap();
}

fn faulty(dir: &std::path::Path) -> (Buf, Arc<spillbuffer::testing::Faults>) {
    with_faults(builder(dir).memory_target(0))
}

#[test]
fn failed_writes_keep_values_in_memory_and_retry_later() {
    for kind in [WriteFault::Error, WriteFault::NoSpace, WriteFault::Short] {
        let tmp = tempfile::tempdir().unwrap();
        let (b, faults) = faulty(tmp.path());
        faults.fail_all_writes(kind);
        for k in 0..10u64 {
            b.insert(k, value(k, 3000)).unwrap();
        }
        b.flush_blocking().unwrap();
        let s = b.stats();
        assert!(s.spill_errors_total >= 1, "{kind:?}: {s:?}");
        assert_eq!(s.disk_count, 0);
        assert_eq!(s.memory_count, 10, "values kept in memory");
        assert_eq!(s.spill_budget_refusals_total, 0);
        faults.clear();
        b.evict(usize::MAX);
        b.flush_blocking().unwrap();
        let s = b.stats();
        assert_eq!((s.disk_count, s.memory_count), (10, 0), "{kind:?}: {s:?}");
        for k in 0..10u64 {
            assert_eq!(
                *b.get(&k).unwrap().unwrap(),
                value(k, 3000),
                "{kind:?} key {k}"
            );
        }
        b.validate().unwrap();
    }
}

#[test]
fn a_torn_write_is_never_read_as_a_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = faulty(tmp.path());
    b.insert(1, value(1, 2000)).unwrap();
    b.flush_blocking().unwrap();
    faults.fail_nth_write(1, WriteFault::Short);
    b.insert(2, value(2, 2000)).unwrap(); // torn
    b.insert(3, value(3, 2000)).unwrap(); // written after the torn bytes
    b.flush_blocking().unwrap();
    b.evict(usize::MAX); // 2 retried
    b.flush_blocking().unwrap();
    for k in 1..=3u64 {
        assert_eq!(*b.get(&k).unwrap().unwrap(), value(k, 2000), "key {k}");
    }
    b.validate().unwrap();
}

#[test]
fn corrupted_records_are_reported_and_other_keys_still_served() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = faulty(tmp.path());
    for k in 0..5u64 {
        b.insert(k, value(k, 5000)).unwrap();
    }
    b.flush_blocking().unwrap();
    faults.flip_bits_on_read(true);
    let err = b.get(&3).unwrap_err();
    match &err {
        Error::Corrupt { key, path, .. } => {
            assert_eq!(key, "3");
            assert!(path.to_string_lossy().contains("seg-"), "{err}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    faults.flip_bits_on_read(false);
    for k in 0..5u64 {
        assert_eq!(*b.get(&k).unwrap().unwrap(), value(k, 5000), "key {k}");
    }
    b.validate().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_read_errors_every_waiter_then_retries_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = faulty(tmp.path());
    b.insert(9, value(9, 5000)).unwrap();
    b.flush().await.unwrap();
    faults.fail_nth_read(1);
    faults.hold_reads(true);
    let (mut x, mut y) = (pin!(b.pin(&9)), pin!(b.pin(&9)));
    start_each(&mut [x.as_mut(), y.as_mut()]).await;
    faults.wait_until_held(1);
    faults.hold_reads(false);
    let (x, y) = tokio::join!(x, y);
    assert_eq!(faults.reads(), 1, "the two pins share one read");
    for r in [x, y] {
        let e = r.unwrap_err();
        assert!(e.is_io(), "{e}");
        assert!(e.to_string().contains("seg-"), "names the file: {e}");
    }
    assert_eq!(*b.pin(&9).await.unwrap().unwrap(), value(9, 5000));
    b.validate().unwrap();
}

#[test]
fn a_failed_segment_creation_is_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = FaultyStorage::new();
    let faults = storage.faults();
    faults.fail_nth_create(1);
    let b: Buf = builder(tmp.path())
        .memory_target(0)
        .storage(Arc::new(storage))
        .build()
        .unwrap();
    b.insert(1, value(1, 100)).unwrap();
    b.flush_blocking().unwrap();
    assert_eq!(b.stats().spill_errors_total, 1);
    b.evict(usize::MAX);
    b.flush_blocking().unwrap();
    assert_eq!(b.stats().disk_count, 1);
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(1, 100));
}
