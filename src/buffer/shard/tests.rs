//! One shard alone: transitions, lists and what is left for after the
//! lock, with no threads and no files.

use super::*;

fn shard_with(keys: &[u32]) -> Shard<u32, u32> {
    let mut s = Shard::new();
    for (t, &k) in keys.iter().enumerate() {
        let (n, d) = Node::inserted(k, Arc::new(k), 1, k as u64, false);
        s.insert(n, d, || t as u64 + 1);
    }
    s
}

#[test]
fn lru_order_follows_use_and_consume_goes_first() {
    let mut s = shard_with(&[1, 2, 3]);
    assert_eq!(s.order(ListKind::Dirty), vec![1, 2, 3]);
    let h = s.hash.of(&1);
    let Found::Hit { slot, version, .. } = s.lookup(h, &1, None) else {
        panic!("1 is resident")
    };
    assert_eq!(s.order(ListKind::Dirty), vec![2, 3]);
    s.unpin(slot, version, false, 100, || 10);
    assert_eq!(s.order(ListKind::Dirty), vec![2, 3, 1]);
    let h = s.hash.of(&3);
    let Found::Hit { slot, version, .. } = s.lookup(h, &3, None) else {
        panic!("3 is resident")
    };
    s.unpin(slot, version, true, 100, || 11);
    assert_eq!(s.order(ListKind::Dirty), vec![3, 2, 1]);
    s.validate().unwrap();
    let d = s.take_delta();
    assert_eq!((d.resident, d.count, d.len, d.pinned), (3, 3, 3, 0));
}

#[test]
fn a_pin_under_the_read_lock_keeps_the_entry_listed_and_eviction_moves_it_up() {
    let mut s = shard_with(&[1, 2, 3]);
    let h = s.hash.of(&1);
    let hits = s.hit(h, &1).expect("1 is resident and listed");
    assert_eq!(**hits.value(), 1);
    assert_eq!(s.order(ListKind::Dirty), vec![1, 2, 3], "a hit moved it");
    // This thread's clock past the ticks the shard was given by hand.
    s.ctx.ticks.next(100);
    assert!(HitPins::release(hits, true).is_none(), "the entry holds it");
    s.validate().unwrap();
    // The tail was used since it was linked: moved up, not evicted.
    let (w, after) = s.evict_tail(ListKind::Dirty, None).unwrap();
    assert_eq!(w, 0);
    assert!(after.write.is_none());
    assert_eq!(s.order(ListKind::Dirty), vec![2, 3, 1]);
    let mut drained = Vec::new();
    while let Some((w, after)) = s.evict_tail(ListKind::Dirty, None) {
        assert_eq!(w, 1);
        drained.push(after.write.expect("dirty values are written").key);
        s.validate().unwrap();
    }
    assert_eq!(drained, vec![2, 3, 1]);
}

#[test]
fn evicting_a_tail_pinned_under_the_read_lock_leases_it_until_released() {
    let mut s = shard_with(&[1, 2]);
    let h = s.hash.of(&1);
    let hits = s.hit(h, &1).unwrap();
    let (w, after) = s.evict_tail(ListKind::Dirty, None).unwrap();
    assert_eq!(w, 0, "a pinned tail was evicted");
    assert!(after.write.is_none());
    assert_eq!(s.node(s.find(&1).unwrap()).pins(), 1, "no lease taken");
    assert!(
        s.hit(h, &1).is_none(),
        "a leased entry pinned under the read lock"
    );
    s.validate().unwrap();
    let last = HitPins::release(hits, true).expect("the lease ends");
    let at = last.at();
    assert!(s.unpin(at.slot, at.version, false, 100, || 10).is_none());
    assert_eq!(s.order(ListKind::Dirty), vec![2, 1]);
    s.validate().unwrap();
    assert_eq!(s.take_delta().pinned, 0);
}

#[test]
fn removing_an_entry_pinned_under_the_read_lock_keeps_its_value_detached() {
    let mut s = shard_with(&[1]);
    let h = s.hash.of(&1);
    let hits = s.hit(h, &1).unwrap();
    let after = s.remove(&1, None).unwrap();
    assert!(
        after.drop.is_none(),
        "a pinned value was handed back to drop"
    );
    assert_eq!(s.detached().count(), 1);
    let last = HitPins::release(hits, true).expect("the lease ends");
    let at = last.at();
    drop(last);
    let freed = s.unpin(at.slot, at.version, false, 100, || 10);
    assert!(
        matches!(freed, Some((_, false))),
        "the last pin frees the value"
    );
    assert_eq!(s.detached().count(), 0);
    s.validate().unwrap();
}

#[test]
fn eviction_writes_dirty_and_drops_clean_and_a_late_write_is_released() {
    let mut s = shard_with(&[1, 2]);
    let (_, after) = s.evict_tail(ListKind::Dirty, None).unwrap();
    let job = after.write.unwrap();
    assert_eq!(job.key, 1);
    let loc = DiskLoc::new(0, 0, 40);
    let after = s.spill_done(&1, job.version, loc);
    assert!(
        after.drop.is_some(),
        "an unpinned value leaves memory once written"
    );
    // A write finishing for a removed entry frees its record.
    let removed = s.remove(&2, None).unwrap();
    assert!(removed.drop.is_some());
    let after = s.spill_done(&2, 2, loc);
    assert_eq!(after.release, Some(loc));
    assert!(s.evict_tail(ListKind::Dirty, None).is_none());
    s.validate().unwrap();
}

#[test]
fn replacing_a_key_hands_its_readers_the_new_value() {
    let mut s = shard_with(&[1]);
    let (_, after) = s.evict_tail(ListKind::Dirty, None).unwrap();
    let v = after.write.unwrap().version;
    s.spill_done(&1, v, DiskLoc::new(0, 0, 40));
    let (tx, _rx) = crate::buffer::handoff::channel();
    let h = s.hash.of(&1);
    assert!(matches!(
        s.lookup(h, &1, Some(Waiter::Blocking(tx))),
        Found::Read { .. }
    ));
    let (n, d) = Node::inserted(1, Arc::new(9), 1, 50, false);
    let after = s.insert(n, d, || 60);
    assert!(after.release.is_some(), "the old record dies");
    assert!(matches!(after.wake, Some(Wake::Pinned { waiters, .. }) if waiters.len() == 1));
    // The new value is pinned by the reader: on no list.
    assert!(s.order(ListKind::Dirty).is_empty());
    s.validate().unwrap();
}

#[test]
fn validate_catches_a_node_on_the_wrong_list() {
    let mut s = shard_with(&[1]);
    let i = s.find(&1).unwrap();
    s.lists.link_front(&mut s.slab, i, ListKind::Clean, 5);
    assert!(s.validate().is_err());
}

/// An owner for a shard of its own: its pins' releases call back nobody.
pub(crate) struct NoOwner;

impl<V> crate::buffer::hit::PinOwner<V> for NoOwner {
    fn repin(&self, _: crate::buffer::hit::PinAt) {}
    fn unpin(&self, _: crate::buffer::hit::PinAt, _: bool, _: Arc<V>) {}
    fn consume_hit(&self, _: Arc<HitPins<V>>) {}
}
