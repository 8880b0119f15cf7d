//! Wall-clock busy time of the pool: how long at least one IO thread was
//! running a job. The per-job times the buffer reports
//! (`spill_seconds_total`, …) add up over threads, so two threads writing
//! for one second count two; this counts one.

use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use crate::sync::Mutex;
use std::time::Instant;

#[derive(Default)]
pub(crate) struct Busy {
    /// Jobs running now, and when the count last rose from zero.
    running: Mutex<(usize, Option<Instant>)>,
    /// Busy periods that have ended, in nanoseconds.
    done_ns: AtomicU64,
}

impl Busy {
    /// A thread starts a job.
    pub(crate) fn start(&self) {
        let mut r = self.running.lock();
        if r.0 == 0 {
            r.1 = Some(Instant::now());
        }
        r.0 += 1;
    }

    /// A thread finished its job.
    pub(crate) fn end(&self) {
        let mut r = self.running.lock();
        r.0 -= 1;
        if r.0 == 0 {
            if let Some(since) = r.1.take() {
                let ns = since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                self.done_ns.fetch_add(ns, Relaxed);
            }
        }
    }

    /// Busy seconds so far, including the period running now.
    pub(crate) fn seconds(&self) -> f64 {
        let r = self.running.lock();
        let now = r.1.map_or(0, |since| since.elapsed().as_nanos() as u64);
        (self.done_ns.load(Relaxed) + now) as f64 * 1e-9
    }
}
