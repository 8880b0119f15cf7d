//! [`Pinned`]: an RAII guard on a value that keeps its entry from being
//! evicted until the last guard for it is dropped or consumed.

use crate::buffer::hit::{HitPins, PinAt, PinOwner};
use crate::error::Result;
use crate::sync::Arc;
use std::fmt;
use std::ops::Deref;

/// The outcome sent to a reader waiting on a disk read.
pub(crate) type PinResult<V> = Result<Option<Pinned<V>>>;

/// A reader waiting for an in-flight read.
pub(crate) enum Waiter<V> {
    /// `pin().await`.
    Async(tokio::sync::oneshot::Sender<PinResult<V>>),
    /// A blocking `get` on another thread.
    Blocking(super::handoff::Sender<PinResult<V>>),
}

impl<V> Waiter<V> {
    /// Deliver the outcome. A reader that went away drops it, which
    /// releases the pin it carried.
    pub(crate) fn send(self, result: PinResult<V>) {
        match self {
            Waiter::Async(tx) => drop(tx.send(result)),
            Waiter::Blocking(tx) => tx.send(result),
        }
    }
}

/// A value held in memory for the caller. While any `Pinned` for an entry
/// lives, the entry is not evicted; dropping the last one makes it
/// evictable again (as most recently used), and [`Pinned::consume`] makes
/// it first in line.
///
/// The guard dereferences to the value. It stays valid even if the key is
/// removed or replaced meanwhile: it then holds the old value.
pub struct Pinned<V> {
    /// `Some` for the guard's whole life; taken only when it is released
    /// (so the owner can decide where the value is freed).
    hold: Option<Hold<V>>,
}

/// What a guard holds: a pin the shard counts on the entry, or a pin
/// taken under the shard's read lock (see [`crate::buffer::hit`]).
enum Hold<V> {
    Entry {
        value: Arc<V>,
        owner: Arc<dyn PinOwner<V>>,
        at: PinAt,
    },
    Hit(Arc<HitPins<V>>),
}

impl<V> Pinned<V> {
    /// A guard for a pin already counted on the entry.
    pub(crate) fn new(value: Arc<V>, owner: Arc<dyn PinOwner<V>>, at: PinAt) -> Self {
        Pinned {
            hold: Some(Hold::Entry { value, owner, at }),
        }
    }

    /// A guard for a pin of `pins` already taken.
    pub(crate) fn of_hit(pins: Arc<HitPins<V>>) -> Self {
        Pinned {
            hold: Some(Hold::Hit(pins)),
        }
    }

    fn hold(&self) -> &Hold<V> {
        self.hold.as_ref().expect("a live guard holds its pin")
    }

    fn arc(&self) -> &Arc<V> {
        match self.hold() {
            Hold::Entry { value, .. } => value,
            Hold::Hit(pins) => pins.value(),
        }
    }

    fn release(&mut self, consume: bool) {
        match self.hold.take() {
            Some(Hold::Entry { value, owner, at }) => owner.unpin(at, consume, value),
            Some(Hold::Hit(pins)) => {
                // A consume goes through the shard, which orders it; a
                // plain release needs the buffer only to end a lease.
                if let Some(owner) = consume.then(|| pins.owner()).flatten() {
                    owner.consume_hit(pins);
                } else if let Some(last) = HitPins::release(pins, !consume) {
                    // The buffer may be gone: the lease ends here then.
                    if let Some(owner) = last.owner() {
                        owner.unpin(last.at(), consume, last.into_value());
                    }
                }
            }
            None => {}
        }
    }

    /// The host is done with the value: unpin it and make its entry the
    /// first to be evicted. If a valid disk copy exists (the value was read
    /// back from disk) its memory is freed at once, with no write.
    pub fn consume(mut self) {
        self.release(true);
    }

    /// A shared handle on the value itself, which outlives the pin.
    pub fn value(&self) -> &Arc<V> {
        self.arc()
    }

    /// Whether this pin was taken under the shard's read lock.
    #[cfg(test)]
    pub(crate) fn is_hit(&self) -> bool {
        matches!(self.hold(), Hold::Hit(_))
    }

    /// The version of the entry this pin was made for.
    pub(crate) fn version(&self) -> u64 {
        match self.hold() {
            Hold::Entry { at, .. } => at.version,
            Hold::Hit(pins) => pins.at().version,
        }
    }
}

impl<V> Deref for Pinned<V> {
    type Target = V;

    fn deref(&self) -> &V {
        self.arc()
    }
}

impl<V> Clone for Pinned<V> {
    fn clone(&self) -> Self {
        let hold = match self.hold() {
            Hold::Entry { value, owner, at } => {
                owner.repin(*at);
                Hold::Entry {
                    value: Arc::clone(value),
                    owner: Arc::clone(owner),
                    at: *at,
                }
            }
            // Another handle is another pin.
            Hold::Hit(pins) => Hold::Hit(Arc::clone(pins)),
        };
        Pinned { hold: Some(hold) }
    }
}

impl<V> Drop for Pinned<V> {
    fn drop(&mut self) {
        self.release(false);
    }
}

impl<V: fmt::Debug> fmt::Debug for Pinned<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pinned").field(&**self).finish()
    }
}
