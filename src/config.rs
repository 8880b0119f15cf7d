//! The builder: every setting of a [`SpillBuffer`], checked once in
//! [`Builder::build`].

use crate::buffer::SpillBuffer;
use crate::codec::Compression;
use crate::error::{Error, Result};
use crate::store::storage::{FsStorage, Storage};
use crate::value::Spill;
use std::fmt::Debug;
use std::hash::Hash;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

/// Settings for a [`SpillBuffer`]; made by [`SpillBuffer::builder`].
pub struct Builder<K, V> {
    pub(crate) dirs: Vec<PathBuf>,
    pub(crate) memory_target: usize,
    pub(crate) memory_limit: Option<usize>,
    pub(crate) max_spill: u64,
    pub(crate) compression: Compression,
    pub(crate) io_threads: usize,
    pub(crate) segment_size: u64,
    pub(crate) compact_below: f64,
    pub(crate) shards: usize,
    pub(crate) storage: Arc<dyn Storage>,
    _types: PhantomData<fn(K, V)>,
}

impl<K, V> Debug for Builder<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("dirs", &self.dirs)
            .field("memory_target", &self.memory_target)
            .field("memory_limit", &self.memory_limit)
            .field("max_spill", &self.max_spill)
            .field("compression", &self.compression)
            .field("io_threads", &self.io_threads)
            .field("segment_size", &self.segment_size)
            .field("compact_below", &self.compact_below)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl<K, V> Builder<K, V>
where
    K: Hash + Eq + Clone + Debug + Send + Sync + 'static,
    V: Spill,
{
    pub(crate) fn new(dir: PathBuf) -> Self {
        Builder {
            dirs: vec![dir],
            memory_target: 1 << 30,
            memory_limit: None,
            max_spill: u64::MAX,
            compression: Compression::Lz4,
            io_threads: 2,
            segment_size: 64 << 20,
            compact_below: 0.7,
            shards: 16,
            storage: Arc::new(FsStorage),
            _types: PhantomData,
        }
    }

    /// Bytes of values (by [`Spill::weight`]) kept in memory before the least
    /// recently used are spilled. Defaults to: 1 GiB.
    pub fn memory_target(mut self, bytes: usize) -> Self {
        self.memory_target = bytes;
        self
    }

    /// Bytes of resident values (including those being written) above which
    /// [`SpillBuffer::insert_async`] waits. Must be at least the target.
    /// Defaults to: the memory target, following it when it changes.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Disk budget: bytes of live records (as stored) the buffer may keep on
    /// disk; a spill that would pass it is refused and the value stays in
    /// memory. Defaults to: unlimited.
    pub fn max_spill(mut self, bytes: u64) -> Self {
        self.max_spill = bytes;
        self
    }

    /// Per-record compression. Defaults to: [`Compression::Lz4`], which
    /// stores a record raw when compression does not shrink it.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Threads in the buffer's own IO pool. Defaults to: 2.
    pub fn io_threads(mut self, n: usize) -> Self {
        self.io_threads = n;
        self
    }

    /// Spill directories. Records are spread over them round-robin; one that
    /// fails is passed over for a while. Replaces the directory given to
    /// [`SpillBuffer::builder`]. Defaults to: that one directory.
    pub fn dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.dirs = dirs.into_iter().map(Into::into).collect();
        self
    }

    /// Size of the segment files small records are packed into; a record
    /// larger than this gets a file of its own. Defaults to: 64 MiB.
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// A sealed segment whose live bytes fall below this fraction of its
    /// size is compacted on the IO pool, once the store as a whole holds
    /// more file space than live bytes / fraction plus the open segments
    /// (so a host draining its keys in order does not pay for copying
    /// records that are about to die). Defaults to: 0.7, which keeps file
    /// space within 1/0.7 ≈ 1.43 × live bytes plus the open segments.
    pub fn compact_below(mut self, fraction: f64) -> Self {
        self.compact_below = fraction;
        self
    }

    /// Number of index shards (independent locks). Each shard takes about
    /// 2 KiB before it holds a key: its lock, the heads of its LRU chains
    /// and the owners its pins hold, each on cache lines of its own so
    /// that threads working on different keys do not write the same line.
    /// Defaults to: 16.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// The storage layer segment files are written through. Defaults to:
    /// [`FsStorage`], the local file system. Tests use
    /// [`crate::testing::FaultyStorage`].
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    fn check(&self) -> Result<()> {
        let bad = |setting, detail: String| Err(Error::Config { setting, detail });
        if self.dirs.is_empty() {
            return bad("dirs", "at least one spill directory is needed".into());
        }
        if self.io_threads == 0 {
            return bad("io_threads", "must be at least 1".into());
        }
        if let Some(limit) = self.memory_limit {
            if limit < self.memory_target {
                return bad(
                    "memory_limit",
                    format!("{limit} is below memory_target {}", self.memory_target),
                );
            }
        }
        if self.segment_size < 4096 {
            return bad(
                "segment_size",
                format!("{} is below the minimum of 4096 bytes", self.segment_size),
            );
        }
        if !(0.0..=1.0).contains(&self.compact_below) {
            return bad(
                "compact_below",
                format!("{} is not a fraction in 0..=1", self.compact_below),
            );
        }
        if self.shards == 0 || self.shards > 1 << 16 {
            return bad("shards", format!("{} is not in 1..=65536", self.shards));
        }
        Ok(())
    }

    /// Check the settings, create the private spill directories and start
    /// the IO pool.
    pub fn build(self) -> Result<SpillBuffer<K, V>> {
        self.check()?;
        SpillBuffer::from_builder(self)
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
