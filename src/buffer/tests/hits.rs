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

/// A shard at its budget gives a new cell before it retires one: its
/// table keeps room for that cell rather than doubling for it, so that
/// a table at a budget of a power of two cells (the default's) stays
/// half full, not a quarter.
#[test]
fn a_table_at_its_budget_does_not_grow_for_the_cell_given_before_a_retirement() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_with_cells(dir.path(), 8);
    for k in 0..40 {
        b.insert(k, value(k)).unwrap();
    }
    for k in 0..8 {
        pin_until_celled(&b, k, 8);
    }
    assert_eq!(b.inner().hits.slots(), 16, "8 cells, half of the slots");
    // Each new cell now costs a retirement.
    for k in 8..40 {
        pin_until_celled(&b, k, 8);
    }
    assert_eq!(b.stats().hit_cells_retired_total, 32);
    assert_eq!(b.inner().hits.slots(), 16, "the table grew at its budget");
    b.validate().unwrap();
}

/// A buffer of sixteen shards with room for 64 values and `cells` hit
/// cells, and the first `n` keys of shard 0: each shard keeps a
/// sixteenth of the cells, and a cell is in use for `cells` ticks.
fn shard_of_many(
    dir: &std::path::Path,
    cells: usize,
    n: usize,
) -> (SpillBuffer<u64, Vec<f64>>, Vec<u64>) {
    let b = SpillBuffer::builder(dir)
        .memory_target(64 * W)
        .shards(16)
        .hit_cells(cells)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..)
        .filter(|k| b.inner().shard_of(k) == 0)
        .take(n)
        .collect();
    for &k in &keys {
        b.insert(k, value(k)).unwrap();
    }
    (b, keys)
}

/// A cell drawn at the budget while every other cell was hit since it
/// was queued is retired at once, so that keys in use keep theirs; once
/// the others are idle, the key keeps its cell and the oldest idle one
/// goes.
#[test]
fn a_cell_drawn_while_all_others_are_in_use_goes_first() {
    let dir = tempfile::tempdir().unwrap();
    // Two cells in shard 0, in use for 32 ticks.
    let (b, keys) = shard_of_many(dir.path(), 32, 3);
    let [used, also_used, asker] = keys[..] else {
        unreachable!()
    };
    let retired = || b.stats().hit_cells_retired_total;
    let celled = || keys.iter().filter(|&&k| has_cell(&b, k)).count();
    drop(hit(&b, used));
    drop(hit(&b, also_used));
    // The asker is pinned between hits of the others until drawn.
    let mut asks = 0;
    while retired() == 0 {
        for k in [used, also_used] {
            assert!(b.try_pin(&k).unwrap().is_hit(), "{k}'s cell went");
        }
        drop(b.try_pin(&asker).unwrap());
        asks += 1;
        assert!(asks < 1000, "no cell drawn in 1000 asks");
    }
    assert!(has_cell(&b, used) && has_cell(&b, also_used));
    assert!(!has_cell(&b, asker), "the drawn cell stayed");
    // Now the others are idle.
    pin_until_celled(&b, asker, 2);
    assert_eq!(celled(), 2);
    assert!(!has_cell(&b, used), "the oldest idle cell stayed");
    assert_eq!(retired(), 2);
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

/// A new set of keys pinned over and over, arriving when every cell is
/// given to keys no longer used, takes their cells at its second pin
/// through the shard: the cell to go has been idle for longer than the
/// asker went between its pins. Were the askers drawn, one in 16, the
/// third round would find one key in 16 with a cell.
#[test]
fn a_new_hot_set_takes_the_cells_of_an_idle_one_at_once() {
    let dir = tempfile::tempdir().unwrap();
    const CELLS: u64 = 8;
    let b = buffer_with_cells(dir.path(), CELLS as usize);
    for k in 0..2 * CELLS {
        b.insert(k, value(k)).unwrap();
    }
    for k in 0..CELLS {
        drop(hit(&b, k));
    }
    // One round: each new key pinned once; its hits.
    let round = || {
        (CELLS..2 * CELLS)
            .filter(|k| {
                let p = b.try_pin(k).expect("resident");
                assert_eq!(p[0], *k as f64);
                p.is_hit()
            })
            .count()
    };
    assert_eq!(round(), 0, "new keys had cells");
    assert_eq!(round(), 0, "a key pinned once had a cell");
    assert_eq!(round(), CELLS as usize, "the new set has no cells");
    assert_eq!(b.inner().hits.len(), CELLS as usize);
    assert!(
        (0..CELLS).all(|k| !has_cell(&b, k)),
        "an idle key kept its cell"
    );
    b.validate().unwrap();
}

/// A cell used within the last `hit_cells` ticks (a tick per use, for a
/// single thread) is among the uses the budget covers, as in an LRU of
/// that many cells: a key pinned twice in a row does not take its place
/// but by the draw. Once that many uses of other keys have passed, it
/// does.
#[test]
fn a_cell_used_within_the_budgets_ticks_stays_against_a_key_pinned_twice() {
    let dir = tempfile::tempdir().unwrap();
    // Sixteen shards of 8 cells: 128 ticks, far more than one shard's
    // cells take to give.
    const TOTAL: usize = 128;
    let (b, mut keys) = shard_of_many(dir.path(), TOTAL, 9);
    let asker = keys.pop().unwrap();
    let celled = keys;
    let elsewhere = (0..).find(|k| b.inner().shard_of(k) != 0).unwrap();
    b.insert(elsewhere, value(elsewhere)).unwrap();
    for &k in &celled {
        assert_eq!(pin_until_celled(&b, k, TOTAL), 2, "{k}: under the budget");
    }
    let pin = |k: u64| {
        let p = b.try_pin(&k).unwrap();
        assert!(!p.is_hit(), "{k} had a cell");
    };
    pin(asker);
    pin(asker);
    assert!(
        !has_cell(&b, asker),
        "a key pinned twice took a cell in use"
    );
    for _ in 0..TOTAL {
        drop(b.try_pin(&elsewhere).unwrap());
    }
    pin(asker);
    assert!(has_cell(&b, asker), "the oldest cell outlived the budget");
    assert!(!has_cell(&b, celled[0]), "the oldest cell stayed");
    assert!(celled[1..].iter().all(|&k| has_cell(&b, k)));
    b.validate().unwrap();
}

/// `Stats` counts the keys with a cell, the cells retired and the pins
/// through a lock; hits are not counted.
#[test]
fn stats_count_cells_retirements_and_locked_pins() {
    let dir = tempfile::tempdir().unwrap();
    let b = buffer_with_cells(dir.path(), 2);
    for k in 0..3 {
        b.insert(k, value(k)).unwrap();
    }
    let counts = || {
        let s = b.stats();
        (s.hit_cells, s.hit_cells_retired_total, s.locked_pins_total)
    };
    assert_eq!(counts(), (0, 0, 0));
    assert!(!b.stats().to_string().contains("pins through a lock"));
    drop(hit(&b, 0));
    assert_eq!(counts(), (1, 0, 2), "two pins through the lock, one hit");
    drop(hit(&b, 1));
    // Every cell given: 2 takes the one idle longest (0's) at its second
    // pin, and 0 then pins through the lock.
    let pins = pin_until_celled(&b, 2, 2) as u64;
    drop(b.try_pin(&0).unwrap());
    assert_eq!(counts(), (2, 1, 5 + pins));
    assert!(b.try_pin(&2).unwrap().is_hit());
    assert_eq!(counts(), (2, 1, 5 + pins));
    let shown = b.stats().to_string();
    assert!(
        shown.contains(&format!(
            "pins through a lock: {}; hit cells: 2 (1 retired)",
            5 + pins
        )),
        "{shown}"
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
