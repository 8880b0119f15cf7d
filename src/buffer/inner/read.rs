//! The read path: a lookup pins a value in memory, or starts (or joins)
//! the one read of a value on disk; the read runs on the pool, or on the
//! caller's thread for a blocking `get`, and its outcome is handed to
//! every waiter. Prefetch reads a value back ahead of use when it fits
//! within the target next to what is resident, dropping clean values to
//! make room if that is enough.

use super::Inner;
use crate::buffer::pinned::{Pinned, Waiter};
use crate::buffer::shard::{After, Found, Wake};
use crate::buffer::Key;
use crate::error::Result;
use crate::io::Priority;
use crate::metrics::spans::JobSpan;
use crate::metrics::Metrics;
use crate::store::DiskLoc;
use crate::sync::Arc;
use crate::value::Spill;
use std::borrow::Borrow;
use std::cell::Cell;
use std::hash::Hash;
use std::time::Instant;

/// What a lookup for a read found.
pub(crate) enum Lookup<K, V> {
    Missing,
    Hit(Pinned<V>),
    /// Not in memory and no waiter was given.
    NotResident,
    /// A read is in flight; the waiter was queued on it.
    Joined,
    /// The caller must run (or queue) the read of `key` at `loc`.
    Read {
        key: K,
        version: u64,
        loc: DiskLoc,
    },
}

impl<K: Key, V: Spill> Inner<K, V> {
    /// Find `key` for a read. With a waiter, a value on disk gets a read
    /// started or joined; without one, only a memory hit pins.
    pub(crate) fn lookup<Q>(&self, key: &Q, waiter: Option<Waiter<V>>) -> Lookup<K, V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.of(key);
        let s = self.shard_of_hash(hash);
        // The hit path: the shard's read lock, and a pin counted on the
        // entry's hit pins.
        let hit = self.shards[s].core.read().hit(hash, key);
        if let Some(hits) = hit {
            return Lookup::Hit(Pinned::of_hit(hits));
        }
        match self.with_shard(s, |shard| shard.lookup(hash, key, waiter)) {
            Found::Hit {
                slot,
                version,
                value,
            } => Lookup::Hit(self.pin_handle(s, slot, version, value)),
            Found::Missing => Lookup::Missing,
            Found::NotResident => Lookup::NotResident,
            Found::Joined => Lookup::Joined,
            Found::Read { key, version, loc } => Lookup::Read { key, version, loc },
        }
    }

    /// Read `key`'s record back and hand the value to its waiters. Runs on
    /// the pool, or on the caller's thread for a blocking `get`.
    pub(crate) fn unspill(&self, key: K, version: u64, loc: DiskLoc) {
        let span = JobSpan::unspill(&self.telemetry, &key, loc);
        let start = Instant::now();
        let res = self.store.get::<V>(&key, loc).map(Arc::new);
        Metrics::add_time(&self.metrics.unspill_nanos, start.elapsed());
        span.outcome(&res, |_| loc, |loc| self.store.path_of(loc));
        if res.is_ok() {
            Metrics::add(&self.metrics.unspill_count, 1);
            Metrics::add(&self.metrics.unspilled_bytes, loc.len());
        }
        self.unspill_done(key, version, res);
    }

    fn unspill_done(&self, key: K, version: u64, res: Result<Arc<V>>) {
        let s = self.shard_of(&key);
        let target = self.target();
        let value = res.as_ref().ok().map(Arc::clone);
        let wake = self.with_shard(s, |shard| {
            shard.read_done(&key, version, value, target, || self.next_tick_synced(s))
        });
        match res {
            Ok(_) => {
                self.act(
                    s,
                    After {
                        wake,
                        ..After::default()
                    },
                );
                self.evict_to_target();
            }
            Err(e) => {
                tracing::warn!(key = ?key, error = %e, "reading a spilled value failed");
                if let Some(Wake::Failed(waiters)) = wake {
                    for w in waiters {
                        w.send(Err(e.clone()));
                    }
                }
                self.wake_mem_waiters();
            }
        }
    }

    /// Read `key` back ahead of use if it is on disk and fits within the
    /// target next to what is already resident, after dropping clean
    /// values last used at or before tick `asked` if that makes it fit
    /// ([`Inner::drop_clean_for`]). Runs on the pool.
    pub(crate) fn prefetch_one(&self, key: K, asked: u64) {
        let s = self.shard_of(&key);
        // Try again only after room was made. Another prefetch may take
        // the room this one made before it reserves it; then make room
        // again, as long as there are clean values old enough to drop
        // (each round drops at least one or ends). The bound only guards
        // against a livelock that progress elsewhere rules out.
        // Values pinned under a read lock are the host's working set too,
        // though no gauge counts them: added up by a walk of the index,
        // once the counted pins alone leave no room.
        let mut hit_pinned = None;
        for _ in 0..64 {
            let target = self.target();
            let refused = Cell::new(None);
            let pinned = self.pinned() + hit_pinned.unwrap_or(0);
            let start = self.with_shard(s, |shard| {
                // Promise the memory first, so concurrent prefetches cannot
                // together pass the target.
                shard.start_prefetch(&key, |w| {
                    let admitted = self.accounting.admit(w, pinned, target);
                    if !admitted {
                        refused.set(Some(w));
                    }
                    admitted
                })
            });
            if let Some((version, loc)) = start {
                self.unspill(key, version, loc);
                return;
            }
            // Not on disk, consumed, or gone: nothing to read.
            let Some(w) = refused.get() else { return };
            if hit_pinned.is_none() {
                let walked = self.hit_pinned();
                hit_pinned = Some(walked);
                if walked > 0 {
                    continue;
                }
            }
            if !self.drop_clean_for(w, asked) {
                return;
            }
        }
    }

    pub(crate) fn start_read(&self, key: K, version: u64, loc: DiskLoc) {
        // The read lands after every use the caller made before.
        self.now_published();
        self.submit(Priority::Demand, move |me| me.unspill(key, version, loc));
    }

    pub(crate) fn queue_prefetch(&self, key: K, asked: u64) {
        self.submit(Priority::Background, move |me| me.prefetch_one(key, asked));
    }
}
