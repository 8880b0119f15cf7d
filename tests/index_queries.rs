//! What the index answers about keys without reading values back:
//! `key_info`, `resident_keys` / `spilled_keys`, `stored_key`,
//! `with_resident`, and the `spilled_weight_bytes` gauge.

mod common;

use common::value;
use spillbuffer::{KeyInfo, SpillBuffer};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

type Buf = SpillBuffer<u64, Vec<u8>>;

fn buffer(dir: &std::path::Path, target: usize) -> Buf {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .segment_size(64 * 1024)
        .build()
        .expect("build")
}

#[test]
fn key_info_and_the_tiers_agree_with_where_values_are() {
    let tmp = tempfile::tempdir().unwrap();
    // Room for 4 of the 20 values (of weights 1000 + i).
    let b = buffer(tmp.path(), 4_100);
    for i in 0..20u64 {
        b.insert(i, value(i, 1000 + i as usize)).unwrap();
    }
    b.flush_blocking().unwrap();
    let resident: HashSet<u64> = b.resident_keys().into_iter().collect();
    let spilled: HashSet<u64> = b.spilled_keys().into_iter().collect();
    assert_eq!(
        resident.len() + spilled.len(),
        20,
        "{resident:?} {spilled:?}"
    );
    assert!(resident.is_disjoint(&spilled));
    assert!(!resident.is_empty() && spilled.len() >= 16, "{resident:?}");
    let mut spilled_weight = 0;
    for i in 0..20u64 {
        let info = b.key_info(&i).expect("present");
        assert_eq!(info.weight, 1000 + i as usize, "key {i}");
        assert_eq!(info.resident, resident.contains(&i), "key {i}");
        // A pin that does not wait agrees: in memory exactly when resident.
        assert_eq!(b.try_pin(&i).is_some(), info.resident, "key {i}");
        if !info.resident {
            spilled_weight += info.weight as u64;
        }
    }
    assert_eq!(b.stats().spilled_weight_bytes, spilled_weight);
    assert_eq!(b.key_info(&99), None);
    b.validate().unwrap();

    // Read one back: it is resident again, and its weight no longer
    // counts as spilled.
    let back = *spilled.iter().next().unwrap();
    drop(b.get(&back).unwrap().unwrap());
    let info: KeyInfo = b.key_info(&back).unwrap();
    assert!(info.resident, "{info:?}");
    b.flush_blocking().unwrap();
    let spilled_now: u64 = b
        .spilled_keys()
        .iter()
        .map(|k| b.key_info(k).unwrap().weight as u64)
        .sum();
    assert_eq!(b.stats().spilled_weight_bytes, spilled_now);

    // Removing a spilled key takes its weight off the gauge.
    let gone = *b.spilled_keys().first().unwrap();
    let w = b.key_info(&gone).unwrap().weight as u64;
    assert!(b.remove(&gone));
    assert_eq!(b.key_info(&gone), None);
    assert_eq!(b.stats().spilled_weight_bytes, spilled_now - w);
    b.validate().unwrap();
}

#[test]
fn with_resident_sees_values_in_memory_only_and_counts_as_a_use() {
    let tmp = tempfile::tempdir().unwrap();
    // Room for 3 values of 1000.
    let b = buffer(tmp.path(), 3_000);
    for i in 0..3u64 {
        b.insert(i, value(i, 1000)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert_eq!(b.with_resident(&0, |v| v.clone()), Some(value(0, 1000)));
    assert_eq!(b.with_resident(&7, |v| v.len()), None);
    // Key 0 was used last of the three: the next insert evicts key 1.
    b.insert(3, value(3, 1000)).unwrap();
    b.flush_blocking().unwrap();
    assert!(b.key_info(&0).unwrap().resident, "a use did not count");
    assert!(!b.key_info(&1).unwrap().resident, "key 1 stayed");
    assert_eq!(b.with_resident(&1, |v| v.len()), None, "on disk, read back");
    assert!(
        !b.key_info(&1).unwrap().resident,
        "with_resident read it back"
    );
    // No pin is left behind: the value can still be evicted.
    assert_eq!(b.evict(4_000), 3_000);
    b.flush_blocking().unwrap();
    assert!(b.resident_keys().is_empty(), "{:?}", b.resident_keys());
    b.validate().unwrap();
}

/// A key whose equal forms differ: names equal whatever their case.
#[derive(Debug, Clone)]
struct Name(String);

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.0.eq_ignore_ascii_case(&other.0)
    }
}

impl Eq for Name {}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_ascii_lowercase().hash(state);
    }
}

#[test]
fn stored_key_is_the_form_first_inserted() {
    let tmp = tempfile::tempdir().unwrap();
    let b: SpillBuffer<Name, Vec<u8>> = SpillBuffer::builder(tmp.path()).build().unwrap();
    b.insert(Name("Alpha".into()), value(1, 10)).unwrap();
    let stored = b.stored_key(&Name("ALPHA".into())).expect("present");
    assert_eq!(stored.0, "Alpha");
    assert!(b.stored_key(&Name("beta".into())).is_none());
}
