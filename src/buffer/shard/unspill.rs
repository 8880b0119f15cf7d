//! Reads in a shard: a lookup that pins a value in memory or starts (or
//! joins) its read back, a prefetch, and the outcome of a read.

use super::{Found, Shard, Wake};
use crate::buffer::accounting::Delta;
use crate::buffer::entry::{ListKind, State};
use crate::buffer::pinned::Waiter;
use crate::store::DiskLoc;
use crate::sync::Arc;
use std::borrow::Borrow;
use std::hash::Hash;

impl<K: Hash + Eq + Clone, V> Shard<K, V> {
    /// Find `key` for a read. A value in memory is pinned; with a waiter,
    /// a value on disk gets a read started or joined.
    pub(crate) fn lookup<Q>(&mut self, hash: u64, key: &Q, waiter: Option<Waiter<V>>) -> Found<K, V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(idx) = self.find_hashed(hash, key) else {
            return Found::Missing;
        };
        let n = self.node(idx);
        let version = n.version;
        if let Some(value) = n.state().value() {
            let value = Arc::clone(value);
            self.unlink(idx);
            let d = self.node_mut(idx).pin();
            self.add(d);
            self.locked_pins += 1;
            return Found::Hit {
                slot: idx,
                version,
                value,
            };
        }
        let Some(w) = waiter else {
            return Found::NotResident;
        };
        match self.node_mut(idx).start_read(w) {
            Ok(Some(loc)) => Found::Read {
                key: self.node(idx).key.clone(),
                version,
                loc,
            },
            Ok(None) => Found::Joined,
            Err(_) => Found::NotResident,
        }
    }

    /// Start a prefetch of `key` if it is on disk, was not consumed since
    /// its last pin, and `admit` grants its weight (taking the
    /// reservation itself, atomically against the target).
    pub(crate) fn start_prefetch(
        &mut self,
        key: &K,
        admit: impl FnOnce(usize) -> bool,
    ) -> Option<(u64, DiskLoc)> {
        let idx = self.find(key)?;
        let n = self.node_mut(idx);
        // Consumed since its last pin: the host is done with it, and a hint
        // for it is stale. Reading it back would be a second read of the
        // same record for nothing.
        if !matches!(n.state(), State::OnDisk { .. }) || n.consumed() || !admit(n.weight) {
            return None;
        }
        let version = n.version;
        let (loc, d) = n.start_prefetch()?;
        // `admit` took the reservation already.
        self.add(Delta { reserved: 0, ..d });
        Some((version, loc))
    }

    /// `key`'s read finished. `value` is `None` for a failed read; a value
    /// heavier than `target` read for nobody (a prefetch) is not kept. A
    /// kept value is pinned once per waiter, or linked as clean at
    /// `tick()` when nobody waits.
    pub(crate) fn read_done(
        &mut self,
        key: &K,
        version: u64,
        value: Option<Arc<V>>,
        target: usize,
        tick: impl FnOnce() -> u64,
    ) -> Option<Wake<V>> {
        // Removed or replaced meanwhile: its waiters were answered then.
        let idx = self.find_version(key, version)?;
        let n = self.node_mut(idx);
        let keep = value.filter(|_| !(n.reading_for_nobody() && n.weight > target));
        let landed = keep.clone();
        let (waiters, _, d) = n.read_done(keep);
        self.add(d);
        let Some(value) = landed else {
            return (!waiters.is_empty()).then_some(Wake::Failed(waiters));
        };
        if waiters.is_empty() {
            self.link_front(idx, ListKind::Clean, tick());
            return None;
        }
        for _ in 0..waiters.len() {
            let d = self.node_mut(idx).pin();
            self.add(d);
        }
        Some(Wake::Pinned {
            waiters,
            slot: idx,
            version,
            value,
        })
    }
}
