//! The hit path (`buffer::hit`) as the host sees it: a key in memory and on
//! its list is pinned under its shard's read lock, and every promise of a
//! pin holds.

use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

const LEN: usize = 1024;
const W: usize = LEN * 8;

/// A buffer of one shard whose target fits `fit` values of [`W`] bytes.
fn buffer_fitting(dir: &std::path::Path, fit: usize) -> SpillBuffer<u64, Vec<f64>> {
    SpillBuffer::builder(dir)
        .memory_target(fit * W)
        .shards(1)
        .build()
        .unwrap()
}

fn value(k: u64) -> Vec<f64> {
    vec![k as f64; LEN]
}

/// Pin `k`, which must be a hit.
fn hit(b: &SpillBuffer<u64, Vec<f64>>, k: u64) -> Pinned<Vec<f64>> {
    let p = b.try_pin(&k).expect("resident");
    assert!(p.is_hit(), "the pin of {k} took the write lock");
    p
}

/// A key in memory and on its list is pinned under the read lock; one
/// pinned under the write lock (off its list) is pinned that way again
/// until its last pin goes.
#[test]
fn a_listed_key_is_hit_and_an_unlisted_one_takes_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 8);
    b.insert(1, value(1)).unwrap();
    let p = hit(&b, 1);
    assert_eq!(p[0], 1.0);
    let again = p.clone();
    assert!(again.is_hit());
    drop(p);
    assert_eq!(again.len(), LEN);
    drop(again);
    b.validate().unwrap();
    // Written and read back by `get`: pinned under the write lock.
    b.evict(W);
    b.flush_blocking().unwrap();
    let read = b.get(&1).unwrap().unwrap();
    assert!(!read.is_hit());
    let second = b.try_pin(&1).unwrap();
    assert!(!second.is_hit(), "an entry off its list was hit");
    drop((read, second));
    drop(hit(&b, 1));
    b.validate().unwrap();
}

#[test]
fn a_hit_pin_is_never_evicted_and_its_lease_ends_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 4);
    b.insert(0, value(0)).unwrap();
    let p = hit(&b, 0);
    // Key 0 is the least recently used of all these, and pinned.
    for k in 1..20 {
        b.insert(k, value(k)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(!on_disk(&b).contains(&0), "a pinned value was evicted");
    // Eviction met it and leased it: it counts as pinned now.
    assert_eq!(b.inner().pinned(), W);
    b.validate().unwrap();
    assert_eq!(p[0], 0.0);
    drop(p);
    // The lease ended: unpinned, most recently used, and the target holds.
    assert_eq!(b.inner().pinned(), 0);
    b.flush_blocking().unwrap();
    b.validate().unwrap();
    for k in 20..23 {
        b.insert(k, value(k)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(
        !on_disk(&b).contains(&0),
        "released last, it went before older values"
    );
    for k in 23..30 {
        b.insert(k, value(k)).unwrap();
    }
    b.flush_blocking().unwrap();
    assert!(on_disk(&b).contains(&0), "once released it can go");
    b.validate().unwrap();
}

#[test]
fn hits_order_eviction_exactly_for_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let fit = 6;
    let b = buffer_fitting(dir.path(), fit);
    for k in 0..fit as u64 {
        b.insert(k, value(k)).unwrap();
    }
    // Use them under the read lock in another order; the list itself does
    // not move, so eviction must find each use.
    let order = [3u64, 0, 5, 1, 4, 2];
    for &k in &order {
        let p = b.try_pin(&k).unwrap();
        assert!(p.is_hit());
    }
    for (i, &k) in order.iter().enumerate() {
        b.insert(100 + i as u64, value(100)).unwrap();
        b.flush_blocking().unwrap();
        let gone = on_disk(&b);
        let want: Vec<u64> = order[..=i].to_vec();
        let mut got: Vec<u64> = gone.into_iter().filter(|k| *k < 100).collect();
        got.sort_unstable();
        let mut want_sorted = want.clone();
        want_sorted.sort_unstable();
        assert_eq!(got, want_sorted, "after evicting for {k}");
    }
    b.validate().unwrap();
}

#[test]
fn consuming_a_hit_frees_a_clean_value_and_puts_a_dirty_one_first() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 4);
    // A clean value: written, read back.
    b.insert(0, value(0)).unwrap();
    b.evict(W);
    b.flush_blocking().unwrap();
    assert!(on_disk(&b).contains(&0));
    drop(b.get(&0).unwrap().unwrap());
    let p = hit(&b, 0);
    let before = b.stats().memory_bytes;
    p.consume();
    assert_eq!(b.stats().memory_bytes, before - W as u64, "not freed");
    assert!(on_disk(&b).contains(&0));
    let s0 = b.inner().shard_of(&0u64);
    let kept = b.inner().with_shard(s0, |shard| {
        shard.nodes().any(|(i, _)| shard.hits_of(i).is_some())
    });
    assert!(!kept, "a freed value kept its hit pins");
    // A dirty one goes first, before older values.
    for k in 1..=4 {
        b.insert(k, value(k)).unwrap();
    }
    let p = hit(&b, 4);
    let held = p.clone();
    p.consume();
    // Another pin is held: consumed, but not evicted yet.
    b.insert(5, value(5)).unwrap();
    b.flush_blocking().unwrap();
    assert!(!on_disk(&b).contains(&4));
    drop(held);
    b.insert(6, value(6)).unwrap();
    b.flush_blocking().unwrap();
    assert!(on_disk(&b).contains(&4), "consumed, it was not first out");
    assert!(!on_disk(&b).contains(&2), "an older value went instead");
    b.validate().unwrap();
}

#[test]
fn remove_and_replace_leave_a_hit_its_old_value() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 4);
    b.insert(0, value(0)).unwrap();
    b.insert(1, value(1)).unwrap();
    let removed = hit(&b, 0);
    let replaced = hit(&b, 1);
    assert!(b.remove(&0));
    b.insert(1, value(11)).unwrap();
    assert!(b.try_pin(&0).is_none());
    assert_eq!(b.try_pin(&1).unwrap()[0], 11.0);
    assert_eq!((removed[0], replaced[0]), (0.0, 1.0));
    // Both old values are detached, held by their pins.
    assert_eq!(b.stats().detached_bytes, 2 * W as u64);
    b.validate().unwrap();
    drop((removed, replaced));
    assert_eq!(b.stats().detached_bytes, 0);
    b.validate().unwrap();
}

#[test]
fn a_hit_outlives_its_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 4);
    b.insert(0, value(0)).unwrap();
    let p = hit(&b, 0);
    let value = Arc::clone(p.value());
    drop(b);
    assert_eq!(p[0], 0.0);
    drop(p);
    assert_eq!(Arc::strong_count(&value), 1, "the buffer's handles leaked");
}

/// `Stats` counts the pins through the write lock; hits are not counted.
#[test]
fn stats_count_the_pins_through_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 8);
    b.insert(0, value(0)).unwrap();
    let locked = || b.stats().locked_pins_total;
    assert_eq!(locked(), 0);
    assert!(!b.stats().to_string().contains("pins through a write lock"));
    let first = hit(&b, 0);
    assert_eq!(locked(), 0, "a hit was counted");
    // Leased (off its list), the entry takes the write lock.
    b.evict(W);
    let second = b.try_pin(&0).unwrap();
    assert!(!second.is_hit());
    assert_eq!(locked(), 1);
    drop((first, second));
    assert!(hit(&b, 0)[0] == 0.0, "unpinned, it is listed again");
    let shown = b.stats().to_string();
    assert!(shown.contains("pins through a write lock: 1"), "{shown}");
    b.validate().unwrap();
}

#[test]
fn threads_hitting_while_others_evict_remove_and_replace_keep_every_promise() {
    let dir = tempfile::tempdir().unwrap();
    let b = SpillBuffer::<u64, Vec<f64>>::builder(dir.path())
        .memory_target(16 * W)
        .shards(2)
        .build()
        .unwrap();
    const KEYS: u64 = 32;
    for k in 0..KEYS {
        b.insert(k, value(k)).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let b = &b;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                for _ in 0..20_000 {
                    let k = rng.gen_range(0..KEYS);
                    if let Some(p) = b.try_pin(&k) {
                        // A value is k or 1000 + k (replaced), never another
                        // key's and never freed under the pin.
                        assert!(p[0] == k as f64 || p[0] == (1000 + k) as f64);
                        assert_eq!(p[LEN - 1], p[0]);
                        if rng.gen_range(0..16) == 0 {
                            p.consume();
                        }
                    }
                }
            });
        }
        let b = &b;
        s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(99);
            for i in 0..3_000 {
                let k = rng.gen_range(0..KEYS);
                match i % 3 {
                    0 => b.insert(k, value(1000 + k)).unwrap(),
                    1 => {
                        b.remove(&k);
                        b.insert(k, value(k)).unwrap();
                    }
                    _ => drop(b.evict(4 * W)),
                }
            }
        });
    });
    b.flush_blocking().unwrap();
    b.validate().unwrap();
    assert_eq!(b.stats().detached_bytes, 0);
}
