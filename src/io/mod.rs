//! The dedicated IO pool: the buffer's own threads, fed by four crossbeam
//! queues in priority order — frees of large values, demand reads (a caller
//! is waiting), spill writes, then background work (prefetch, compaction,
//! file deletion). While the host says memory is short
//! ([`Pool::set_writes_first`]), spill writes go before demand reads: a
//! write that lands gives memory back, a read takes more. Read threads, if
//! any, take demand reads only: a read blocks its thread in `pread()` for
//! the device's latency, so reads in flight at once need as many threads,
//! which cost no CPU while they wait.
//!
//! Jobs are boxed closures, so the pool knows nothing of keys and values.
//! It counts queued and running jobs so that `flush` can wait for all of
//! them, from async code or from a blocking caller, and measures its
//! wall-clock busy time ([`busy`]). With the `metrics` feature its threads
//! also run a periodic callback ([`periodic`]) between jobs.
//!
//! Jobs that move a record between a host's stream (a peer's socket) and
//! disk run on threads of their own ([`streams`]): they may wait on the
//! peer for as long as it takes, and must never hold up the disk work of
//! the queues above.

mod busy;
#[cfg(feature = "metrics")]
mod periodic;
mod streams;

use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use crate::sync::Arc;
use crate::sync::{Condvar, Mutex, RwLock};
use busy::Busy;
use crossbeam_channel::{Receiver, Select, Sender};
#[cfg(feature = "metrics")]
use periodic::Periodic;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::{JoinHandle, ThreadId};
use streams::Streams;
pub(crate) use streams::{Free, StreamJob};

/// The periodic callback of the threads, if any: `None` without the
/// `metrics` feature, so that the build without it is the plain pool.
#[cfg(feature = "metrics")]
type MaybePeriodic = Option<Arc<Periodic>>;
#[cfg(not(feature = "metrics"))]
type MaybePeriodic = Option<Arc<std::convert::Infallible>>;

/// A unit of work for the pool.
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// Queue a job goes to; lower runs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// Gives memory back: freeing a large value. Short, and it goes before
    /// reads so that a read allocating its value can reuse those pages
    /// rather than fault in fresh ones.
    Free = 0,
    /// A reader is waiting for this.
    Demand = 1,
    /// Memory is waiting for this.
    Spill = 2,
    /// Nobody waits: prefetch, compaction, deleting files.
    Background = 3,
}

/// The pool's read threads, which run demand reads only.
#[derive(Clone, Copy, Default)]
pub(crate) struct Readers {
    /// How many.
    pub threads: usize,
    /// Run by each when it starts (to set its thread-local limits).
    pub on_start: Option<fn()>,
}

/// Number of queues, one per [`Priority`].
const QUEUES: usize = 4;

/// The order threads take the queues in: normally by [`Priority`]; with
/// writes first, spill writes before demand reads (frees still first:
/// they are short and give memory back too).
const NORMAL: [usize; QUEUES] = [0, 1, 2, 3];
const WRITES_FIRST: [usize; QUEUES] = [
    Priority::Free as usize,
    Priority::Spill as usize,
    Priority::Demand as usize,
    Priority::Background as usize,
];

/// Counts jobs not yet finished and wakes those waiting for zero.
#[derive(Default)]
struct Idle {
    pending: AtomicUsize,
    waiters: Mutex<Vec<tokio::sync::oneshot::Sender<()>>>,
    cv: Condvar,
}

impl Idle {
    fn done(&self) {
        if self.pending.fetch_sub(1, SeqCst) == 1 {
            // Taking the lock orders this wake-up after any waiter that saw
            // a non-zero count under it.
            let waiters = std::mem::take(&mut *self.waiters.lock());
            self.cv.notify_all();
            for w in waiters {
                let _ = w.send(());
            }
        }
    }
}

struct Queues {
    tx: [Sender<Job>; QUEUES],
    /// Jobs for the stream threads.
    streams: Sender<StreamJob>,
    /// Dropped at shutdown to wake idle threads.
    stop: Option<Sender<()>>,
}

pub(crate) struct Pool {
    /// `None` once shut down; the lock makes "check open, then send"
    /// atomic with respect to shutdown, so no job slips in after the drain.
    queues: RwLock<Option<Queues>>,
    rx: [Receiver<Job>; QUEUES],
    idle: Arc<Idle>,
    busy: Arc<Busy>,
    /// Spill writes before demand reads ([`Pool::set_writes_first`]).
    writes_first: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    thread_ids: Vec<ThreadId>,
    /// Threads for jobs that wait on a host's stream, started on demand.
    streams: Streams,
    #[cfg(feature = "metrics")]
    periodic: MaybePeriodic,
}

impl Pool {
    /// Start `threads` IO threads.
    #[cfg(test)]
    pub(crate) fn new(threads: usize) -> std::io::Result<Pool> {
        Pool::start(threads, Readers::default(), None)
    }

    /// Start `threads` IO threads and the read threads `readers` asks for.
    #[cfg_attr(
        all(feature = "metrics", not(test)),
        expect(
            dead_code,
            reason = "with the metrics feature, buffers start pools with a periodic callback"
        )
    )]
    pub(crate) fn with_readers(threads: usize, readers: Readers) -> std::io::Result<Pool> {
        Pool::start(threads, readers, None)
    }

    /// Start `threads` IO threads that run the callback given to
    /// [`Pool::on_period`] at most once per `every`: after a job, or after
    /// waiting that long for one.
    #[cfg(feature = "metrics")]
    pub(crate) fn with_periodic(
        threads: usize,
        readers: Readers,
        every: std::time::Duration,
    ) -> std::io::Result<Pool> {
        Pool::start(threads, readers, Some(Arc::new(Periodic::new(every))))
    }

    /// Set the callback of a pool made by [`Pool::with_periodic`].
    #[cfg(feature = "metrics")]
    pub(crate) fn on_period(&self, run: Box<dyn Fn() + Send + Sync>) {
        if let Some(t) = &self.periodic {
            t.set(run);
        }
    }

    fn start(threads: usize, readers: Readers, periodic: MaybePeriodic) -> std::io::Result<Pool> {
        let channels: [(Sender<Job>, Receiver<Job>); QUEUES] =
            std::array::from_fn(|_| crossbeam_channel::unbounded());
        let rx = channels.each_ref().map(|(_, rx)| rx.clone());
        let tx = channels.map(|(tx, _)| tx);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let (streams_tx, streams_rx) = crossbeam_channel::unbounded();
        let idle = Arc::new(Idle::default());
        let busy = Arc::new(Busy::default());
        let writes_first = Arc::new(AtomicBool::new(false));
        // Under shuttle each job runs on a shuttle thread of its own
        // (`submit`); no thread waits on the queues.
        #[cfg(all(test, shuttle))]
        let (threads, readers) = {
            let _ = (threads, readers);
            (0, Readers::default())
        };
        let mut handles = Vec::with_capacity(threads + readers.threads);
        let reads = [rx[Priority::Demand as usize].clone()];
        let kinds = (0..threads)
            .map(|i| (format!("spillbuffer-io-{i}"), rx.to_vec(), None))
            .chain((0..readers.threads).map(|i| {
                let name = format!("spillbuffer-read-{i}");
                (name, reads.to_vec(), readers.on_start)
            }));
        for (name, rx, on_start) in kinds {
            let stop = stop_rx.clone();
            let idle = Arc::clone(&idle);
            let busy = Arc::clone(&busy);
            let order = Arc::clone(&writes_first);
            let periodic = periodic.clone();
            let h = std::thread::Builder::new().name(name).spawn(move || {
                if let Some(f) = on_start {
                    f();
                }
                worker(rx, stop, idle, busy, order, periodic)
            })?;
            handles.push(h);
        }
        Ok(Pool {
            thread_ids: handles.iter().map(|h| h.thread().id()).collect(),
            queues: RwLock::new(Some(Queues {
                tx,
                streams: streams_tx,
                stop: Some(stop_tx),
            })),
            rx,
            streams: Streams::new(streams_rx, Arc::clone(&idle)),
            idle,
            busy,
            writes_first,
            threads: Mutex::new(handles),
            #[cfg(feature = "metrics")]
            periodic,
        })
    }

    /// Queue a job. Returns false (dropping the job) once shut down.
    pub(crate) fn submit(&self, prio: Priority, job: Job) -> bool {
        let g = self.queues.read();
        let Some(q) = g.as_ref() else {
            return false;
        };
        self.idle.pending.fetch_add(1, SeqCst);
        #[cfg(all(test, shuttle))]
        {
            let _ = (&q.tx, prio);
            spawn_on_shuttle(job, Arc::clone(&self.idle));
        }
        #[cfg(not(all(test, shuttle)))]
        if q.tx[prio as usize].send(job).is_err() {
            self.idle.done();
            return false;
        }
        true
    }

    /// Queue a job that moves bytes between a host's stream and disk, and
    /// may wait on the stream for long: it runs on a stream thread, never
    /// on the threads of the four queues, so a slow peer holds up only its
    /// own transfer (and, once [`streams::MAX_THREADS`] transfers wait on
    /// their peers, the transfers queued behind them). Counted by `flush`
    /// like any job. `Ok(false)` (dropping the job) once shut down; `Err`
    /// if no thread could be started for it (the job is dropped).
    pub(crate) fn submit_stream(&self, job: StreamJob) -> std::io::Result<bool> {
        let g = self.queues.read();
        let Some(q) = g.as_ref() else {
            return Ok(false);
        };
        self.idle.pending.fetch_add(1, SeqCst);
        if q.streams.send(job).is_err() {
            self.idle.done();
            return Ok(false);
        }
        self.streams.after_send()?;
        Ok(true)
    }

    /// While `on`, threads take queued spill writes before demand reads
    /// (and prefetches, as always): for a host whose memory is over its
    /// target. Jobs already running are not affected.
    pub(crate) fn set_writes_first(&self, on: bool) {
        self.writes_first.store(on, Relaxed);
    }

    /// Run the queued [`Priority::Free`] jobs on the calling thread, for a
    /// caller about to allocate a large value that is free to block: a
    /// value freed here gives its pages to the next allocation, one freed
    /// later by a pool thread leaves that allocation to fault in fresh
    /// pages.
    pub(crate) fn run_queued_frees(&self) {
        for job in self.rx[Priority::Free as usize].try_iter() {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("a spillbuffer IO job panicked; the pool keeps running");
            }
            self.idle.done();
        }
    }

    /// Jobs queued or running.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.idle.pending.load(SeqCst)
    }

    /// Wall-clock seconds during which at least one thread ran a job.
    pub(crate) fn busy_seconds(&self) -> f64 {
        self.busy.seconds()
    }

    /// Is the calling thread one of this pool's?
    pub(crate) fn on_pool_thread(&self) -> bool {
        let me = std::thread::current().id();
        self.thread_ids.contains(&me)
    }

    /// Resolve once no job is queued or running.
    pub(crate) async fn wait_idle(&self) {
        let rx = {
            let mut w = self.idle.waiters.lock();
            if self.idle.pending.load(SeqCst) == 0 {
                return;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            w.push(tx);
            rx
        };
        let _ = rx.await;
    }

    /// Block the calling thread until no job is queued or running.
    pub(crate) fn wait_idle_blocking(&self) {
        let mut w = self.idle.waiters.lock();
        while self.idle.pending.load(SeqCst) != 0 {
            self.idle.cv.wait(&mut w);
        }
    }

    /// Stop the threads after their current job, and drop queued jobs.
    pub(crate) fn shutdown(&self) {
        let Some(mut q) = self.queues.write().take() else {
            return;
        };
        drop(q.stop.take());
        drop(q);
        // Stream threads are not joined: one may be waiting on a peer.
        // They drop what is queued and exit once their job returns.
        self.streams.stop();
        let handles = std::mem::take(&mut *self.threads.lock());
        let on_pool = self.on_pool_thread();
        for h in handles {
            // A pool thread cannot join itself; it exits on its own once
            // its current job returns.
            if !on_pool {
                let _ = h.join();
            }
        }
        for rx in &self.rx {
            for job in rx.try_iter() {
                drop(job);
                self.idle.done();
            }
        }
        self.streams.drain();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Run jobs from the queues `rx` (in priority order) until the pool stops.
fn worker(
    rx: Vec<Receiver<Job>>,
    stop: Receiver<()>,
    idle: Arc<Idle>,
    busy: Arc<Busy>,
    writes_first: Arc<AtomicBool>,
    periodic: MaybePeriodic,
) {
    loop {
        let job = match next_job(&rx, &stop, &writes_first, &periodic) {
            Some(job) => job,
            None => return,
        };
        busy.start();
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("a spillbuffer IO job panicked; the pool keeps running");
        }
        busy.end();
        // Before the job counts as done, so that a `flush` returns after
        // what the periodic callback publishes of the job's outcome.
        run_periodic(&periodic);
        idle.done();
    }
}

/// Under shuttle: run `job` on a shuttle thread of its own, so that the
/// schedules explored cover every order of the jobs, and every
/// interleaving of a job with the host's threads and the other jobs. The
/// queues' priorities (and `set_writes_first`) are not kept (an order
/// they rule out is still one the buffer's state must survive, as a
/// second pool thread allows), there are no read threads, and no job
/// counts as on a pool thread (`on_pool_thread`).
#[cfg(all(test, shuttle))]
fn spawn_on_shuttle(job: Job, idle: Arc<Idle>) {
    shuttle::thread::spawn(move || {
        job();
        idle.done();
    });
}

/// Run the periodic callback if it is due, containing a panic in it.
#[cfg_attr(not(feature = "metrics"), inline(always))]
fn run_periodic(periodic: &MaybePeriodic) {
    #[cfg(feature = "metrics")]
    if let Some(t) = periodic {
        if catch_unwind(AssertUnwindSafe(|| t.run_if_due())).is_err() {
            tracing::error!("a spillbuffer metrics publication panicked; the pool keeps running");
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = periodic;
}

/// The highest-priority job available, waiting if there is none. `None`
/// when the pool is stopping.
fn next_job(
    rx: &[Receiver<Job>],
    stop: &Receiver<()>,
    writes_first: &AtomicBool,
    periodic: &MaybePeriodic,
) -> Option<Job> {
    loop {
        if stop.try_recv() == Err(crossbeam_channel::TryRecvError::Disconnected) {
            return None;
        }
        // A read thread has one queue, demand reads; an IO thread has all
        // of them, indexed by priority.
        let order: &[usize] = if rx.len() < QUEUES {
            &[0]
        } else if writes_first.load(Relaxed) {
            &WRITES_FIRST
        } else {
            &NORMAL
        };
        for &i in order {
            if let Ok(job) = rx[i].try_recv() {
                return Some(job);
            }
        }
        let mut sel = Select::new();
        for r in rx {
            sel.recv(r);
        }
        sel.recv(stop);
        // Only wait for readiness; the loop above then takes the job in
        // priority order.
        #[cfg(feature = "metrics")]
        if let Some(t) = periodic {
            if sel.ready_timeout(t.idle_wait()).is_err() {
                run_periodic(periodic);
            }
            continue;
        }
        let _ = periodic;
        sel.ready();
    }
}

#[cfg(test)]
mod tests;
