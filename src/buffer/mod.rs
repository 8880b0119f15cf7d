//! The public [`SpillBuffer`]: a thin handle over the shared state in
//! [`inner`], which coordinates the parts:
//!
//! - components that own their state, each behind a small interface:
//!   [`accounting`] (the memory gauges, target and limit, and the
//!   `insert_async` waiters), [`eviction`] (the eviction order, the write
//!   back-off, one evictor at a time), [`spill_queue`] (victims waiting
//!   to be written, failures by kind);
//! - [`entry`]: an entry's states and transitions, and the gauge changes
//!   ([`accounting::Delta`]) each makes; [`detached`]: values that outlive
//!   their entry;
//! - [`shard`]: one shard of the index (map, slab, [`lru`] lists), which
//!   applies transitions under its lock and says what to do after it;
//! - [`inner`]: the coordinator, whose fields are private to it; its
//!   operations by concern: `inner::evict` (the eviction loop),
//!   `inner::write` (the write path), `inner::failure` (what a failed
//!   spill does, and when `insert_async` refuses a value), `inner::read`
//!   (the read path and prefetch), `inner::query` (what the index says
//!   of a key without a read or a pin), `inner::transfer` (records handed
//!   out and taken in without decoding);
//! - [`pinned`]: the [`Pinned`] guard; [`hit`]: the pins a lookup takes
//!   under a shard's read lock; [`clock`], [`hash`]: the LRU clock, key
//!   hashing; [`handoff`]: the one-shot a blocking `get` waits on.

pub(crate) mod accounting;
pub(crate) mod clock;
pub(crate) mod detached;
pub(crate) mod entry;
pub(crate) mod eviction;
pub(crate) mod handoff;
pub(crate) mod hash;
pub(crate) mod hit;
pub(crate) mod inner;
pub(crate) mod lru;
pub(crate) mod pinned;
pub(crate) mod shard;
pub(crate) mod spill_queue;
#[cfg(test)]
mod tests;

use crate::config::Builder;
use crate::error::{Error, InsertError, Result, SpillFailure};
use crate::io::{Pool, Readers};
use crate::metrics::Stats;
use crate::store::dirs::{sweep_stale, SpillDirs};
use crate::store::scratch;
use crate::store::{Store, StoreConfig};
use crate::sync::Arc;
use crate::sync::Mutex;
use crate::value::Spill;
use inner::failure::Admission;
pub use inner::query::KeyInfo;
use inner::read::Lookup;
use inner::Inner;
pub use pinned::Pinned;
use pinned::Waiter;
use std::borrow::Borrow;
use std::fmt::{self, Debug};
use std::hash::Hash;
use std::path::PathBuf;

/// Scratch each read thread keeps, per buffer: enough for the records of
/// small values and for compressed values up to about 2 MiB; larger ones
/// read on a read thread allocate their scratch for the read. Many read
/// threads each keeping the IO threads' larger scratch could hold
/// gigabytes that no gauge counts.
const READ_THREAD_SCRATCH: usize = 2 << 20;

/// What a key must be: hashable, comparable, cheap enough to clone (IO jobs
/// carry a copy), printable for error messages, and shareable.
pub trait Key: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
impl<T: Hash + Eq + Clone + Debug + Send + Sync + 'static> Key for T {}

/// Keyed values in memory under a byte target, the least recently used
/// spilled to local disk on a dedicated IO pool.
///
/// A `SpillBuffer` is a cheap, cloneable handle; all clones share one
/// buffer. Dropping the last handle stops the IO threads and deletes the
/// spill directory. See the crate docs for an example.
pub struct SpillBuffer<K, V> {
    handle: Arc<Handle<K, V>>,
}

impl<K, V> Clone for SpillBuffer<K, V> {
    fn clone(&self) -> Self {
        SpillBuffer {
            handle: Arc::clone(&self.handle),
        }
    }
}

/// Owned by the handles only (not by IO jobs or pins), so that its drop
/// marks the moment the last handle goes.
struct Handle<K, V> {
    inner: Arc<Inner<K, V>>,
    dirs: Mutex<Option<SpillDirs>>,
}

impl<K, V> Drop for Handle<K, V> {
    fn drop(&mut self) {
        self.inner.pool().shutdown();
        // Pins may outlive the buffer; their values are in memory, so the
        // files can go.
        drop(self.dirs.lock().take());
    }
}

impl<K: Key, V: Spill> Debug for SpillBuffer<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillBuffer")
            .field("len", &self.len())
            .field("memory_target", &self.memory_target())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<K: Key, V: Spill> Builder<K, V> {
    /// Check the settings, create the private spill directories and start
    /// the IO pool.
    pub fn build(self) -> Result<SpillBuffer<K, V>> {
        let cfg = self.check()?;
        let dirs = SpillDirs::create(&cfg.dirs)?;
        let readers = Readers {
            threads: cfg.read_threads,
            on_start: Some(|| scratch::keep_at_most(READ_THREAD_SCRATCH)),
        };
        #[cfg(feature = "metrics")]
        let pool = Pool::with_periodic(cfg.io_threads, readers, cfg.metrics_interval);
        #[cfg(not(feature = "metrics"))]
        let pool = Pool::with_readers(cfg.io_threads, readers);
        let pool =
            pool.map_err(|e| Error::io("start IO threads", dirs.path(0).to_path_buf(), e))?;
        let store = Store::new(
            dirs.paths().to_vec(),
            Arc::clone(&cfg.storage),
            StoreConfig {
                segment_size: cfg.segment_size,
                max_spill: cfg.max_spill,
                compact_below: cfg.compact_below,
                compression: cfg.compression,
            },
        );
        let inner = Inner::new(&cfg, store, pool);
        #[cfg(feature = "metrics")]
        {
            // Weak: the pool's threads must not keep the buffer alive.
            let weak = Arc::downgrade(&inner);
            inner.pool().on_period(Box::new(move || {
                if let Some(inner) = weak.upgrade() {
                    inner.publish_stats();
                }
            }));
        }
        for parent in cfg.dirs {
            inner.pool().submit(
                crate::io::Priority::Background,
                Box::new(move || drop(sweep_stale(&parent))),
            );
        }
        Ok(SpillBuffer {
            handle: Arc::new(Handle {
                inner,
                dirs: Mutex::new(Some(dirs)),
            }),
        })
    }
}

impl<K: Key, V: Spill> SpillBuffer<K, V> {
    /// Start configuring a buffer that spills into a private sub-directory
    /// of `dir`.
    pub fn builder(dir: impl Into<PathBuf>) -> Builder<K, V> {
        Builder::new(dir.into())
    }

    fn inner(&self) -> &Inner<K, V> {
        &self.handle.inner
    }

    fn lookup<Q>(&self, key: &Q, waiter: Option<Waiter<V>>) -> Lookup<K, V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner().lookup(key, waiter)
    }

    /// Insert `value` under `key`, replacing any old value in either tier.
    ///
    /// Never waits for disk: if memory passes the target, the least recently
    /// used values are queued for writing on the IO pool. A value heavier
    /// than the whole target is queued for writing at once. The `Result`
    /// is kept for errors a future version may detect up front; today
    /// insertion always succeeds.
    pub fn insert(&self, key: K, value: V) -> Result<()> {
        self.inner().insert(key, value);
        Ok(())
    }

    /// Insert, then wait until memory (every value the buffer holds:
    /// resident ones, including those being written, and detached ones —
    /// values of removed or replaced keys still held by a pin or a write;
    /// `Stats::memory_bytes`) is at or below `memory_limit`. Waiters resume in
    /// arrival order. This is the back-pressure a producer should use.
    ///
    /// # Errors
    ///
    /// When memory is over `memory_limit`, no write is in flight and
    /// spilling is failing — the disk is full or failing, `max_spill` is
    /// reached, or the values left in memory are ones whose encode failed
    /// — the value is **not inserted** and comes back in an
    /// [`InsertError`] with its key, and with an [`Error::MemoryLimit`]
    /// whose cause names the failure. The buffer is unchanged (an older
    /// value of the key stays). Pause and retry (each call retries the
    /// writes once the write back-off allows, and waits for that retry's
    /// outcome before deciding), shed the value, or remove keys; spilling
    /// resumes by itself when writes succeed again.
    ///
    /// When the wait after inserting cannot end because nothing more can
    /// be spilled (a write failed meanwhile, or only the host's own pins
    /// keep memory up), it returns `Ok` rather than wait for ever: the
    /// value is in, and the next call refuses if spilling is failing.
    /// Memory therefore stays within `memory_limit` plus the values of
    /// the calls in progress when spilling started to fail.
    ///
    /// Cancel safety: a future dropped before it inserted (only possible
    /// while it waits on writes retried after a failure) drops the value.
    pub async fn insert_async(&self, key: K, value: V) -> Result<(), InsertError<K, V>> {
        let inner = self.inner();
        loop {
            match inner.admission() {
                Admission::Admit => break,
                Admission::Wait => inner.accounting().wait_for_memory().await,
                Admission::Refuse(error) => {
                    return Err(InsertError { key, value, error });
                }
            }
        }
        inner.insert(key, value);
        inner.accounting().wait_for_memory().await;
        Ok(())
    }

    /// The most recent spill failure (key and error: [`Error::Encode`],
    /// [`Error::Io`] or [`Error::DiskBudget`]), or `None` if no spill has
    /// failed. Failures are also counted by cause in [`Stats`] and logged
    /// as `tracing` warnings with the key and the error.
    pub fn last_spill_error(&self) -> Option<SpillFailure<K>> {
        self.inner().last_spill_error()
    }

    /// Retry what failed to spill, now: end the write back-off, and make
    /// the values set aside after an encode error candidates for eviction
    /// again (when the host changed something that may fix them). Then
    /// evict down to the target. Returns how many values were set aside.
    /// Spilling also resumes by itself: a replaced value is no longer set
    /// aside, and the back-off ends with its timer, a successful write or
    /// a `remove`. Walks every entry of every shard holding a set-aside
    /// value: a call for when the host fixed a cause, not for a loop.
    pub fn retry_spills(&self) -> usize {
        self.inner().retry_spills()
    }

    /// Pin `key`'s value, reading it back from disk on this thread if
    /// needed. Blocking: for async callers, use [`SpillBuffer::pin`].
    /// Concurrent readers of the same key share one read.
    ///
    /// Like every lookup, it takes the key or any borrowed form of it
    /// (`&str` for `String` keys, `&[T]` for `Vec<T>` keys).
    pub fn get<Q>(&self, key: &Q) -> Result<Option<Pinned<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.lookup(key, None) {
            Lookup::Hit(p) => return Ok(Some(p)),
            Lookup::Missing => return Ok(None),
            _ => {}
        }
        let (tx, rx) = handoff::channel();
        match self.lookup(key, Some(Waiter::Blocking(tx))) {
            Lookup::Hit(p) => return Ok(Some(p)),
            Lookup::Missing | Lookup::NotResident => return Ok(None),
            Lookup::Joined => {}
            Lookup::Read { key, version, loc } => {
                // Large values dropped earlier may still wait for the pool
                // to free them: free them here first, so that this read's
                // value reuses their pages rather than faulting in fresh
                // ones. This caller blocks on a read anyway.
                self.inner().pool().run_queued_frees();
                self.inner().unspill(key, version, loc)
            }
        }
        rx.recv().unwrap_or_else(inner::closed)
    }

    /// Pin `key`'s value. Never blocks the caller: a value on disk is read
    /// back on the IO pool, and concurrent pins of one key share that read.
    /// Resolves to `None` if the key is absent (or removed meanwhile).
    pub async fn pin<Q>(&self, key: &Q) -> Result<Option<Pinned<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.lookup(key, None) {
            Lookup::Hit(p) => return Ok(Some(p)),
            Lookup::Missing => return Ok(None),
            _ => {}
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self.lookup(key, Some(Waiter::Async(tx))) {
            Lookup::Hit(p) => return Ok(Some(p)),
            Lookup::Missing | Lookup::NotResident => return Ok(None),
            Lookup::Joined => {}
            Lookup::Read { key, version, loc } => self.inner().start_read(key, version, loc),
        }
        rx.await.unwrap_or_else(|_| inner::closed())
    }

    /// Pin `key`'s value if it is in memory; never waits.
    pub fn try_pin<Q>(&self, key: &Q) -> Option<Pinned<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.lookup(key, None) {
            Lookup::Hit(p) => Some(p),
            _ => None,
        }
    }

    /// Hint that `keys` will be needed soon, in this order. Those on disk
    /// are read back on the IO pool, in order, as long as they fit within
    /// the memory target next to what is resident.
    ///
    /// To make room, a prefetch drops only values that cost no IO to drop:
    /// unpinned clean values (whose disk copy is valid), consumed ones
    /// first, then the least recently used, and only values last used
    /// before this call (so the keys of one call, or of an earlier one
    /// read back since, never push each other out). It never queues a
    /// write and never passes the target: a key that does not fit even
    /// then is skipped. A `pin` of a key being prefetched joins its read.
    /// A key whose value was [`Pinned::consume`]d since it was last pinned
    /// is not read back (the host is done with it): pin it to get it again.
    pub fn prefetch(&self, keys: impl IntoIterator<Item = K>) {
        let inner = self.inner();
        let asked = inner.now_published();
        for key in keys {
            inner.queue_prefetch(key, asked);
        }
    }

    /// Remove `key`, freeing its memory and disk space; pending IO for it is
    /// cancelled or discarded. Returns whether the key was present.
    /// Existing [`Pinned`] guards keep the old value alive.
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner().remove(key, None)
    }

    /// Remove `key` and hand its value back; `None` if the key is absent.
    /// A value on disk is read back on the IO pool first, never on the
    /// caller's thread; if that read fails, the error is returned and the
    /// key stays (nothing is lost).
    ///
    /// The value comes back as an `Arc`, without a copy: other holders may
    /// still share it — a [`Pinned`] guard of the key (which keeps reading
    /// the old value), or a write of it still in flight. When none does,
    /// which is the usual case, `Arc::try_unwrap` gives the value itself;
    /// otherwise clone it, or wait for the other holders to go. (A take
    /// that returned `V` would have to fail or copy in that case.)
    ///
    /// If another thread replaces the key while its value is being read
    /// back, the new value is taken instead; if another thread removes it,
    /// the take finds it absent.
    pub async fn take<Q>(&self, key: &Q) -> Result<Option<Arc<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        loop {
            let Some(pin) = self.pin(key).await? else {
                return Ok(None);
            };
            if let Some(value) = self.take_pinned(key, pin) {
                return Ok(Some(value));
            }
        }
    }

    /// [`SpillBuffer::take`] for blocking callers: a value on disk is read
    /// back on this thread, as [`SpillBuffer::get`] does.
    pub fn take_blocking<Q>(&self, key: &Q) -> Result<Option<Arc<V>>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        loop {
            let Some(pin) = self.get(key)? else {
                return Ok(None);
            };
            if let Some(value) = self.take_pinned(key, pin) {
                return Ok(Some(value));
            }
        }
    }

    /// Remove `key` if it still holds the value `pin` holds, and hand that
    /// value back; `None` if it was replaced meanwhile.
    fn take_pinned<Q>(&self, key: &Q, pin: Pinned<V>) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let value = Arc::clone(pin.value());
        let removed = self.inner().remove(key, Some(pin.version()));
        // The pin goes after the entry: the value is the caller's now, not
        // a detached value of the buffer's.
        drop(pin);
        removed.then_some(value)
    }

    /// Evict at least `bytes` of unpinned values now (consumed ones first,
    /// then in the eviction order of docs/design.md), whatever the target. Returns the weight of the
    /// values dropped or queued for writing.
    pub fn evict(&self, bytes: usize) -> usize {
        self.inner().evict_bytes(bytes)
    }

    /// Change the memory target at run time, evicting if needed. A
    /// `memory_limit` left at its default follows the target; one set
    /// explicitly is raised to the target if below it.
    pub fn set_memory_target(&self, bytes: usize) {
        self.inner().set_target(bytes);
    }

    /// The current memory target.
    pub fn memory_target(&self) -> usize {
        self.inner().target()
    }

    /// Tell the buffer whether the host's memory is short (a worker's
    /// process memory over its target fraction, say: memory the buffer does
    /// not see). While `true`, the IO pool takes queued spill writes before
    /// demand reads and prefetches, so that memory falls before more is
    /// allocated for reads; a reader then waits longer. Takes effect for
    /// the next job each IO thread takes. Defaults to: `false`.
    pub fn set_writes_first(&self, on: bool) {
        self.inner().pool().set_writes_first(on);
    }

    /// Wait until all queued IO (spills, reads, prefetches, compaction) has
    /// finished, transfers on a host's stream too
    /// ([`SpillBuffer::receive_record`], [`SpillBuffer::send_record`]):
    /// those wait on their peers.
    pub async fn flush(&self) -> Result<()> {
        self.inner().pool().wait_idle().await;
        Ok(())
    }

    /// Block until all queued IO has finished.
    pub fn flush_blocking(&self) -> Result<()> {
        self.inner().pool().wait_idle_blocking();
        Ok(())
    }

    /// Is `key` present (in either tier)?
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = self.inner();
        inner.with_shard(inner.shard_of(key), |shard| shard.contains(key))
    }

    /// The live keys, in no particular order, without reading any value
    /// back or touching the LRU order. A snapshot: keys inserted or removed
    /// by other threads while it is taken may or may not be in it.
    pub fn keys(&self) -> Vec<K> {
        let inner = self.inner();
        let mut out = Vec::with_capacity(self.len());
        for s in 0..inner.shard_count() {
            inner.with_shard(s, |shard| {
                out.extend(shard.nodes().map(|(_, n)| n.key.clone()))
            });
        }
        out
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.inner().accounting().len()
    }

    /// True when no key is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A snapshot of gauges and counters.
    pub fn stats(&self) -> Stats {
        self.inner().stats()
    }

    /// The buffer's private spill sub-directories, one per configured
    /// directory.
    pub fn spill_dirs(&self) -> Vec<PathBuf> {
        self.handle
            .dirs
            .lock()
            .as_ref()
            .map(|d| d.paths().to_vec())
            .unwrap_or_default()
    }

    /// Check the internal invariants (index, LRU lists, pins, gauges,
    /// segment live bytes). Waits for the IO pool to go idle first; call it
    /// only when no other thread is using the buffer. Meant for tests and
    /// fuzzing; returns a description of the first violation found.
    #[doc(hidden)]
    #[cfg(any(test, feature = "testing"))]
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.inner().validate()
    }
}
