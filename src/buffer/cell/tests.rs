//! Tests of the hit cell's protocol.
//!
//! - `unit`: one-thread checks of every step of the word's protocol, and a
//!   stress test with real threads that pin while a stand-in shard closes
//!   and reopens the cell under a mutex.
//! - `schedules` (`RUSTFLAGS="--cfg shuttle"`): the races the design
//!   names, explored by shuttle's randomised schedulers against a model of
//!   the shard's books (on the list, lease pin, removed, value taken).

use super::*;

/// Where the test cells' entry is (a version per cell in `schedules`).
fn at(version: u64) -> PinAt {
    PinAt {
        shard: 3,
        slot: 7,
        version,
    }
}

/// What test cells made outside an index share, in an `Arc` a lease
/// holds a count of, as an index's pool.
struct TestPool {
    common: Common<u64>,
}

impl TestPool {
    fn new(owner: Weak<dyn PinOwner<u64>>, ticks: Arc<Ticks>) -> Arc<Self> {
        Common::within(owner, ticks, |common| TestPool { common })
    }

    /// A closed, empty cell of this pool. The caller keeps the pool until
    /// the cell is gone.
    fn cell(&self) -> HitCell<u64> {
        // SAFETY: as the caller promises.
        unsafe { HitCell::new(NonNull::from(&self.common)) }
    }
}

#[cfg(not(shuttle))]
mod unit {
    use super::index::{tag, CHUNK};
    use super::*;
    use crate::buffer::hash::KeyHash;
    use crate::buffer::pinned::Pinned;
    use crate::buffer::way::WAYS;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    const VALUE: u64 = 0x5eed;

    /// What the stand-in buffer was asked to do.
    #[derive(Default, Debug)]
    struct Calls {
        repin: u32,
        unpin: u32,
        end_lease: u32,
        consume: u32,
    }

    /// A buffer that only records the calls.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Calls>,
    }

    impl PinOwner<u64> for Recorder {
        fn repin(&self, _: PinAt) {
            self.calls.lock().unwrap().repin += 1;
        }

        fn unpin(&self, _: PinAt, _: bool, _: Arc<u64>) {
            self.calls.lock().unwrap().unpin += 1;
        }

        fn end_lease(&self, _: &HitCell<u64>) {
            self.calls.lock().unwrap().end_lease += 1;
        }

        fn consume_cell(&self, cell: &HitCell<u64>) -> Released {
            let mut calls = self.calls.lock().unwrap();
            calls.consume += 1;
            let released = cell.release_consumed();
            if released == Released::EndLease {
                calls.end_lease += 1;
            }
            released
        }
    }

    impl Recorder {
        /// The cell never takes the shard's own pin path.
        fn assert_no_entry_pins(&self) {
            let calls = self.calls.lock().unwrap();
            assert_eq!((calls.repin, calls.unpin), (0, 0), "{calls:?}");
        }
    }

    /// A closed cell holding `VALUE`, owned by a fresh recorder, living in
    /// the returned pool.
    fn fixture() -> (Arc<Recorder>, Arc<Ticks>, HitCell<u64>, Arc<TestPool>) {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let weak: Weak<dyn PinOwner<u64>> = Arc::downgrade(&owner) as _;
        let life = TestPool::new(weak, Arc::clone(&ticks));
        let cell = life.cell();
        cell.assign(Arc::new(VALUE), at(1));
        (owner, ticks, cell, life)
    }

    /// An index of one shard, whose cells call back `owner`.
    fn index_for(owner: &Arc<Recorder>, ticks: &Arc<Ticks>) -> HitIndex<u64, u64> {
        let weak: Weak<dyn PinOwner<u64>> = Arc::downgrade(owner) as _;
        HitIndex::new(KeyHash::new(), 1, weak, Arc::clone(ticks))
    }

    /// A hit on `key` through `index`.
    fn hit(index: &HitIndex<u64, u64>, key: u64) -> Option<CellPin<u64>> {
        index.pin(index.hash_of(&key), &key)
    }

    #[test]
    fn a_closed_cell_refuses_hits() {
        let (owner, ticks, cell, _life) = fixture();
        // New cells are closed.
        assert!(!cell.is_open());
        assert!(!cell.try_pin(), "a new (closed) cell was pinned");
        assert_eq!(cell.pins(), 0);
        assert!(cell.is_idle());
        // Opened, then closed again.
        cell.open(ticks.next(0));
        assert_eq!(cell.close_word(), 0);
        assert!(!cell.try_pin(), "a closed cell was pinned");
        assert_eq!(cell.pins(), 0);
        assert!(!cell.is_leased());
        owner.assert_no_entry_pins();
    }

    #[test]
    fn an_open_cell_pins_and_release_is_done() {
        let (owner, ticks, cell, _life) = fixture();
        cell.open(ticks.next(0));
        assert!(cell.is_open());
        assert!(cell.try_pin());
        assert!(cell.try_pin());
        assert_eq!(cell.pins(), 2);
        assert_eq!(**cell.value(), VALUE);
        assert_eq!(cell.release(), Released::Done);
        assert_eq!(cell.release(), Released::Done);
        assert_eq!(cell.pins(), 0);
        assert!(cell.is_open(), "a release closed the cell");
        assert!(!cell.is_leased());
        assert!(!cell.is_idle(), "an open cell counts as idle");
        let calls = owner.calls.lock().unwrap();
        assert_eq!(
            calls.end_lease, 0,
            "a release of an open cell ended a lease"
        );
    }

    #[test]
    fn closing_a_pinned_cell_leases_until_the_last_release() {
        let (owner, ticks, cell, _life) = fixture();
        cell.open(ticks.next(0));
        for _ in 0..3 {
            assert!(cell.try_pin());
        }
        assert_eq!(cell.close_word(), 3, "close reports the pins it leased");
        assert!(!cell.is_open());
        assert!(cell.is_leased());
        assert_eq!(cell.pins(), 3);
        assert!(!cell.is_idle());
        assert!(!cell.try_pin(), "a leased cell was pinned");
        // Closing again leases nothing more and keeps the lease.
        assert_eq!(cell.close_word(), 0);
        assert!(cell.is_leased());
        // The pins still read the value.
        assert_eq!(**cell.value(), VALUE);
        assert_eq!(cell.release(), Released::Done);
        assert!(cell.is_leased(), "the lease ended with a pin left");
        assert_eq!(cell.release(), Released::Done);
        assert!(cell.is_leased(), "the lease ended with a pin left");
        assert_eq!(cell.release(), Released::EndLease);
        assert!(!cell.is_leased(), "the last release left the lease bit");
        assert_eq!(cell.pins(), 0);
        assert!(cell.is_idle());
        assert!(!cell.try_pin());
        // Opened again (the lease given back and the entry relinked), the
        // cell's releases are plain ones again.
        cell.open(ticks.next(0));
        assert!(cell.try_pin());
        assert_eq!(cell.release(), Released::Done);
        owner.assert_no_entry_pins();
    }

    #[test]
    fn closing_an_unpinned_cell_leaves_it_idle() {
        let (_owner, ticks, cell, _life) = fixture();
        cell.open(ticks.next(0));
        // Pins that come and go before the close leave nothing.
        assert!(cell.try_pin());
        assert_eq!(cell.release(), Released::Done);
        assert_eq!(cell.close_word(), 0);
        assert!(!cell.is_open());
        assert!(!cell.is_leased());
        assert!(cell.is_idle());
    }

    #[test]
    fn release_stores_a_tick_newer_than_the_open() {
        let (_owner, ticks, cell, _life) = fixture();
        let opened = ticks.next(0);
        cell.open(opened);
        assert_eq!(cell.last_use(), opened, "open stores its tick");
        assert!(cell.try_pin());
        assert_eq!(cell.last_use(), opened, "a pin stored a tick");
        assert_eq!(cell.release(), Released::Done);
        let used = cell.last_use();
        assert!(used > opened, "release stored {used}, opened at {opened}");
        assert!(cell.try_pin());
        assert_eq!(cell.release(), Released::Done);
        assert!(cell.last_use() > used, "a later release is not newer");
        // A leased release stores its tick too (the shard relinks by it).
        let before = cell.last_use();
        assert!(cell.try_pin());
        assert_eq!(cell.close_word(), 1);
        assert_eq!(cell.release(), Released::EndLease);
        assert!(cell.last_use() > before);
    }

    #[test]
    fn a_consumed_release_records_no_use() {
        let (_owner, ticks, cell, _life) = fixture();
        let opened = ticks.next(0);
        cell.open(opened);
        assert!(cell.try_pin());
        assert!(cell.try_pin());
        assert_eq!(cell.release_consumed(), Released::Done);
        assert_eq!(cell.last_use(), opened, "a consumed release stored a tick");
        assert_eq!(cell.pins(), 1);
        // It ends a lease like any release.
        assert_eq!(cell.close_word(), 1);
        assert_eq!(cell.release_consumed(), Released::EndLease);
        assert!(cell.is_idle());
        assert_eq!(cell.last_use(), opened);
    }

    #[test]
    fn repin_adds_a_pin_that_needs_its_own_release() {
        let (_owner, ticks, cell, _life) = fixture();
        cell.open(ticks.next(0));
        assert!(cell.try_pin());
        cell.repin();
        assert_eq!(cell.pins(), 2);
        assert_eq!(cell.release(), Released::Done);
        assert_eq!(cell.pins(), 1);
        assert_eq!(cell.release(), Released::Done);
        assert_eq!(cell.pins(), 0);

        // A repin before the close is leased with the rest.
        assert!(cell.try_pin());
        cell.repin();
        assert_eq!(cell.close_word(), 2);
        assert_eq!(cell.release(), Released::Done);
        assert!(cell.is_leased());
        assert_eq!(cell.release(), Released::EndLease);
        assert!(cell.is_idle());

        // A repin of a leased cell (a guard cloned after the close) joins
        // the lease: the lease ends with the last of them.
        cell.open(ticks.next(0));
        assert!(cell.try_pin());
        assert_eq!(cell.close_word(), 1);
        cell.repin();
        assert_eq!(cell.pins(), 2);
        assert_eq!(cell.release(), Released::Done);
        assert!(cell.is_leased());
        assert_eq!(cell.release(), Released::EndLease);
        assert!(cell.is_idle());
    }

    #[test]
    fn take_value_only_from_a_closed_idle_cell_and_once() {
        let (_owner, ticks, cell, _life) = fixture();
        cell.open(ticks.next(0));
        assert!(
            cell.take_value().is_none(),
            "took the value of an open cell"
        );
        assert!(cell.try_pin());
        assert!(cell.take_value().is_none(), "took a pinned value");
        assert_eq!(cell.close_word(), 1);
        assert!(cell.take_value().is_none(), "took a leased value");
        assert_eq!(**cell.value(), VALUE, "the pin lost its value");
        assert_eq!(cell.release(), Released::EndLease);
        let value = cell
            .take_value()
            .expect("a closed idle cell gives its value");
        assert_eq!(*value, VALUE);
        assert!(cell.take_value().is_none(), "the value was taken twice");
        // Taking it gave up the cell's handle: ours is the only one.
        assert_eq!(Arc::strong_count(&value), 1);

        // A cell never opened is closed and idle: its value can go.
        let (_owner, _ticks, fresh, _life_fresh) = fixture();
        assert_eq!(fresh.take_value().as_deref(), Some(&VALUE));
        assert!(fresh.take_value().is_none());
    }

    #[test]
    fn owner_and_place() {
        let (owner, _ticks, cell, _life) = fixture();
        assert_eq!(cell.at(), at(1));
        assert!(cell.owner().is_some());
        drop(owner);
        assert!(cell.owner().is_none(), "the cell kept its buffer alive");
    }

    #[test]
    fn guards_of_a_cell_end_the_lease_through_the_owner() {
        let (owner, ticks, cell, life) = fixture();
        cell.open(ticks.next(0));
        assert!(cell.try_pin());
        // SAFETY: pinned while `cell` lives.
        let guard = Pinned::of_cell(unsafe { CellPin::taken(&cell) });
        let clone = guard.clone();
        assert_eq!(cell.pins(), 2, "a cloned guard did not repin the cell");
        assert_eq!(*guard, VALUE);
        assert_eq!(cell.close(), 2);
        assert_eq!(Arc::strong_count(&life), 2, "the lease holds the pool");
        drop(clone);
        assert_eq!(owner.calls.lock().unwrap().end_lease, 0);
        drop(guard);
        assert_eq!(owner.calls.lock().unwrap().end_lease, 1);
        assert!(cell.is_idle());
        assert_eq!(Arc::strong_count(&life), 1, "the lease's end let go");

        // Consuming goes through the owner, which releases the pin.
        cell.open(ticks.next(0));
        assert!(cell.try_pin());
        // SAFETY: as above.
        Pinned::of_cell(unsafe { CellPin::taken(&cell) }).consume();
        assert_eq!(owner.calls.lock().unwrap().consume, 1);
        assert_eq!(cell.pins(), 0);
        assert_eq!(Arc::strong_count(&life), 1);

        // With the buffer gone, the last release of a lease does nothing
        // but release, and give the lease's count back.
        assert!(cell.try_pin());
        // SAFETY: as above.
        let guard = Pinned::of_cell(unsafe { CellPin::taken(&cell) });
        assert_eq!(cell.close(), 1);
        drop(owner);
        assert_eq!(*guard, VALUE);
        drop(guard);
        assert!(cell.is_idle());
        assert_eq!(Arc::strong_count(&life), 1);
    }

    /// A pin abandoned (taken on another key's cell) records no use, and
    /// ends a lease it was the last pin of.
    #[test]
    fn an_abandoned_pin_records_no_use_but_ends_its_lease() {
        let (owner, ticks, cell, life) = fixture();
        cell.open(7);
        assert!(cell.try_pin());
        // SAFETY: pinned while `cell` lives.
        unsafe { CellPin::taken(&cell) }.abandon();
        assert_eq!(cell.last_use(), 7, "an abandoned pin recorded a use");
        assert_eq!(cell.pins(), 0);
        assert!(cell.try_pin());
        assert_eq!(cell.close(), 1);
        assert_eq!(Arc::strong_count(&life), 2);
        // SAFETY: as above.
        unsafe { CellPin::taken(&cell) }.abandon();
        assert_eq!(owner.calls.lock().unwrap().end_lease, 1);
        assert!(cell.is_idle());
        assert_eq!(Arc::strong_count(&life), 1, "the lease's count was kept");
        drop(ticks);
    }

    /// A guard holds its cell by the pin: with the index gone, the cell's
    /// pool (and the value in the cell) lives until the guard's release
    /// ends the lease, and goes then.
    #[test]
    fn a_leased_cell_lives_exactly_as_long_as_its_pins() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let value = Arc::new(VALUE);
        let weak_value = Arc::downgrade(&value);
        let cell = index.give(5, value, at(1));
        cell.open(ticks.next(0));
        let guard = Pinned::of_cell(hit(&index, 5).expect("an open cell pins"));
        let clone = guard.clone();
        // The shard closes it (leased) and takes it out of the index; the
        // index goes: only the lease holds the cell now.
        assert_eq!(cell.close(), 2);
        index.withdraw(cell);
        drop(index);
        assert_eq!(*guard, VALUE);
        drop(guard);
        assert_eq!(*clone, VALUE, "the cell went with a pin left");
        assert!(weak_value.upgrade().is_some());
        drop(clone);
        assert!(weak_value.upgrade().is_none(), "the cell outlived its pins");
    }

    /// The buffer gone with hits pinned on open cells: the index closes
    /// them, and each lives until its last pin goes; the values of cells
    /// with no pin go at once.
    #[test]
    fn a_dropped_index_leaves_pinned_cells_to_their_pins() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let (value, idle_value) = (Arc::new(VALUE), Arc::new(VALUE + 1));
        let (weak, idle_weak) = (Arc::downgrade(&value), Arc::downgrade(&idle_value));
        index.give(5, value, at(1)).open(ticks.next(0));
        index.give(6, idle_value, at(2)).open(ticks.next(0));
        let guard = Pinned::of_cell(hit(&index, 5).expect("an open cell pins"));
        drop(index);
        assert!(
            idle_weak.upgrade().is_none(),
            "an unpinned cell's value was kept"
        );
        assert_eq!(*guard, VALUE);
        assert!(weak.upgrade().is_some());
        drop(guard);
        assert!(weak.upgrade().is_none(), "the cell outlived its pins");
    }

    #[test]
    fn the_index_pins_only_open_cells_of_their_key() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        assert!(hit(&index, 5).is_none());
        let cell = index.give(5, Arc::new(VALUE), at(1));
        assert_eq!(index.len(), 1);
        assert!(hit(&index, 5).is_none(), "pinned a closed cell");
        cell.open(ticks.next(0));
        let pinned = hit(&index, 5).expect("an open cell pins");
        assert!(std::ptr::eq(pinned.cell(), &*cell));
        assert_eq!(cell.pins(), 1);
        assert!(hit(&index, 6).is_none());
        pinned.release(false);
        assert_eq!(cell.pins(), 0);
        assert!(index.get(&5).unwrap().same(&cell));
        assert_eq!(cell.close_word(), 0);
        assert!(hit(&index, 5).is_none());
        index.withdraw(cell);
        assert!(index.get(&5).is_none());
        assert!(hit(&index, 5).is_none());
        assert_eq!(index.len(), 0);
        assert_eq!(cell.pins(), 0);
    }

    /// A place whose cell was taken out is given to the next key, as a new
    /// gift; a hit on the old key, even through the old slot, never pins
    /// the new key's cell.
    #[test]
    fn places_are_given_again_and_never_pin_for_their_old_key() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let old = index.give(5, Arc::new(VALUE), at(1));
        let gen = old.gen();
        old.open(ticks.next(0));
        assert!(old.retire());
        index.withdraw(old);
        let new = index.give(6, Arc::new(VALUE + 1), at(2));
        assert!(new.same(&old), "a free place was not given again");
        assert_eq!(new.gen(), gen + 1);
        new.open(ticks.next(0));
        let opened = new.last_use();
        assert!(hit(&index, 5).is_none(), "a hit on the old key pinned");
        // The old key's slot, as a hit that read the table before the
        // place was given again finds it: the key tells them apart.
        assert!(new.place_pin(&5).is_none(), "pinned another key's cell");
        assert_eq!(new.pins(), 0, "the wrong key's pin was kept");
        assert_eq!(new.last_use(), opened, "the wrong key's pin was a use");
        let pinned = hit(&index, 6).expect("the new key pins");
        assert_eq!(**pinned.cell().value(), VALUE + 1);
        assert_eq!(pinned.cell().at(), at(2));
        pinned.release(false);
    }

    /// A cell taken out of the index while leased keeps its place until
    /// the lease ends; then the place is given again.
    #[test]
    fn a_leased_place_is_given_again_only_after_its_lease() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let cell = index.give(5, Arc::new(VALUE), at(1));
        cell.open(ticks.next(0));
        let pin = hit(&index, 5).expect("an open cell pins");
        assert_eq!(cell.close(), 1);
        index.withdraw(cell);
        let other = index.give(6, Arc::new(VALUE + 1), at(2));
        assert!(!other.same(&cell), "a leased place was given again");
        pin.release(false);
        assert_eq!(owner.calls.lock().unwrap().end_lease, 1);
        // The owner (here a recorder) gives the lease back under the lock:
        index.lease_ended(&cell);
        let again = index.give(7, Arc::new(VALUE + 2), at(3));
        assert!(again.same(&cell), "a place whose lease ended stayed out");
        assert_eq!(index.len(), 2);
    }

    /// Many keys in one table, grown several times, and taken out in an
    /// order that shifts places back across each other: every key left
    /// still pins, and none taken out does.
    #[test]
    fn the_table_grows_and_shifts_back_without_losing_keys() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let n = 300u64;
        let cells: Vec<_> = (0..n)
            .map(|k| {
                let cell = index.give(k, Arc::new(k), at(k));
                cell.open(ticks.next(0));
                cell
            })
            .collect();
        assert_eq!(index.len(), n as usize);
        // Every third key, then every other of the rest.
        let gone: Vec<u64> = (0..n).filter(|k| k % 3 == 0 || k % 7 == 1).collect();
        for &k in &gone {
            let cell = cells[k as usize];
            assert!(cell.retire());
            index.withdraw(cell);
        }
        for k in 0..n {
            let pinned = hit(&index, k);
            if gone.contains(&k) {
                assert!(pinned.is_none(), "key {k} pinned after it went");
            } else {
                let pinned = pinned.unwrap_or_else(|| panic!("key {k} lost"));
                assert_eq!(**pinned.cell().value(), k);
                pinned.release(false);
            }
        }
        assert_eq!(index.len(), (n as usize) - gone.len());
    }

    /// Keys whose hashes share their tag and their home slot lie in one
    /// run of slots whose tags all match: a hit tells its own place from
    /// the others' by the hash, before and after some are taken out.
    #[test]
    fn keys_sharing_a_tag_and_a_home_each_pin_their_own() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        // The top seven bits (the tag) and the low five (the home slot in
        // any table of up to 32 slots, which 12 keys fill to at most half)
        // alike.
        let same = |k: &u64| {
            let h = index.hash_of(k);
            (h >> 57, h & 0x1f)
        };
        let first = same(&0);
        let keys: Vec<u64> = (0..).filter(|k| same(k) == first).take(12).collect();
        let cells: Vec<_> = keys
            .iter()
            .map(|&k| {
                let cell = index.give(k, Arc::new(k), at(k));
                cell.open(ticks.next(0));
                cell
            })
            .collect();
        let pins_its_own = |k: u64| {
            let pinned = hit(&index, k).unwrap_or_else(|| panic!("key {k} lost"));
            assert_eq!(**pinned.cell().value(), k, "key {k} pinned another's");
            pinned.release(false);
        };
        keys.iter().for_each(|&k| pins_its_own(k));
        for (i, &k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            assert!(cells[i].retire());
            index.withdraw(cells[i]);
            assert!(hit(&index, k).is_none(), "key {k} pinned after it went");
        }
        keys.iter()
            .skip(1)
            .step_by(2)
            .for_each(|&k| pins_its_own(k));
        assert_eq!(index.len(), keys.len() / 2);
    }

    /// A tag is the hash's top seven bits, all 128 values of them (hashes
    /// that differ in its lowest bit are told apart by the slot alone), and
    /// a key whose tag is 0 is in its slot like any other.
    #[test]
    fn tags_take_all_128_values_and_0_is_one() {
        let tags: HashSet<usize> = (0..128u64).map(|t| tag(t << 57)).collect();
        assert_eq!(tags.len(), 128);
        assert_ne!(tag(0), tag(1 << 57));
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let k = (0..).find(|k| tag(index.hash_of(k)) == 0).unwrap();
        let cell = index.give(k, Arc::new(k), at(k));
        cell.open(ticks.next(0));
        let pinned = hit(&index, k).unwrap_or_else(|| panic!("key {k}, of tag 0, lost"));
        assert_eq!(**pinned.cell().value(), k);
        pinned.release(false);
        assert!(cell.retire());
        index.withdraw(cell);
        assert!(hit(&index, k).is_none(), "key {k} pinned after it went");
        assert_eq!(index.len(), 0);
    }

    /// Two threads (ways) giving cells in turn get places from chunks of
    /// their own: neither's places lie between the other's.
    #[test]
    fn each_way_gives_places_from_chunks_of_its_own() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let mut places = [Vec::new(), Vec::new()];
        for k in 0..CHUNK as u64 {
            for (way, mine) in places.iter_mut().enumerate() {
                let key = 1000 * way as u64 + k;
                let cell = index.give_in(way, key, Arc::new(key), at(key));
                mine.push(HitIndex::address(&cell));
            }
        }
        let span = |v: &Vec<usize>| (*v.iter().min().unwrap(), *v.iter().max().unwrap());
        let (a, b) = (span(&places[0]), span(&places[1]));
        assert!(
            a.1 < b.0 || b.1 < a.0,
            "the ways' places interleave: {a:x?} and {b:x?}"
        );
        assert_eq!(index.places(), 2 * CHUNK);
    }

    /// `count` cells of keys from `first` on, given by `way`, and their
    /// places' addresses.
    fn give_many(
        index: &HitIndex<u64, u64>,
        way: usize,
        first: u64,
        count: usize,
    ) -> (Vec<CellRef<u64, u64>>, Vec<usize>) {
        (first..first + count as u64)
            .map(|k| {
                let cell = index.give_in(way, k, Arc::new(k), at(k));
                let address = HitIndex::address(&cell);
                (cell, address)
            })
            .unzip()
    }

    /// A chunk whose every place was freed is filled again whole, in
    /// order, by any way, before the shard allocates.
    #[test]
    fn a_chunk_emptied_is_filled_again_in_order() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let (first, first_places) = give_many(&index, 0, 0, CHUNK);
        let (_second, _) = give_many(&index, 0, 1000, CHUNK);
        for cell in first {
            index.withdraw(cell);
        }
        assert_eq!((index.places(), index.free_places()), (2 * CHUNK, CHUNK));
        let (_again, places) = give_many(&index, 1, 2000, CHUNK);
        assert_eq!(index.places(), 2 * CHUNK, "allocated with a chunk empty");
        let mut sorted = first_places.clone();
        sorted.sort_unstable();
        assert_eq!(places, sorted, "not the emptied chunk's places, in order");
    }

    /// With fewer than a chunk's worth of free places per way, a shard
    /// gives new cells places of a new chunk rather than single places
    /// freed among older cells.
    #[test]
    fn with_few_places_free_a_shard_allocates_rather_than_fill_gaps() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let (cells, first) = give_many(&index, 0, 0, CHUNK);
        for cell in cells.into_iter().step_by(2) {
            index.withdraw(cell);
        }
        let (_, places) = give_many(&index, 0, 1000, CHUNK);
        assert_eq!(index.places(), 2 * CHUNK);
        assert_eq!(index.free_places(), CHUNK / 2);
        assert!(
            places.iter().all(|p| !first.contains(p)),
            "a place freed among older cells was given"
        );
    }

    /// With a chunk's worth of free places per way and no chunk empty, a
    /// way whose chunk is full fills the chunk with most free places, in
    /// order, then allocates once fewer are free.
    #[test]
    fn with_many_places_free_a_way_fills_the_chunk_with_most() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let chunks: Vec<_> = (0..6)
            .map(|c| give_many(&index, 0, 1000 * c as u64, CHUNK))
            .collect();
        // Free the first few places of each chunk, last first: 259 free,
        // the most (45) in chunk 4.
        let counts = [43, 42, 43, 43, 45, 43];
        for (c, &count) in counts.iter().enumerate() {
            for i in (0..count).rev() {
                index.withdraw(chunks[c].0[i]);
            }
        }
        assert!(index.free_places() >= WAYS * CHUNK);
        let (_, places) = give_many(&index, 1, 100_000, 46);
        assert_eq!(places[..45], chunks[4].1[..45], "not chunk 4's, in order");
        assert_eq!(index.places(), 7 * CHUNK, "the 46th not in a new chunk");
        assert!(!chunks.iter().any(|c| c.1.contains(&places[45])));
    }

    /// Ways taking turns to give a chunk's worth of cells and free all
    /// but one of them, so that no chunk is ever empty again, give the
    /// free places among the cells kept rather than allocate: at most
    /// `(WAYS + 1) * CHUNK` places beyond the most cells held at once.
    #[test]
    fn ways_taking_turns_keep_the_places_bounded() {
        let owner = Arc::new(Recorder::default());
        let ticks = Arc::new(Ticks::new());
        let index = index_for(&owner, &ticks);
        let rounds = 60;
        for round in 0..rounds {
            let way = round % WAYS;
            let (cells, _) = give_many(&index, way, round as u64 * 1000, CHUNK);
            for cell in cells.into_iter().skip(1) {
                index.withdraw(cell);
            }
        }
        // The most at once: the cells kept, and one round's.
        let most = rounds - 1 + CHUNK;
        let bound = most + (WAYS + 1) * CHUNK;
        assert!(
            index.places() <= bound,
            "{} places for {most} cells at most (bound {bound})",
            index.places()
        );
    }

    /// The stand-in shard's books for the stress test.
    #[derive(Default, Debug)]
    struct Books {
        /// The entry is on the list (the cell is open).
        linked: bool,
        /// The entry's one pin for a lease.
        lease_pins: u32,
        leases_taken: u64,
        leases_ended: u64,
        /// Leases ended by a consuming release (inside `consume_cell`).
        consume_ends: u64,
    }

    struct StressShard {
        books: Mutex<Books>,
        ticks: Arc<Ticks>,
    }

    impl StressShard {
        /// Give a lease back, under the lock; every other lease relinks the
        /// entry at once, the rest wait for the closer thread to.
        fn end_locked(&self, books: &mut Books, cell: &HitCell<u64>) {
            assert_eq!(books.lease_pins, 1, "a lease ended that was not taken");
            assert!(!books.linked, "a lease ended on a linked entry");
            assert!(cell.is_idle(), "a lease ended with pins or lease bit");
            books.lease_pins = 0;
            books.leases_ended += 1;
            if books.leases_ended % 2 == 0 {
                cell.open(self.ticks.next(0));
                books.linked = true;
            }
        }
    }

    impl PinOwner<u64> for StressShard {
        fn repin(&self, _: PinAt) {
            unreachable!("the hit path never pins through the shard")
        }

        fn unpin(&self, _: PinAt, _: bool, _: Arc<u64>) {
            unreachable!("the hit path never pins through the shard")
        }

        fn end_lease(&self, cell: &HitCell<u64>) {
            self.end_locked(&mut self.books.lock().unwrap(), cell);
        }

        fn consume_cell(&self, cell: &HitCell<u64>) -> Released {
            let mut books = self.books.lock().unwrap();
            let released = cell.release_consumed();
            if released == Released::EndLease {
                books.consume_ends += 1;
                self.end_locked(&mut books, cell);
            }
            released
        }
    }

    /// Sets the flag when dropped, panicking or not.
    struct StopOnDrop<'a>(&'a AtomicBool);

    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }

    #[test]
    fn threads_pin_while_the_shard_closes_and_reopens() {
        const HITTERS: usize = 3;
        const LEASES: u64 = 1_000;
        let ticks = Arc::new(Ticks::new());
        let shard = Arc::new(StressShard {
            books: Mutex::new(Books::default()),
            ticks: Arc::clone(&ticks),
        });
        let weak: Weak<dyn PinOwner<u64>> = Arc::downgrade(&shard) as _;
        let pool = TestPool::new(weak, Arc::clone(&ticks));
        let cell = pool.cell();
        cell.assign(Arc::new(VALUE), at(1));
        {
            let mut books = shard.books.lock().unwrap();
            cell.open(ticks.next(0));
            books.linked = true;
        }
        let stop = AtomicBool::new(false);
        let hits = AtomicU64::new(0);
        let release_ends = AtomicU64::new(0);
        // A bound on the run, not a synchronisation: the closer stops at
        // LEASES leases or at the deadline, whichever comes first.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut rounds = 0u64;
        std::thread::scope(|scope| {
            for t in 0..HITTERS {
                let (cell, stop, hits, release_ends) = (&cell, &stop, &hits, &release_ends);
                scope.spawn(move || {
                    let mut i = t as u64;
                    while !stop.load(Relaxed) {
                        i += 1;
                        if !cell.try_pin() {
                            // Closed: leave the core to the closer.
                            std::thread::yield_now();
                            continue;
                        }
                        hits.fetch_add(1, Relaxed);
                        assert_eq!(**cell.value(), VALUE, "a pin lost its value");
                        let mut held = 1;
                        if i % 5 == 0 {
                            cell.repin();
                            held += 1;
                        }
                        for _ in 0..i % 8 {
                            std::hint::spin_loop();
                        }
                        assert_eq!(**cell.value(), VALUE, "a pin lost its value");
                        for k in 0..held {
                            if i % 11 == 0 && k == 0 {
                                cell.owner().expect("the shard lives").consume_cell(cell);
                            } else if cell.release() == Released::EndLease {
                                release_ends.fetch_add(1, Relaxed);
                                cell.owner().expect("the shard lives").end_lease(cell);
                            }
                        }
                    }
                });
            }
            // The hitters stop when the closer does, also if it panics
            // (a hitter's panic poisons the lock, and the closer's next
            // lock panics): else the scope would wait for them forever.
            let _stop = StopOnDrop(&stop);
            // The closer: takes the entry off its list (closing the cell),
            // and puts it back once its lease, if any, is given back.
            loop {
                rounds += 1;
                {
                    let mut books = shard.books.lock().unwrap();
                    if books.linked {
                        books.linked = false;
                        let pins = cell.close_word();
                        if pins > 0 {
                            assert_eq!(books.lease_pins, 0, "a second lease");
                            books.lease_pins = 1;
                            books.leases_taken += 1;
                        } else {
                            assert!(cell.is_idle(), "closed unpinned, not idle");
                        }
                    } else if books.lease_pins == 0 {
                        assert!(cell.is_idle(), "relinked with pins or lease bit");
                        cell.open(ticks.next(0));
                        books.linked = true;
                    }
                    if books.leases_taken >= LEASES || Instant::now() > deadline {
                        break;
                    }
                }
                std::thread::yield_now();
            }
        });
        let books = shard.books.lock().unwrap();
        let hits = hits.into_inner();
        assert!(hits > 0, "no hit in {rounds} rounds");
        assert!(
            books.leases_taken > 0,
            "no close met a pin in {rounds} rounds and {hits} hits"
        );
        assert_eq!(books.leases_taken, books.leases_ended, "{books:?}");
        assert_eq!(
            release_ends.into_inner() + books.consume_ends,
            books.leases_ended,
            "a lease ended without an EndLease, or twice: {books:?}"
        );
        assert_eq!(books.lease_pins, 0);
        assert_eq!(cell.pins(), 0, "pins left");
        assert!(!cell.is_leased(), "lease bit left");
        assert_eq!(cell.is_open(), books.linked);
    }
}

#[cfg(shuttle)]
mod schedules {
    use super::*;
    use crate::buffer::hash::KeyHash;
    use shuttle::sync::Mutex;
    use shuttle::thread;

    /// Schedules per scheduler per test.
    const ITERATIONS: usize = 10_000;

    /// Run `schedule` under shuttle's random and PCT schedulers.
    fn explore(schedule: fn()) {
        shuttle::check_random(schedule, ITERATIONS);
        shuttle::check_pct(schedule, ITERATIONS, 3);
    }

    /// The value of the cell made for `version`.
    fn value_of(version: u64) -> u64 {
        1_000 + version
    }

    /// The shard's books for one entry version (one cell).
    #[derive(Debug, Default)]
    struct Model {
        /// On the list: the cell must be open.
        linked: bool,
        /// The entry's pin for a lease (0 or 1).
        lease_pins: u32,
        /// Removed, or evicted: the value leaves memory once no lease
        /// holds it.
        removed: bool,
        /// `take_value` gave the value up.
        value_taken: bool,
        leases_taken: u32,
        leases_ended: u32,
        /// Leases whose EndLease came out of `consume_cell`.
        consume_ends: u32,
        /// The shard retired the cell to keep within its budget: the
        /// entry stays on its list, without a cell.
        retired: bool,
    }

    /// The stand-in shard: its books under its lock, one model per cell
    /// version (the books outlive the shard, for the test's checks).
    struct Shard {
        models: Arc<Mutex<Vec<Model>>>,
        ticks: Arc<Ticks>,
        /// What the cells share (the schedules close with `close_word`,
        /// so no lease takes a count of it).
        pool: Arc<TestPool>,
    }

    /// A cell made by the stand-in shard, with its pool: the cells of a
    /// schedule may outlive the shard.
    struct TestCell {
        cell: HitCell<u64>,
        _pool: Arc<TestPool>,
    }

    impl std::ops::Deref for TestCell {
        type Target = HitCell<u64>;

        fn deref(&self) -> &HitCell<u64> {
            &self.cell
        }
    }

    impl Shard {
        fn new(versions: usize) -> Arc<Self> {
            let ticks = Arc::new(Ticks::new());
            Arc::new_cyclic(|shard: &Weak<Shard>| Shard {
                models: Arc::new(Mutex::new(
                    (0..versions).map(|_| Model::default()).collect(),
                )),
                ticks: Arc::clone(&ticks),
                pool: TestPool::new(shard.clone() as _, ticks),
            })
        }

        /// A new, closed cell for `version`, holding `value`.
        fn cell_with(self: &Arc<Self>, version: u64, value: Arc<u64>) -> Arc<TestCell> {
            let cell = self.pool.cell();
            cell.assign(value, at(version));
            Arc::new(TestCell {
                cell,
                _pool: Arc::clone(&self.pool),
            })
        }

        fn cell(self: &Arc<Self>, version: u64) -> Arc<TestCell> {
            self.cell_with(version, Arc::new(value_of(version)))
        }

        fn link_locked(&self, m: &mut Model, cell: &HitCell<u64>) {
            assert!(!m.linked && !m.removed && m.lease_pins == 0, "{m:?}");
            assert!(cell.is_idle(), "linked with pins or the lease bit");
            cell.open(self.ticks.next(0));
            m.linked = true;
        }

        /// Put `cell`'s entry on the list.
        fn link(&self, cell: &HitCell<u64>) {
            let mut models = self.models.lock().unwrap();
            self.link_locked(&mut models[cell.at().version as usize], cell);
        }

        /// Evict `cell`'s entry if it is on the list.
        fn evict(&self, cell: &HitCell<u64>) {
            let mut models = self.models.lock().unwrap();
            evict_locked(&mut models[cell.at().version as usize], cell);
        }

        /// Remove `cell`'s entry.
        fn remove(&self, cell: &HitCell<u64>) {
            let mut models = self.models.lock().unwrap();
            remove_locked(&mut models[cell.at().version as usize], cell);
        }

        fn end_lease_locked(&self, m: &mut Model, cell: &HitCell<u64>) {
            assert_eq!(m.lease_pins, 1, "a lease ended that was not taken: {m:?}");
            assert!(!m.linked, "a lease ended on a linked entry");
            assert!(cell.is_idle(), "a lease ended with pins or lease bit");
            m.lease_pins = 0;
            m.leases_ended += 1;
            if m.removed {
                leave_memory(m, cell);
            } else {
                self.link_locked(m, cell);
            }
        }
    }

    /// The entry's value leaves memory: the cell must give it up, once.
    fn leave_memory(m: &mut Model, cell: &HitCell<u64>) {
        assert!(!m.value_taken, "the value left memory twice");
        let value = cell
            .take_value()
            .expect("a closed cell with no lease gives its value up");
        assert_eq!(*value, value_of(cell.at().version));
        m.value_taken = true;
    }

    /// Unlink and close; the pins the close found become a lease.
    fn unlink_locked(m: &mut Model, cell: &HitCell<u64>) {
        assert!(m.linked);
        assert!(cell.is_open(), "a linked entry's cell is closed");
        m.linked = false;
        let pins = cell.close_word();
        assert!(!cell.is_open());
        if pins > 0 {
            // (Not `is_leased()`: the last pin may be released already,
            // its releaser now waiting for the lock to end the lease.)
            assert_eq!(m.lease_pins, 0, "a second lease");
            m.lease_pins = 1;
            m.leases_taken += 1;
        }
    }

    fn evict_locked(m: &mut Model, cell: &HitCell<u64>) {
        if !m.linked {
            return;
        }
        unlink_locked(m, cell);
        if m.lease_pins == 0 {
            // Nothing pinned it: evicted, its value leaves memory.
            m.removed = true;
            leave_memory(m, cell);
        }
    }

    fn remove_locked(m: &mut Model, cell: &HitCell<u64>) {
        if m.removed {
            return;
        }
        if m.linked {
            unlink_locked(m, cell);
        }
        m.removed = true;
        if m.lease_pins == 0 {
            leave_memory(m, cell);
        }
    }

    impl PinOwner<u64> for Shard {
        fn repin(&self, _: PinAt) {
            unreachable!("the hit path never pins through the shard")
        }

        fn unpin(&self, _: PinAt, _: bool, _: Arc<u64>) {
            unreachable!("the hit path never pins through the shard")
        }

        fn end_lease(&self, cell: &HitCell<u64>) {
            let mut models = self.models.lock().unwrap();
            self.end_lease_locked(&mut models[cell.at().version as usize], cell);
        }

        fn consume_cell(&self, cell: &HitCell<u64>) -> Released {
            let mut models = self.models.lock().unwrap();
            let m = &mut models[cell.at().version as usize];
            let released = cell.release_consumed();
            if released == Released::EndLease {
                m.consume_ends += 1;
                self.end_lease_locked(m, cell);
            }
            released
        }
    }

    /// What a hitter saw.
    #[derive(Default, Debug)]
    struct Seen {
        hits: u32,
        /// Releases that returned EndLease (and called `end_lease`).
        end_leases: u32,
        /// EndLease with the buffer gone: nobody to give the lease to.
        orphan_ends: u32,
    }

    impl std::ops::AddAssign for Seen {
        fn add_assign(&mut self, o: Seen) {
            self.hits += o.hits;
            self.end_leases += o.end_leases;
            self.orphan_ends += o.orphan_ends;
        }
    }

    /// A hit: pin if open, then [`use_pin`].
    fn hit(models: &Mutex<Vec<Model>>, cell: &HitCell<u64>, consume: bool, seen: &mut Seen) {
        if cell.try_pin() {
            seen.hits += 1;
            use_pin(models, cell, consume, seen);
        }
    }

    /// Two hitter threads on `cell`: hitter `h` hits it once per entry of
    /// `consumes(h)`, consuming where that says so.
    fn hitters(
        models: &Arc<Mutex<Vec<Model>>>,
        cell: &Arc<TestCell>,
        consumes: fn(usize) -> Vec<bool>,
    ) -> Vec<thread::JoinHandle<Seen>> {
        (0..2)
            .map(|h| {
                let (models, cell) = (Arc::clone(models), Arc::clone(cell));
                thread::spawn(move || {
                    let mut seen = Seen::default();
                    for consume in consumes(h) {
                        hit(&models, &cell, consume, &mut seen);
                    }
                    seen
                })
            })
            .collect()
    }

    /// What the hitters saw, once they are done.
    fn joined(hitters: Vec<thread::JoinHandle<Seen>>) -> Seen {
        let mut seen = Seen::default();
        for h in hitters {
            seen += h.join().unwrap();
        }
        seen
    }

    /// Use a pin held on `cell`: read the value (it must be intact the
    /// whole time the pin is held, and the shard must not be able to take
    /// it), release, and give the lease back if the release was its last
    /// pin. `consume` releases through the owner.
    fn use_pin(models: &Mutex<Vec<Model>>, cell: &HitCell<u64>, consume: bool, seen: &mut Seen) {
        let expect = value_of(cell.at().version);
        assert_eq!(**cell.value(), expect, "a pinned value changed");
        // Let the shard run while the pin is held.
        thread::yield_now();
        {
            // The shard, under its lock, cannot take a pinned value.
            let _shard = models.lock().unwrap();
            assert!(cell.take_value().is_none(), "took a pinned value");
        }
        assert_eq!(**cell.value(), expect, "a pinned value changed");
        if consume {
            if let Some(owner) = cell.owner() {
                owner.consume_cell(cell);
                return;
            }
        }
        if cell.release() == Released::EndLease {
            match cell.owner() {
                Some(owner) => {
                    seen.end_leases += 1;
                    owner.end_lease(cell);
                }
                None => seen.orphan_ends += 1,
            }
        }
    }

    /// The end of a schedule: every lease taken was ended once, by exactly
    /// one EndLease; no pin or lease bit is left; the value left memory
    /// exactly when the model says, and is still there otherwise.
    fn check_end(models: &Mutex<Vec<Model>>, cells: &[&HitCell<u64>], seen: &Seen) {
        let models = models.lock().unwrap();
        let taken: u32 = models.iter().map(|m| m.leases_taken).sum();
        let consume_ends: u32 = models.iter().map(|m| m.consume_ends).sum();
        assert_eq!(
            seen.end_leases + consume_ends,
            taken,
            "EndLease not once per lease: {seen:?} {models:?}"
        );
        assert_eq!(seen.orphan_ends, 0);
        for cell in cells {
            let m = &models[cell.at().version as usize];
            assert_eq!(cell.pins(), 0, "pins left: {m:?}");
            assert!(!cell.is_leased(), "lease bit left: {m:?}");
            assert_eq!(m.lease_pins, 0, "lease pin left: {m:?}");
            assert_eq!(m.leases_taken, m.leases_ended, "{m:?}");
            assert_eq!(m.removed, m.value_taken, "{m:?}");
            assert_eq!(cell.is_open(), m.linked, "{m:?}");
            if m.value_taken {
                assert!(cell.take_value().is_none(), "a value taken twice");
            } else {
                // Still in memory: on the list (the model has no other
                // resting state), and its value still there.
                assert!(m.linked, "{m:?}");
                assert!(cell.try_pin());
                assert_eq!(**cell.value(), value_of(cell.at().version));
                assert_eq!(cell.release(), Released::Done);
            }
        }
    }

    /// (a) Pin vs close (the eviction freeze): hits race evictions; a hit
    /// that pinned reads the value intact, and a lease it holds keeps the
    /// entry (relinked when the lease ends, then evictable again).
    fn pin_vs_close() {
        let shard = Shard::new(1);
        let models = Arc::clone(&shard.models);
        let cell = shard.cell(0);
        shard.link(&cell);
        let hitters = hitters(&models, &cell, |h| vec![false, h == 1]);
        let evictor = {
            let (shard, cell) = (Arc::clone(&shard), Arc::clone(&cell));
            thread::spawn(move || {
                shard.evict(&cell);
                shard.evict(&cell);
            })
        };
        let seen = joined(hitters);
        evictor.join().unwrap();
        check_end(&models, &[&cell], &seen);
    }

    #[test]
    fn schedules_pin_vs_close() {
        explore(pin_vs_close);
    }

    /// (b) Last unpin vs lease: two pins (one of them a repin) released
    /// concurrently with the close; exactly one release ends the lease if
    /// the close found a pin.
    fn last_unpins_vs_lease() {
        let shard = Shard::new(1);
        let models = Arc::clone(&shard.models);
        let cell = shard.cell(0);
        shard.link(&cell);
        assert!(cell.try_pin());
        cell.repin();
        let releasers: Vec<_> = (0..2)
            .map(|_| {
                let (models, cell) = (Arc::clone(&models), Arc::clone(&cell));
                thread::spawn(move || {
                    let mut seen = Seen::default();
                    use_pin(&models, &cell, false, &mut seen);
                    seen
                })
            })
            .collect();
        let evictor = {
            let (shard, cell) = (Arc::clone(&shard), Arc::clone(&cell));
            thread::spawn(move || shard.evict(&cell))
        };
        let mut seen = Seen::default();
        for r in releasers {
            seen += r.join().unwrap();
        }
        evictor.join().unwrap();
        check_end(&models, &[&cell], &seen);
    }

    #[test]
    fn schedules_last_unpins_vs_lease() {
        explore(last_unpins_vs_lease);
    }

    /// (c) Remove vs last unpin: a removal (with an eviction racing it)
    /// while a hit holds a pin; the value leaves memory either at the
    /// removal or at the end of the lease, once, and never under a pin.
    fn remove_vs_last_unpin() {
        let shard = Shard::new(1);
        let models = Arc::clone(&shard.models);
        let cell = shard.cell(0);
        shard.link(&cell);
        let hitter = {
            let (models, cell) = (Arc::clone(&models), Arc::clone(&cell));
            thread::spawn(move || {
                let mut seen = Seen::default();
                hit(&models, &cell, false, &mut seen);
                hit(&models, &cell, false, &mut seen);
                seen
            })
        };
        let evictor = {
            let (shard, cell) = (Arc::clone(&shard), Arc::clone(&cell));
            thread::spawn(move || shard.evict(&cell))
        };
        let remover = {
            let (shard, cell) = (Arc::clone(&shard), Arc::clone(&cell));
            thread::spawn(move || shard.remove(&cell))
        };
        let seen = hitter.join().unwrap();
        evictor.join().unwrap();
        remover.join().unwrap();
        {
            let models = models.lock().unwrap();
            assert!(models[0].removed && models[0].value_taken, "{models:?}");
        }
        check_end(&models, &[&cell], &seen);
    }

    #[test]
    fn schedules_remove_vs_last_unpin() {
        explore(remove_vs_last_unpin);
    }

    /// (d) Replace vs pin: the shard removes the old version and publishes
    /// a new open cell in the slot the hits read (the index); a hit pins
    /// whichever cell it loaded and reads the value that cell was made
    /// with. An eviction of whatever the slot holds races both.
    fn replace_vs_pin() {
        let shard = Shard::new(2);
        let models = Arc::clone(&shard.models);
        let old = shard.cell(0);
        shard.link(&old);
        let slot = Arc::new(Mutex::new(Arc::clone(&old)));
        let load = |slot: &Mutex<Arc<TestCell>>| Arc::clone(&slot.lock().unwrap());
        let hitters: Vec<_> = (0..2)
            .map(|h| {
                let (models, slot) = (Arc::clone(&models), Arc::clone(&slot));
                thread::spawn(move || {
                    let mut seen = Seen::default();
                    for round in 0..2 {
                        let cell = load(&slot);
                        hit(&models, &cell, h == 1 && round == 1, &mut seen);
                    }
                    seen
                })
            })
            .collect();
        let replacer = {
            let (shard, slot, old) = (Arc::clone(&shard), Arc::clone(&slot), Arc::clone(&old));
            thread::spawn(move || {
                let mut models = shard.models.lock().unwrap();
                remove_locked(&mut models[0], &old);
                let new = shard.cell(1);
                shard.link_locked(&mut models[1], &new);
                *slot.lock().unwrap() = new;
            })
        };
        let evictor = {
            let (shard, slot) = (Arc::clone(&shard), Arc::clone(&slot));
            thread::spawn(move || {
                let cell = load(&slot);
                shard.evict(&cell);
            })
        };
        let mut seen = Seen::default();
        for h in hitters {
            seen += h.join().unwrap();
        }
        replacer.join().unwrap();
        evictor.join().unwrap();
        let new = load(&slot);
        assert_eq!(new.at().version, 1);
        {
            let models = models.lock().unwrap();
            assert!(models[0].removed && models[0].value_taken, "{models:?}");
        }
        check_end(&models, &[&old, &new], &seen);
    }

    #[test]
    fn schedules_replace_vs_pin() {
        explore(replace_vs_pin);
    }

    /// (e) The buffer dropped with pins alive: the owner goes (maybe after
    /// an eviction leased the pins) while hits hold pins. The pins still
    /// read the value; a lease whose last release finds no owner ends with
    /// nobody to tell; no pin or lease bit is left, and the value goes with
    /// the cell.
    fn buffer_dropped_with_pins_alive() {
        let shard = Shard::new(1);
        let models = Arc::clone(&shard.models);
        let value = Arc::new(value_of(0));
        let cell = shard.cell_with(0, Arc::clone(&value));
        shard.link(&cell);
        let hitters = hitters(&models, &cell, |_| vec![false]);
        let dropper = {
            let cell = Arc::clone(&cell);
            // The only strong handle on the buffer.
            thread::spawn(move || {
                shard.evict(&cell);
                drop(shard);
            })
        };
        let seen = joined(hitters);
        dropper.join().unwrap();
        assert!(
            cell.owner().is_none(),
            "the buffer outlived its last handle"
        );
        assert_eq!(cell.pins(), 0, "pins left");
        assert!(!cell.is_leased(), "lease bit left");
        let models = models.lock().unwrap();
        let m = &models[0];
        assert_eq!(cell.is_open(), m.linked, "{m:?}");
        assert_eq!(
            seen.end_leases + seen.orphan_ends,
            m.leases_taken,
            "EndLease not once per lease: {seen:?} {m:?}"
        );
        assert_eq!(m.leases_ended, seen.end_leases, "{seen:?} {m:?}");
        assert_eq!(m.value_taken, m.removed, "{m:?}");
        if m.value_taken {
            assert_eq!(Arc::strong_count(&value), 1, "the taken value leaked");
        } else {
            // Still in the cell (leased and relinked, or orphaned): it goes
            // with the cell.
            assert_eq!(Arc::strong_count(&value), 2);
            assert_eq!(Arc::strong_count(&cell), 1, "a hitter kept the cell");
            drop(cell);
            assert_eq!(Arc::strong_count(&value), 1, "the value outlived its cell");
        }
    }

    #[test]
    fn schedules_buffer_dropped_with_pins_alive() {
        explore(buffer_dropped_with_pins_alive);
    }

    /// (f) Pin vs retire: hits race the shard retiring the cell to keep
    /// within its budget. A retire succeeds only while no pin is held;
    /// after it no hit pins and the cell gives its value up; one that
    /// fails leaves the cell open, its pins and value intact.
    fn pin_vs_retire() {
        let shard = Shard::new(1);
        let models = Arc::clone(&shard.models);
        let cell = shard.cell(0);
        shard.link(&cell);
        let hitters = hitters(&models, &cell, |_| vec![false, false]);
        let retirer = {
            let (models, cell) = (Arc::clone(&models), Arc::clone(&cell));
            thread::spawn(move || {
                for _ in 0..2 {
                    let mut models = models.lock().unwrap();
                    let m = &mut models[0];
                    if !m.retired && cell.retire() {
                        assert!(!cell.is_open() && cell.is_idle(), "retired while held");
                        m.retired = true;
                        leave_memory(m, &cell);
                    }
                    drop(models);
                    thread::yield_now();
                }
            })
        };
        let seen = joined(hitters);
        retirer.join().unwrap();
        let models = models.lock().unwrap();
        let m = &models[0];
        assert_eq!(cell.pins(), 0, "pins left");
        assert!(!cell.is_leased(), "a retire made a lease");
        assert_eq!(seen.end_leases + seen.orphan_ends, 0, "{seen:?}");
        if m.retired {
            assert!(!cell.is_open(), "{m:?}");
            assert!(!cell.try_pin(), "a retired cell pinned");
        } else {
            assert!(cell.is_open(), "{m:?}");
            assert!(cell.try_pin());
            assert_eq!(**cell.value(), value_of(0));
            assert_eq!(cell.release(), Released::Done);
        }
    }

    #[test]
    fn schedules_pin_vs_retire() {
        explore(pin_vs_retire);
    }

    /// (g) A hit racing its key's place given to another key: the shard
    /// retires key 5's cell and gives its place to key 6, while one hitter
    /// looks up 5 and another 6 through the index. A hit never holds
    /// another key's cell: on 5 it gets version 0's value, on 6 version
    /// 1's; a pin taken on the place for the wrong key is given back, and
    /// no pin is left.
    fn hit_vs_place_given_again() {
        let shard = Shard::new(2);
        let models = Arc::clone(&shard.models);
        let weak: Weak<dyn PinOwner<u64>> = Arc::downgrade(&shard) as _;
        let index = Arc::new(HitIndex::<u64, u64>::new(
            KeyHash::new(),
            1,
            weak,
            Arc::clone(&shard.ticks),
        ));
        let first = index.give(5, Arc::new(value_of(0)), at(0));
        shard.link(&first);
        let hitters: Vec<_> = [(5u64, 0u64), (6, 1)]
            .into_iter()
            .map(|(key, version)| {
                let index = Arc::clone(&index);
                thread::spawn(move || {
                    let mut hits = 0;
                    for _ in 0..2 {
                        let Some(pin) = index.pin(index.hash_of(&key), &key) else {
                            continue;
                        };
                        hits += 1;
                        let cell = pin.cell();
                        assert_eq!(cell.at().version, version, "key {key}: another key's cell");
                        assert_eq!(**cell.value(), value_of(version));
                        thread::yield_now();
                        assert_eq!(**cell.value(), value_of(version), "a pinned value changed");
                        pin.release(false);
                    }
                    hits
                })
            })
            .collect();
        let giver = {
            let (models, index) = (Arc::clone(&models), Arc::clone(&index));
            thread::spawn(move || {
                for _ in 0..2 {
                    let mut models = models.lock().unwrap();
                    if first.retire() {
                        models[0].retired = true;
                        index.withdraw(first);
                        let second = index.give(6, Arc::new(value_of(1)), at(1));
                        assert!(second.same(&first), "the free place was not given again");
                        second.open(1);
                        models[1].linked = true;
                        return Some(second);
                    }
                    drop(models);
                    thread::yield_now();
                }
                None
            })
        };
        let hits: u32 = hitters.into_iter().map(|h| h.join().unwrap()).sum();
        let given = giver.join().unwrap();
        assert_eq!(first.pins(), 0, "pins left ({hits} hits)");
        assert!(!first.is_leased());
        let hit = |key: u64| index.pin(index.hash_of(&key), &key);
        match given {
            Some(second) => {
                assert!(second.is_open());
                assert!(hit(5).is_none(), "the old key pins the given place");
                let pin = hit(6).expect("the new key pins");
                assert_eq!(**pin.cell().value(), value_of(1));
                pin.release(false);
            }
            None => {
                assert!(first.is_open());
                let pin = hit(5).expect("the key kept its cell");
                assert_eq!(**pin.cell().value(), value_of(0));
                pin.release(false);
                assert!(hit(6).is_none());
            }
        }
    }

    #[test]
    fn schedules_hit_vs_place_given_again() {
        explore(hit_vs_place_given_again);
    }
}
