//! Values that outlive their entry: what a removed or replaced entry
//! leaves behind ([`Removed`]), and the value that pins or its write still
//! hold after that ([`Detached`]), counted as the buffer's memory until
//! its last holder lets go.

use crate::buffer::accounting::Delta;
use crate::buffer::pinned::Waiter;
use crate::store::DiskLoc;
use crate::sync::Arc;

/// What a removed entry left: its record (to release), its value (to drop,
/// when nothing else the buffer counts holds it, else `detached`) and the
/// readers waiting on it (to answer).
pub(crate) struct Removed<V> {
    pub disk: Option<DiskLoc>,
    pub drop: Option<Arc<V>>,
    pub waiters: Vec<Waiter<V>>,
    pub detached: Option<Detached<V>>,
}

/// The value of a removed or replaced entry that pins or its write still
/// hold. It no longer belongs to any key, but its memory is still the
/// buffer's: it counts in `memory_bytes` and against `memory_limit` (not
/// against the target, which bounds what eviction can free) until its last
/// holder lets go. The shard keeps it by its entry's version, which pins
/// and write jobs carry.
pub(crate) struct Detached<V> {
    value: Arc<V>,
    weight: usize,
    pins: u32,
    /// Its write is queued or running.
    writing: bool,
}

impl<V> Detached<V> {
    pub(crate) fn new(value: Arc<V>, weight: usize, pins: u32, writing: bool) -> Self {
        Detached {
            value,
            weight,
            pins,
            writing,
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn weight(&self) -> usize {
        self.weight
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn pins(&self) -> u32 {
        self.pins
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn writing(&self) -> bool {
        self.writing
    }

    fn io(&self) -> isize {
        if self.writing {
            self.weight as isize
        } else {
            0
        }
    }

    /// The gauges of it becoming detached.
    pub(crate) fn entered(&self) -> Delta {
        Delta {
            detached: self.weight as isize,
            detached_count: 1,
            detached_io: self.io(),
            ..Delta::ZERO
        }
    }

    /// One more pin (a guard cloned).
    pub(crate) fn repin(&mut self) {
        self.pins += 1;
    }

    /// A pin released. Hands the value back (to drop) when nothing holds
    /// it any more; the caller then forgets it.
    pub(crate) fn unpin(&mut self) -> (Option<Arc<V>>, Delta) {
        self.pins = self.pins.saturating_sub(1);
        self.gone_if_free(Delta::ZERO)
    }

    /// Its write reported (done, failed, or dropped because the entry was
    /// gone). Hands the value back as [`Detached::unpin`] does.
    pub(crate) fn write_ended(&mut self) -> (Option<Arc<V>>, Delta) {
        let d = Delta {
            detached_io: -self.io(),
            ..Delta::ZERO
        };
        self.writing = false;
        self.gone_if_free(d)
    }

    fn gone_if_free(&self, d: Delta) -> (Option<Arc<V>>, Delta) {
        if self.pins > 0 || self.writing {
            return (None, d);
        }
        let left = Delta {
            detached: -(self.weight as isize),
            detached_count: -1,
            ..d
        };
        (Some(Arc::clone(&self.value)), left)
    }
}
