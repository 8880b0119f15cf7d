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
