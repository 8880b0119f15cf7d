//! The segment table: packing, release, budget and compaction policy.

use super::*;
use codec::Codec;

fn store(dir: &std::path::Path, segment_size: u64, max_spill: u64) -> Store<u32> {
    Store::new(
        vec![dir.to_path_buf()],
        Arc::new(storage::FsStorage),
        StoreConfig {
            segment_size,
            max_spill,
            compact_below: 0.5,
            compression: Compression::None,
        },
    )
}

/// A store of 1 MiB segments, no budget, with `compression`: what the
/// read and write paths' own tests (in `get.rs`, `put.rs`) start from.
pub(super) fn store_with(dir: &std::path::Path, compression: Compression) -> Store<u32> {
    Store::new(
        vec![dir.to_path_buf()],
        Arc::new(storage::FsStorage),
        StoreConfig {
            segment_size: 1 << 20,
            max_spill: u64::MAX,
            compact_below: 0.5,
            compression,
        },
    )
}

/// `len` incompressible bytes that depend on `seed` (stored raw even with
/// lz4 on).
pub(super) fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn rec(payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; record::HEADER];
    b.extend_from_slice(payload);
    record::seal(&mut b, Codec::Raw, payload.len() as u64);
    b
}

#[test]
fn small_records_share_a_segment_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), 1 << 20, u64::MAX);
    let a = s.write(&1, &rec(b"alpha")).unwrap();
    let b = s.write(&2, &rec(b"beta")).unwrap();
    assert_eq!(a.seg, b.seg);
    let mut buf = Vec::new();
    s.read(&2, b, &mut buf).unwrap();
    assert_eq!(record::open(&buf).unwrap().payload, b"beta");
    assert_eq!(s.disk_count(), 2);
    assert_eq!(s.disk_bytes(), a.len() + b.len());
    s.validate().unwrap();
}

#[test]
fn large_record_gets_its_own_file_and_is_deleted_when_dead() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), 100, u64::MAX);
    let big = s.write(&1, &rec(&[7u8; 500])).unwrap();
    let path = s.path_of(big);
    assert!(path.exists());
    match s.release(big) {
        Some(d) => s.delete(d),
        None => panic!("a dead own-file segment must be deleted"),
    }
    assert!(!path.exists());
    assert_eq!(s.file_bytes(), 0);
    s.validate().unwrap();
}

#[test]
fn sealed_segment_is_released_when_its_last_record_dies() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), 100, u64::MAX);
    let a = s.write(&1, &rec(&[1u8; 40])).unwrap(); // 72 bytes
    let b = s.write(&2, &rec(&[2u8; 40])).unwrap(); // does not fit: new segment
    assert_ne!(a.seg, b.seg);
    let first = s.path_of(a);
    assert!(s.release(a).is_some());
    // The open segment is kept even when empty.
    assert!(s.release(b).is_none());
    assert_eq!(s.disk_bytes(), 0);
    let _ = first;
    s.validate().unwrap();
}

#[test]
fn disk_budget_refuses_and_does_not_count() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), 1 << 20, 100);
    s.write(&1, &rec(&[0u8; 40])).unwrap();
    let err = s.write(&2, &rec(&[0u8; 40])).unwrap_err();
    assert!(
        matches!(err, Error::DiskBudget { budget: 100, .. }),
        "{err}"
    );
    assert_eq!(s.disk_count(), 1);
    s.validate().unwrap();
}

#[test]
fn sparse_segment_is_compacted_only_once_the_store_passes_its_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let s = store(tmp.path(), 200, u64::MAX);
    // 52-byte records, three to a segment: 0..3, 3..6, 6..9 sealed,
    // 9..12 in the open segment. File space 624 bytes.
    let locs: Vec<_> = (0..12)
        .map(|i| s.write(&i, &rec(&[i as u8; 20])).unwrap())
        .collect();
    assert_eq!(locs[0].seg, locs[2].seg);
    // Sparse sealed segments, but the store is within live / 0.5 plus
    // one open segment: nothing is copied (a drain in order).
    for i in [0, 1, 3, 4, 6, 7] {
        assert!(s.release(locs[i]).is_none(), "{i}");
    }
    assert!(s.take_compaction_requests().is_empty());
    assert!(s.release(locs[9]).is_none());
    assert!(s.take_compaction_requests().is_empty());
    // Live 208: bound 416 + 200 < 624. A release anywhere now takes up a
    // deferred sparse segment.
    assert!(s.release(locs[10]).is_none());
    let asked = s.take_compaction_requests();
    assert_eq!(asked, vec![locs[6].seg]);
    assert_eq!(s.live_records(asked[0]), vec![(locs[8], 8)]);
    s.validate().unwrap();
}

#[test]
fn dead_blocks_are_the_aligned_insides_of_the_gaps() {
    use super::compact::dead_blocks;
    // Live: 100..200 and 9000..9100 in a 20000-byte segment.
    let holes = dead_blocks(&[(100, 100), (9000, 100)], 20000);
    assert_eq!(holes, vec![(4096, 8192), (12288, 16384)]);
    // No gap holds a whole block.
    assert!(dead_blocks(&[(0, 4000), (4100, 4000)], 8192).is_empty());
    assert_eq!(dead_blocks(&[], 8192), vec![(0, 8192)]);
}

/// On a full disk, compaction punches and packs in place: every live
/// record reads back from where `relocate` was told it went, holes never
/// touch a live record, and the space is given back.
#[test]
fn a_full_disk_is_compacted_in_place_and_records_survive() {
    // Small records only: no dead run holds a whole block, so nothing can
    // be punched until the records are packed.
    full_disk_compaction(|_| 300);
    // Mixed: punching frees room first, then copies finish the job.
    full_disk_compaction(|k| if k % 3 == 0 { 5000 } else { 300 });
}

/// A store of 64 KiB segments on a 256 KiB disk, filled with records of
/// `len_of(key)` bytes (each byte the key's) until the disk refused one:
/// the store, its faults, the records' locations and the bytes used.
fn a_full_disk(
    len_of: fn(u32) -> usize,
) -> (
    tempfile::TempDir,
    Store<u32>,
    Arc<crate::store::faulty::Faults>,
    std::collections::HashMap<u32, DiskLoc>,
) {
    use crate::store::faulty::FaultyStorage;
    let tmp = tempfile::tempdir().unwrap();
    let storage = FaultyStorage::new();
    let faults = storage.faults();
    let s: Store<u32> = Store::new(
        vec![tmp.path().to_path_buf()],
        Arc::new(storage),
        StoreConfig {
            segment_size: 64 << 10,
            max_spill: u64::MAX,
            compact_below: 0.7,
            compression: Compression::None,
        },
    );
    faults.set_capacity(256 << 10);
    let mut locs = std::collections::HashMap::new();
    for k in 0u32.. {
        match s.write(&k, &rec(&vec![k as u8; len_of(k)])) {
            Ok(l) => {
                locs.insert(k, l);
            }
            Err(Error::DiskFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    (tmp, s, faults, locs)
}

/// Release nine records in ten of `locs`, spread over every segment.
fn release_nine_in_ten(s: &Store<u32>, locs: &mut std::collections::HashMap<u32, DiskLoc>) {
    for k in locs
        .keys()
        .copied()
        .filter(|k| k % 10 != 0)
        .collect::<Vec<_>>()
    {
        let l = locs.remove(&k).unwrap();
        if let Some(d) = s.release(l) {
            s.delete(d);
        }
    }
}

/// Run the queued compactions, `rounds` times, moving `locs` along.
/// Returns whether any was passed over for a hold.
fn compact_rounds(
    s: &Store<u32>,
    locs: &std::cell::RefCell<std::collections::HashMap<u32, DiskLoc>>,
    rounds: usize,
) -> bool {
    let mut held = false;
    for _ in 0..rounds {
        for seg in s.take_compaction_requests() {
            let out = s.compact(seg, |k, old, new| {
                let mut m = locs.borrow_mut();
                assert_eq!(m.get(k), Some(&old));
                m.insert(*k, new);
                compact::Relocated::Moved
            });
            held |= out.held;
        }
    }
    held
}

fn full_disk_compaction(len_of: fn(u32) -> usize) {
    let (_tmp, s, faults, mut locs) = a_full_disk(len_of);
    let used = faults.used_bytes();
    release_nine_in_ten(&s, &mut locs);
    let locs = std::cell::RefCell::new(locs);
    compact_rounds(&s, &locs, 3);
    space_back_and_records_intact(&s, &faults, used, &locs.borrow(), len_of);
    // Room again: a new record fits.
    s.write(&1_000_000, &rec(&[7u8; 5000])).unwrap();
}

/// The store is valid, uses under a third of the `used` bytes, and every
/// record of `locs` reads back as written.
fn space_back_and_records_intact(
    s: &Store<u32>,
    faults: &crate::store::faulty::Faults,
    used: u64,
    locs: &std::collections::HashMap<u32, DiskLoc>,
    len_of: fn(u32) -> usize,
) {
    s.validate().unwrap();
    assert!(
        faults.used_bytes() < used / 3,
        "space given back: {} of {used}",
        faults.used_bytes()
    );
    let mut buf = Vec::new();
    for (k, l) in locs {
        s.read(k, *l, &mut buf).unwrap();
        let want = vec![*k as u8; len_of(*k)];
        assert_eq!(record::open(&buf).unwrap().payload, want, "{k}");
    }
}

/// While a transfer holds a segment ([`Store::hold`]), compaction on a
/// full disk neither punches it nor packs it in place: a record that died
/// under the hold still sends whole and unchanged. The pass is not queued
/// again while the hold lasts (no loop on the pool), but when the last
/// hold goes; then it gives the space back.
#[test]
fn a_held_segment_keeps_its_dead_records_until_the_hold_goes() {
    let len_of = |k: u32| if k % 3 == 0 { 5000 } else { 300 };
    let (_tmp, s, faults, mut locs) = a_full_disk(len_of);
    let used = faults.used_bytes();
    // In every segment, one record that is about to die, held.
    let mut doomed = std::collections::HashMap::new();
    for (&k, &l) in &locs {
        if k % 10 != 0 {
            doomed.entry(l.seg).or_insert((k, l));
        }
    }
    let holds: Vec<_> = doomed
        .values()
        .map(|&(k, l)| (k, l, s.hold(l).expect("segment present")))
        .collect();
    release_nine_in_ten(&s, &mut locs);
    let locs = std::cell::RefCell::new(locs);
    assert!(
        compact_rounds(&s, &locs, 1),
        "compaction passed over a hold"
    );
    assert!(
        s.take_compaction_requests().is_empty(),
        "queued again while held"
    );
    s.validate().unwrap();
    for (k, l, hold) in &holds {
        let mut wire = Vec::new();
        let n = hold.send(k, 1, &mut wire).unwrap();
        assert_eq!(n, wire.len() as u64);
        let body = &wire[crate::frame::FRAME..];
        assert_eq!(body.len() as u64, l.len());
        let want = vec![*k as u8; len_of(*k)];
        assert_eq!(record::open(body).unwrap().payload, want, "{k}");
    }
    drop(holds);
    assert!(
        !compact_rounds(&s, &locs, 3),
        "queued again once the holds went"
    );
    space_back_and_records_intact(&s, &faults, used, &locs.borrow(), len_of);
}

/// A write that fails on a full disk leaves its range allocated and dead.
/// Punching that range out gives back no space the disk had before the
/// write, so it must not count as space returned: the buffer would retry
/// at once, fail into a new range, punch it out, and so on without end.
#[test]
fn punching_out_failed_writes_returns_no_space() {
    let (_tmp, s, _faults, locs) = a_full_disk(|_| 10_000);
    let live: Vec<(u32, DiskLoc)> = locs.iter().map(|(&k, &l)| (k, l)).collect();
    let locs = std::cell::RefCell::new(locs);
    s.take_space_returned();
    let epoch = s.space_epoch();
    for k in 0..40u32 {
        match s.write(&(1_000 + k), &rec(&vec![k as u8; 10_000])) {
            Err(Error::DiskFull { .. }) => {}
            other => panic!("write {k} on a full disk: {other:?}"),
        }
        compact_rounds(&s, &locs, 1);
        assert!(!s.take_space_returned(), "after failed write {k}");
    }
    assert_eq!(s.space_epoch(), epoch);
    s.validate().unwrap();
    for (k, l) in live {
        assert_eq!(locs.borrow()[&k], l, "record {k} did not move");
    }
}
