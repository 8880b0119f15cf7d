//! What a host sees of a buffer from outside: the counters kept as atomics
//! on the hot paths and read as one [`Stats`] snapshot ([`stats`]); their
//! publication through the `metrics` facade (`publish`, feature `metrics`);
//! and the tracing spans around the IO pool's jobs ([`spans`], feature
//! `tracing`). [`Telemetry`] holds a buffer's part of these. Gauges that
//! the index owns (resident bytes and counts) live in the index; this
//! module holds the totals.

#[cfg(feature = "metrics")]
mod publish;
pub(crate) mod spans;
mod stats;
mod telemetry;

pub use stats::Stats;
pub(crate) use telemetry::Telemetry;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The counters behind the `*_total` fields of [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub spilled_bytes: AtomicU64,
    pub spill_count: AtomicU64,
    pub unspilled_bytes: AtomicU64,
    pub unspill_count: AtomicU64,
    pub clean_evictions: AtomicU64,
    pub spill_errors: AtomicU64,
    pub encode_errors: AtomicU64,
    pub io_errors: AtomicU64,
    pub budget_refusals: AtomicU64,
    pub compacted: AtomicU64,
    pub spill_nanos: AtomicU64,
    pub unspill_nanos: AtomicU64,
    pub records_sent: AtomicU64,
    pub records_sent_encoded: AtomicU64,
    pub records_sent_bytes: AtomicU64,
    pub records_received: AtomicU64,
    pub records_received_bytes: AtomicU64,
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
        stats.spill_errors_encode_total = self.encode_errors.load(Relaxed);
        stats.spill_errors_io_total = self.io_errors.load(Relaxed);
        stats.spill_budget_refusals_total = self.budget_refusals.load(Relaxed);
        stats.compacted_count_total = self.compacted.load(Relaxed);
        stats.spill_seconds_total = self.spill_nanos.load(Relaxed) as f64 * 1e-9;
        stats.unspill_seconds_total = self.unspill_nanos.load(Relaxed) as f64 * 1e-9;
        stats.records_sent_total = self.records_sent.load(Relaxed);
        stats.records_sent_encoded_total = self.records_sent_encoded.load(Relaxed);
        stats.records_sent_bytes_total = self.records_sent_bytes.load(Relaxed);
        stats.records_received_total = self.records_received.load(Relaxed);
        stats.records_received_bytes_total = self.records_received_bytes.load(Relaxed);
    }
}
