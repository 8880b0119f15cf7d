use super::*;
use crate::sync::atomic::AtomicBool;

/// Two jobs that run at the same time for at least 20 ms each count
/// their overlap once: busy time is at least one job's length, at most
/// the wall time around them, and does not grow while idle.
#[test]
fn busy_time_is_wall_time_with_a_job_running() {
    let pool = Pool::new(2).unwrap();
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let wall = std::time::Instant::now();
    for _ in 0..2 {
        let barrier = Arc::clone(&barrier);
        pool.submit(
            Priority::Spill,
            Box::new(move || {
                // Both jobs are running once the barrier opens.
                barrier.wait();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }),
        );
    }
    pool.wait_idle_blocking();
    let wall = wall.elapsed().as_secs_f64();
    let busy = pool.busy_seconds();
    assert!(busy >= 0.020, "busy {busy} s");
    assert!(busy <= wall, "busy {busy} s > wall {wall} s");
    assert_eq!(pool.busy_seconds(), busy, "idle time is not busy time");
}

#[test]
fn runs_jobs_and_waits_for_them() {
    let pool = Pool::new(2).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    for _ in 0..100 {
        let n = Arc::clone(&n);
        assert!(pool.submit(
            Priority::Spill,
            Box::new(move || {
                n.fetch_add(1, SeqCst);
            })
        ));
    }
    pool.wait_idle_blocking();
    assert_eq!(n.load(SeqCst), 100);
    assert_eq!(pool.pending(), 0);
}

/// The order in which `pool`'s only thread runs one job of each
/// priority, all queued while it is busy.
fn order_of_queued_jobs(pool: &Pool) -> Vec<&'static str> {
    let order = Arc::new(Mutex::new(Vec::new()));
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    // Occupy the only thread so that every queue fills up behind it.
    pool.submit(
        Priority::Demand,
        Box::new(move || {
            let _ = gate_rx.recv();
        }),
    );
    for (p, name) in [
        (Priority::Background, "bg"),
        (Priority::Demand, "read"),
        (Priority::Spill, "spill"),
        (Priority::Free, "free"),
    ] {
        let order = Arc::clone(&order);
        pool.submit(p, Box::new(move || order.lock().push(name)));
    }
    gate_tx.send(()).unwrap();
    pool.wait_idle_blocking();
    let order = order.lock().clone();
    order
}

#[test]
fn queued_jobs_run_in_priority_order() {
    let pool = Pool::new(1).unwrap();
    assert_eq!(
        order_of_queued_jobs(&pool),
        vec!["free", "read", "spill", "bg"]
    );
}

#[test]
fn with_writes_first_queued_writes_go_before_reads() {
    let pool = Pool::new(1).unwrap();
    pool.set_writes_first(true);
    assert_eq!(
        order_of_queued_jobs(&pool),
        vec!["free", "spill", "read", "bg"]
    );
    // Back to the normal order once memory is no longer short.
    pool.set_writes_first(false);
    assert_eq!(
        order_of_queued_jobs(&pool),
        vec!["free", "read", "spill", "bg"]
    );
}

#[test]
fn panicking_job_does_not_kill_the_pool() {
    let pool = Pool::new(1).unwrap();
    pool.submit(Priority::Spill, Box::new(|| panic!("boom")));
    let ran = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&ran);
    pool.submit(Priority::Spill, Box::new(move || r.store(true, SeqCst)));
    pool.wait_idle_blocking();
    assert!(ran.load(SeqCst));
}

#[test]
fn shutdown_drops_queued_jobs_and_refuses_new_ones() {
    let pool = Pool::new(1).unwrap();
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    pool.submit(
        Priority::Spill,
        Box::new(move || {
            let _ = gate_rx.recv();
        }),
    );
    pool.submit(Priority::Background, Box::new(|| {}));
    assert_eq!(pool.pending(), 2);
    let t = std::thread::spawn(move || {
        // Release the running job once shutdown has started waiting.
        std::thread::yield_now();
        let _ = gate_tx.send(());
    });
    pool.shutdown();
    t.join().unwrap();
    assert!(!pool.submit(Priority::Demand, Box::new(|| {})));
    // Whether or not the queued job ran first, nothing is left counted.
    assert_eq!(pool.pending(), 0);
}

/// A stream job waiting on its peer holds up neither the queues nor
/// shutdown; `flush` counts it; one thread serves jobs that follow each
/// other.
#[test]
fn stream_jobs_run_apart_from_the_queues() {
    let pool = Pool::new(1).unwrap();
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    assert!(pool
        .submit_stream(Box::new(move |_free| {
            let _ = gate_rx.recv();
        }))
        .unwrap());
    let ran = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&ran);
    pool.submit(Priority::Spill, Box::new(move || r.store(true, SeqCst)));
    // The spill job runs (and finishes) while the stream job waits.
    while !ran.load(SeqCst) || pool.pending() > 1 {
        std::thread::yield_now();
    }
    assert_eq!(pool.pending(), 1, "the stream job is still counted");
    gate_tx.send(()).unwrap();
    pool.wait_idle_blocking();
    for _ in 0..20 {
        let (tx, rx) = crossbeam_channel::bounded::<()>(1);
        pool.submit_stream(Box::new(move |free| {
            drop(free);
            let _ = tx.send(());
        }))
        .unwrap();
        rx.recv().unwrap();
    }
    assert_eq!(pool.streams.live(), 1, "one thread for jobs in turn");
    // A job stuck on its peer at shutdown is not waited for.
    let (_gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    pool.submit_stream(Box::new(move |_free| {
        let _ = gate_rx.recv();
    }))
    .unwrap();
    pool.shutdown();
    assert!(!pool.submit_stream(Box::new(|_free| {})).unwrap());
}

/// Read threads take demand reads while every IO thread is busy, and
/// nothing else: a spill job waits for an IO thread.
/// Start a spill job on one of `pool`'s IO threads that runs until the
/// returned sender sends (or is dropped); returns once it has started.
fn occupy(pool: &Pool) -> crossbeam_channel::Sender<()> {
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(0);
    let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(1);
    pool.submit(
        Priority::Spill,
        Box::new(move || {
            started_tx.send(()).unwrap();
            let _ = gate_rx.recv();
        }),
    );
    started_rx.recv().unwrap();
    gate_tx
}

#[test]
fn read_threads_run_demand_reads_only() {
    let readers = Readers {
        threads: 2,
        on_start: None,
    };
    let pool = Pool::with_readers(1, readers).unwrap();
    // Occupy the only IO thread with a spill job.
    let gate_tx = occupy(&pool);
    let spilled = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&spilled);
    pool.submit(Priority::Spill, Box::new(move || s.store(true, SeqCst)));
    // Two reads that each wait for the other: both must run at once,
    // on the two read threads.
    let both = Arc::new(std::sync::Barrier::new(2));
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    for _ in 0..2 {
        let both = Arc::clone(&both);
        let done = done_tx.clone();
        pool.submit(
            Priority::Demand,
            Box::new(move || {
                both.wait();
                done.send(std::thread::current().name().map(String::from))
                    .unwrap();
            }),
        );
    }
    for _ in 0..2 {
        let name = done_rx.recv().unwrap().unwrap();
        assert!(name.starts_with("spillbuffer-read-"), "{name}");
    }
    assert!(!spilled.load(SeqCst), "a read thread ran a spill job");
    gate_tx.send(()).unwrap();
    pool.wait_idle_blocking();
    assert!(spilled.load(SeqCst));
    assert!(pool.thread_ids.len() == 3);
}

/// Queued frees run on a caller that asks, and count as done.
#[test]
fn queued_frees_run_on_the_caller() {
    let pool = Pool::new(1).unwrap();
    let gate_tx = occupy(&pool);
    let ran_on = Arc::new(Mutex::new(None));
    let r = Arc::clone(&ran_on);
    pool.submit(
        Priority::Free,
        Box::new(move || *r.lock() = Some(std::thread::current().id())),
    );
    assert_eq!(pool.pending(), 2);
    pool.run_queued_frees();
    assert_eq!(*ran_on.lock(), Some(std::thread::current().id()));
    assert_eq!(pool.pending(), 1);
    gate_tx.send(()).unwrap();
    pool.wait_idle_blocking();
}

#[tokio::test]
async fn async_wait_resolves() {
    let pool = Pool::new(2).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let n = Arc::clone(&n);
        pool.submit(
            Priority::Demand,
            Box::new(move || {
                n.fetch_add(1, SeqCst);
            }),
        );
    }
    pool.wait_idle().await;
    assert_eq!(n.load(SeqCst), 10);
}
