//! The hit path (`buffer::cell`) as the host sees it: a key pinned before
//! is pinned again through its cell, and every promise of a pin holds.

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

/// Pin `k` through the shard twice, so that it has a cell, and return the
/// next pin, which must be a hit.
fn hit(b: &SpillBuffer<u64, Vec<f64>>, k: u64) -> Pinned<Vec<f64>> {
    drop(b.try_pin(&k).expect("resident"));
    drop(b.try_pin(&k).expect("still resident"));
    let p = b.try_pin(&k).expect("still resident");
    assert!(p.is_hit(), "the third pin of {k} took the shard's path");
    p
}

/// A key gets a cell when its second pin through the shard is released,
/// not its first: keys pinned once (most inputs of a worker's tasks)
/// never pay for one.
#[test]
fn a_key_pinned_twice_gets_a_cell_and_its_next_pin_is_a_hit() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_fitting(dir.path(), 8);
    for k in 1..5 {
        b.insert(k, value(k)).unwrap();
        drop(b.try_pin(&k).unwrap());
    }
    assert_eq!(b.inner().hits.len(), 0, "keys pinned once got cells");
    let second = b.try_pin(&1).unwrap();
    assert!(!second.is_hit(), "a key pinned once has no cell");
    drop(second);
    assert_eq!(b.inner().hits.len(), 1);
    b.validate().unwrap();
    // Replaced, the key is new again: its next two pins take the shard.
    b.insert(1, value(1)).unwrap();
    assert!(!has_cell(&b, 1));
    drop(b.try_pin(&1).unwrap());
    assert!(!has_cell(&b, 1), "a new value pinned once got a cell");
    let p = hit(&b, 1);
    assert_eq!(p[0], 1.0);
    let again = p.clone();
    assert!(again.is_hit());
    drop(p);
    assert_eq!(again.len(), LEN);
    drop(again);
    assert_eq!(b.inner().hits.len(), 1);
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
        drop(b.try_pin(&k).unwrap());
        drop(b.try_pin(&k).unwrap());
    }
    // Use them through their cells in another order; the list itself does
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
    assert_eq!(b.inner().hits.len(), 0, "a freed value kept its cell");
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

/// A buffer of one shard with room for 64 values and `cells` hit cells.
fn buffer_with_cells(dir: &std::path::Path, cells: usize) -> SpillBuffer<u64, Vec<f64>> {
    SpillBuffer::builder(dir)
        .memory_target(64 * W)
        .shards(1)
        .hit_cells(cells)
        .build()
        .unwrap()
}

fn has_cell(b: &SpillBuffer<u64, Vec<f64>>, k: u64) -> bool {
    b.inner().hits.get(&k).is_some()
}

/// Pin `k` through the shard until it gets a cell (at the budget, one in
/// `ADMIT_ONE_IN` asks does), checking the budget after each pin; the
/// pins it took.
fn pin_until_celled(b: &SpillBuffer<u64, Vec<f64>>, k: u64, budget: usize) -> usize {
    for pins in 1..=1000 {
        let p = b.try_pin(&k).expect("resident");
        assert!(!p.is_hit(), "{k} had a cell before its pin {pins}");
        drop(p);
        assert!(b.inner().hits.len() <= budget, "{k}, pin {pins}");
        if has_cell(b, k) {
            return pins;
        }
    }
    panic!("{k} got no cell in 1000 pins");
}

/// Beyond its budget, a shard retires the cells not hit for longest (one
/// hit or released since it was given is kept over an older idle one),
/// never one pinned; a key whose cell was retired takes the shard's path
/// until it gets a cell again.
#[test]
fn cells_stay_within_their_budget_and_the_least_recently_hit_go_first() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_with_cells(dir.path(), 4);
    for k in 0..10 {
        b.insert(k, value(k)).unwrap();
    }
    let held = hit(&b, 0);
    for k in 1..4 {
        drop(hit(&b, k));
    }
    // At the budget: 2 is hit after its cell was given, 1 and 3 are idle.
    drop(hit(&b, 2));
    pin_until_celled(&b, 9, 4);
    let celled: Vec<u64> = (0..10).filter(|&k| has_cell(&b, k)).collect();
    assert_eq!(celled, [0, 2, 3, 9], "1, the oldest idle cell, went");
    b.validate().unwrap();
    // 2 is hit again, so 3 is the oldest idle cell now.
    assert_eq!(held[0], 0.0);
    drop(held);
    drop(hit(&b, 2));
    pin_until_celled(&b, 8, 4);
    let celled: Vec<u64> = (0..10).filter(|&k| has_cell(&b, k)).collect();
    assert_eq!(celled, [0, 2, 8, 9], "3 went, 2 was hit since");
    let p = b.try_pin(&3).unwrap();
    assert!(!p.is_hit(), "key 3's cell was retired");
    assert_eq!(p[0], 3.0);
    drop(p);
    pin_until_celled(&b, 3, 4);
    assert!(b.try_pin(&3).unwrap().is_hit());
    b.validate().unwrap();
}

/// A cell drawn at the budget while every other cell was hit since it
/// was queued is retired at once, so that keys in use keep theirs; drawn
/// again once the others are idle, the key keeps its cell and the oldest
/// idle one goes.
#[test]
fn a_cell_drawn_while_all_others_are_in_use_goes_first() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_with_cells(dir.path(), 2);
    let retired = || b.inner().with_shard(0, |s| s.cells_retired());
    let celled = || (0..3).filter(|&k| has_cell(&b, k)).collect::<Vec<u64>>();
    for k in 0..3 {
        b.insert(k, value(k)).unwrap();
    }
    // 0 and 1 are hit after their cells were given (and queued).
    drop(hit(&b, 0));
    drop(hit(&b, 1));
    pin_until_celled(&b, 2, 2);
    assert_eq!(celled(), [1, 2], "0, the oldest idle cell, went");
    assert_eq!(retired(), 2, "2's first cell went at once, then 0's");
    b.validate().unwrap();
}

/// At the budget, only some keys that ask get a cell, so that keys pinned
/// in turn, twice as many as the cells, keep cells across their cycles and
/// about half their pins are hits; were every asker given one, each cell
/// would be retired before its key came round again and no pin would be
/// a hit.
#[test]
fn keys_pinned_in_turn_beyond_the_budget_keep_their_cells() {
    let dir = tempfile::tempdir().unwrap();
    const CELLS: usize = 8;
    let b = buffer_with_cells(dir.path(), CELLS);
    let keys = 2 * CELLS as u64;
    for k in 0..keys {
        b.insert(k, value(k)).unwrap();
    }
    let mut hits = 0;
    for cycle in 0..300 {
        for k in 0..keys {
            let p = b.try_pin(&k).expect("resident");
            assert_eq!(p[0], k as f64);
            if cycle >= 200 && p.is_hit() {
                hits += 1;
            }
        }
        assert!(b.inner().hits.len() <= CELLS, "cycle {cycle}");
    }
    let pins = 100 * keys as usize;
    assert!(
        hits * 3 >= pins,
        "{hits} hits of the last {pins} pins: cells turned over"
    );
    b.validate().unwrap();
}

/// With no cells, every pin takes the shard's path, and keeps every
/// promise of a pin.
#[test]
fn with_no_cells_every_pin_takes_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_with_cells(dir.path(), 0);
    b.insert(1, value(1)).unwrap();
    drop(b.try_pin(&1).unwrap());
    let p = b.try_pin(&1).unwrap();
    assert!(!p.is_hit());
    assert_eq!(p[0], 1.0);
    drop(p);
    assert_eq!(b.inner().hits.len(), 0);
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
