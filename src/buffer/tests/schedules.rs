//! The buffer's races under shuttle's schedules:
//! `RUSTFLAGS="--cfg shuttle" cargo test --release --lib --target-dir target/shuttle shuttle`.
//!
//! Every lock and atomic of the buffer and of its IO pool comes from
//! `crate::sync`, which under `cfg(shuttle)` makes each a point where
//! shuttle may switch threads; and each IO job runs on a shuttle thread of
//! its own (`crate::io`), so the order of the jobs is explored along with
//! their interleaving with the host's threads. Each test ends with a flush
//! and `validate()` (gauges equal to what the entries add up to, no
//! unpinned resident bytes over the target, lists and states in order),
//! then reads every key back.
//!
//! A schedule that fails is printed by shuttle; `shuttle::replay` runs it
//! again for as long as the code it was found on is unchanged.

use super::*;
use crate::store::codec::Compression;
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::thread;
use std::collections::HashMap;

/// Schedules per test and scheduler.
const ITERATIONS: usize = 400;

/// Run `f` under PCT schedules (which find a bug that needs a few
/// particular orderings with a known probability), then random ones;
/// fixed seeds, so a run is repeatable.
fn explore(f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    let g = Arc::clone(&f);
    shuttle::Runner::new(
        PctScheduler::new_from_seed(0x5eed, 3, ITERATIONS),
        shuttle::Config::new(),
    )
    .run(move || g());
    shuttle::Runner::new(
        RandomScheduler::new_from_seed(0x5eed, ITERATIONS),
        shuttle::Config::new(),
    )
    .run(move || f());
}

fn buffer(dir: &std::path::Path, target: usize, shards: usize) -> SpillBuffer<u64, Vec<u8>> {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .shards(shards)
        .compression(Compression::None)
        .build()
        .unwrap()
}

/// The value of `key`, `len` bytes: distinct per key.
fn value(key: u64, len: usize) -> Vec<u8> {
    vec![key as u8 + 1; len]
}

/// Flush, check the invariants, and read every key of `want` back.
fn settle(b: &SpillBuffer<u64, Vec<u8>>, want: &HashMap<u64, Vec<u8>>) {
    b.flush_blocking().unwrap();
    b.validate().unwrap();
    assert_eq!(b.len(), want.len());
    for (k, v) in want {
        let got = b.get(k).unwrap().unwrap_or_else(|| panic!("key {k} lost"));
        assert_eq!(*got, *v, "key {k}");
    }
}

/// The `faults` fuzz input `b52de25b…` (see `gauge_tear.rs`): a write
/// ends on its job's thread while the host inserts and evicts. Whatever
/// the host's eviction read of the gauges while the write's change
/// landed, nothing unpinned stays over the target.
#[test]
fn shuttle_a_write_ends_while_the_host_evicts() {
    explore(|| {
        let dir = tempfile::tempdir().unwrap();
        let b = buffer(dir.path(), 4096, 1);
        b.insert(4, value(4, 2517)).unwrap();
        // Heavier than the target: its write is queued at once.
        b.insert(8, value(8, 4190)).unwrap();
        b.insert(0, value(0, 3062)).unwrap();
        let want = [(4, 2517), (8, 4190), (0, 3062)];
        settle(&b, &want.map(|(k, n)| (k, value(k, n))).into());
    });
}

/// Two host threads pin, insert and consume while the values they pin are
/// evicted, written and read back.
#[test]
fn shuttle_pins_and_inserts_on_two_threads_while_values_spill() {
    explore(|| {
        let dir = tempfile::tempdir().unwrap();
        let b = buffer(dir.path(), 3000, 2);
        for k in 0..3 {
            b.insert(k, value(k, 1000)).unwrap();
        }
        let other = b.clone();
        let t = thread::spawn(move || {
            // A pin taken before the other thread's inserts push its value
            // out, held across this thread's own insert.
            let p = other.get(&0).unwrap().unwrap();
            other.insert(3, value(3, 1000)).unwrap();
            assert_eq!(*p, value(0, 1000));
            drop(p);
            let q = other.get(&1).unwrap().unwrap();
            assert_eq!(*q, value(1, 1000));
        });
        b.insert(4, value(4, 1000)).unwrap();
        if let Some(p) = b.try_pin(&2) {
            p.consume();
        }
        let p = b.get(&0).unwrap().unwrap();
        assert_eq!(*p, value(0, 1000));
        drop(p);
        t.join().unwrap();
        settle(&b, &(0..5).map(|k| (k, value(k, 1000))).collect());
    });
}

/// A value pinned while its write runs (it stays in memory, clean), and a
/// key removed while its write runs (its value detached until the write
/// lets go of it).
#[test]
fn shuttle_a_pin_and_a_remove_race_writes() {
    explore(|| {
        let dir = tempfile::tempdir().unwrap();
        let b = buffer(dir.path(), 1000, 1);
        b.insert(0, value(0, 1000)).unwrap();
        // Key 0 goes to be written.
        b.insert(1, value(1, 1000)).unwrap();
        let other = b.clone();
        let t = thread::spawn(move || {
            let p = other.try_pin(&0).or_else(|| other.get(&0).unwrap());
            assert_eq!(*p.unwrap(), value(0, 1000));
        });
        // Key 1 goes to be written, then is removed, while key 0's write
        // may still run.
        b.insert(2, value(2, 1000)).unwrap();
        assert!(b.remove(&1));
        t.join().unwrap();
        settle(&b, &[(0, value(0, 1000)), (2, value(2, 1000))].into());
    });
}

/// `insert_async` waits on the memory gauge while another thread pins and
/// writes end: it returns, and nothing is left over the target.
#[test]
fn shuttle_insert_async_against_pins_and_writes() {
    explore(|| {
        let dir = tempfile::tempdir().unwrap();
        let b = buffer(dir.path(), 2000, 2);
        let other = b.clone();
        let t = thread::spawn(move || {
            for k in 0..3 {
                if let Some(p) = other.get(&k).unwrap() {
                    assert_eq!(*p, value(k, 1000));
                }
            }
        });
        for k in 0..4 {
            shuttle::future::block_on(b.insert_async(k, value(k, 1000))).unwrap();
        }
        t.join().unwrap();
        settle(&b, &(0..4).map(|k| (k, value(k, 1000))).collect());
    });
}
