//! The fast IO paths: large values written from and read into their own
//! memory (no intermediate buffer), small ones packed into batched writes.
//! These check that they round-trip and fail as the plain paths do.

mod common;

use common::{value, with_faults};
use spillbuffer::testing::Faults;
use spillbuffer::{BoxError, Compression, Error, Spill, SpillBuffer};
use std::sync::Arc;

const BIG: usize = 300_000;

fn buffer<V: Spill>(dir: &std::path::Path, compression: Compression) -> SpillBuffer<u64, V> {
    SpillBuffer::builder(dir)
        .memory_target(0)
        .compression(compression)
        .build()
        .unwrap()
}

#[test]
fn large_values_round_trip_raw_and_compressed() {
    let tmp = tempfile::tempdir().unwrap();
    for compression in [Compression::None, Compression::Lz4] {
        let b = buffer::<Vec<u8>>(tmp.path(), compression);
        let noise = value(1, BIG);
        let mut half = value(2, BIG);
        half[..BIG / 2].fill(0);
        b.insert(1, noise.clone()).unwrap();
        b.insert(2, half.clone()).unwrap();
        b.insert(3, String::from("x").repeat(BIG).into_bytes())
            .unwrap();
        b.flush_blocking().unwrap();
        assert_eq!(b.stats().disk_count, 3);
        assert_eq!(*b.get(&1).unwrap().unwrap(), noise);
        assert_eq!(*b.get(&2).unwrap().unwrap(), half);
        assert_eq!(b.get(&3).unwrap().unwrap().len(), BIG);
        b.validate().unwrap();
    }
}

#[test]
fn large_strings_and_f64_vectors_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let s = buffer::<String>(tmp.path(), Compression::Lz4);
    let text: String = (0..BIG / 10).map(|i| format!("{i:09} ")).collect();
    s.insert(1, text.clone()).unwrap();
    s.flush_blocking().unwrap();
    assert_eq!(*s.get(&1).unwrap().unwrap(), text);

    let f = buffer::<Vec<f64>>(tmp.path(), Compression::None);
    let xs: Vec<f64> = (0..BIG / 8).map(|i| i as f64 * 0.5).collect();
    f.insert(1, xs.clone()).unwrap();
    f.flush_blocking().unwrap();
    assert_eq!(*f.get(&1).unwrap().unwrap(), xs);
}

/// A type with neither `as_encoded` nor `decode_in_place`: large records
/// of it go through the buffered paths.
#[derive(Debug, Clone, PartialEq)]
struct Opaque(Vec<u8>);

impl Spill for Opaque {
    fn weight(&self) -> usize {
        self.0.len()
    }
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(&self.0);
        Ok(())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Opaque(bytes.to_vec()))
    }
}

#[test]
fn types_without_in_place_paths_still_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    for compression in [Compression::None, Compression::Lz4] {
        let b = buffer::<Opaque>(tmp.path(), compression);
        let v = Opaque(value(3, BIG));
        let z = Opaque(vec![0u8; BIG]);
        b.insert(1, v.clone()).unwrap();
        b.insert(2, z.clone()).unwrap();
        b.flush_blocking().unwrap();
        assert_eq!(*b.get(&1).unwrap().unwrap(), v);
        assert_eq!(*b.get(&2).unwrap().unwrap(), z);
    }
}

/// Everything on disk, raw records, over a storage layer that fails on demand.
fn large_buffer(dir: &std::path::Path) -> (SpillBuffer<u64, Vec<u8>>, Arc<Faults>) {
    with_faults(
        SpillBuffer::builder(dir)
            .memory_target(0)
            .compression(Compression::None),
    )
}

#[test]
fn corrupted_large_record_is_reported_and_others_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = large_buffer(tmp.path());
    b.insert(1, value(1, BIG)).unwrap();
    b.insert(2, value(2, BIG)).unwrap();
    b.flush_blocking().unwrap();
    faults.flip_bits_on_read(true);
    match b.get(&1) {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, "1"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    faults.flip_bits_on_read(false);
    assert_eq!(*b.get(&2).unwrap().unwrap(), value(2, BIG));
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(1, BIG));
    b.validate().unwrap();
}

#[test]
fn failed_large_write_keeps_the_value_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = large_buffer(tmp.path());
    faults.fail_nth_write(1, spillbuffer::testing::WriteFault::Short);
    b.insert(1, value(1, BIG)).unwrap();
    b.flush_blocking().unwrap();
    assert_eq!(b.stats().spill_errors_total, 1);
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(1, BIG));
}

fn small_buffer(dir: &std::path::Path) -> (SpillBuffer<u64, Vec<u8>>, Arc<Faults>) {
    with_faults(
        SpillBuffer::builder(dir)
            .memory_target(8 << 10)
            .segment_size(64 << 10),
    )
}

#[test]
fn batched_small_values_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, _) = small_buffer(tmp.path());
    for k in 0..2000u64 {
        b.insert(k, value(k, 1000 + (k as usize % 7) * 100))
            .unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(b.stats().disk_count >= 1900, "{:?}", b.stats());
    b.validate().unwrap();
    for k in (0..2000u64).rev() {
        assert_eq!(
            *b.get(&k).unwrap().unwrap(),
            value(k, 1000 + (k as usize % 7) * 100),
            "key {k}"
        );
    }
    b.validate().unwrap();
}

#[test]
fn failed_batch_writes_lose_nothing_and_retry_once_the_fault_clears() {
    let tmp = tempfile::tempdir().unwrap();
    let (b, faults) = small_buffer(tmp.path());
    faults.fail_all_writes(spillbuffer::testing::WriteFault::Short);
    for k in 0..500u64 {
        b.insert(k, value(k, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    let st = b.stats();
    assert_eq!(st.disk_count, 0, "{st:?}");
    assert!(st.spill_errors_total > 0);
    assert_eq!(st.memory_count, 500);
    faults.clear();
    // Target-driven evictions wait out the back-off the failures started;
    // an explicit evict retries at once.
    b.insert(500, value(500, 1000)).unwrap();
    b.evict(usize::MAX);
    b.flush_blocking().unwrap();
    assert!(b.stats().disk_count > 0, "{:?}", b.stats());
    for k in 0..=500u64 {
        assert_eq!(*b.get(&k).unwrap().unwrap(), value(k, 1000), "key {k}");
    }
    b.validate().unwrap();
}
