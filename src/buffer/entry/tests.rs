//! The state machine alone: no threads, no files.

use super::*;

fn dirty(w: usize) -> Node<u32, u32> {
    Node::inserted(1, Arc::new(7), w, 1, false).0
}

fn loc() -> DiskLoc {
    DiskLoc::new(0, 0, 40)
}

#[test]
fn insert_evict_write_and_read_back_balance_the_gauges() {
    let (mut n, d0) = Node::<u32, u32>::inserted(1, Arc::new(7), 10, 1, false);
    assert_eq!((d0.resident, d0.count, d0.len), (10, 1, 1));
    assert_eq!(n.wanted_list(), Some(ListKind::Dirty));
    let Some((Evicted::Write(v), d1)) = n.evict() else {
        panic!("a dirty entry is written")
    };
    assert_eq!((*v, d1.spilling), (7, 10));
    assert_eq!(n.state().name(), "spilling");
    let (freed, d2) = n.spill_done(loc());
    assert!(freed.is_some());
    assert_eq!(n.state().name(), "on-disk");
    let (tx, _rx) = crate::buffer::handoff::channel();
    assert_eq!(n.start_read(Waiter::Blocking(tx)).ok(), Some(Some(loc())));
    let (waiters, prefetch, d3) = n.read_done(Some(Arc::new(7)));
    assert_eq!((waiters.len(), prefetch), (1, false));
    assert_eq!(n.state().name(), "resident-clean");
    let (_, d4) = n.removed();
    let sum = [d1, d2, d3, d4].into_iter().fold(d0, Delta::plus);
    assert_eq!(sum, Delta::ZERO, "every gauge back to zero");
}

#[test]
fn a_pin_during_the_write_keeps_the_value_clean() {
    let mut n = dirty(8);
    let (_, d1) = n.evict().unwrap();
    let d2 = n.pin();
    assert_eq!((d2.pinned, d2.pinned_spilling), (8, 8));
    let (freed, d3) = n.spill_done(loc());
    assert!(freed.is_none());
    assert_eq!(n.state().name(), "resident-clean");
    assert_eq!((d3.spilling, d3.pinned_spilling, d3.resident), (-8, -8, 0));
    let (next, d4) = n.unpin(false, 100);
    assert!(matches!(
        next,
        Unpinned::Link {
            kind: ListKind::Clean,
            first_out: false
        }
    ));
    assert_eq!(d1.plus(d2).plus(d3).plus(d4), Delta::ZERO);
}

#[test]
fn consuming_a_clean_value_frees_it_and_a_dirty_one_goes_first_out() {
    let mut n = dirty(4);
    n.pin();
    let (next, _) = n.unpin(true, 100);
    assert!(matches!(
        next,
        Unpinned::Link {
            kind: ListKind::Dirty,
            first_out: true
        }
    ));
    n.evict().unwrap();
    n.spill_done(loc());
    let (tx, _rx) = crate::buffer::handoff::channel();
    n.start_read(Waiter::Blocking(tx)).ok();
    n.read_done(Some(Arc::new(7)));
    n.pin();
    let (next, d) = n.unpin(true, 100);
    assert!(matches!(next, Unpinned::Freed(_)));
    assert_eq!((d.resident, d.count, d.pinned), (-4, -1, -4));
    assert_eq!(n.state().name(), "on-disk");
}

#[test]
fn a_failed_write_keeps_the_value_dirty() {
    let mut n = dirty(5);
    let (_, d1) = n.evict().unwrap();
    let d2 = n.spill_failed(false);
    assert_eq!(n.state().name(), "resident-dirty");
    assert_eq!(d1.plus(d2), Delta::ZERO);
}

#[test]
fn a_prefetch_reserves_until_it_lands_or_fails() {
    let mut n = dirty(6);
    n.evict().unwrap();
    n.spill_done(loc());
    let (_, d1) = n.start_prefetch().unwrap();
    assert_eq!(d1.reserved, 6);
    assert!(n.reading_for_nobody());
    let (w, prefetch, d2) = n.read_done(None);
    assert!(w.is_empty() && prefetch);
    assert_eq!(n.state().name(), "on-disk");
    assert_eq!(d1.plus(d2), Delta::ZERO);
    assert!(n.start_prefetch().is_some());
    let (_, _, d3) = n.read_done(Some(Arc::new(1)));
    assert_eq!((d3.reserved, d3.resident), (-6, 6));
}

#[test]
fn relocation_follows_only_the_owned_record() {
    let mut n = dirty(1);
    n.evict().unwrap();
    n.spill_done(loc());
    let new = DiskLoc::new(1, 0, 40);
    assert_eq!(n.relocate(new, loc()), Relocated::Stale);
    assert_eq!(n.relocate(loc(), new), Relocated::Moved);
    let (tx, _rx) = crate::buffer::handoff::channel();
    n.start_read(Waiter::Blocking(tx)).ok();
    assert_eq!(n.relocate(new, loc()), Relocated::Busy);
}

/// The per-key metadata target (<= 128 bytes per key, measured by
/// `cargo run --release --example bench -- --workload metadata`) rests
/// on the entry staying this small: the rare unspilling state boxes its
/// waiters, and `DiskLoc`'s non-zero length gives the state a niche.
#[test]
fn an_entry_stays_within_96_bytes() {
    assert!(std::mem::size_of::<State<Vec<f64>>>() <= 40);
    assert!(std::mem::size_of::<Option<Node<u64, Vec<f64>>>>() <= 96);
}

#[test]
fn a_removed_value_still_held_stays_counted_until_its_holders_go() {
    // Pinned and being written: detached, held by both.
    let (mut n, d0) = Node::<u32, u32>::inserted(1, Arc::new(7), 6, 1, false);
    let (_, d1) = n.evict().unwrap();
    let d2 = n.pin();
    let (removed, d3) = n.removed();
    assert!(removed.drop.is_none());
    let mut det = removed.detached.expect("held by a pin and a write");
    assert_eq!(
        (d3.resident, d3.detached, d3.detached_count, d3.detached_io),
        (-6, 6, 1, 6)
    );
    let (gone, d4) = det.write_ended();
    assert!(gone.is_none(), "the pin still holds it");
    assert_eq!((d4.detached, d4.detached_io), (0, -6));
    det.repin();
    assert!(det.unpin().0.is_none());
    let (gone, d5) = det.unpin();
    assert_eq!(gone.as_deref(), Some(&7));
    let sum = [d1, d2, d3, d4, d5].into_iter().fold(d0, Delta::plus);
    assert_eq!(sum, Delta::ZERO, "every gauge back to zero");

    // Unpinned and resident: nothing holds it, it is dropped at once.
    let (removed, d) = dirty(3).removed();
    assert!(removed.drop.is_some() && removed.detached.is_none());
    assert_eq!((d.resident, d.detached), (-3, 0));
}

#[test]
fn writes_ending_and_pins_of_written_values_ask_for_a_target_check_evictions_do_not() {
    // Evictions run inside the check: none of theirs may ask for another.
    let mut clean = dirty(8);
    let (_, to_spill) = clean.evict().unwrap();
    assert!(
        !to_spill.needs_target_check(),
        "a value queued to be written"
    );
    let pin = clean.pin();
    assert!(pin.needs_target_check(), "a pin of a value being written");
    let (_, kept) = clean.spill_done(loc());
    assert!(kept.needs_target_check(), "a write ending under a pin");
    let (_, unpin) = clean.unpin(false, usize::MAX);
    assert!(!unpin.needs_target_check(), "an unpin evicts by itself");
    let Some((Evicted::Dropped(_), dropped)) = clean.evict() else {
        panic!("a clean value is dropped")
    };
    assert!(!dropped.needs_target_check(), "a clean value dropped");

    let mut n = dirty(8);
    n.evict().unwrap();
    let (_, written) = n.spill_done(loc());
    assert!(written.needs_target_check(), "a write ending");
    let mut n = dirty(8);
    n.evict().unwrap();
    assert!(
        n.spill_failed(false).needs_target_check(),
        "a write failing"
    );
}
