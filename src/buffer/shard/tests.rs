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
fn the_tail_is_the_oldest_use_over_every_way() {
    let mut s: Shard<u32, u32> = Shard::new();
    for k in 1..=8u32 {
        let (n, _) = Node::inserted(k, Arc::new(k), 1, k as u64, false);
        let i = s.put(n);
        s.lists
            .link_front(&mut s.slab, k as usize % 2, i, ListKind::Dirty, k as u64);
    }
    let i = s.find(&5).unwrap();
    s.lists.link_front(&mut s.slab, 3, i, ListKind::Dirty, 9);
    let i = s.find(&6).unwrap();
    s.lists.link_back(&mut s.slab, 1, i, ListKind::Dirty);
    s.validate().unwrap();
    assert_eq!(s.order(ListKind::Dirty), vec![6, 1, 2, 3, 4, 7, 8, 5]);
    let mut drained = Vec::new();
    while let Some((w, after)) = s.evict_tail(ListKind::Dirty, None) {
        assert_eq!(w, 1);
        drained.push(after.write.expect("dirty values are written").key);
        s.validate().unwrap();
    }
    assert_eq!(drained, vec![6, 1, 2, 3, 4, 7, 8, 5]);
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
    s.lists.link_front(&mut s.slab, 0, i, ListKind::Clean, 5);
    assert!(s.validate().is_err());
}

/// An owner for a shard of its own: its cells' releases call back nobody.
pub(crate) struct NoOwner;

impl<V> crate::buffer::pinned::PinOwner<V> for NoOwner {
    fn repin(&self, _: crate::buffer::pinned::PinAt) {}
    fn unpin(&self, _: crate::buffer::pinned::PinAt, _: bool, _: Arc<V>) {}
    fn end_lease(&self, _: &crate::buffer::cell::HitCell<V>) {}
    fn consume_cell(
        &self,
        cell: &crate::buffer::cell::HitCell<V>,
    ) -> crate::buffer::cell::Released {
        cell.release_consumed()
    }
}
