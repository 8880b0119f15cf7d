//! Spill failures: what each cause does, how it is counted and reported,
//! and when `insert_async` refuses a value because of them.
//!
//! - An encode error is the value's own: writing it again cannot succeed,
//!   and it says nothing about the disk. The value is set aside (kept in
//!   memory, on no eviction list) until it is replaced or the host calls
//!   `retry_spills`; other values go on spilling.
//! - A write error (disk full, another I/O error) or a refusal by
//!   `max_spill` is the disk's: every value would fail the same way for a
//!   while, so target-driven writes back off (`eviction::Eviction`).
//!
//! Each failure is counted by cause, logged with the key and the error
//! (which names the file, or the budget), and kept as the buffer's last
//! spill error. When memory is over `memory_limit`, no write is in flight
//! and one of these failures stands in the way, `insert_async` refuses new
//! values (see [`Admission`]).

use super::Inner;
use crate::buffer::Key;
use crate::error::{Error, SpillFailure};
use crate::metrics::Metrics;
use crate::value::Spill;

/// What `insert_async` does with a value before inserting it.
pub(crate) enum Admission {
    /// Insert it (then wait for memory, as always): memory is within the
    /// limit, writes that may bring it down are in flight, or only the
    /// host's pins keep it above (they are the host's to release).
    Admit,
    /// Spilling is failing and writes are in flight to try again: wait for
    /// their outcome, then ask again.
    Wait,
    /// Memory is over the limit, nothing is being written and nothing more
    /// can be: hand the value back with this error.
    Refuse(Error),
}

impl<K: Key, V: Spill> Inner<K, V> {
    /// A write of `key` (at `version`) failed with `err`: count, log and
    /// remember it, and put the value back in memory (set aside if its
    /// encode failed). `epoch` is the store's space epoch from before the
    /// write.
    pub(crate) fn spill_failed(&self, key: &K, version: u64, err: Error, epoch: u64) {
        Metrics::add(&self.metrics.spill_errors, 1);
        let encode = matches!(err, Error::Encode { .. });
        match &err {
            Error::Encode { .. } => {
                Metrics::add(&self.metrics.encode_errors, 1);
                tracing::warn!(
                    key = ?key,
                    error = %err,
                    "encode failed; the value stays in memory, set aside from spilling until replaced or retried"
                );
            }
            Error::DiskBudget { .. } => {
                Metrics::add(&self.metrics.budget_refusals, 1);
                self.eviction.write_failed();
                if self.spill_queue.budget_refused() {
                    tracing::warn!(key = ?key, error = %err, "disk budget reached; values stay in memory");
                }
            }
            _ => {
                Metrics::add(&self.metrics.io_errors, 1);
                self.eviction.write_failed();
                tracing::warn!(key = ?key, error = %err, "spill failed; the value stays in memory");
            }
        }
        self.spill_queue.failed(key, err, encode);
        let s = self.shard_of(key);
        // A value the write held last (its key removed or replaced
        // meanwhile) is dropped here, after the shard lock.
        let last_holder = self.with_shard(s, |shard| {
            shard.spill_failed(key, version, encode, || self.next_tick_synced(s))
        });
        drop(last_holder);
        // Space came back while this write was failing: whoever took that
        // news may have found nothing to write (this value was still being
        // written) and cleared the back-off before this failure set it.
        // Nothing else would try again until the host acts, so try now.
        if !encode && self.store.space_epoch() != epoch {
            self.eviction.write_succeeded();
            self.evict_to_target();
        }
        // Nothing retries the eviction until the host acts again, so with
        // no other write in flight memory will not fall: `stalled` then
        // releases the waiters, and `admission` tells them why.
        self.wake_mem_waiters();
    }

    /// The most recent spill failure, if any.
    pub(crate) fn last_spill_error(&self) -> Option<SpillFailure<K>> {
        self.spill_queue.last_failure()
    }

    /// Try again what failed: end the write back-off, and make every
    /// set-aside value a candidate for eviction again. Returns how many
    /// values were set aside. Walks every entry of every shard holding one
    /// (under that shard's lock): meant for a host that fixed a cause, not
    /// for a loop.
    pub(crate) fn retry_spills(&self) -> usize {
        self.eviction.write_succeeded();
        let mut n = 0;
        if self.accounting.set_aside() > 0 {
            for s in 0..self.shards.len() {
                n += self.with_shard(s, |shard| shard.retry_spills(|| self.next_tick_synced(s)));
            }
        }
        self.evict_to_target();
        n
    }

    /// Keys were removed: space on disk or in the budget may be free, so
    /// the next eviction may write at once rather than wait out the
    /// back-off.
    pub(crate) fn space_freed(&self) {
        self.eviction.write_succeeded();
    }

    /// Whether `insert_async` inserts its value, waits for the writes in
    /// flight first, or refuses it.
    ///
    /// While spills succeed this admits at once, so `insert_async` inserts
    /// and then waits (its documented order). Once a write has failed, a
    /// value is admitted over the limit only after a write succeeds again:
    /// otherwise each end of the back-off, whose retried writes are in
    /// flight for a moment, would let one more value in per caller, and
    /// memory would creep up for as long as the disk stays full.
    pub(crate) fn admission(&self) -> Admission {
        let limit = self.accounting.limit();
        if self.accounting.memory_held() <= limit {
            return Admission::Admit;
        }
        // Over the limit. Evict again: a back-off may have ended, and
        // retrying is what the caller's call is for.
        self.evict_to_target();
        if self.accounting.io_in_flight() {
            return if self.eviction.failing() {
                Admission::Wait
            } else {
                Admission::Admit
            };
        }
        let memory = self.accounting.memory_held();
        // Eviction is done with what it can do. What it could not evict
        // (unpinned bytes over the target) is held by a failure: values
        // set aside, or dirty values the write back-off keeps. With none,
        // the host's pins are what keep memory over the limit.
        let excess = self.over_target();
        if memory <= limit || excess == 0 {
            return Admission::Admit;
        }
        let set_aside = self.accounting.set_aside();
        match self
            .spill_queue
            .cause(self.eviction.failing(), excess, set_aside)
        {
            Some(cause) => Admission::Refuse(Error::MemoryLimit {
                memory: memory as u64,
                limit: limit as u64,
                cause: Box::new(cause),
            }),
            None => Admission::Admit,
        }
    }
}
