//! A callback the pool's threads run now and then (feature `metrics`: it
//! publishes the buffer's stats): after a job, and when a thread has
//! waited for one as long as the interval, each time only if the interval
//! has passed since the last run. Zero runs it after every job.

use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shortest wait of an idle thread between runs, so that a zero
/// interval does not spin.
const MIN_IDLE_WAIT: Duration = Duration::from_millis(10);

pub(crate) struct Periodic {
    every: Duration,
    /// Set once the buffer exists, after the threads have started.
    run: OnceLock<Box<dyn Fn() + Send + Sync>>,
    epoch: Instant,
    /// When the next run is due, in nanoseconds since `epoch`.
    next_ns: AtomicU64,
}

impl Periodic {
    pub(crate) fn new(every: Duration) -> Periodic {
        Periodic {
            every,
            run: OnceLock::new(),
            epoch: Instant::now(),
            next_ns: AtomicU64::new(0),
        }
    }

    /// Set the callback; only the first call counts.
    pub(crate) fn set(&self, run: Box<dyn Fn() + Send + Sync>) {
        let _ = self.run.set(run);
    }

    /// How long an idle thread waits for a job before it runs the callback.
    pub(crate) fn idle_wait(&self) -> Duration {
        self.every.max(MIN_IDLE_WAIT)
    }

    /// Run the callback if it is due. With a zero interval, always: a
    /// run skipped because another thread claimed it could miss the
    /// outcome of this thread's job.
    pub(crate) fn run_if_due(&self) {
        let Some(run) = self.run.get() else {
            return;
        };
        if !self.every.is_zero() {
            let now = self.epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            let next = self.next_ns.load(Relaxed);
            let every = self.every.as_nanos().min(u64::MAX as u128) as u64;
            // One thread claims each due run; a late run is made up by the
            // next job's end or the next idle wait.
            if now < next
                || self
                    .next_ns
                    .compare_exchange(next, now.saturating_add(every), Relaxed, Relaxed)
                    .is_err()
            {
                return;
            }
        }
        run();
    }
}
