//! The stream threads: where a record moves between a host's stream (a
//! peer's socket, handed to the buffer) and disk, read, checksummed and
//! written a piece at a time by one thread, the way a plain copy loop
//! works. Such a job may wait on its peer for as long as the peer takes,
//! so it never runs on the threads of the pool's four queues: a slow or
//! stalled peer then holds up only its own transfer, never a spill, a read
//! or a compaction.
//!
//! Threads start when a job finds none waiting (up to [`MAX_THREADS`]),
//! and exit after [`IDLE_EXIT`] without work; a buffer that never streams
//! a record starts none. They are not joined at shutdown (one may be
//! waiting on a peer): they drop what is queued and exit once their
//! current job returns.

use super::Idle;
use crate::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering::SeqCst};
use crate::sync::Arc;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// At most this many stream threads per buffer: transfers beyond it queue
/// until one finishes.
pub(crate) const MAX_THREADS: usize = 16;

/// A stream thread without work for this long exits.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// A job for a stream thread. It drops the [`Free`] it is given once its
/// work is done and before it hands its outcome over, so that the caller
/// woken by the outcome, queueing its next transfer at once, finds the
/// thread free rather than start another.
pub(crate) type StreamJob = Box<dyn for<'a> FnOnce(Free<'a>) + Send + 'static>;

/// The stream thread running a job, as long as the job holds this; once
/// dropped the job counts as done (`flush` may return) and the thread as
/// free.
pub(crate) struct Free<'a> {
    s: &'a Shared,
}

impl Drop for Free<'_> {
    fn drop(&mut self) {
        self.s.waiting.fetch_add(1, SeqCst);
        self.s.idle.done();
    }
}

pub(super) struct Streams {
    shared: Arc<Shared>,
}

struct Shared {
    rx: Receiver<StreamJob>,
    /// The pool's count of unfinished jobs, which `flush` waits on.
    idle: Arc<Idle>,
    /// Threads alive.
    live: AtomicUsize,
    /// Threads waiting for a job (or started and about to).
    waiting: AtomicUsize,
    /// Set at shutdown: queued jobs are dropped, not run.
    stopped: AtomicBool,
}

impl Streams {
    pub(super) fn new(rx: Receiver<StreamJob>, idle: Arc<Idle>) -> Streams {
        Streams {
            shared: Arc::new(Shared {
                rx,
                idle,
                live: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                stopped: AtomicBool::new(false),
            }),
        }
    }

    /// After a job was queued: start a thread for it unless one is
    /// waiting (or [`MAX_THREADS`] run). `Err` if no thread could be
    /// started and none is alive: the queued jobs are then dropped (their
    /// callers see the buffer closed) rather than left to wait forever.
    /// With a thread alive, the job waits for it instead.
    pub(super) fn after_send(&self) -> std::io::Result<()> {
        let s = &self.shared;
        // Pairs with the fence in `run`: either this sees a thread that
        // is about to exit for want of work as gone, or that thread sees
        // the job just queued.
        fence(SeqCst);
        // `waiting` before the queue's length: a waiting thread takes the
        // job off the queue before it counts itself busy, so read in this
        // order the two never show the job still queued and its taker
        // already busy, which started a second thread for a job the first
        // had taken.
        let waiting = s.waiting.load(SeqCst);
        if s.rx.len() <= waiting || s.live.load(SeqCst) >= MAX_THREADS {
            return Ok(());
        }
        s.live.fetch_add(1, SeqCst);
        s.waiting.fetch_add(1, SeqCst);
        let shared = Arc::clone(s);
        let started = std::thread::Builder::new()
            .name("spillbuffer-stream".into())
            .spawn(move || run(&shared));
        if let Err(e) = started {
            s.waiting.fetch_sub(1, SeqCst);
            if s.live.fetch_sub(1, SeqCst) == 1 {
                self.drain();
            }
            return Err(e);
        }
        Ok(())
    }

    /// Threads alive.
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        self.shared.live.load(SeqCst)
    }

    /// Shutdown: queued jobs are dropped from now on.
    pub(super) fn stop(&self) {
        self.shared.stopped.store(true, SeqCst);
    }

    /// Drop the queued jobs, counting each as done.
    pub(super) fn drain(&self) {
        for job in self.shared.rx.try_iter() {
            drop(job);
            self.shared.idle.done();
        }
    }
}

/// A stream thread: run jobs until none came for [`IDLE_EXIT`] or the
/// pool shut down.
fn run(s: &Shared) {
    loop {
        let got = s.rx.recv_timeout(IDLE_EXIT);
        s.waiting.fetch_sub(1, SeqCst);
        match got {
            Ok(job) => {
                let free = Free { s };
                if s.stopped.load(SeqCst) {
                    drop(job);
                    drop(free);
                } else if catch_unwind(AssertUnwindSafe(|| job(free))).is_err() {
                    tracing::error!("a spillbuffer stream job panicked; its thread keeps running");
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                s.live.fetch_sub(1, SeqCst);
                // Pairs with the fence in `after_send`.
                fence(SeqCst);
                if s.rx.is_empty() {
                    return;
                }
                // A job queued while this thread was giving up, by a
                // caller that counted it as waiting: stay for it.
                s.live.fetch_add(1, SeqCst);
                s.waiting.fetch_add(1, SeqCst);
            }
            Err(RecvTimeoutError::Disconnected) => {
                s.live.fetch_sub(1, SeqCst);
                return;
            }
        }
    }
}
