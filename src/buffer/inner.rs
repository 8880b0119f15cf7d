//! The shared state behind every [`super::SpillBuffer`] handle: the sharded
//! index, the memory gauges, eviction, and the IO jobs (spill, unspill,
//! prefetch, compaction) that run on the pool.
//!
//! Lock discipline: at most one lock is held at a time (a shard's, the
//! store's, or the memory waiters'), and only for O(1) work. Encoding, IO,
//! dropping values and waking waiters happen after the lock is released.

use super::core::{Core, ListKind, Node, State};
use super::hash::KeyHash;
use super::pinned::{PinAt, PinOwner, PinResult, Pinned, Waiter};
use super::tick::Ticks;
use super::way::{self, WAYS};
use super::Key;
use crate::codec::{self, Codec, Compression};
use crate::error::{BoxError, Error, Result};
use crate::io::{Pool, Priority};
use crate::metrics::{Metrics, Stats};
use crate::store::{record, AfterRelease, DiskLoc, Store};
use crate::value::Spill;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// One shard: its core behind a lock, and the ticks of its two list tails
/// published for lock-free victim selection. Aligned to keep shards on
/// separate cache lines; `repr(C)` with the lock word last, so that it
/// shares one line with the fields a pin or its release writes.
#[repr(C, align(128))]
pub(crate) struct Shard<K, V> {
    tails: [AtomicU64; 2],
    /// The newest LRU tick taken for this shard. Written only under the
    /// shard lock; read without it by [`Ticks::next_synced`].
    clock: AtomicU64,
    /// Weight of this shard's pinned values. Written only under the shard
    /// lock (a load and a store, no read-modify-write), on the shard's own
    /// cache line: pins of keys in different shards never contend on it.
    pinned: AtomicUsize,
    pub core: Mutex<Core<K, V>>,
}

/// Gauges of what is in memory, kept exact under the shard locks.
#[derive(Default)]
pub(crate) struct Gauges {
    /// Weight of values in memory (resident, spilling, pinned).
    pub resident: AtomicUsize,
    pub resident_count: AtomicUsize,
    /// Weight of values with a write queued or running.
    pub spilling: AtomicUsize,
    /// Weight of values both pinned and spilling: counted in the shards'
    /// pinned weight and in `spilling`, so `over_target` adds it back rather
    /// than count it twice.
    pub pinned_spilling: AtomicUsize,
    /// Weight of prefetch reads in flight (memory promised to them).
    pub reserved: AtomicUsize,
    /// Live keys.
    pub len: AtomicUsize,
}

/// A value alone on its cache lines (two, against adjacent-line
/// prefetching), so that the atomics every pin and unpin update do not
/// invalidate the read-mostly fields next to them on other cores.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Aligned so that the `Arc` counts in front of it, which every `Pinned`
/// clone and drop updates, sit on a cache line of their own.
#[repr(align(128))]
pub(crate) struct Inner<K, V> {
    pub shards: Box<[Shard<K, V>]>,
    hasher: KeyHash,
    pub target: AtomicUsize,
    pub limit: AtomicUsize,
    pub limit_follows_target: bool,
    ticks: Ticks,
    next_version: AtomicU64,
    pub g: Padded<Gauges>,
    pub compression: Compression,
    pub store: Store<K>,
    pub pool: Pool,
    pub metrics: Metrics,
    /// `insert_async` callers waiting for memory, oldest first.
    mem_waiters: Mutex<VecDeque<tokio::sync::oneshot::Sender<()>>>,
    mem_waiting: AtomicUsize,
    /// Victims waiting to be written. Whenever it is not empty, a job that
    /// drains it is queued or running: values evicted while a write is in
    /// flight pile up here and go out together.
    spill_queue: Mutex<Vec<SpillJob<K, V>>>,
    /// Serialises prefetch admission (reading `resident` and taking a
    /// reservation) against a prefetched value moving from reserved to
    /// resident. Taken only on the pool, inside a shard lock.
    admission: Mutex<()>,
    /// A disk-budget refusal was logged and no spill has succeeded since.
    budget_logged: AtomicBool,
    backoff: Backoff,
    me: Weak<Inner<K, V>>,
}

/// Buffers reused by the encode/compress/read/decompress steps of one thread.
#[derive(Default)]
struct Scratch {
    a: Vec<u8>,
    b: Vec<u8>,
    /// Small records packed for one write.
    batch: Vec<u8>,
    /// Set by `encode_record`: the record is in `b` (compressed), not `a`.
    b_holds_record: bool,
}

/// Scratch buffers larger than this are released after use rather than
/// kept for the thread's life.
const SCRATCH_KEEP: usize = 64 << 20;

/// Values at least this heavy are freed on the IO pool when the caller's
/// thread would otherwise drop the last handle on them: freeing a large
/// allocation is a `munmap` (and page-table work proportional to its
/// size), which a host's event loop should not pay. Smaller values are
/// freed in place; handing them off would cost more than the free.
pub(crate) const HEAVY_DROP: usize = 1 << 20;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut guard) => {
            let s = &mut *guard;
            let r = f(s);
            for v in [&mut s.a, &mut s.b, &mut s.batch] {
                if v.capacity() > SCRATCH_KEEP {
                    *v = Vec::new();
                }
            }
            r
        }
        // Re-entered (a Spill impl using a buffer inside encode): use fresh
        // buffers rather than fail.
        Err(_) => f(&mut Scratch::default()),
    })
}

fn sub(a: &AtomicUsize, n: usize) {
    a.fetch_sub(n, Relaxed);
}

fn add(a: &AtomicUsize, n: usize) {
    a.fetch_add(n, Relaxed);
}

/// What a lookup for a read found.
pub(crate) enum Lookup<V> {
    Missing,
    Hit(Pinned<V>),
    /// Not in memory and no waiter was given.
    NotResident,
    /// A read is in flight; the waiter was queued on it.
    Joined,
    /// The caller must run (or queue) the read at `loc`.
    Read {
        version: u64,
        loc: DiskLoc,
    },
}

/// Configuration the inner state is built from.
pub(crate) struct InnerConfig<K> {
    pub shards: usize,
    pub target: usize,
    pub limit: Option<usize>,
    pub compression: Compression,
    pub store: Store<K>,
    pub pool: Pool,
}

impl<K: Key, V: Spill> Inner<K, V> {
    pub(crate) fn new(cfg: InnerConfig<K>) -> Arc<Self> {
        let hasher = KeyHash::new();
        Arc::new_cyclic(|me| Inner {
            shards: (0..cfg.shards)
                .map(|_| Shard {
                    core: Mutex::new(Core::with_hash(hasher)),
                    tails: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
                    clock: AtomicU64::new(0),
                    pinned: AtomicUsize::new(0),
                })
                .collect(),
            hasher,
            target: AtomicUsize::new(cfg.target),
            limit: AtomicUsize::new(cfg.limit.unwrap_or(cfg.target)),
            limit_follows_target: cfg.limit.is_none(),
            ticks: Ticks::new(),
            next_version: AtomicU64::new(1),
            g: Padded(Gauges::default()),
            compression: cfg.compression,
            store: cfg.store,
            pool: cfg.pool,
            metrics: Metrics::default(),
            mem_waiters: Mutex::new(VecDeque::new()),
            mem_waiting: AtomicUsize::new(0),
            spill_queue: Mutex::new(Vec::new()),
            admission: Mutex::new(()),
            budget_logged: AtomicBool::new(false),
            backoff: Backoff::new(),
            me: me.clone(),
        })
    }

    pub(crate) fn shard_of(&self, key: &K) -> usize {
        self.shard_of_hash(self.hasher.of(key))
    }

    fn shard_of_hash(&self, hash: u64) -> usize {
        // Middle bits: the table inside the shard uses the low ones for the
        // bucket and the top seven for its control bytes. Scaled by a
        // multiply rather than reduced by `%`: a division costs more than
        // the rest of the hashing.
        let mid = (hash >> 24) & 0xffff_ffff;
        ((mid * self.shards.len() as u64) >> 32) as usize
    }

    /// A tick for a use of an entry of shard `s` by the host. Take it only
    /// under the lock of the shard whose list it orders: two threads that
    /// took theirs first could link in the other order.
    fn next_tick(&self, s: usize) -> u64 {
        let clock = &self.shards[s].clock;
        let t = self.ticks.next(clock.load(Relaxed));
        clock.store(t, Relaxed);
        t
    }

    /// [`Inner::next_tick`] for work on the IO pool: after every tick
    /// taken before the job (see [`Ticks::next_synced`]).
    fn next_tick_synced(&self, s: usize) -> u64 {
        let t = self
            .ticks
            .next_synced(self.shards.iter().map(|sh| sh.clock.load(Relaxed)));
        self.shards[s].clock.store(t, Relaxed);
        t
    }

    pub(crate) fn target(&self) -> usize {
        self.target.load(Relaxed)
    }

    /// Run `f` on shard `s` under its lock, then publish its list tails if
    /// they moved.
    pub(crate) fn with_shard<R>(&self, s: usize, f: impl FnOnce(&mut Core<K, V>) -> R) -> R {
        let shard = &self.shards[s];
        let mut core = shard.core.lock();
        let r = f(&mut core);
        if core.take_tails_moved() {
            shard.tails[0].store(core.tail_tick(ListKind::Clean), Relaxed);
            shard.tails[1].store(core.tail_tick(ListKind::Dirty), Relaxed);
        }
        r
    }

    fn owner(&self) -> Arc<dyn PinOwner<V>> {
        self.me.upgrade().expect("inner is alive while used")
    }

    /// [`WAYS`] [`ShardOwner`]s per shard, for the handles to give their
    /// pins: a thread's pins of shard `s` hold owner
    /// `s * WAYS + way::this_thread()`.
    pub(crate) fn shard_owners(self: &Arc<Self>) -> Box<[Arc<dyn PinOwner<V>>]> {
        (0..self.shards.len() * WAYS)
            .map(|_| -> Arc<dyn PinOwner<V>> {
                Arc::new(ShardOwner {
                    inner: Arc::clone(self),
                })
            })
            .collect()
    }

    /// A guard for a pin of slot `idx` of shard `s` already counted on its
    /// entry. Pins made for a handle hold that shard's owner; those made on
    /// the IO pool (rare: a read that lands) hold the buffer itself.
    fn pin_handle(
        &self,
        s: usize,
        idx: u32,
        version: u64,
        value: Arc<V>,
        owners: Option<&[Arc<dyn PinOwner<V>>]>,
    ) -> Pinned<V> {
        let owner = match owners.and_then(|o| o.get(s * WAYS + way::this_thread())) {
            Some(o) => Arc::clone(o),
            None => self.owner(),
        };
        Pinned::new(
            value,
            owner,
            PinAt {
                shard: s as u32,
                slot: idx,
                version,
            },
        )
    }

    /// Queue `f` on the pool with a strong handle on `self`.
    fn submit(&self, prio: Priority, f: impl FnOnce(&Inner<K, V>) + Send + 'static) {
        if let Some(me) = self.me.upgrade() {
            self.pool.submit(prio, Box::new(move || f(&me)));
        }
    }

    /// Bytes above the target held by unpinned values that no write is
    /// already taking away. Pinned values are the host's working set: they
    /// count against `memory_limit`, not against the eviction target.
    fn over_target(&self) -> usize {
        let r = self.g.resident.load(Relaxed);
        let unheld = r.saturating_sub(self.g.spilling.load(Relaxed));
        let target = self.target();
        // Under the target even before pins are counted: the common case
        // after an unpin, answered without reading every shard.
        if unheld <= target {
            return 0;
        }
        // A value both pinned and being written is already out of `unheld`.
        let pinned_only = self
            .pinned()
            .saturating_sub(self.g.pinned_spilling.load(Relaxed));
        unheld.saturating_sub(pinned_only).saturating_sub(target)
    }

    /// Weight of values with at least one pin, over all shards.
    pub(crate) fn pinned(&self) -> usize {
        self.shards.iter().map(|s| s.pinned.load(Relaxed)).sum()
    }

    /// Change shard `s`'s pinned weight; the caller holds its lock.
    fn add_pinned(&self, s: usize, w: usize) {
        let p = &self.shards[s].pinned;
        p.store(p.load(Relaxed) + w, Relaxed);
    }

    fn sub_pinned(&self, s: usize, w: usize) {
        let p = &self.shards[s].pinned;
        p.store(p.load(Relaxed) - w, Relaxed);
    }

    // ----- pins -------------------------------------------------------

    /// Add a pin to an in-memory node of shard `s` (under its lock).
    fn pin_node(&self, s: usize, core: &mut Core<K, V>, idx: u32) {
        let n = core.node_mut(idx);
        n.pins += 1;
        n.consumed = false;
        if n.pins == 1 {
            self.add_pinned(s, n.weight);
            if matches!(n.state, State::Spilling { .. }) {
                add(&self.g.pinned_spilling, n.weight);
            }
        }
        core.unlink(idx);
    }

    /// Find `key` for a read. With a waiter, a value on disk gets a read
    /// started or joined; without one, only a memory hit pins.
    pub(crate) fn lookup(
        &self,
        key: &K,
        waiter: Option<Waiter<V>>,
        owners: &[Arc<dyn PinOwner<V>>],
    ) -> Lookup<V> {
        let hash = self.hasher.of(key);
        let s = self.shard_of_hash(hash);
        let hit = self.with_shard(s, |core| {
            let Some(idx) = core.find_hashed(hash, key) else {
                return Err(Lookup::Missing);
            };
            let n = core.node_mut(idx);
            let version = n.version;
            match &mut n.state {
                State::Resident { value, .. } | State::Spilling { value } => {
                    let v = Arc::clone(value);
                    self.pin_node(s, core, idx);
                    Ok((idx, version, v))
                }
                State::Unspilling { waiters, .. } => match waiter {
                    Some(w) => {
                        waiters.push(w);
                        Err(Lookup::Joined)
                    }
                    None => Err(Lookup::NotResident),
                },
                State::OnDisk { loc } => match waiter {
                    Some(w) => {
                        let loc = *loc;
                        n.state = State::Unspilling {
                            loc,
                            waiters: Box::new(vec![w]),
                            prefetch: false,
                        };
                        Err(Lookup::Read { version, loc })
                    }
                    None => Err(Lookup::NotResident),
                },
            }
        });
        match hit {
            Ok((idx, version, v)) => Lookup::Hit(self.pin_handle(s, idx, version, v, Some(owners))),
            Err(l) => l,
        }
    }

    // ----- insert / remove ------------------------------------------

    pub(crate) fn insert(&self, key: K, value: V) {
        let weight = value.weight();
        let value = Arc::new(value);
        let version = self.next_version.fetch_add(1, Relaxed);
        let oversized = weight > self.target();
        let s = self.shard_of(&key);
        let job_key = oversized.then(|| key.clone());
        let (old, served, idx) = self.with_shard(s, |core| {
            let old = core.find(&key).map(|i| self.detach(s, core, i));
            let state = if oversized {
                State::Spilling {
                    value: Arc::clone(&value),
                }
            } else {
                State::Resident {
                    value: Arc::clone(&value),
                    disk: None,
                }
            };
            let idx = core.insert(Node::new(key, state, weight, version));
            add(&self.g.resident, weight);
            add(&self.g.resident_count, 1);
            if oversized {
                add(&self.g.spilling, weight);
            } else {
                core.link_front(idx, ListKind::Dirty, self.next_tick(s));
            }
            // Readers waiting on the old value's disk read get the new one.
            let mut served = Vec::new();
            let mut old = old;
            if let Some(State::Unspilling { waiters, .. }) = old.as_mut().map(|n| &mut n.state) {
                served = std::mem::take(waiters);
                for _ in 0..served.len() {
                    self.pin_node(s, core, idx);
                }
            }
            (old, served, idx)
        });
        if old.is_none() {
            add(&self.g.len, 1);
        }
        for w in served {
            w.send(Ok(Some(self.pin_handle(
                s,
                idx,
                version,
                Arc::clone(&value),
                None,
            ))));
        }
        if let Some(key) = job_key {
            self.queue_spill(SpillJob {
                key,
                version,
                value,
            });
        } else {
            drop(value);
        }
        if let Some(old) = old {
            self.dispose(old);
        }
        self.evict_to_target();
    }

    /// Take node `idx` out of shard `s`'s index, adjusting the gauges
    /// (under its lock).
    fn detach(&self, s: usize, core: &mut Core<K, V>, idx: u32) -> Node<K, V> {
        let n = core.remove(idx);
        match &n.state {
            State::Resident { .. } | State::Spilling { .. } => {
                sub(&self.g.resident, n.weight);
                sub(&self.g.resident_count, 1);
                if n.pins > 0 {
                    self.sub_pinned(s, n.weight);
                }
                if matches!(n.state, State::Spilling { .. }) {
                    sub(&self.g.spilling, n.weight);
                    if n.pins > 0 {
                        sub(&self.g.pinned_spilling, n.weight);
                    }
                }
            }
            State::Unspilling { prefetch: true, .. } => sub(&self.g.reserved, n.weight),
            _ => {}
        }
        n
    }

    /// Finish off a detached node outside the lock: free its disk record,
    /// tell its waiters it is gone, drop its value.
    fn dispose(&self, node: Node<K, V>) {
        if let Some(loc) = node.state.disk() {
            self.release(loc);
        }
        match node.state {
            State::Unspilling { waiters, .. } => {
                for w in *waiters {
                    w.send(Ok(None));
                }
            }
            State::Resident { value, .. } | State::Spilling { value } => self.drop_value(value),
            State::OnDisk { .. } => {}
        }
    }

    /// Let go of a handle on a value. If it is the last handle, the value
    /// is heavy and this is not an IO thread, the free happens on the pool
    /// (see [`HEAVY_DROP`]). Never called under a lock.
    ///
    /// The job goes to the free queue, ahead of everything else: it takes
    /// well under a millisecond, and memory the gauges already count as
    /// free is waiting on it. Behind a steady stream of reads it could wait
    /// while real memory outgrew the accounting; and each read queued ahead
    /// of it would allocate its value while these pages are still taken,
    /// faulting in fresh ones instead of reusing them.
    fn drop_value(&self, value: Arc<V>) {
        // A count of one cannot rise under us: no other handle exists to
        // clone from (the crate keeps no `Weak` to values).
        if Arc::strong_count(&value) == 1
            && value.weight() >= HEAVY_DROP
            && !self.pool.on_pool_thread()
        {
            // If the pool is shut down the job is dropped here, freeing the
            // value in place: nothing better is left to do.
            self.pool
                .submit(Priority::Free, Box::new(move || drop(value)));
        } else {
            drop(value);
        }
    }

    pub(crate) fn remove(&self, key: &K) -> bool {
        let s = self.shard_of(key);
        let node = self.with_shard(s, |core| core.find(key).map(|i| self.detach(s, core, i)));
        match node {
            Some(node) => {
                sub(&self.g.len, 1);
                self.dispose(node);
                self.wake_mem_waiters();
                true
            }
            None => false,
        }
    }

    /// A disk record is dead: account for it, and queue whatever the store
    /// asks for (deleting an empty segment, compacting a sparse one).
    fn release(&self, loc: DiskLoc) {
        match self.store.release(loc) {
            AfterRelease::Nothing => {}
            AfterRelease::Delete(dead) => {
                self.submit(Priority::Background, move |me| me.store.delete(dead))
            }
            AfterRelease::Compact(seg) => {
                self.submit(Priority::Background, move |me| me.compact(seg))
            }
        }
    }

    // ----- eviction ---------------------------------------------------

    /// Evict until unpinned resident bytes are within the target.
    pub(crate) fn evict_to_target(&self) {
        let writes = self.backoff.allows_writes();
        while self.over_target() > 0 {
            if self.evict_one(writes).is_none() {
                break;
            }
        }
        self.wake_mem_waiters();
    }

    /// Evict at least `bytes` now, whatever the target. Returns the weight
    /// of the values dropped or queued for writing.
    pub(crate) fn evict_bytes(&self, bytes: usize) -> usize {
        let mut done = 0;
        while done < bytes {
            match self.evict_one(true) {
                Some(w) => done += w,
                None => break,
            }
        }
        self.wake_mem_waiters();
        done
    }

    /// Evict the least recently used unpinned entry, clean ones first:
    /// drop it if clean, queue its write if dirty (only if `writes`).
    /// Returns its weight, or `None` when nothing is evictable.
    fn evict_one(&self, writes: bool) -> Option<usize> {
        let kinds: &[ListKind] = if writes {
            &[ListKind::Clean, ListKind::Dirty]
        } else {
            &[ListKind::Clean]
        };
        for &kind in kinds {
            let k = kind as usize;
            for attempt in 0.. {
                // The global LRU entry is the oldest of the shards' tails.
                let (tick, s) = self
                    .shards
                    .iter()
                    .enumerate()
                    .map(|(i, sh)| (sh.tails[k].load(Relaxed), i))
                    .min()
                    .expect("at least one shard");
                if tick == u64::MAX {
                    break;
                }
                // Another thread may have moved that tail meanwhile; retry a
                // few times, then take what the shard has.
                if let Some(w) = self.evict_tail(s, kind, (attempt < 8).then_some(tick)) {
                    return Some(w);
                }
            }
        }
        None
    }

    fn evict_tail(&self, s: usize, kind: ListKind, expect_tick: Option<u64>) -> Option<usize> {
        let taken = self.with_shard(s, |core| {
            let (idx, tick) = core.tail(kind)?;
            if expect_tick.is_some_and(|t| t != tick) {
                return None;
            }
            core.unlink(idx);
            let n = core.node_mut(idx);
            let w = n.weight;
            match std::mem::replace(&mut n.state, State::OnDisk { loc: NO_LOC }) {
                State::Resident {
                    value,
                    disk: Some(loc),
                } => {
                    n.state = State::OnDisk { loc };
                    sub(&self.g.resident, w);
                    sub(&self.g.resident_count, 1);
                    Some((w, Err(value)))
                }
                State::Resident { value, disk: None } => {
                    n.state = State::Spilling {
                        value: Arc::clone(&value),
                    };
                    add(&self.g.spilling, w);
                    Some((w, Ok((n.key.clone(), n.version, value))))
                }
                other => {
                    // Lists hold only resident entries; validate() checks it.
                    n.state = other;
                    None
                }
            }
        })?;
        match taken {
            (w, Err(clean_value)) => {
                Metrics::add(&self.metrics.clean_evictions, 1);
                self.drop_value(clean_value);
                Some(w)
            }
            (w, Ok((key, version, value))) => {
                self.queue_spill(SpillJob {
                    key,
                    version,
                    value,
                });
                Some(w)
            }
        }
    }

    pub(crate) fn set_target(&self, bytes: usize) {
        self.target.store(bytes, Relaxed);
        if self.limit_follows_target {
            self.limit.store(bytes, Relaxed);
        } else {
            self.limit.fetch_max(bytes, Relaxed);
        }
        self.evict_to_target();
    }

    // ----- back-pressure ----------------------------------------------

    fn under_limit(&self) -> bool {
        self.g.resident.load(Relaxed) <= self.limit.load(Relaxed)
    }

    /// Resolves once memory is within the limit. Waiters are served in
    /// arrival order; a newcomer does not overtake a queue.
    pub(crate) async fn wait_for_memory(&self) {
        let rx = {
            let mut q = self.mem_waiters.lock();
            if q.is_empty() && (self.under_limit() || self.stalled()) {
                return;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            q.push_back(tx);
            self.mem_waiting.store(q.len(), SeqCst);
            rx
        };
        // Pairs with the fence in `wake_mem_waiters`: either a thread
        // that just freed memory sees this waiter, or the check below sees
        // the freed memory. (The gauges are relaxed atomics.)
        std::sync::atomic::fence(SeqCst);
        // Memory may have dropped before the waiter was queued.
        self.wake_mem_waiters();
        let _ = rx.await;
    }

    /// No write is in flight, so memory will not fall without the host
    /// acting (unpinning, removing): eviction has already queued every
    /// write it could, and the rest is pinned or failed to spill. Waiting
    /// would never end, so back-pressure is released instead.
    fn stalled(&self) -> bool {
        self.g.spilling.load(Relaxed) == 0
    }

    /// Resolve the waiting `insert_async` calls, all of them in arrival
    /// order, if memory is within the limit or cannot fall.
    fn wake_mem_waiters(&self) {
        // Pairs with the fence in `wait_for_memory`.
        std::sync::atomic::fence(SeqCst);
        if self.mem_waiting.load(SeqCst) == 0 {
            return;
        }
        let ready = {
            let mut q = self.mem_waiters.lock();
            if q.is_empty() || !(self.under_limit() || self.stalled()) {
                return;
            }
            self.mem_waiting.store(0, SeqCst);
            std::mem::take(&mut *q)
        };
        for tx in ready {
            let _ = tx.send(());
        }
    }

    // ----- spill --------------------------------------------------------

    /// Queue a victim for writing; the first one in an empty queue also
    /// queues the job that drains it.
    fn queue_spill(&self, job: SpillJob<K, V>) {
        let first = {
            let mut q = self.spill_queue.lock();
            q.push(job);
            q.len() == 1
        };
        if first {
            self.submit(Priority::Spill, |me| me.drain_spills());
        }
    }

    /// Write out everything queued: large values one by one, small ones
    /// packed into writes of up to [`BATCH_BYTES`]. Runs on the pool.
    fn drain_spills(&self) {
        let jobs = std::mem::take(&mut *self.spill_queue.lock());
        let mut small = Vec::new();
        for job in jobs {
            if job.value.weight() >= IN_PLACE_MIN {
                // A job each, so that both IO threads can take them.
                let SpillJob {
                    key,
                    version,
                    value,
                } = job;
                self.submit(Priority::Spill, move |me| me.spill(key, version, value));
            } else {
                small.push(job);
            }
        }
        if !small.is_empty() {
            self.spill_batch(small);
        }
    }

    /// Encode small values into one buffer of sealed records and write it
    /// with one call per [`BATCH_BYTES`]. A value that fails to encode, or
    /// whose write fails, stays in memory as after a failed single spill.
    fn spill_batch(&self, jobs: Vec<SpillJob<K, V>>) {
        let start = Instant::now();
        let batch_limit = BATCH_BYTES.min(self.store.segment_size() as usize);
        with_scratch(|sc| {
            sc.batch.clear();
            // (job, shard, record length) of the records in `sc.batch`.
            let mut packed: Vec<(SpillJob<K, V>, usize, u64)> = Vec::new();
            for job in jobs {
                let s = self.shard_of(&job.key);
                // Removed or replaced since it was queued: nothing to do.
                if self
                    .with_shard(s, |core| core.find_version(&job.key, job.version))
                    .is_none()
                {
                    continue;
                }
                let res = self
                    .store
                    .check_budget(record::HEADER as u64)
                    .and_then(|()| self.encode_record(&job.key, &job.value, sc));
                match res {
                    Ok(len) => {
                        // A batch stays within one segment: a larger write
                        // would get a file of its own, and the space bound
                        // of compaction assumes segment-sized files.
                        if !packed.is_empty() && sc.batch.len() + len > batch_limit {
                            self.write_batch(std::mem::take(&mut packed), &sc.batch);
                            sc.batch.clear();
                        }
                        let rec = if sc.b_holds_record { &sc.b } else { &sc.a };
                        sc.batch.extend_from_slice(&rec[..len]);
                        packed.push((job, s, len as u64));
                    }
                    Err(e) => self.spill_failed(s, &job.key, job.version, e),
                }
            }
            if !packed.is_empty() {
                self.write_batch(packed, &sc.batch);
            }
            sc.batch.clear();
        });
        Metrics::add_time(&self.metrics.spill_nanos, start.elapsed());
    }

    /// Write the packed records in `buf` with one call and finish each.
    /// If that write fails, they are tried one by one.
    fn write_batch(&self, packed: Vec<(SpillJob<K, V>, usize, u64)>, buf: &[u8]) {
        let records: Vec<(&K, u64)> = packed.iter().map(|(j, _, len)| (&j.key, *len)).collect();
        let res = self.store.write_records(&[buf], &records);
        drop(records);
        match res {
            Ok(locs) => {
                for ((job, s, _), loc) in packed.into_iter().zip(locs) {
                    let (key, version) = job.written();
                    self.spill_done(s, key, version, loc);
                }
            }
            // One record's fate should not hang on its neighbours' (a
            // budget that fits some, a fault that has cleared): each is
            // tried on its own, exactly as an unbatched spill would be.
            Err(_) if packed.len() > 1 => {
                let mut at = 0usize;
                for (job, s, len) in packed {
                    let rec = &buf[at..at + len as usize];
                    at += len as usize;
                    let (key, version) = job.written();
                    match self.store.write(&key, rec) {
                        Ok(loc) => self.spill_done(s, key, version, loc),
                        Err(e) => self.spill_failed(s, &key, version, e),
                    }
                }
            }
            Err(e) => {
                for (job, s, _) in packed {
                    self.spill_failed(s, &job.key, job.version, e.clone());
                }
            }
        }
    }

    /// Write one value out. Runs on the pool.
    fn spill(&self, key: K, version: u64, value: Arc<V>) {
        let s = self.shard_of(&key);
        // Removed or replaced since it was queued: nothing to do.
        if self
            .with_shard(s, |core| core.find_version(&key, version))
            .is_none()
        {
            return;
        }
        let start = Instant::now();
        let res = self.write_value(&key, &value);
        Metrics::add_time(&self.metrics.spill_nanos, start.elapsed());
        drop(value);
        self.queue_compactions();
        match res {
            Ok(loc) => self.spill_done(s, key, version, loc),
            Err(e) => self.spill_failed(s, &key, version, e),
        }
    }

    fn write_value(&self, key: &K, value: &V) -> Result<DiskLoc> {
        // Budget already spent: do not even encode.
        self.store.check_budget(record::HEADER as u64)?;
        if let Some(bytes) = value.as_encoded().filter(|b| b.len() >= IN_PLACE_MIN) {
            return self.write_in_place(key, bytes);
        }
        with_scratch(|sc| {
            let len = self.encode_record(key, value, sc)?;
            let rec = if sc.b_holds_record { &sc.b } else { &sc.a };
            self.store.write(key, &rec[..len])
        })
    }

    /// Encode `value` and seal it as one record in scratch: in `sc.b` when
    /// compressed (`sc.b_holds_record`), else in `sc.a`. Returns its length.
    fn encode_record(&self, key: &K, value: &V, sc: &mut Scratch) -> Result<usize> {
        let buf = &mut sc.a;
        buf.clear();
        buf.resize(record::HEADER, 0);
        match catch_unwind(AssertUnwindSafe(|| value.encode(buf))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(Error::Encode {
                    key: format!("{key:?}"),
                    source: e.into(),
                })
            }
            Err(_) => {
                return Err(Error::Encode {
                    key: format!("{key:?}"),
                    source: Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
                        "encode panicked",
                    )),
                })
            }
        }
        let raw_len = (buf.len() - record::HEADER) as u64;
        let compressed = match self.compression {
            Compression::Lz4 => {
                codec::compress_into(&buf[record::HEADER..], &mut sc.b, record::HEADER)
            }
            Compression::None => None,
        };
        match compressed {
            Some(n) => {
                record::seal(&mut sc.b[..record::HEADER + n], Codec::Lz4, raw_len);
                sc.b_holds_record = true;
                Ok(record::HEADER + n)
            }
            None => {
                record::seal(buf, Codec::Raw, raw_len);
                sc.b_holds_record = false;
                Ok(buf.len())
            }
        }
    }

    /// Write a large value whose memory is its encoding: compressed into
    /// scratch if that pays, else straight from the value's memory behind a
    /// header on the stack, with no copy.
    fn write_in_place(&self, key: &K, bytes: &[u8]) -> Result<DiskLoc> {
        let raw_len = bytes.len() as u64;
        if self.compression == Compression::Lz4 {
            let done = with_scratch(|sc| {
                let n = codec::compress_into(bytes, &mut sc.b, record::HEADER)?;
                let rec = &mut sc.b[..record::HEADER + n];
                record::seal(rec, Codec::Lz4, raw_len);
                Some(self.store.write(key, rec))
            });
            if let Some(res) = done {
                return res;
            }
        }
        // Two pieces, header then payload, with one syscall each: measured
        // faster here than checksumming and writing 256 KiB pieces in turn
        // (17 syscalls, each with the file's write lock and dirty-page
        // throttling check), although that reads the value once instead of
        // twice.
        let mut head = [0u8; record::HEADER];
        record::seal_header(&mut head, Codec::Raw, bytes, raw_len);
        self.store.write_pieces(key, &[&head, bytes])
    }

    fn spill_done(&self, s: usize, key: K, version: u64, loc: DiskLoc) {
        Metrics::add(&self.metrics.spill_count, 1);
        Metrics::add(&self.metrics.spilled_bytes, loc.len());
        self.budget_logged.store(false, Relaxed);
        self.backoff.success();
        let outcome = self.with_shard(s, |core| {
            let idx = core.find_version(&key, version)?;
            let n = core.node_mut(idx);
            let State::Spilling { value } = std::mem::replace(&mut n.state, State::OnDisk { loc })
            else {
                unreachable!("only spill jobs move an entry out of Spilling")
            };
            sub(&self.g.spilling, n.weight);
            if n.pins > 0 {
                sub(&self.g.pinned_spilling, n.weight);
            }
            if n.pins == 0 {
                sub(&self.g.resident, n.weight);
                sub(&self.g.resident_count, 1);
                Some(Ok(value))
            } else {
                // Pinned while it was being written: it stays in memory, now
                // clean; when unpinned it can be dropped without a write.
                n.state = State::Resident {
                    value,
                    disk: Some(loc),
                };
                Some(Err(()))
            }
        });
        match outcome {
            None => self.release(loc), // removed or replaced meanwhile
            Some(Ok(freed)) => {
                drop(freed);
                self.wake_mem_waiters();
            }
            Some(Err(())) => self.evict_to_target(),
        }
    }

    fn spill_failed(&self, s: usize, key: &K, version: u64, err: Error) {
        Metrics::add(&self.metrics.spill_errors, 1);
        self.backoff.failure();
        let budget = matches!(err, Error::DiskBudget { .. });
        if budget {
            Metrics::add(&self.metrics.budget_refusals, 1);
            if !self.budget_logged.swap(true, Relaxed) {
                tracing::warn!(key = ?key, error = %err, "disk budget reached; values stay in memory");
            }
        } else {
            tracing::warn!(key = ?key, error = %err, "spill failed; the value stays in memory");
        }
        self.with_shard(s, |core| {
            let Some(idx) = core.find_version(key, version) else {
                return;
            };
            let n = core.node_mut(idx);
            let State::Spilling { value } =
                std::mem::replace(&mut n.state, State::OnDisk { loc: NO_LOC })
            else {
                unreachable!("only spill jobs move an entry out of Spilling")
            };
            n.state = State::Resident { value, disk: None };
            sub(&self.g.spilling, n.weight);
            if n.pins > 0 {
                sub(&self.g.pinned_spilling, n.weight);
            }
            // Most recently used: the next eviction tries another value
            // rather than this one again.
            if n.pins == 0 {
                core.link_front(idx, ListKind::Dirty, self.next_tick_synced(s));
            }
        });
        // Nothing retries the eviction until the host acts again, so with
        // no other write in flight memory will not fall: `stalled` then
        // releases the waiters rather than leave them waiting forever.
        self.wake_mem_waiters();
    }

    // ----- unspill ------------------------------------------------------

    /// Read `key`'s record back and hand the value to its waiters. Runs on
    /// the pool, or on the caller's thread for a blocking `get`.
    pub(crate) fn unspill(&self, key: K, version: u64, loc: DiskLoc) {
        let start = Instant::now();
        let res = self.read_value(&key, loc).map(Arc::new);
        Metrics::add_time(&self.metrics.unspill_nanos, start.elapsed());
        if res.is_ok() {
            Metrics::add(&self.metrics.unspill_count, 1);
            Metrics::add(&self.metrics.unspilled_bytes, loc.len());
        }
        self.unspill_done(key, version, loc, res);
    }

    fn read_value(&self, key: &K, loc: DiskLoc) -> Result<V> {
        if loc.len() >= IN_PLACE_MIN as u64 {
            return self.read_in_place(key, loc);
        }
        with_scratch(|sc| {
            let path = self.store.read(loc, &mut sc.a)?;
            let corrupt = |detail: String| Error::Corrupt {
                key: format!("{key:?}"),
                path: path.clone(),
                detail,
            };
            let rec = record::open(&sc.a).map_err(corrupt)?;
            let bytes: &[u8] = match rec.codec {
                Codec::Raw => rec.payload,
                Codec::Lz4 => {
                    let raw_len = usize::try_from(rec.raw_len)
                        .map_err(|_| corrupt("record too large for this machine".into()))?;
                    codec::decompress_into(rec.payload, raw_len, &mut sc.b).map_err(corrupt)?;
                    &sc.b
                }
            };
            decode(bytes).map_err(corrupt)
        })
    }

    /// Read a large record back with as few copies as the value type
    /// allows: the header first, then a raw payload straight into the
    /// value's own memory ([`Spill::decode_in_place`]), checksummed piece
    /// by piece while each piece is still in cache; an lz4 payload is read
    /// into scratch and decompressed straight into the value. Types without
    /// an in-place path decode from scratch, as small records do.
    fn read_in_place(&self, key: &K, loc: DiskLoc) -> Result<V> {
        let (file, path) = self.store.file(loc)?;
        let corrupt = |detail: String| Error::Corrupt {
            key: format!("{key:?}"),
            path: path.clone(),
            detail,
        };
        let io = |e| Error::io("read record", path.clone(), e);
        let mut head = [0u8; record::HEADER];
        file.read_exact_at(&mut head, loc.offset).map_err(io)?;
        let (codec, stored, raw_len) = record::parse_header(&head).map_err(corrupt)?;
        if stored.checked_add(record::HEADER as u64) != Some(loc.len()) {
            return Err(corrupt(format!(
                "header says {stored} payload bytes, the index {}",
                loc.len() - record::HEADER as u64
            )));
        }
        let raw_len = usize::try_from(raw_len)
            .map_err(|_| corrupt("record too large for this machine".into()))?;
        let body = loc.offset + record::HEADER as u64;
        let want_crc = record::payload_crc(&head);
        // The first failure inside `fill`, reported as is.
        let mut failed: Option<Error> = None;
        let in_place = match codec {
            Codec::Raw => {
                let mut fill = |dst: &mut [u8]| -> std::result::Result<(), BoxError> {
                    let mut crc = crc32fast::Hasher::new();
                    let mut at = body;
                    for piece in dst.chunks_mut(READ_PIECE) {
                        if let Err(e) = file.read_exact_at(piece, at) {
                            failed = Some(io(e));
                            return Err("read failed".into());
                        }
                        crc.update(piece);
                        at += piece.len() as u64;
                    }
                    if crc.finalize() != want_crc {
                        failed = Some(corrupt("payload checksum mismatch".into()));
                        return Err("checksum mismatch".into());
                    }
                    Ok(())
                };
                decode_in_place::<V>(raw_len, &mut fill)
            }
            Codec::Lz4 => None,
        };
        match in_place {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) => return Err(failed.take().unwrap_or_else(|| corrupt(e))),
            None => {}
        }
        with_scratch(|sc| {
            let stored = stored as usize;
            // Only grow the initialised length: a reused buffer needs no memset.
            if sc.a.len() < stored {
                sc.a.resize(stored, 0);
            }
            sc.a.truncate(stored);
            file.read_exact_at(&mut sc.a, body).map_err(io)?;
            if crc32fast::hash(&sc.a) != want_crc {
                return Err(corrupt("payload checksum mismatch".into()));
            }
            match codec {
                Codec::Raw => decode(&sc.a).map_err(corrupt),
                Codec::Lz4 => {
                    let payload = &sc.a;
                    let mut fill = |dst: &mut [u8]| -> std::result::Result<(), BoxError> {
                        codec::decompress_exact(payload, dst).map_err(|e| {
                            failed = Some(corrupt(e));
                            BoxError::from("decompression failed")
                        })
                    };
                    match decode_in_place::<V>(raw_len, &mut fill) {
                        Some(Ok(v)) => Ok(v),
                        Some(Err(e)) => Err(failed.take().unwrap_or_else(|| corrupt(e))),
                        None => {
                            codec::decompress_into(payload, raw_len, &mut sc.b).map_err(corrupt)?;
                            decode(&sc.b).map_err(corrupt)
                        }
                    }
                }
            }
        })
    }

    fn unspill_done(&self, key: K, version: u64, loc: DiskLoc, res: Result<Arc<V>>) {
        let s = self.shard_of(&key);
        let target = self.target();
        let mut waiters = Vec::new();
        let mut idx_out = 0;
        let res = self.with_shard(s, |core| {
            // Removed or replaced meanwhile: its waiters were answered then.
            let Some(idx) = core.find_version(&key, version) else {
                return res;
            };
            idx_out = idx;
            let n = core.node_mut(idx);
            let State::Unspilling {
                waiters: w,
                prefetch,
                ..
            } = std::mem::replace(&mut n.state, State::OnDisk { loc })
            else {
                unreachable!("only the reader moves an entry out of Unspilling")
            };
            waiters = *w;
            // A value heavier than the target is not kept beyond its pins.
            let keep = res.is_ok() && !(waiters.is_empty() && n.weight > target);
            {
                // A prefetched value moves from reserved to resident in one
                // step as `prefetch_one` sees it: count it resident first,
                // under the admission lock, or a concurrent prefetch could
                // find the room it held free for a moment and take it too.
                let _admission = prefetch.then(|| self.admission.lock());
                if keep {
                    add(&self.g.resident, n.weight);
                    add(&self.g.resident_count, 1);
                }
                if prefetch {
                    sub(&self.g.reserved, n.weight);
                }
            }
            let Ok(value) = &res else { return res };
            if !keep {
                return res;
            }
            n.state = State::Resident {
                value: Arc::clone(value),
                disk: Some(loc),
            };
            if waiters.is_empty() {
                core.link_front(idx, ListKind::Clean, self.next_tick_synced(s));
            } else {
                for _ in 0..waiters.len() {
                    self.pin_node(s, core, idx);
                }
            }
            res
        });
        match res {
            Ok(value) => {
                for w in waiters {
                    w.send(Ok(Some(self.pin_handle(
                        s,
                        idx_out,
                        version,
                        Arc::clone(&value),
                        None,
                    ))));
                }
                drop(value);
                self.evict_to_target();
            }
            Err(e) => {
                tracing::warn!(key = ?key, error = %e, "reading a spilled value failed");
                for w in waiters {
                    w.send(Err(e.clone()));
                }
                self.wake_mem_waiters();
            }
        }
    }

    /// Read `key` back ahead of use if it is on disk and fits within the
    /// target next to what is already resident. Runs on the pool.
    pub(crate) fn prefetch_one(&self, key: K) {
        let s = self.shard_of(&key);
        let target = self.target();
        let start = self.with_shard(s, |core| {
            let idx = core.find(&key)?;
            let n = core.node_mut(idx);
            let State::OnDisk { loc } = n.state else {
                return None;
            };
            // Consumed since its last pin: the host is done with it, and a
            // hint for it is stale (it was queued before the pin, or the
            // host re-hints a window it has passed). Reading it back would
            // be a second read of the same record for nothing.
            if n.consumed {
                return None;
            }
            let w = n.weight;
            // Promise the memory first, so concurrent prefetches cannot
            // together pass the target.
            let _admission = self.admission.lock();
            let unpinned = self.g.resident.load(Relaxed).saturating_sub(self.pinned());
            self.g
                .reserved
                .fetch_update(Relaxed, Relaxed, |r| {
                    (unpinned + r + w <= target).then_some(r + w)
                })
                .ok()?;
            n.state = State::Unspilling {
                loc,
                waiters: Box::default(),
                prefetch: true,
            };
            Some((n.version, loc))
        });
        if let Some((version, loc)) = start {
            self.unspill(key, version, loc);
        }
    }

    pub(crate) fn start_read(&self, key: K, version: u64, loc: DiskLoc) {
        self.submit(Priority::Demand, move |me| me.unspill(key, version, loc));
    }

    pub(crate) fn queue_prefetch(&self, key: K) {
        self.submit(Priority::Background, move |me| me.prefetch_one(key));
    }

    // ----- compaction ---------------------------------------------------

    fn queue_compactions(&self) {
        for seg in self.store.take_compaction_requests() {
            self.submit(Priority::Background, move |me| me.compact(seg));
        }
    }

    /// Rewrite the live records of sparse segment `seg` elsewhere, then
    /// point their entries at the copies. Readers keep using the old copy
    /// until the switch, and the old file stays open until they are done.
    fn compact(&self, seg: u32) {
        let mut retry = false;
        for (old, key) in self.store.live_records(seg) {
            let copy = with_scratch(|sc| {
                let path = self.store.read(old, &mut sc.a)?;
                // Copy only a record that checks: a read that went wrong
                // (a flipped bit, a torn read) must not become the only copy.
                record::open(&sc.a).map_err(|detail| Error::Corrupt {
                    key: format!("{key:?}"),
                    path,
                    detail,
                })?;
                self.store.write(&key, &sc.a)
            });
            let new = match copy {
                Ok(new) => new,
                Err(e) => {
                    tracing::warn!(segment = seg, error = %e, "compaction stopped");
                    break;
                }
            };
            let s = self.shard_of(&key);
            let moved = self.with_shard(s, |core| {
                let idx = core.find(&key)?;
                match &mut core.node_mut(idx).state {
                    State::Resident { disk: Some(l), .. } | State::OnDisk { loc: l }
                        if *l == old =>
                    {
                        *l = new;
                        Some(true)
                    }
                    // A read of the old copy is in flight; try again later.
                    State::Unspilling { loc, .. } if *loc == old => Some(false),
                    _ => None,
                }
            });
            match moved {
                Some(true) => {
                    Metrics::add(&self.metrics.compacted, 1);
                    self.release(old);
                }
                Some(false) => {
                    retry = true;
                    self.release(new);
                }
                None => self.release(new),
            }
        }
        self.store.compaction_done(seg);
        self.queue_compactions();
        if retry {
            self.submit(Priority::Background, move |me| me.compact(seg));
        }
    }

    // ----- introspection ------------------------------------------------

    pub(crate) fn stats(&self) -> Stats {
        let mut st = Stats {
            memory_bytes: self.g.resident.load(Relaxed) as u64,
            memory_count: self.g.resident_count.load(Relaxed) as u64,
            spilling_bytes: self.g.spilling.load(Relaxed) as u64,
            disk_bytes: self.store.disk_bytes(),
            disk_count: self.store.disk_count(),
            file_bytes: self.store.file_bytes(),
            ..Stats::default()
        };
        self.metrics.fill(&mut st);
        st
    }

    /// Check every invariant that holds when no IO is in flight: waits for
    /// the pool to go idle first. The caller must not run other operations
    /// meanwhile.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        self.pool.wait_idle_blocking();
        let (mut resident, mut count, mut spilling, mut pinned, mut len) = (0, 0, 0, 0, 0);
        let mut pinned_spilling = 0;
        let mut disk_records = 0u64;
        // (key, record, state) of every entry with a disk copy, checked
        // against the store after the shard lock is released: one lock at
        // a time, here too.
        let mut owned = Vec::new();
        let mut disk_sum = 0u64;
        for (s, shard) in self.shards.iter().enumerate() {
            let core = shard.core.lock();
            core.validate().map_err(|e| format!("shard {s}: {e}"))?;
            for kind in [ListKind::Clean, ListKind::Dirty] {
                let published = shard.tails[kind as usize].load(Relaxed);
                if published != core.tail_tick(kind) {
                    return Err(format!("shard {s}: stale published tail for {kind:?}"));
                }
            }
            len += core.len();
            let shard_pinned: usize = core
                .nodes()
                .filter(|(_, n)| n.pins > 0)
                .map(|(_, n)| n.weight)
                .sum();
            if shard_pinned != shard.pinned.load(Relaxed) {
                return Err(format!(
                    "shard {s}: pinned gauge {}, its pinned entries weigh {shard_pinned}",
                    shard.pinned.load(Relaxed)
                ));
            }
            for (i, n) in core.nodes() {
                if self.shard_of(&n.key) != s {
                    return Err(format!("key {:?} is in the wrong shard", n.key));
                }
                let in_memory = n.state.value().is_some();
                if n.pins > 0 && !in_memory {
                    return Err(format!("slot {i}: pinned but {}", n.state.name()));
                }
                if in_memory {
                    resident += n.weight;
                    count += 1;
                    if n.pins > 0 {
                        pinned += n.weight;
                    }
                }
                match &n.state {
                    State::Spilling { .. } => {
                        spilling += n.weight;
                        if n.pins > 0 {
                            pinned_spilling += n.weight;
                        }
                    }
                    State::Unspilling { prefetch, .. } => {
                        return Err(format!(
                            "key {:?} still unspilling (prefetch {prefetch}) with the pool idle",
                            n.key
                        ))
                    }
                    _ => {}
                }
                if let Some(loc) = n.state.disk() {
                    disk_records += 1;
                    disk_sum += loc.len();
                    owned.push((n.key.clone(), loc, n.state.name()));
                }
            }
        }
        let g = &self.g;
        let checks = [
            ("resident", resident, g.resident.load(Relaxed)),
            ("resident_count", count, g.resident_count.load(Relaxed)),
            ("spilling", spilling, g.spilling.load(Relaxed)),
            ("pinned", pinned, self.pinned()),
            (
                "pinned_spilling",
                pinned_spilling,
                g.pinned_spilling.load(Relaxed),
            ),
            // With the pool idle no read is in flight (checked above), so
            // no prefetch holds a reservation.
            ("reserved", 0, g.reserved.load(Relaxed)),
            ("len", len, g.len.load(Relaxed)),
        ];
        for (name, counted, gauge) in checks {
            if counted != gauge {
                return Err(format!(
                    "gauge {name} is {gauge}, entries add up to {counted}"
                ));
            }
        }
        if spilling != 0 {
            return Err(format!(
                "{spilling} bytes still spilling with the pool idle"
            ));
        }
        self.store.validate()?;
        // Each record must be live, its entry's key's, and no other entry's:
        // a key has one place on disk.
        let mut locs = std::collections::HashSet::new();
        for (key, loc, state) in owned {
            if self.store.record_key(loc).as_ref() != Some(&key) {
                return Err(format!(
                    "key {key:?} ({state}) points at {loc:?}, not a live record of its own"
                ));
            }
            if !locs.insert((loc.seg, loc.offset)) {
                return Err(format!("key {key:?} shares record {loc:?}"));
            }
        }
        if disk_records != self.store.disk_count() || disk_sum != self.store.disk_bytes() {
            return Err(format!(
                "entries own {disk_records} records / {disk_sum} bytes, store has {} / {}",
                self.store.disk_count(),
                self.store.disk_bytes()
            ));
        }
        let failed = self.metrics.spill_errors.load(Relaxed) > 0;
        if !failed && self.over_target() > 0 {
            return Err(format!(
                "unpinned resident bytes {} pass the target {}",
                resident - pinned,
                self.target()
            ));
        }
        Ok(())
    }
}

/// After a failed spill, evictions by the target stop queueing writes for a
/// while (10 ms, doubling on each further failure up to 1 s, reset by a
/// success): with a broken or full disk, every insert would otherwise
/// re-encode and re-try every value over the target. Clean evictions go on,
/// and an explicit `evict` always tries.
struct Backoff {
    epoch: Instant,
    until_ns: AtomicU64,
    step_ns: AtomicU64,
}

impl Backoff {
    const FIRST_NS: u64 = 10_000_000;
    const MAX_NS: u64 = 1_000_000_000;

    fn new() -> Self {
        Backoff {
            epoch: Instant::now(),
            until_ns: AtomicU64::new(0),
            step_ns: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn allows_writes(&self) -> bool {
        let until = self.until_ns.load(Relaxed);
        until == 0 || self.now_ns() >= until
    }

    fn failure(&self) {
        let step = (self.step_ns.load(Relaxed) * 2).clamp(Self::FIRST_NS, Self::MAX_NS);
        self.step_ns.store(step, Relaxed);
        self.until_ns.store(self.now_ns() + step, Relaxed);
    }

    fn success(&self) {
        if self.until_ns.load(Relaxed) != 0 {
            self.step_ns.store(0, Relaxed);
            self.until_ns.store(0, Relaxed);
        }
    }
}

/// Values whose encoding is at least this large are written from and read
/// into their own memory when their type allows it; below it, one syscall
/// through a reused buffer is cheaper than two without one.
const IN_PLACE_MIN: usize = 64 << 10;

/// Small records are packed into writes of about this many bytes.
const BATCH_BYTES: usize = 1 << 20;

/// A value chosen for eviction, waiting in the spill queue.
struct SpillJob<K, V> {
    key: K,
    version: u64,
    value: Arc<V>,
}

impl<K, V> SpillJob<K, V> {
    /// The job's record is written (or its write is settled): let go of the
    /// pool's handle on the value before the entry is updated, and keep
    /// what names the entry.
    fn written(self) -> (K, u64) {
        (self.key, self.version)
    }
}

/// Piece size of an in-place read: each piece is checksummed right after it
/// lands, while it is still in the core's cache.
const READ_PIECE: usize = 256 << 10;

/// `V::decode`, with a panic turned into an error.
fn decode<V: Spill>(bytes: &[u8]) -> std::result::Result<V, String> {
    match catch_unwind(AssertUnwindSafe(|| V::decode(bytes))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("decode failed: {e}")),
        Err(_) => Err("decode panicked".into()),
    }
}

/// `V::decode_in_place`, with a panic turned into an error. The error of a
/// failed decode is its message; one from `fill` the caller has kept.
fn decode_in_place<V: Spill>(
    len: usize,
    fill: &mut dyn FnMut(&mut [u8]) -> std::result::Result<(), BoxError>,
) -> Option<std::result::Result<V, String>> {
    match catch_unwind(AssertUnwindSafe(|| V::decode_in_place(len, fill))) {
        Ok(Some(Ok(v))) => Some(Ok(v)),
        Ok(Some(Err(e))) => Some(Err(format!("decode failed: {e}"))),
        Ok(None) => None,
        Err(_) => Some(Err("decode panicked".into())),
    }
}

/// Placeholder location used only while a state is being swapped out.
const NO_LOC: DiskLoc = DiskLoc::NONE;

impl<K: Key, V: Spill> PinOwner<V> for Inner<K, V> {
    fn repin(&self, at: PinAt) {
        self.with_shard(at.shard as usize, |core| {
            if let Some(n) = core.get_version(at.slot, at.version) {
                if n.pins > 0 {
                    n.pins += 1;
                }
            }
        });
    }

    fn unpin(&self, at: PinAt, consume: bool, guard: Arc<V>) {
        let target = self.target();
        let freed = self.with_shard(at.shard as usize, |core| {
            let n = core.get_version(at.slot, at.version)?;
            if n.pins == 0 {
                return None;
            }
            n.pins -= 1;
            n.consumed |= consume;
            if n.pins > 0 {
                return None;
            }
            self.sub_pinned(at.shard as usize, n.weight);
            if matches!(n.state, State::Spilling { .. }) {
                sub(&self.g.pinned_spilling, n.weight);
            }
            let free_now = n.consumed || n.weight > target;
            match &n.state {
                State::Resident {
                    disk: Some(loc), ..
                } if free_now => {
                    // Done with, and a valid disk copy exists: free it now.
                    let loc = *loc;
                    let State::Resident { value, .. } =
                        std::mem::replace(&mut n.state, State::OnDisk { loc })
                    else {
                        unreachable!()
                    };
                    sub(&self.g.resident, n.weight);
                    sub(&self.g.resident_count, 1);
                    Some(value)
                }
                State::Resident { disk, .. } => {
                    let kind = if disk.is_some() {
                        ListKind::Clean
                    } else {
                        ListKind::Dirty
                    };
                    if n.consumed {
                        core.link_back(at.slot, kind);
                    } else {
                        core.link_front(at.slot, kind, self.next_tick(at.shard as usize));
                    }
                    None
                }
                _ => None,
            }
        });
        // The guard's handle goes first, so that the entry's (if freed) is
        // the last one and the free happens on the pool.
        self.drop_value(guard);
        let freed_any = freed.is_some();
        if let Some(value) = freed {
            Metrics::add(&self.metrics.clean_evictions, 1);
            self.drop_value(value);
        }
        // An unpin that freed nothing moved neither the resident nor the
        // spilling gauge, so it cannot release an `insert_async` waiter;
        // it needs eviction only if the value it made evictable passes
        // the target. Skipping the rest keeps a fence off the hit path.
        if freed_any || self.over_target() > 0 {
            self.evict_to_target();
        }
    }
}

/// The buffer as the pins of one shard hold it. Each shard has its own, one
/// per [`WAYS`] (owned by the [`super::SpillBuffer`] handles), so that a pin
/// and its release update a reference count that only pins of the same
/// shard, by threads of the same way, share: with one `Arc<Inner>` cloned
/// and dropped by every pin, two threads pinning different keys wrote the
/// same cache line each time.
///
/// Aligned so that each count sits on a cache line of its own. A guard
/// keeps the buffer alive through its owner, even after the last handle
/// is gone.
#[repr(align(128))]
pub(crate) struct ShardOwner<K, V> {
    inner: Arc<Inner<K, V>>,
}

impl<K: Key, V: Spill> PinOwner<V> for ShardOwner<K, V> {
    fn repin(&self, at: PinAt) {
        self.inner.repin(at);
    }

    fn unpin(&self, at: PinAt, consume: bool, value: Arc<V>) {
        self.inner.unpin(at, consume, value);
    }
}

/// Outcome of waiting on a read, for the blocking and async paths alike.
pub(crate) fn closed<V>() -> PinResult<V> {
    Err(Error::Closed)
}

#[cfg(test)]
mod tests {
    use super::{Backoff, Shard, ShardOwner, WAYS};
    use std::alloc::Layout;
    use std::sync::atomic::Ordering::Relaxed;

    /// `Builder::shards` documents about 2 KiB per shard before any key:
    /// the shard, its chain heads and its pins' owners (each owner an
    /// `Arc` allocation: two counts, then the owner at its alignment).
    #[test]
    fn a_shard_costs_about_2_kib() {
        let owner = Layout::new::<[usize; 2]>()
            .extend(Layout::new::<ShardOwner<u64, Vec<f64>>>())
            .unwrap()
            .0
            .pad_to_align()
            .size();
        let shard = std::mem::size_of::<Shard<u64, Vec<f64>>>()
            + super::super::core::CHAIN_HEADS_BYTES
            + WAYS * owner;
        assert!(shard <= 2048, "{shard} bytes per shard");
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let b = Backoff::new();
        assert!(b.allows_writes());
        b.failure();
        assert_eq!(b.step_ns.load(Relaxed), Backoff::FIRST_NS);
        b.failure();
        assert_eq!(b.step_ns.load(Relaxed), 2 * Backoff::FIRST_NS);
        for _ in 0..20 {
            b.failure();
        }
        assert_eq!(b.step_ns.load(Relaxed), Backoff::MAX_NS);
        assert!(!b.allows_writes(), "within a one-second back-off");
        b.success();
        assert!(b.allows_writes());
        assert_eq!(b.step_ns.load(Relaxed), 0);
    }
}
