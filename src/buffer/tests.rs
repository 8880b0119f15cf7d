//! Tests of the buffer as a whole that look inside it: pins and their
//! owners, the residency of keys, and the eviction order.

use super::*;

fn buffer(dir: &std::path::Path) -> SpillBuffer<u64, Vec<f64>> {
    SpillBuffer::builder(dir)
        .memory_target(1 << 20)
        .build()
        .unwrap()
}

#[test]
fn keys_lists_both_tiers_without_reading_back() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer(dir.path());
    for k in 0..32u64 {
        b.insert(k, vec![k as f64; 1 << 14]).unwrap();
    }
    b.remove(&7);
    b.flush_blocking().unwrap();
    assert!(!on_disk(&b).is_empty(), "some keys must be spilled");
    let reads = b.stats().unspill_count_total;
    let mut keys = b.keys();
    keys.sort_unstable();
    let want: Vec<u64> = (0..32).filter(|&k| k != 7).collect();
    assert_eq!(keys, want);
    assert_eq!(b.stats().unspill_count_total, reads, "keys() read a value");
    b.validate().unwrap();
}

#[test]
fn pins_hold_their_shards_owner_not_the_shared_count() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer(dir.path());
    for k in 0..64 {
        b.insert(k, vec![k as f64; 4]).unwrap();
    }
    let shared = Arc::strong_count(&b.handle.inner);
    let pins: Vec<_> = (0..64).map(|k| b.try_pin(&k).unwrap()).collect();
    let copies: Vec<_> = pins.iter().map(Pinned::clone).collect();
    // No pin touched the count every thread would share...
    assert_eq!(Arc::strong_count(&b.handle.inner), shared);
    // ...each took one on its own shard's owner.
    let held: usize = b
        .handle
        .owners
        .iter()
        .map(|o| Arc::strong_count(o) - 1)
        .sum();
    assert_eq!(held, pins.len() + copies.len());
    drop((pins, copies));
    assert!(b.handle.owners.iter().all(|o| Arc::strong_count(o) == 1));
    b.validate().unwrap();
}

#[test]
fn a_guard_outlives_the_buffer_and_then_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer(dir.path());
    b.insert(1, vec![1.0; 4]).unwrap();
    b.insert(2, vec![2.0; 4]).unwrap();
    let weak = Arc::downgrade(&b.handle.inner);
    let p = b.try_pin(&1).unwrap();
    let q = b.try_pin(&2).unwrap();
    drop(b);
    // The guards still read their values and work as guards, and they
    // keep the state alive (a guard drop updates it)...
    assert_eq!(*p, vec![1.0; 4]);
    let p2 = p.clone();
    drop(p);
    q.consume();
    assert!(weak.upgrade().is_some(), "freed under a live guard");
    assert_eq!(*p2, vec![1.0; 4]);
    // ...until the last one goes: no cycle keeps it.
    drop(p2);
    assert!(
        weak.upgrade().is_none(),
        "state leaked after the last guard"
    );
}

/// Keys not in memory, found without touching the LRU order.
fn on_disk(b: &SpillBuffer<u64, Vec<f64>>) -> Vec<u64> {
    let inner = b.inner();
    let mut out = Vec::new();
    for s in 0..inner.shards.len() {
        inner.with_shard(s, |shard| {
            out.extend(
                shard
                    .nodes()
                    .filter(|(_, n)| n.state().value().is_none())
                    .map(|(_, n)| n.key),
            );
        });
    }
    out.sort_unstable();
    out
}

/// Keys 0.. that fall in distinct shards, so that the order below is
/// across shards (no shard's own clock can carry it).
fn keys_in_distinct_shards(b: &SpillBuffer<u64, Vec<f64>>, n: usize) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    (0u64..)
        .filter(|k| seen.insert(b.inner().shard_of(k)))
        .take(n)
        .collect()
}

#[test]
fn eviction_follows_one_threads_use_order_across_shards_and_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer(dir.path());
    let k = keys_in_distinct_shards(&b, 6);
    for &key in &k {
        b.insert(key, vec![key as f64; 4]).unwrap();
    }
    // All on disk, then back as clean entries, in a known order: k[2]
    // and k[4] read here, k[0] prefetched on the pool in between (its
    // tick must follow k[2]'s and precede k[4]'s), k[1] and k[3] last.
    b.evict(usize::MAX);
    b.flush_blocking().unwrap();
    assert_eq!(on_disk(&b).len(), 6);
    drop(b.get(&k[5]).unwrap());
    drop(b.get(&k[2]).unwrap());
    b.prefetch([k[0]]);
    b.flush_blocking().unwrap();
    for &i in &[4, 1, 3] {
        drop(b.get(&k[i]).unwrap());
    }
    // Touch k[5] again: it becomes the most recent.
    drop(b.try_pin(&k[5]).unwrap());
    b.validate().unwrap();
    let mut gone = Vec::new();
    for _ in 0..6 {
        let before = on_disk(&b);
        assert_eq!(b.evict(1), 32, "one clean value at a time");
        let after = on_disk(&b);
        let new: Vec<_> = after.iter().filter(|x| !before.contains(x)).collect();
        assert_eq!(new.len(), 1);
        gone.push(*new[0]);
    }
    assert_eq!(gone, vec![k[2], k[0], k[4], k[1], k[3], k[5]]);
}
