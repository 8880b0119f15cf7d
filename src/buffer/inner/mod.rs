//! The shared state behind every [`super::SpillBuffer`] handle, and the
//! coordinator of its parts: each operation locks a shard, asks it to
//! apply the entry transitions ([`super::shard`]), and acts on what it
//! returned after unlocking ([`Inner::act`]). The state it coordinates is
//! held by components with interfaces of their own (accounting, eviction,
//! the spill queue, the store, the IO pool); its fields are private to
//! this module and to its operations, which live in child modules by
//! concern: [`evict`], [`write`], [`failure`], [`read`], [`query`],
//! `transfer` and `validate`.
//!
//! Lock order (docs/design.md): at most two locks are held at once — a
//! shard's (in write mode), then the prefetch admission lock inside it;
//! a hit holds a shard's in read mode alone; the store's,
//! the spill queue's, the failures' and the memory waiters' are taken
//! alone. Encoding, IO,
//! dropping values and waking waiters happen after every lock is released.

pub(crate) mod evict;
pub(crate) mod failure;
pub(crate) mod query;
pub(crate) mod read;
mod transfer;
#[cfg(any(test, feature = "testing"))]
mod validate;
pub(crate) mod write;

use super::accounting::{Accounting, Delta};
use super::entry::{ListKind, Node};
use super::eviction::Eviction;
use super::hash::{shard_of, KeyHash};
use super::hit::{HitContext, HitPins, PinAt, PinOwner};
use super::pinned::{PinResult, Pinned};
use super::shard::{After, Shard, Wake};
use super::spill_queue::SpillQueue;
use super::Key;
use crate::config::Config;
use crate::error::Error;
use crate::io::{Pool, Priority};
use crate::metrics::spans::JobSpan;
use crate::metrics::{Metrics, Stats, Telemetry};
use crate::store::{DiskLoc, Store};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use crate::sync::ShardedLock;
use crate::sync::{Arc, Weak};
use crate::value::Spill;
use std::borrow::Borrow;
use std::hash::Hash;

/// One shard behind its lock, with the ticks of its two list tails
/// published for lock-free victim selection. Aligned to keep shards on
/// separate cache lines.
#[repr(C, align(128))]
pub(crate) struct LockedShard<K, V> {
    tails: [AtomicU64; 2],
    /// The newest LRU tick taken for this shard. Written only under the
    /// shard lock; read without it by [`Ticks::next_synced`].
    clock: AtomicU64,
    /// Weight of this shard's pinned values. Written only under the shard
    /// lock (a load and a store, no read-modify-write), on the shard's own
    /// cache line: pins of keys in different shards never contend on it.
    pinned: AtomicUsize,
    /// Read mode for a pin of a listed entry ([`Shard::hit`]), write mode
    /// for everything else.
    core: ShardedLock<Shard<K, V>>,
}

/// Aligned so that the `Arc` counts in front of it, which every `Pinned`
/// clone and drop updates, sit on a cache line of their own.
#[repr(align(128))]
pub(crate) struct Inner<K, V> {
    shards: Box<[LockedShard<K, V>]>,
    hasher: KeyHash,
    /// The clock and the owner every entry's hit pins share.
    ctx: Arc<HitContext<V>>,
    next_version: AtomicU64,
    /// Memory held against the target and the limit, and the
    /// `insert_async` callers waiting for it to fall.
    accounting: Accounting,
    store: Store<K>,
    pool: Pool,
    metrics: Metrics,
    /// The buffer's name, its metrics publisher.
    telemetry: Telemetry,
    /// Victims waiting to be written, and the failures of writes.
    spill_queue: SpillQueue<K, V>,
    /// The eviction order, the write back-off and the one-evictor lock.
    eviction: Eviction,
    me: Weak<Inner<K, V>>,
}

/// Values at least this heavy are freed on the IO pool when the caller's
/// thread would otherwise drop the last handle on them: freeing a large
/// allocation is a `munmap` (and page-table work proportional to its
/// size), which a host's event loop should not pay. Smaller values are
/// freed in place; handing them off would cost more than the free.
pub(crate) const HEAVY_DROP: usize = 1 << 20;

impl<K, V> Inner<K, V> {
    /// Memory held against the target and the limit, and the
    /// `insert_async` callers waiting for it to fall.
    pub(crate) fn accounting(&self) -> &Accounting {
        &self.accounting
    }

    /// The IO pool, for the handle to wait on and to shut down.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Number of shards of the index.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

impl<K: Key, V: Spill> Inner<K, V> {
    pub(crate) fn new(cfg: &Config, store: Store<K>, pool: Pool) -> Arc<Self> {
        let hasher = KeyHash::new();
        Arc::new_cyclic(|me: &Weak<Inner<K, V>>| {
            let owner = me.clone() as Weak<dyn PinOwner<V>>;
            let ctx = Arc::new(HitContext::new(owner));
            Inner {
                shards: (0..cfg.shards)
                    .map(|s| LockedShard {
                        core: ShardedLock::new(Shard::new_in(hasher, Arc::clone(&ctx), s as u32)),
                        tails: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
                        clock: AtomicU64::new(0),
                        pinned: AtomicUsize::new(0),
                    })
                    .collect(),
                hasher,
                ctx,
                next_version: AtomicU64::new(1),
                accounting: Accounting::new(cfg.memory_target, cfg.memory_limit),
                store,
                pool,
                metrics: Metrics::default(),
                telemetry: Telemetry::new(cfg.name.as_deref()),
                spill_queue: SpillQueue::new(),
                eviction: Eviction::new(),
                me: me.clone(),
            }
        })
    }

    /// The shard of `key`, or of a borrowed form of it (which hashes the
    /// same: see [`Shard::find`]).
    pub(crate) fn shard_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        self.shard_of_hash(self.hasher.of(key))
    }

    pub(crate) fn shard_of_hash(&self, hash: u64) -> usize {
        shard_of(hash, self.shards.len())
    }

    /// A tick for a use of an entry of shard `s` by the host. Take it only
    /// under the lock of the shard whose list it orders: two threads that
    /// took theirs first could link in the other order.
    fn next_tick(&self, s: usize) -> u64 {
        let clock = &self.shards[s].clock;
        let t = self.ctx.ticks.next(clock.load(Relaxed));
        clock.store(t, Relaxed);
        t
    }

    /// [`Inner::next_tick`] for work on the IO pool: after every tick
    /// taken before the job (see [`Ticks::next_synced`]).
    pub(crate) fn next_tick_synced(&self, s: usize) -> u64 {
        let t = self
            .ctx
            .ticks
            .next_synced(self.shards.iter().map(|sh| sh.clock.load(Relaxed)));
        self.shards[s].clock.store(t, Relaxed);
        t
    }

    /// "Now", for the ages eviction compares and the uses a prefetch
    /// counts as before it: at or after every shard's newest tick and
    /// every tick the calling thread took, before every tick it takes
    /// next (exact for a single thread). Another thread's uses may be up
    /// to [`SLACK`](super::clock::SLACK) ticks ahead.
    pub(crate) fn now(&self) -> u64 {
        let floor = self.shards.iter().map(|sh| sh.clock.load(Relaxed)).max();
        self.ctx.ticks.now(floor.unwrap_or(0))
    }

    /// [`Inner::now`], published: a read queued after this lands after
    /// every use the calling thread made before.
    pub(crate) fn now_published(&self) -> u64 {
        let now = self.now();
        self.ctx.ticks.publish(now);
        now
    }

    /// Weight of values pinned under a shard's read lock and not leased
    /// (see [`crate::buffer::hit`]): pinned, though not in
    /// [`Inner::pinned`]. A walk of every shard's index under its read
    /// lock, for the prefetch that found no room without them.
    pub(crate) fn hit_pinned(&self) -> usize {
        self.shards.iter().map(|s| s.core.read().hit_pinned()).sum()
    }

    pub(crate) fn target(&self) -> usize {
        self.accounting.target()
    }

    /// Bytes above the target held by unpinned values that no write is
    /// already taking away (see [`Accounting::over_target`]).
    pub(crate) fn over_target(&self) -> usize {
        self.accounting.over_target(|| self.pinned())
    }

    /// Weight of values with at least one pin counted by their shard, over
    /// all shards.
    pub(crate) fn pinned(&self) -> usize {
        self.shards.iter().map(|s| s.pinned.load(Relaxed)).sum()
    }

    /// Resolve the waiting `insert_async` calls if memory is within the
    /// limit or cannot fall.
    pub(crate) fn wake_mem_waiters(&self) {
        self.accounting.wake_waiters();
    }

    /// Run `f` on shard `s` under its lock; then, still under it, apply
    /// the gauge changes its transitions made and publish its list tails
    /// if they moved.
    pub(crate) fn with_shard<R>(&self, s: usize, f: impl FnOnce(&mut Shard<K, V>) -> R) -> R {
        let locked = &self.shards[s];
        let mut shard = locked.core.write();
        let r = f(&mut shard);
        let delta = shard.take_delta();
        self.accounting.apply(delta, &locked.pinned);
        let repaired = shard.take_repaired();
        if repaired > locked.clock.load(Relaxed) {
            locked.clock.store(repaired, Relaxed);
        }
        if shard.take_tails_moved() {
            locked.tails[0].store(shard.tail_tick(ListKind::Clean), Relaxed);
            locked.tails[1].store(shard.tail_tick(ListKind::Dirty), Relaxed);
        }
        drop(shard);
        // A change that a concurrent eviction may have misread (see
        // `Delta::needs_target_check`): look again, now that it is whole.
        // Evictions themselves never need this, so this does not recurse.
        if delta.needs_target_check() {
            self.check_target();
        }
        r
    }

    /// Do what a shard operation on shard `s` left for after its lock:
    /// answer readers, release a record, queue a write, drop a value.
    pub(crate) fn act(&self, s: usize, after: After<K, V>) {
        let After {
            drop: value,
            clean_eviction: _,
            release,
            write,
            wake,
        } = after;
        match wake {
            Some(Wake::Gone(waiters)) => waiters.into_iter().for_each(|w| w.send(Ok(None))),
            Some(Wake::Pinned {
                waiters,
                slot,
                version,
                value,
            }) => {
                for w in waiters {
                    let pin = self.pin_handle(s, slot, version, Arc::clone(&value));
                    w.send(Ok(Some(pin)));
                }
            }
            // Dropped: the readers see the channel closed.
            Some(Wake::Failed(waiters)) => drop(waiters),
            None => {}
        }
        if let Some(loc) = release {
            self.release(loc);
        }
        if let Some(job) = write {
            self.queue_spill(job);
        }
        if let Some(value) = value {
            self.drop_value(value);
        }
    }

    fn owner(&self) -> Arc<dyn PinOwner<V>> {
        self.me.upgrade().expect("inner is alive while used")
    }

    /// A guard for a pin of slot `idx` of shard `s` already counted on its
    /// entry.
    pub(crate) fn pin_handle(&self, s: usize, idx: u32, version: u64, value: Arc<V>) -> Pinned<V> {
        let at = PinAt {
            shard: s as u32,
            slot: idx,
            version,
        };
        Pinned::new(value, self.owner(), at)
    }

    /// Queue `f` on the pool with a strong handle on `self`.
    pub(crate) fn submit(&self, prio: Priority, f: impl FnOnce(&Inner<K, V>) + Send + 'static) {
        if let Some(me) = self.me.upgrade() {
            self.pool.submit(prio, Box::new(move || f(&me)));
        }
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        let weight = value.weight();
        let value = Arc::new(value);
        let version = self.next_version.fetch_add(1, Relaxed);
        let oversized = weight > self.target();
        let s = self.shard_of(&key);
        let (node, delta) = Node::inserted(key, value, weight, version, oversized);
        let after = self.with_shard(s, |shard| shard.insert(node, delta, || self.next_tick(s)));
        self.act(s, after);
        self.evict_to_target();
    }

    /// Is the write of `key` at `version` still wanted? If not (the entry
    /// was removed or replaced since), the caller drops the job without
    /// writing, and the value stops counting as held by it.
    pub(crate) fn write_wanted(&self, key: &K, version: u64) -> bool {
        let s = self.shard_of(key);
        let (wanted, value) = self.with_shard(s, |shard| shard.write_wanted(key, version));
        if let Some(value) = value {
            self.drop_value(value);
        }
        if !wanted {
            // Memory fell, or at least one job fewer holds it: the waiters
            // may be free to go, or stalled.
            self.wake_mem_waiters();
        }
        wanted
    }

    /// Remove `key`; with `version`, only if it still holds that version.
    pub(crate) fn remove<Q>(&self, key: &Q, version: Option<u64>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let s = self.shard_of(key);
        match self.with_shard(s, |shard| shard.remove(key, version)) {
            Some(after) => {
                self.act(s, after);
                self.space_freed();
                self.wake_mem_waiters();
                true
            }
            None => false,
        }
    }

    /// Let go of a handle on a value. If it is the last handle, the value
    /// is heavy and this is not an IO thread, the free happens on the pool
    /// (see [`HEAVY_DROP`]). Never called under a lock.
    ///
    /// The job goes to the free queue, ahead of everything else: it takes
    /// well under a millisecond, and memory the gauges already count as
    /// free is waiting on it.
    pub(crate) fn drop_value(&self, value: Arc<V>) {
        // A count of one cannot rise under us: no other handle exists to
        // clone from (the crate keeps no `Weak` to values).
        let w = value.weight();
        if Arc::strong_count(&value) == 1 && w >= HEAVY_DROP && !self.pool.on_pool_thread() {
            // Until the job has freed it the value is still the buffer's
            // memory: counted as detached, held by an IO job. If the pool
            // is shut down the job is dropped unrun, which frees the value
            // and settles the gauges all the same.
            if let Some(me) = self.me.upgrade() {
                let freeing = Freeing::new(me, value, w);
                self.pool
                    .submit(Priority::Free, Box::new(move || drop(freeing)));
                return;
            }
        }
        drop(value);
    }

    /// A disk record is dead: account for it, delete its segment on the
    /// pool if that died too, and take up any compaction it asks for.
    fn release(&self, loc: DiskLoc) {
        if let Some(dead) = self.store.release(loc) {
            self.submit(Priority::Background, move |me| {
                me.store.delete(dead);
                me.reclaimed();
            });
        }
        self.reclaimed();
    }

    /// Space may have come back (a record released, a file deleted, holes
    /// punched): if the store says a refused or failed write would now
    /// fit, evictions write again at once instead of at the end of the
    /// back-off; then take up any compaction asked for.
    fn reclaimed(&self) {
        if self.store.take_space_returned() {
            self.eviction.write_succeeded();
            self.evict_to_target();
        }
        self.queue_compactions();
    }

    /// Drain the store's compaction requests onto the pool. Called after
    /// every write and every release.
    pub(crate) fn queue_compactions(&self) {
        for seg in self.store.take_compaction_requests() {
            self.submit(Priority::Background, move |me| me.compact(seg));
        }
    }

    /// Compact segment `seg`, switching each entry to its record's copy
    /// under the entry's shard lock. Runs on the pool.
    fn compact(&self, seg: u32) {
        let span = JobSpan::compact(&self.telemetry, || {
            self.store.path_of(DiskLoc::new(seg, 0, 1))
        });
        let done = self.store.compact(seg, |key, old, new| {
            self.with_shard(self.shard_of(key), |shard| shard.relocate(key, old, new))
        });
        span.record("moved", done.moved);
        span.record("retry", done.retry as u64);
        drop(span);
        Metrics::add(&self.metrics.compacted, done.moved);
        // A pass that must be tried again (a read of a record was in
        // flight) was queued again by the store, still marked compacting:
        // `reclaimed` hands it to the pool with any other request.
        self.reclaimed();
    }

    pub(crate) fn set_target(&self, bytes: usize) {
        self.accounting.set_target(bytes);
        self.evict_to_target();
    }

    /// The stats now; with the `metrics` feature, published too.
    pub(crate) fn stats(&self) -> Stats {
        self.telemetry.stats(|| self.read_stats())
    }

    /// From the IO pool's ticks: publish the stats if they changed.
    #[cfg(feature = "metrics")]
    pub(crate) fn publish_stats(&self) {
        self.telemetry.tick(|| self.read_stats());
    }

    fn read_stats(&self) -> Stats {
        let g = self.accounting.read();
        let mut st = Stats {
            memory_bytes: (g.resident + g.detached) as u64,
            memory_count: (g.count + g.detached_count) as u64,
            spilling_bytes: g.spilling as u64,
            detached_bytes: g.detached as u64,
            detached_count: g.detached_count as u64,
            set_aside_bytes: g.set_aside as u64,
            spilled_weight_bytes: g.spilled_weight as u64,
            io_busy_seconds_total: self.pool.busy_seconds(),
            disk_bytes: self.store.disk_bytes(),
            disk_count: self.store.disk_count(),
            file_bytes: self.store.file_bytes(),
            ..Stats::default()
        };
        self.metrics.fill(&mut st);
        for shard in self.shards.iter() {
            st.locked_pins_total += shard.core.read().locked_pins();
        }
        st
    }
}

impl<K: Key, V: Spill> Inner<K, V> {
    /// What follows a pin's release, once the shard is unlocked: drop the
    /// value the shard let go of (`freed`: a clean eviction if `true`),
    /// and evict if needed.
    fn after_unpin(&self, freed: Option<(Arc<V>, bool)>) {
        let freed_any = freed.is_some();
        if let Some((value, clean_eviction)) = freed {
            if clean_eviction {
                Metrics::add(&self.metrics.clean_evictions, 1);
            }
            self.drop_value(value);
        }
        // An unpin that freed nothing moved neither the resident nor the
        // spilling gauge, so it cannot release an `insert_async` waiter;
        // it needs eviction only if the value it made evictable passes
        // the target.
        if freed_any {
            self.evict_to_target();
        } else {
            self.check_target();
        }
    }

    /// A consume of the pin `hits`, which the shard orders.
    fn release_hit(&self, hits: Arc<HitPins<V>>) {
        let target = self.target();
        let s = hits.at().shard as usize;
        let freed = self.with_shard(s, |shard| {
            shard.consume_hit(hits, target, || self.next_tick(s))
        });
        self.after_unpin(freed);
    }
}

impl<K: Key, V: Spill> PinOwner<V> for Inner<K, V> {
    fn repin(&self, at: PinAt) {
        self.with_shard(at.shard as usize, |shard| shard.repin(at.slot, at.version));
    }

    fn unpin(&self, at: PinAt, consume: bool, guard: Arc<V>) {
        let target = self.target();
        let s = at.shard as usize;
        let freed = self.with_shard(s, |shard| {
            shard.unpin(at.slot, at.version, consume, target, || self.next_tick(s))
        });
        // The guard's handle goes first, so that the entry's (if freed) is
        // the last one and the free happens on the pool.
        self.drop_value(guard);
        self.after_unpin(freed);
    }

    fn consume_hit(&self, hits: Arc<HitPins<V>>) {
        self.release_hit(hits);
    }
}

/// A heavy value on its way to be freed on the IO pool (see
/// [`Inner::drop_value`]), counted as detached until it is: the gauges are
/// settled when this is dropped, whether the job ran or was dropped unrun
/// at shutdown.
struct Freeing<K: Key, V: Spill> {
    inner: Arc<Inner<K, V>>,
    value: Option<Arc<V>>,
    weight: usize,
}

impl<K: Key, V: Spill> Freeing<K, V> {
    fn new(inner: Arc<Inner<K, V>>, value: Arc<V>, weight: usize) -> Self {
        inner.accounting.apply_unsharded(Delta::freeing(weight));
        Freeing {
            inner,
            value: Some(value),
            weight,
        }
    }
}

impl<K: Key, V: Spill> Drop for Freeing<K, V> {
    fn drop(&mut self) {
        drop(self.value.take());
        self.inner
            .accounting
            .apply_unsharded(Delta::freeing(self.weight).negate());
        self.inner.wake_mem_waiters();
    }
}

/// Outcome of waiting on a read whose sender went away.
pub(crate) fn closed<V>() -> PinResult<V> {
    Err(Error::Closed)
}

#[cfg(test)]
mod tests {
    use super::LockedShard;

    /// `Builder::shards` documents about 1.5 KiB per shard before any key:
    /// this, and the eight stripes of its lock, a cache line each.
    #[test]
    fn a_shard_costs_under_2_kib() {
        let shard = std::mem::size_of::<LockedShard<u64, Vec<f64>>>() + 8 * 128;
        assert!(shard <= 2048, "{shard} bytes per shard");
    }
}
