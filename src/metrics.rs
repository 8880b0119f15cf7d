//! Counters kept as atomics on the hot paths and read as one [`Stats`]
//! snapshot. Gauges that the index owns (resident bytes and counts) live in
//! the index; this module holds the totals.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A snapshot of a buffer's state and counters, from
/// [`crate::SpillBuffer::stats`]. Gauges are read one by one without a global
/// lock, so under concurrent use they may be a few operations apart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Weight of the values held in memory (including those being written).
    pub memory_bytes: u64,
    /// Number of values held in memory.
    pub memory_count: u64,
    /// Weight of the resident values queued for, or in the middle of, a write.
    pub spilling_bytes: u64,
    /// Bytes of the live records on disk, as stored (after compression).
    pub disk_bytes: u64,
    /// Number of live records on disk.
    pub disk_count: u64,
    /// Disk space the spill files occupy.
    pub file_bytes: u64,
    /// Encoded bytes written to disk, over the buffer's life.
    pub spilled_bytes_total: u64,
    /// Records written to disk, over the buffer's life.
    pub spill_count_total: u64,
    /// Encoded bytes read back from disk, over the buffer's life.
    pub unspilled_bytes_total: u64,
    /// Records read back from disk, over the buffer's life.
    pub unspill_count_total: u64,
    /// Evictions that needed no write because a valid disk copy existed.
    pub clean_evictions_total: u64,
    /// Spills that failed (encode error, I/O error, disk budget); the value
    /// stayed in memory.
    pub spill_errors_total: u64,
    /// Of `spill_errors_total`, those refused because of `max_spill`.
    pub spill_budget_refusals_total: u64,
    /// Records rewritten by compaction, over the buffer's life.
    pub compacted_count_total: u64,
    /// Seconds the IO pool spent on spill jobs.
    pub spill_seconds_total: f64,
    /// Seconds spent reading records back (IO pool or blocking `get`).
    pub unspill_seconds_total: f64,
}

/// The counters behind the `*_total` fields of [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub spilled_bytes: AtomicU64,
    pub spill_count: AtomicU64,
    pub unspilled_bytes: AtomicU64,
    pub unspill_count: AtomicU64,
    pub clean_evictions: AtomicU64,
    pub spill_errors: AtomicU64,
    pub budget_refusals: AtomicU64,
    pub compacted: AtomicU64,
    pub spill_nanos: AtomicU64,
    pub unspill_nanos: AtomicU64,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_time(counter: &AtomicU64, d: Duration) {
        counter.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Fill the `*_total` fields of `stats`.
    pub(crate) fn fill(&self, stats: &mut Stats) {
        stats.spilled_bytes_total = self.spilled_bytes.load(Relaxed);
        stats.spill_count_total = self.spill_count.load(Relaxed);
        stats.unspilled_bytes_total = self.unspilled_bytes.load(Relaxed);
        stats.unspill_count_total = self.unspill_count.load(Relaxed);
        stats.clean_evictions_total = self.clean_evictions.load(Relaxed);
        stats.spill_errors_total = self.spill_errors.load(Relaxed);
        stats.spill_budget_refusals_total = self.budget_refusals.load(Relaxed);
        stats.compacted_count_total = self.compacted.load(Relaxed);
        stats.spill_seconds_total = self.spill_nanos.load(Relaxed) as f64 * 1e-9;
        stats.unspill_seconds_total = self.unspill_nanos.load(Relaxed) as f64 * 1e-9;
    }
}
