//! Space that comes back is used again: a full disk, or a spent
//! `max_spill`, stops spilling only until keys are removed, even when the
//! removed keys are scattered so that every segment keeps a live record.
//! On the fault layer's small disk, and on a real tmpfs of a few MiB when
//! the test may mount one.

mod common;

use common::value;
use spillbuffer::testing::{Faults, FaultyStorage};
use spillbuffer::{Compression, SpillBuffer, Stats};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

type Buf = SpillBuffer<u64, Vec<u8>>;

const SEG: u64 = 64 * 1024;
const TARGET: usize = 256 * 1024;

fn builder(dir: &Path) -> spillbuffer::Builder<u64, Vec<u8>> {
    SpillBuffer::builder(dir)
        .segment_size(SEG)
        .compression(Compression::None)
        .memory_target(TARGET)
}

/// Length of key `k`'s value: 200..6200 bytes, mixed so that records do
/// not line up with file-system blocks.
fn len_of(k: u64) -> usize {
    200 + (k.wrapping_mul(2_654_435_761) % 6000) as usize
}

/// Insert keys `from..to`, flushing as it goes so that writes are tried
/// (and fail) along the way.
fn fill(b: &Buf, from: u64, to: u64, live: &mut HashMap<u64, usize>) {
    for k in from..to {
        b.insert(k, value(k, len_of(k))).unwrap();
        live.insert(k, len_of(k));
        if k % 50 == 0 {
            b.flush_blocking().unwrap();
        }
    }
    b.flush_blocking().unwrap();
}

fn check_all(b: &Buf, live: &HashMap<u64, usize>) {
    for (&k, &len) in live {
        let v = b.get(&k).unwrap().unwrap_or_else(|| panic!("key {k} lost"));
        assert_eq!(*v, value(k, len), "key {k}");
        v.consume();
    }
    assert_eq!(b.len(), live.len());
}

/// The scenario on any storage: fill until the disk refuses, remove nine
/// keys in ten spread over every segment, then insert more. `full` tells
/// whether the disk refused (true once spilling failed for lack of space).
fn scenario(b: &Buf, full: impl Fn(&Stats) -> bool) {
    let mut live = HashMap::new();
    fill(b, 0, 1500, &mut live);
    let s = b.stats();
    assert!(full(&s), "the disk must be full by now: {s:?}");
    assert!(
        s.memory_bytes as usize > 2 * TARGET,
        "values held in memory: {s:?}"
    );

    // Nine in ten keys, in every segment: no segment empties.
    for k in (0..1500u64).filter(|k| k % 10 != 0) {
        assert!(b.remove(&k));
        live.remove(&k);
    }
    b.flush_blocking().unwrap();
    // Dead space given back (spilling may already have resumed, so the
    // files hold new records too): within the compaction bound.
    let s = b.stats();
    assert!(
        s.file_bytes as f64 <= s.disk_bytes as f64 / 0.7 + (2 * SEG) as f64,
        "dead space given back: {s:?}"
    );
    // Spilling resumes: the values held in memory and new ones go to disk.
    let spilled = s.spill_count_total;
    fill(b, 1500, 1600, &mut live);
    let s = b.stats();
    assert!(
        s.spill_count_total > spilled + 20,
        "spilling resumed: {spilled} before, {s:?}"
    );
    eprintln!("after removals and 100 more inserts: {s:?}");
    assert!(
        s.memory_bytes as usize <= TARGET,
        "memory back under the target: {s:?}"
    );
    check_all(b, &live);
    b.validate().unwrap();
}

fn faulty(dir: &Path, capacity: u64) -> (Buf, Arc<Faults>) {
    let storage = FaultyStorage::new();
    let faults = storage.faults();
    faults.set_capacity(capacity);
    let b = builder(dir).storage(Arc::new(storage)).build().unwrap();
    (b, faults)
}

#[test]
fn spilling_resumes_after_scattered_removals_on_a_full_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let cap = 2 << 20;
    let (b, faults) = faulty(tmp.path(), cap);
    scenario(&b, |s| {
        s.spill_errors_total > 0 && faults.used_bytes() + SEG > cap
    });
    assert!(faults.used_bytes() <= cap);
}

#[test]
fn spilling_resumes_after_scattered_removals_of_small_records() {
    // 300-byte records: fourteen to a block, so a hole needs a run of dead
    // ones; copying the survivors does the rest once holes made room.
    let tmp = tempfile::tempdir().unwrap();
    let cap = 1 << 20;
    let (b, faults) = faulty(tmp.path(), cap);
    let mut live = HashMap::new();
    for k in 0..6000u64 {
        b.insert(k, value(k, 300)).unwrap();
        live.insert(k, 300);
        if k % 100 == 0 {
            b.flush_blocking().unwrap();
        }
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.spill_errors_total > 0, "{s:?}");
    for k in (0..6000u64).filter(|k| k % 10 != 0) {
        b.remove(&k);
        live.remove(&k);
    }
    b.flush_blocking().unwrap();
    let spilled = b.stats().spill_count_total;
    for k in 6000..7000u64 {
        b.insert(k, value(k, 300)).unwrap();
        live.insert(k, 300);
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(s.spill_count_total > spilled + 100, "{spilled}: {s:?}");
    assert!(s.memory_bytes as usize <= TARGET, "{s:?}");
    assert!(faults.used_bytes() <= cap);
    check_all(&b, &live);
    b.validate().unwrap();
}

#[test]
fn a_spent_disk_budget_is_usable_again_after_scattered_removals() {
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = builder(tmp.path()).max_spill(1 << 20).build().unwrap();
    scenario(&b, |s| s.spill_budget_refusals_total > 0);
    assert!(b.stats().disk_bytes <= 1 << 20);
}

#[test]
fn removing_keys_lets_refused_values_spill_without_further_inserts() {
    // Refused by max_spill, then keys removed: the values held in memory
    // are written without the host doing anything else.
    let tmp = tempfile::tempdir().unwrap();
    let b: Buf = builder(tmp.path())
        .memory_target(0)
        .max_spill(200_000)
        .build()
        .unwrap();
    for k in 0..100u64 {
        b.insert(k, value(k, 4000)).unwrap();
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(
        s.spill_budget_refusals_total > 0 && s.memory_count > 0,
        "{s:?}"
    );
    let on_disk = s.disk_count;
    // Remove the keys on disk, every other one first: the budget comes
    // back record by record.
    let in_memory: Vec<u64> = (0..100u64).filter(|k| b.try_pin(k).is_some()).collect();
    let mut removed = 0;
    for k in (0..100u64).filter(|k| !in_memory.contains(k)) {
        b.remove(&k);
        removed += 1;
        if removed == on_disk / 2 {
            break;
        }
    }
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert!(
        s.disk_count > on_disk / 2,
        "refused values were written: {s:?}"
    );
    assert!(s.disk_bytes <= 200_000, "{s:?}");
    b.validate().unwrap();
}

#[cfg(target_os = "linux")]
mod tmpfs {
    use super::*;
    use std::process::Command;

    /// A tmpfs of `size` mounted at a fresh directory, unmounted on drop.
    struct Mount(tempfile::TempDir);

    impl Mount {
        fn new(size: &str) -> Option<Mount> {
            let dir = tempfile::tempdir().ok()?;
            let ok = Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={size},mode=0755"),
                    "tmpfs",
                ])
                .arg(dir.path())
                .output()
                .is_ok_and(|o| o.status.success());
            ok.then_some(Mount(dir))
        }
    }

    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0.path()).status();
        }
    }

    #[test]
    fn spilling_resumes_after_scattered_removals_on_a_full_tmpfs() {
        let Some(mnt) = Mount::new("2m") else {
            eprintln!("skipped: cannot mount a tmpfs here (needs root and mount rights)");
            return;
        };
        {
            let b: Buf = builder(mnt.0.path()).build().unwrap();
            scenario(&b, |s| s.spill_errors_total > 0);
        }
        drop(mnt);
    }
}
