//! The builder: every setting of a [`SpillBuffer`](crate::SpillBuffer),
//! checked once into a [`Config`] that the buffer is built from
//! (`Builder::build` lives with the buffer, so that this module depends
//! on nothing of it).

use crate::error::{Error, Result};
use crate::store::codec::Compression;
use crate::store::storage::{FsStorage, Storage};
use std::fmt::Debug;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Read threads of the IO pool unless set ([`Builder::read_threads`]).
const DEFAULT_READ_THREADS: usize = 0;
/// More read threads than this is a mistake (a count of bytes?), refused.
const MAX_READ_THREADS: usize = 1024;

/// Settings for a [`SpillBuffer`](crate::SpillBuffer); made by
/// [`SpillBuffer::builder`](crate::SpillBuffer::builder).
pub struct Builder<K, V> {
    cfg: Config,
    _types: PhantomData<fn(K, V)>,
}

/// Checked settings, as [`Builder::check`] hands them to the buffer.
pub(crate) struct Config {
    pub dirs: Vec<PathBuf>,
    pub memory_target: usize,
    pub memory_limit: Option<usize>,
    pub max_spill: u64,
    pub compression: Compression,
    pub io_threads: usize,
    pub read_threads: usize,
    pub segment_size: u64,
    pub compact_below: f64,
    pub shards: usize,
    pub storage: Arc<dyn Storage>,
    pub name: Option<String>,
    pub metrics_interval: Duration,
}

impl<K, V> Debug for Builder<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.cfg;
        f.debug_struct("Builder")
            .field("dirs", &c.dirs)
            .field("memory_target", &c.memory_target)
            .field("memory_limit", &c.memory_limit)
            .field("max_spill", &c.max_spill)
            .field("compression", &c.compression)
            .field("io_threads", &c.io_threads)
            .field("read_threads", &c.read_threads)
            .field("segment_size", &c.segment_size)
            .field("compact_below", &c.compact_below)
            .field("shards", &c.shards)
            .field("name", &c.name)
            .field("metrics_interval", &c.metrics_interval)
            .finish_non_exhaustive()
    }
}

impl<K, V> Builder<K, V> {
    pub(crate) fn new(dir: PathBuf) -> Self {
        let cfg = Config {
            dirs: vec![dir],
            memory_target: 1 << 30,
            memory_limit: None,
            max_spill: u64::MAX,
            compression: Compression::Lz4,
            io_threads: 2,
            read_threads: DEFAULT_READ_THREADS,
            segment_size: 64 << 20,
            compact_below: 0.7,
            shards: 16,
            storage: Arc::new(FsStorage),
            name: None,
            metrics_interval: Duration::from_secs(1),
        };
        Builder {
            cfg,
            _types: PhantomData,
        }
    }

    /// Bytes of values (by [`Spill::weight`](crate::Spill::weight)) kept in memory before the least
    /// recently used are spilled. Defaults to: 1 GiB.
    pub fn memory_target(mut self, bytes: usize) -> Self {
        self.cfg.memory_target = bytes;
        self
    }

    /// Bytes of resident values (including those being written) above which
    /// [`SpillBuffer::insert_async`](crate::SpillBuffer::insert_async) waits. Must be at least the target.
    /// Defaults to: the memory target, following it when it changes.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.cfg.memory_limit = Some(bytes);
        self
    }

    /// Disk budget: bytes of live records (as stored) the buffer may keep on
    /// disk; a spill that would pass it is refused and the value stays in
    /// memory. Defaults to: unlimited.
    pub fn max_spill(mut self, bytes: u64) -> Self {
        self.cfg.max_spill = bytes;
        self
    }

    /// Per-record compression. Defaults to: [`Compression::Lz4`], which
    /// stores a record raw when compression does not shrink it.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.cfg.compression = compression;
        self
    }

    /// Threads in the buffer's own IO pool. Defaults to: 2.
    pub fn io_threads(mut self, n: usize) -> Self {
        self.cfg.io_threads = n;
        self
    }

    /// Threads that run only the reads of [`pin`](crate::SpillBuffer::pin)
    /// (and of record transfers), besides the IO threads, which take reads
    /// too. A read holds its thread in `pread()` for as long as the disk
    /// takes, so the number of reads the disk sees at once is at most
    /// `io_threads + read_threads`: a solid-state disk reaches its
    /// throughput of small random reads only with tens in flight.
    /// Waiting threads cost no CPU; with the page cache warm, reads are
    /// CPU work and more threads than cores only take turns. 0 leaves reads
    /// to the IO threads alone. Each read thread keeps at most 2 MiB of
    /// scratch buffers. Defaults to: 0 (docs/tuning.md).
    pub fn read_threads(mut self, n: usize) -> Self {
        self.cfg.read_threads = n;
        self
    }

    /// Spill directories. Records are spread over them round-robin; one that
    /// fails is passed over for a while. Replaces the directory given to
    /// [`SpillBuffer::builder`](crate::SpillBuffer::builder). Defaults to: that one directory.
    pub fn dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.cfg.dirs = dirs.into_iter().map(Into::into).collect();
        self
    }

    /// Size of the segment files small records are packed into; a record
    /// larger than this gets a file of its own. Defaults to: 64 MiB.
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.cfg.segment_size = bytes;
        self
    }

    /// A sealed segment whose live bytes fall below this fraction of its
    /// size is compacted on the IO pool, once the store as a whole holds
    /// more file space than live bytes / fraction plus the open segments
    /// (so a host draining its keys in order does not pay for copying
    /// records that are about to die). Defaults to: 0.7, which keeps file
    /// space within 1/0.7 ≈ 1.43 × live bytes plus the open segments.
    pub fn compact_below(mut self, fraction: f64) -> Self {
        self.cfg.compact_below = fraction;
        self
    }

    /// Number of index shards (independent locks). Each shard takes about
    /// 1.5 KiB before it holds a key: its lock (a stripe of a cache line
    /// for each of eight reader slots, so that threads reading one shard
    /// do not write the same line), its table and the heads of its LRU
    /// lists, on cache lines of its own.
    /// Defaults to: 16.
    pub fn shards(mut self, n: usize) -> Self {
        self.cfg.shards = n;
        self
    }

    /// The storage layer segment files are written through. Defaults to:
    /// [`FsStorage`], the local file system. Tests use the `FaultyStorage`
    /// of the `testing` feature, which fails on demand.
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.cfg.storage = storage;
        self
    }

    /// The buffer's name: the `buffer` label of its metrics (feature
    /// `metrics`) and the `buffer` field of its tracing spans (feature
    /// `tracing`), so that several buffers in one process can be told
    /// apart. Give live buffers different names: two with the same name
    /// publish over each other. Defaults to: a number, counting the
    /// buffers built without a name in this process from 1 (`"1"`,
    /// `"2"`, …).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.cfg.name = Some(name.into());
        self
    }

    /// How often at most the IO pool publishes the stats through the
    /// `metrics` facade (feature `metrics`; unused without it): after a
    /// job, or after an idle thread has waited this long for one, when
    /// they changed. Every [`SpillBuffer::stats`](crate::SpillBuffer::stats)
    /// call publishes too. Zero publishes after every job (for tests).
    /// Defaults to: 1 second.
    pub fn metrics_interval(mut self, interval: Duration) -> Self {
        self.cfg.metrics_interval = interval;
        self
    }

    /// The settings, checked: the first bad one is named in the error.
    pub(crate) fn check(self) -> Result<Config> {
        let c = self.cfg;
        let bad = |setting, detail: String| Err(Error::Config { setting, detail });
        if c.dirs.is_empty() {
            return bad("dirs", "at least one spill directory is needed".into());
        }
        if c.io_threads == 0 {
            return bad("io_threads", "must be at least 1".into());
        }
        if c.read_threads > MAX_READ_THREADS {
            return bad(
                "read_threads",
                format!("{} is more than {MAX_READ_THREADS}", c.read_threads),
            );
        }
        if let Some(limit) = c.memory_limit {
            if limit < c.memory_target {
                return bad(
                    "memory_limit",
                    format!("{limit} is below memory_target {}", c.memory_target),
                );
            }
        }
        if c.segment_size < 4096 {
            return bad(
                "segment_size",
                format!("{} is below the minimum of 4096 bytes", c.segment_size),
            );
        }
        if !(0.0..=1.0).contains(&c.compact_below) {
            return bad(
                "compact_below",
                format!("{} is not a fraction in 0..=1", c.compact_below),
            );
        }
        if c.shards == 0 || c.shards > 1 << 16 {
            return bad("shards", format!("{} is not in 1..=65536", c.shards));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b() -> Builder<u64, Vec<u8>> {
        Builder::new(std::env::temp_dir())
    }

    #[test]
    fn bad_settings_name_themselves() {
        let cases: Vec<(Builder<u64, Vec<u8>>, &str)> = vec![
            (b().io_threads(0), "io_threads"),
            (b().read_threads(1025), "read_threads"),
            (b().memory_target(10).memory_limit(5), "memory_limit"),
            (b().segment_size(10), "segment_size"),
            (b().compact_below(1.5), "compact_below"),
            (b().shards(0), "shards"),
            (b().dirs(Vec::<PathBuf>::new()), "dirs"),
        ];
        for (builder, name) in cases {
            let err = builder.build().unwrap_err();
            assert!(
                matches!(&err, Error::Config { setting, .. } if *setting == name),
                "{name}: {err}"
            );
            assert!(err.to_string().contains(name));
        }
    }
}
