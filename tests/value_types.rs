//! The optional value types through a buffer: spilled (small records
//! packed, large ones read back in place; raw and lz4), read back equal,
//! weighed as the memory gauge counts them, and a damaged record is
//! `Error::Corrupt`, never a wrong value. Each part runs with its feature
//! (`cargo test --all-features`).
#![cfg(any(
    feature = "arrow",
    feature = "bytes",
    feature = "serde",
    feature = "slices"
))]

use spillbuffer::{Compression, Error, Spill, SpillBuffer};
use std::fmt::Debug;
use std::path::Path;

/// Sizes that take the packed path and the in-place path.
const SMALL: usize = 3000;
const LARGE: usize = 1 << 20;

fn buffer<V: Spill>(dir: &Path, compression: Compression) -> SpillBuffer<u64, V> {
    SpillBuffer::builder(dir)
        .memory_target(0)
        .compression(compression)
        .build()
        .unwrap()
}

/// `values` spilled and read back equal, both compressions, with the
/// memory gauge counting their weights. (The buffer counts a value read
/// back at the weight it had when inserted: a batch read back into one
/// allocation may weigh a little more or less.)
fn round_trip<V: Spill + Clone + PartialEq + Debug>(values: &[V]) {
    for compression in [Compression::None, Compression::Lz4] {
        let tmp = tempfile::tempdir().unwrap();
        let b = buffer::<V>(tmp.path(), compression);
        for (k, v) in values.iter().enumerate() {
            b.insert(k as u64, v.clone()).unwrap();
        }
        b.flush_blocking().unwrap();
        let st = b.stats();
        assert_eq!(st.memory_count, 0, "{compression:?}: all spilled");
        assert_eq!(st.disk_count, values.len() as u64);
        for (k, v) in values.iter().enumerate() {
            let back = b.get(&(k as u64)).unwrap().expect("present");
            assert_eq!(&*back, v, "{compression:?} key {k}");
            assert_eq!(b.stats().memory_bytes, v.weight() as u64);
            drop(back);
            b.flush_blocking().unwrap();
        }
    }
}

/// A spilled `value` whose segment is damaged reads back as `Corrupt`
/// naming its key, never as a value.
fn damaged_is_corrupt<V: Spill + Debug>(value: V) {
    let tmp = tempfile::tempdir().unwrap();
    let b = buffer::<V>(tmp.path(), Compression::None);
    b.insert(7, value).unwrap();
    b.flush_blocking().unwrap();
    let mut damaged = 0;
    for dir in b.spill_dirs() {
        for f in std::fs::read_dir(dir).unwrap().flatten() {
            let path = f.path();
            if path.extension().is_some_and(|e| e == "spill") {
                let mut bytes = std::fs::read(&path).unwrap();
                let at = bytes.len() / 2;
                bytes[at] ^= 0x10;
                std::fs::write(&path, bytes).unwrap();
                damaged += 1;
            }
        }
    }
    assert_eq!(damaged, 1);
    match b.get(&7) {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, "7"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[cfg(feature = "bytes")]
mod bytes_values {
    use super::*;
    use bytes::Bytes;

    fn value(seed: u8, len: usize) -> Bytes {
        (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    #[test]
    fn bytes_spill_and_read_back() {
        round_trip(&[value(3, SMALL), value(5, LARGE)]);
        damaged_is_corrupt(value(7, LARGE));
    }
}

#[cfg(feature = "slices")]
mod slice_values {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn boxed_and_shared_slices_spill_and_read_back() {
        let small: Box<[f64]> = (0..SMALL / 8).map(|i| i as f64).collect();
        let large: Box<[f64]> = (0..LARGE / 8).map(|i| (i as f64).sqrt()).collect();
        round_trip(&[small.clone(), large.clone()]);
        let shared: Vec<Arc<[f64]>> = vec![Arc::from(small), Arc::from(large.clone())];
        round_trip(&shared);
        damaged_is_corrupt(large);
    }
}

#[cfg(feature = "arrow")]
mod arrow_values {
    use super::*;
    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;

    fn batch(rows: usize) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
        let xs: ArrayRef = Arc::new(Float64Array::from_iter(
            (0..rows).map(|i| (i % 5 != 0).then_some(i as f64 * 1.5)),
        ));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("k{i}")),
        ));
        RecordBatch::try_from_iter([("id", ids), ("x", xs), ("name", names)]).unwrap()
    }

    #[test]
    fn record_batches_spill_and_read_back() {
        // About 24 bytes a row.
        round_trip(&[batch(SMALL / 24), batch(LARGE / 24)]);
        damaged_is_corrupt(batch(LARGE / 24));
    }
}

#[cfg(feature = "serde")]
mod serde_values {
    use super::*;
    use serde::{Deserialize, Serialize};
    use spillbuffer::Serde;

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    struct Chunk {
        key: String,
        part: u32,
        rows: Vec<(i64, String)>,
    }

    fn chunk(rows: usize) -> Serde<Chunk> {
        Serde::new(Chunk {
            key: format!("chunk-{rows}"),
            part: 3,
            rows: (0..rows as i64).map(|i| (i, format!("row {i}"))).collect(),
        })
    }

    #[test]
    fn serde_values_spill_and_read_back() {
        // About 12 bytes a row.
        round_trip(&[chunk(SMALL / 12), chunk(LARGE / 12)]);
        damaged_is_corrupt(chunk(LARGE / 12));
    }
}
