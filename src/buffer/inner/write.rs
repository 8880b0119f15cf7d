//! The write path: victims chosen by eviction wait in one spill queue,
//! drained by a job on the IO pool; large values are written one job each,
//! small ones packed together ([`Store::put_batch`](crate::store::Store)).
//! Each outcome is applied to its entry (spill done or failed) under the
//! entry's shard lock; a failure goes to [`super::failure`].

use super::Inner;
use crate::buffer::spill_queue::SpillJob;
use crate::buffer::Key;
use crate::io::Priority;
use crate::metrics::spans::JobSpan;
use crate::metrics::Metrics;
use crate::store::put::IN_PLACE_MIN;
use crate::store::DiskLoc;
use crate::value::Spill;
use std::time::Instant;

impl<K: Key, V: Spill> Inner<K, V> {
    /// Queue a victim for writing; the first one in an empty queue also
    /// queues the job that drains it.
    pub(crate) fn queue_spill(&self, job: SpillJob<K, V>) {
        if self.spill_queue.push(job) {
            self.submit(Priority::Spill, |me| me.drain_spills());
        }
    }

    /// Is `key` still at `version` (not removed or replaced since its
    /// write was queued)? If not, the caller must drop the job unwritten.
    fn still_live(&self, key: &K, version: u64) -> bool {
        self.write_wanted(key, version)
    }

    /// Write out everything queued: large values one by one, small ones
    /// packed. Runs on the pool.
    fn drain_spills(&self) {
        let jobs = self.spill_queue.take();
        let mut small = Vec::new();
        for job in jobs {
            if job.value.weight() >= IN_PLACE_MIN {
                // A job each, so that both IO threads can take them.
                self.submit(Priority::Spill, move |me| me.spill(job));
            } else if self.still_live(&job.key, job.version) {
                small.push(job);
            }
        }
        if small.is_empty() {
            return;
        }
        let span = JobSpan::spill_batch(&self.telemetry, small.len(), || {
            small.iter().map(|j| j.value.weight()).sum()
        });
        let (mut bytes, mut failed) = (0, 0);
        let start = Instant::now();
        let items: Vec<(&K, &V)> = small.iter().map(|j| (&j.key, &*j.value)).collect();
        let epoch = self.store.space_epoch();
        // Each record's outcome is applied as soon as its write is done,
        // so that memory is freed batch by batch. The jobs' handles on the
        // values go at the end; on the pool a free happens in place anyway.
        self.store.put_batch(&items, |i, res| {
            match &res {
                Ok(loc) => bytes += loc.len(),
                Err(_) => failed += 1,
            }
            let job = &small[i];
            self.finish_spill(&job.key, job.version, res, epoch);
        });
        Metrics::add_time(&self.metrics.spill_nanos, start.elapsed());
        span.record("bytes", bytes);
        span.record("failed", failed);
        drop(span);
        drop(items);
        drop(small);
        self.queue_compactions();
    }

    /// Write one value out. Runs on the pool.
    fn spill(&self, job: SpillJob<K, V>) {
        if !self.still_live(&job.key, job.version) {
            return;
        }
        let span = JobSpan::spill(&self.telemetry, &job.key, || job.value.weight());
        let start = Instant::now();
        let epoch = self.store.space_epoch();
        let res = self.store.put(&job.key, &*job.value);
        Metrics::add_time(&self.metrics.spill_nanos, start.elapsed());
        span.outcome(&res, |&loc| loc, |loc| self.store.path_of(loc));
        let SpillJob {
            key,
            version,
            value,
        } = job;
        // The job's handle goes first, so that the entry's is the last one
        // when the entry lets the value go.
        drop(value);
        self.finish_spill(&key, version, res, epoch);
        self.queue_compactions();
    }

    /// Apply a write's outcome to its entry. `epoch` is the store's
    /// [`space_epoch`](crate::store::Store::space_epoch) from before the
    /// write.
    fn finish_spill(&self, key: &K, version: u64, res: crate::error::Result<DiskLoc>, epoch: u64) {
        match res {
            Ok(loc) => self.spill_done(key, version, loc),
            Err(e) => self.spill_failed(key, version, e, epoch),
        }
    }

    fn spill_done(&self, key: &K, version: u64, loc: DiskLoc) {
        Metrics::add(&self.metrics.spill_count, 1);
        Metrics::add(&self.metrics.spilled_bytes, loc.len());
        self.spill_queue.succeeded();
        self.eviction.write_succeeded();
        let s = self.shard_of(key);
        // The shard's change moves `spilling` and `resident` (or
        // `pinned_spilling`): `with_shard` looks at the target again.
        let after = self.with_shard(s, |shard| shard.spill_done(key, version, loc));
        self.act(s, after);
        self.wake_mem_waiters();
    }
}
