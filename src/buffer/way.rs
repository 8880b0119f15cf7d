//! A thread's "way": a small number drawn once per thread, round robin, so
//! that per-shard state that every use writes can be split into
//! [`WAYS`] copies and two threads mostly write different cache lines.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Copies of the per-use state of a shard: the chains of its LRU lists and
/// the reference counts its pins hold.
pub(crate) const WAYS: usize = 4;

thread_local! {
    static WAY: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's way, in `0..WAYS`.
#[inline]
pub(crate) fn this_thread() -> usize {
    WAY.with(|w| {
        let way = w.get();
        if way != usize::MAX {
            return way;
        }
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let way = NEXT.fetch_add(1, Relaxed) % WAYS;
        w.set(way);
        way
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_way() {
        let mine = this_thread();
        assert!(mine < WAYS);
        assert_eq!(this_thread(), mine);
        let theirs = std::thread::spawn(|| (this_thread(), this_thread()))
            .join()
            .unwrap();
        assert!(theirs.0 < WAYS);
        assert_eq!(theirs.0, theirs.1);
    }
}
