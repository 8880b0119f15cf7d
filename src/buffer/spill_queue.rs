//! The spill queue: victims chosen by eviction wait here to be written,
//! and the outcome of the writes that failed is kept here by cause.
//!
//! Whenever the queue is not empty, a job that drains it is queued or
//! running on the IO pool (the first victim in an empty queue asks for
//! it): values evicted while a write is in flight pile up and go out
//! together.
//!
//! Failures are kept by kind: the most recent of any cause (for the host,
//! `last_spill_error`), the most recent write failure (I/O error or
//! `max_spill`) and the most recent encode failure, which `insert_async`
//! names when it refuses a value.

use crate::error::{Error, SpillFailure};
use crate::sync::atomic::{AtomicBool, Ordering::Relaxed};
use crate::sync::Arc;
use crate::sync::Mutex;

/// A value chosen for eviction, waiting to be written.
pub(crate) struct SpillJob<K, V> {
    pub key: K,
    pub version: u64,
    pub value: Arc<V>,
}

/// Victims waiting to be written, and the failures of those written.
pub(crate) struct SpillQueue<K, V> {
    jobs: Mutex<Vec<SpillJob<K, V>>>,
    failures: Mutex<Failures<K>>,
    /// A disk-budget refusal was logged and no spill has succeeded since.
    budget_logged: AtomicBool,
}

struct Failures<K> {
    /// The most recent failure of any cause, for the host.
    last: Option<SpillFailure<K>>,
    /// The most recent write failure (I/O error or `max_spill`): the cause
    /// reported while writes are failing.
    write: Option<Error>,
    /// The most recent encode failure: the cause reported while values are
    /// set aside.
    encode: Option<Error>,
}

impl<K: Clone, V> SpillQueue<K, V> {
    pub(crate) fn new() -> Self {
        SpillQueue {
            jobs: Mutex::new(Vec::new()),
            failures: Mutex::new(Failures {
                last: None,
                write: None,
                encode: None,
            }),
            budget_logged: AtomicBool::new(false),
        }
    }

    /// Queue a victim. Returns `true` when the queue was empty: the caller
    /// then queues the job that drains it.
    pub(crate) fn push(&self, job: SpillJob<K, V>) -> bool {
        let mut q = self.jobs.lock();
        q.push(job);
        q.len() == 1
    }

    /// Every victim queued, for the job that drains the queue.
    pub(crate) fn take(&self) -> Vec<SpillJob<K, V>> {
        std::mem::take(&mut *self.jobs.lock())
    }

    /// A write of `key` failed with `err` (`encode`: the value's encode
    /// failed, not the disk): remember it as the last failure and as the
    /// last of its kind.
    pub(crate) fn failed(&self, key: &K, err: Error, encode: bool) {
        let mut log = self.failures.lock();
        if encode {
            log.encode = Some(err.clone());
        } else {
            log.write = Some(err.clone());
        }
        log.last = Some(SpillFailure {
            key: key.clone(),
            error: err,
        });
    }

    /// The disk budget refused a write. Returns `true` for the first
    /// refusal since a write last succeeded: the one to log.
    pub(crate) fn budget_refused(&self) -> bool {
        !self.budget_logged.swap(true, Relaxed)
    }

    /// A write succeeded: the next budget refusal is logged again.
    pub(crate) fn succeeded(&self) {
        self.budget_logged.store(false, Relaxed);
    }

    /// The most recent spill failure, if any.
    pub(crate) fn last_failure(&self) -> Option<SpillFailure<K>> {
        self.failures.lock().last.clone()
    }

    /// The failure that keeps `excess` unpinned bytes in memory, given
    /// whether writes are `failing` and the weight `set_aside` after
    /// failed encodes: the last write failure when writes fail and hold
    /// more than the set-aside values, else the last encode failure when
    /// values are set aside, else the last write failure while writes
    /// fail.
    pub(crate) fn cause(&self, failing: bool, excess: usize, set_aside: usize) -> Option<Error> {
        let log = self.failures.lock();
        if failing && excess > set_aside {
            log.write.clone()
        } else if set_aside > 0 {
            log.encode.clone()
        } else if failing {
            log.write.clone()
        } else {
            None
        }
    }
}
