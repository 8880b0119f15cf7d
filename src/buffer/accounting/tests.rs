use super::*;
use crate::sync::atomic::AtomicBool;

/// Apply `d`, then its negation, 20,000 times on another thread, while
/// this thread calls `check` with the number of checks so far, until
/// that thread is done. The negation is not a transition the buffer
/// makes: it puts the weight back for the next round.
fn while_applying(a: &Accounting, d: Delta, mut check: impl FnMut(u64)) {
    let pinned = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..20_000 {
                a.apply(d, &pinned);
                a.apply(d.negate(), &pinned);
            }
            done.store(true, SeqCst);
        });
        let mut checks = 0;
        while !done.load(SeqCst) {
            check(checks);
            checks += 1;
        }
    });
}

/// A write that ends lowers `resident` and `spilling` by the same
/// weight. `over_target` reads what is in memory and not being written
/// from `unheld` alone, so it must never see that change half made:
/// either way it would be off by the write's weight, and evict a value
/// too many or stop a value short.
#[test]
fn a_write_that_ends_never_shows_in_unheld() {
    const W: isize = 4096;
    let a = Accounting::new(0, None);
    let pinned = AtomicUsize::new(0);
    let resident = Delta {
        resident: 3 * W,
        count: 3,
        len: 3,
        ..Delta::ZERO
    };
    let evicted = Delta {
        spilling: W,
        ..Delta::ZERO
    };
    let written = Delta {
        resident: -W,
        count: -1,
        spilling: -W,
        ..Delta::ZERO
    };
    a.apply(resident, &pinned);
    a.apply(evicted, &pinned);
    let unheld = a.read().unheld;
    assert_eq!(unheld, 2 * W as usize);
    while_applying(&a, written, |_| {
        assert_eq!(a.gauges.0.unheld.load(Relaxed), unheld);
    });
    let r = a.read();
    assert_eq!(r.resident - r.spilling, r.unheld);
}

/// A key removed while its value is being written moves that weight
/// from `spilling` to `detached_io` in one change. Back-pressure asks
/// whether any IO holds memory (`io_held`): a reader must never find
/// the weight in neither, or it would release `insert_async` waiters
/// while the write still holds the memory it will free.
#[test]
fn a_write_outliving_its_key_always_shows_as_io_in_flight() {
    const W: isize = 4096;
    let a = Accounting::new(0, None);
    let pinned = AtomicUsize::new(0);
    let written = Delta {
        resident: W,
        count: 1,
        spilling: W,
        len: 1,
        ..Delta::ZERO
    };
    let removed = Delta {
        resident: -W,
        count: -1,
        spilling: -W,
        len: -1,
        detached: W,
        detached_count: 1,
        detached_io: W,
        ..Delta::ZERO
    };
    a.apply(written, &pinned);
    while_applying(&a, removed, |reads| {
        assert!(
            a.io_in_flight(),
            "a write in flight showed as none after {reads} reads"
        );
    });
    let r = a.read();
    assert_eq!(r.io_held, W as usize);
    assert_eq!(r.spilling + r.detached_io, r.io_held);
}

/// The derived gauges follow the changes they are derived from.
#[test]
fn readings_of_a_total_match_the_gauges_it_leaves() {
    let a = Accounting::new(0, None);
    let pinned = AtomicUsize::new(0);
    let total = Delta::enter(100)
        .plus(Delta {
            spilling: 40,
            len: 1,
            ..Delta::ZERO
        })
        .plus(Delta::freeing(7));
    a.apply(total, &pinned);
    assert_eq!(a.read().differences(&Readings::of(total)), vec![]);
    assert_eq!(a.read().unheld, 60);
    assert_eq!(a.read().io_held, 47);
}
