//! The reduction scenario (a worker summing chunks it persisted), on one tokio current-thread runtime
//! (the host's "event loop"):
//!
//! 1. persist: `--chunks` chunks of random f64 (`--chunk-mib` each) go in
//!    through `insert_async`, several times the memory target, so most of
//!    them spill;
//! 2. reduce: every chunk is pinned, summed and consumed, in order; the
//!    `remove` of a chunk arrives only after a simulated scheduler round
//!    trip (`--free-lag` chunks later, or `--free-delay-ms` later).
//!
//! A 1 ms ticker task on the same runtime records how late it wakes up
//! during the reduce phase. `--mode blocking` reads with `get` on the event
//! loop, as a synchronous buffer would; `--mode async` keeps `--window`
//! pins in flight (reads on the IO pool) and hints the chunks after them
//! with `prefetch`. Each mode prints one JSON line, with the time a plain
//! sequential `read()` of the same spill files takes in the same run.
//!
//! ```text
//! cargo run --release --example reduction                      # both modes, defaults
//! cargo run --release --example reduction -- --chunks 256 --target-mib 256
//! ```
//! Options (defaults): --mode both|blocking|async (both) --chunks (1024)
//! --chunk-mib (4) --target-mib (1024) --limit-mib (target + window chunks)
//! --window (4) --prefetch (8) --free-lag (16) --free-delay-ms (0: use the
//! lag) --io-threads (cores - 1, at least 1: one core stays with the event
//! loop) --io-nice (0: leave the pool's threads alone)
//! --dir (the system temp dir) --cold (drop the spill files from the page
//! cache before the plain read and before the reduce phase, so both read
//! from the disk). Fields of the JSON lines: docs/reduction.md. Linux only
//! for the measurements that read /proc (they report 0 elsewhere).

#![recursion_limit = "256"]

use serde_json::json;
use spillbuffer::{BoxError, Spill, SpillBuffer};
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

// ----- the value: a chunk that counts its own writes ------------------------

/// Nanoseconds since `EPOCH` of the ticker's last wake-up, and the loop
/// thread's id: the sampler uses them to catch the loop while it is late.
static LAST_TICK_NS: AtomicU64 = AtomicU64::new(0);
static LOOP_TID: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Per chunk id: how many times it was encoded for a write. Lets the run
/// tell a first write from a re-write of a chunk that had a disk copy.
static WRITES: OnceLock<Vec<AtomicU32>> = OnceLock::new();
/// Encoded bytes of writes of chunks that had been written before.
static REWRITTEN_BYTES: AtomicU64 = AtomicU64::new(0);

fn writes() -> &'static [AtomicU32] {
    WRITES.get().expect("set at start")
}

/// A chunk of the array: its index and its numbers.
struct Chunk {
    id: u64,
    data: Vec<f64>,
}

impl Spill for Chunk {
    fn weight(&self) -> usize {
        self.data.len() * 8
    }

    /// The numbers, then the index: a trailer rather than a header, so
    /// that `decode_in_place` can read the whole record into the vector
    /// that becomes the chunk's data and pop the index off its end.
    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        let before = writes()[self.id as usize].fetch_add(1, Relaxed);
        if before > 0 {
            REWRITTEN_BYTES.fetch_add(8 + self.weight() as u64, Relaxed);
        }
        out.extend_from_slice(bytemuck::cast_slice(&self.data));
        out.extend_from_slice(&self.id.to_le_bytes());
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        let at = bytes.len().checked_sub(8).ok_or("short chunk record")?;
        let (data, id) = bytes.split_at(at);
        Ok(Chunk {
            id: u64::from_le_bytes(id.try_into()?),
            data: bytemuck::pod_collect_to_vec(data),
        })
    }

    /// Straight from disk into the chunk's own memory: the read fills
    /// `len / 8` numbers, the last of which holds the index.
    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        let data = Vec::<f64>::decode_in_place(len, fill)?;
        Some(data.and_then(|mut d| {
            let id = d.pop().ok_or("short chunk record")?;
            let id = u64::from_le_bytes(id.to_bits().to_ne_bytes());
            Ok(Chunk { id, data: d })
        }))
    }
}

/// Random numbers in [0, 1) (xorshift64*), seeded by the chunk index.
fn make_chunk(id: u64, len: usize) -> Chunk {
    let mut x = (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
        })
        .collect();
    Chunk { id, data }
}

/// The host's compute: a sum with eight accumulators (fast, and the same
/// result on every call).
fn chunk_sum(data: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = data.chunks_exact(8);
    let rest: f64 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f64>() + rest
}

// ----- options ------------------------------------------------------------

#[derive(Clone, Debug)]
struct Opts {
    modes: Vec<String>,
    chunks: usize,
    chunk_mib: usize,
    target_mib: usize,
    limit_mib: Option<usize>,
    window: usize,
    prefetch: usize,
    free_lag: usize,
    free_delay_ms: u64,
    io_threads: usize,
    io_nice: i32,
    dir: PathBuf,
    cold: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        modes: vec!["blocking".into(), "async".into()],
        chunks: 1024,
        chunk_mib: 4,
        target_mib: 1024,
        limit_mib: None,
        window: 4,
        prefetch: 8,
        free_lag: 16,
        free_delay_ms: 0,
        // Leave one core to the event loop: with as many IO threads as
        // cores, the loop waits for a CPU for up to a scheduler slice,
        // which shows as ticker lateness the buffer did not cause.
        io_threads: std::thread::available_parallelism()
            .map_or(1, |n| n.get().saturating_sub(1).max(1)),
        io_nice: 0,
        dir: std::env::temp_dir(),
        cold: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--cold" {
            o.cold = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let val = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        let num = || -> usize { val.parse().unwrap_or_else(|_| panic!("bad {flag} {val}")) };
        match flag.as_str() {
            "--mode" => {
                o.modes = match val.as_str() {
                    "both" => vec!["blocking".into(), "async".into()],
                    "blocking" | "async" => vec![val.clone()],
                    _ => panic!("--mode is blocking, async or both"),
                }
            }
            "--chunks" => o.chunks = num(),
            "--chunk-mib" => o.chunk_mib = num(),
            "--target-mib" => o.target_mib = num(),
            "--limit-mib" => o.limit_mib = Some(num()),
            "--window" => o.window = num().max(1),
            "--prefetch" => o.prefetch = num(),
            "--free-lag" => o.free_lag = num(),
            "--free-delay-ms" => o.free_delay_ms = num() as u64,
            "--io-threads" => o.io_threads = num(),
            "--io-nice" => o.io_nice = val.parse().expect("--io-nice N"),
            "--dir" => o.dir = PathBuf::from(&val),
            _ => panic!("unknown option {flag}\n{USAGE}"),
        }
    }
    o
}

const USAGE: &str = "usage: reduction [--mode both|blocking|async] [--chunks N] [--chunk-mib N] \
[--target-mib N] [--limit-mib N] [--window N] [--prefetch N] [--free-lag N] [--free-delay-ms N] \
[--io-threads N] [--io-nice N] [--dir DIR] [--cold]";

// ----- measurement helpers --------------------------------------------------

/// Minor and major page faults so far, of the whole process ("self") or
/// of the calling thread ("thread-self").
fn faults(of: &str) -> (u64, u64) {
    std::fs::read_to_string(format!("/proc/{of}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces).
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?))
        })
        .unwrap_or((0, 0))
}

/// Bytes this process has passed to write syscalls so far (/proc/self/io
/// `wchar`): every disk write the buffer makes, spills and compaction
/// copies alike (the JSON lines on stdout add a few hundred bytes).
fn write_syscall_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("wchar: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Time the hypervisor ran something else on this VM's vCPUs (all CPUs,
/// /proc/stat `steal`), in ms. A thread whose vCPU is stolen looks
/// "running" to the guest, yet makes no progress.
fn machine_steal_ms() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()?
                .split_whitespace()
                .nth(8)?
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |ticks| ticks * 10.0) // USER_HZ = 100
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Samples resident bytes (the buffer's gauge) and the process RSS from a
/// thread of its own, so that a blocked event loop does not skew the mean.
struct Sampler {
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(u64, f64, u64, Vec<String>)>,
}

impl Sampler {
    fn start(buf: SpillBuffer<u64, Chunk>) -> Sampler {
        let on = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (on2, stop2) = (Arc::clone(&on), Arc::clone(&stop));
        let handle = std::thread::spawn(move || {
            let (mut peak, mut sum, mut n, mut peak_rss) = (0u64, 0f64, 0u64, 0u64);
            let mut i = 0u64;
            // While the ticker is more than 5 ms overdue: the loop thread's
            // state (R running/runnable, S sleeping, D uninterruptible) and
            // the kernel function it waits in.
            let mut stalls: Vec<String> = Vec::new();
            while !stop2.load(Relaxed) {
                if on2.load(Relaxed) {
                    let overdue = now_ns().saturating_sub(LAST_TICK_NS.load(Relaxed));
                    if overdue > 6_000_000 && stalls.len() < 400 {
                        let tid = LOOP_TID.load(Relaxed);
                        let dir = format!("/proc/self/task/{tid}");
                        let stat =
                            std::fs::read_to_string(format!("{dir}/stat")).unwrap_or_default();
                        let state = stat
                            .rfind(')')
                            .and_then(|p| stat.get(p + 2..p + 3))
                            .unwrap_or("?")
                            .to_string();
                        let wchan =
                            std::fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
                        let syscall = std::fs::read_to_string(format!("{dir}/syscall"))
                            .unwrap_or_default()
                            .split_whitespace()
                            .next()
                            .unwrap_or("?")
                            .to_string();
                        stalls.push(format!(
                            "{:.0}ms:{state}:{wchan}:sys{syscall}",
                            overdue as f64 / 1e6
                        ));
                    }
                    let m = buf.stats().memory_bytes;
                    peak = peak.max(m);
                    sum += m as f64;
                    n += 1;
                    if i % 4 == 0 {
                        peak_rss = peak_rss.max(rss_bytes());
                    }
                    i += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (peak, sum / n.max(1) as f64, peak_rss, stalls)
        });
        Sampler { on, stop, handle }
    }

    fn finish(self) -> (u64, f64, u64, Vec<String>) {
        self.stop.store(true, Relaxed);
        self.handle.join().expect("sampler")
    }
}

/// (cpu time, time runnable but waiting for a CPU) of the calling thread,
/// in ms, from the kernel's schedstat: tells a loop that was preempted by
/// other processes from one that was busy or blocked.
fn thread_schedstat_ms() -> (f64, f64) {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
            Some((it.next()?? / 1e6, it.next()?? / 1e6))
        })
        .unwrap_or((0.0, 0.0))
}

/// Time one synchronous call on the event loop, keeping the worst.
fn timed<R>(worst: &mut f64, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    *worst = worst.max(t.elapsed().as_secs_f64() * 1e3);
    r
}

/// Lower the scheduling priority of the buffer's IO threads (Linux: found
/// by name under /proc/self/task), so that on a loaded machine the event
/// loop wins the CPU over the pool's copying and checksumming. A host
/// choice, made from outside the crate.
fn renice_io_threads(nice: i32) -> usize {
    let mut n = 0;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let Ok(tid) = t.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if comm.starts_with("spillbuffer-io") {
            // SAFETY: a plain syscall; on Linux PRIO_PROCESS with a thread
            // id sets that thread's nice value.
            if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } == 0 {
                n += 1;
            }
        }
    }
    n
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn spill_files(buf: &SpillBuffer<u64, Chunk>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in buf.spill_dirs() {
        for e in std::fs::read_dir(dir).expect("spill dir").flatten() {
            files.push(e.path());
        }
    }
    files.sort();
    files
}

/// Write back and drop the files' pages from the page cache, so that the
/// next read comes from the disk.
fn drop_cache(files: &[PathBuf]) {
    use std::os::fd::AsRawFd;
    for f in files {
        if let Ok(file) = std::fs::File::open(f) {
            let _ = file.sync_all();
            // SAFETY: a plain syscall on a file descriptor we own.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// A plain sequential `read()` of the files into one reused buffer: the
/// figure the reduce phase is compared with. Returns (bytes, seconds).
fn plain_read(files: &[PathBuf]) -> (u64, f64) {
    use std::io::Read;
    let mut buf = vec![0u8; 8 << 20];
    let start = Instant::now();
    let mut total = 0u64;
    for f in files {
        let Ok(mut file) = std::fs::File::open(f) else {
            continue;
        };
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => panic!("read {}: {e}", f.display()),
            }
        }
    }
    (total, start.elapsed().as_secs_f64())
}

/// The floor for any reader that hands out values and checks its data:
/// the same bytes read in `chunk`-sized pieces into fresh vectors, with a
/// CRC-32 of each 256 KiB piece while it is in cache, the last `keep` of
/// them kept alive (the chunks the host has not freed yet), so that the
/// allocator recycles memory about as it does for the buffer. Returns
/// seconds.
fn checked_fresh_read(files: &[PathBuf], chunk: usize, keep: usize) -> f64 {
    use std::os::unix::fs::FileExt;
    let mut kept = VecDeque::new();
    let start = Instant::now();
    for f in files {
        let Ok(file) = std::fs::File::open(f) else {
            continue;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut at = 0u64;
        while at < len {
            let n = chunk.min((len - at) as usize);
            let mut v = vec![0u8; n];
            let mut crc = crc32fast::Hasher::new();
            for piece in v.chunks_mut(256 << 10) {
                if let Err(e) = file.read_exact_at(piece, at) {
                    panic!("read {}: {e}", f.display());
                }
                crc.update(piece);
                at += piece.len() as u64;
            }
            std::hint::black_box(crc.finalize());
            kept.push_back(v);
            if kept.len() > keep {
                kept.pop_front();
            }
        }
    }
    start.elapsed().as_secs_f64()
}

/// Lateness of a 1 ms ticker over `span` on the current runtime, sorted.
async fn idle_ticker(span: Duration) -> Vec<f64> {
    let end = Instant::now() + span;
    let mut late = Vec::new();
    while Instant::now() < end {
        let due = tokio::time::Instant::now() + Duration::from_millis(1);
        tokio::time::sleep_until(due).await;
        late.push((tokio::time::Instant::now() - due).as_secs_f64() * 1e3);
    }
    late.sort_by(f64::total_cmp);
    late
}

// ----- one mode -----------------------------------------------------------

async fn run(o: &Opts, mode: &str) -> serde_json::Value {
    let mib = 1usize << 20;
    let chunk_bytes = o.chunk_mib * mib;
    let target = o.target_mib * mib;
    let limit = o
        .limit_mib
        .map_or(target + o.window * chunk_bytes, |l| l * mib);
    let len = chunk_bytes / 8;
    for w in writes() {
        w.store(0, Relaxed);
    }
    REWRITTEN_BYTES.store(0, Relaxed);

    let buf: SpillBuffer<u64, Chunk> = SpillBuffer::builder(&o.dir)
        .memory_target(target)
        .memory_limit(limit)
        .io_threads(o.io_threads)
        .build()
        .expect("build the buffer");
    if o.io_nice != 0 {
        renice_io_threads(o.io_nice);
    }

    // The ticker: records lateness while `recording` is on.
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (recording, stop) = (Arc::clone(&recording), Arc::clone(&stop));
        tokio::spawn(async move {
            // Lateness as seen, and the same minus the time the loop's
            // thread spent runnable but waiting for a CPU (other processes
            // on a loaded machine) during that period.
            let (mut late_ms, mut own_ms) = (Vec::new(), Vec::new());
            // The worst tick: (late, on-CPU, waiting for a CPU), in ms.
            let mut worst = (0f64, 0f64, 0f64);
            while !stop.load(Relaxed) {
                let due = tokio::time::Instant::now() + Duration::from_millis(1);
                let (cpu0, rq0) = thread_schedstat_ms();
                tokio::time::sleep_until(due).await;
                LAST_TICK_NS.store(now_ns() + 1_000_000, Relaxed);
                if recording.load(Relaxed) {
                    let late = (tokio::time::Instant::now() - due).as_secs_f64() * 1e3;
                    let (cpu1, rq1) = thread_schedstat_ms();
                    late_ms.push(late);
                    own_ms.push((late - (rq1 - rq0)).max(0.0));
                    if late > worst.0 {
                        worst = (late, cpu1 - cpu0, rq1 - rq0);
                    }
                }
            }
            (late_ms, own_ms, worst)
        })
    };
    let sampler = Sampler::start(buf.clone());

    // ----- persist
    let t = Instant::now();
    let mut expected = 0.0f64;
    for i in 0..o.chunks as u64 {
        let c = make_chunk(i, len);
        expected += chunk_sum(&c.data);
        buf.insert_async(i, c).await.expect("insert");
    }
    buf.flush().await.expect("flush");
    let persist_seconds = t.elapsed().as_secs_f64();
    let before = buf.stats();
    let writes_before: Vec<u32> = writes().iter().map(|w| w.load(Relaxed)).collect();

    // ----- the plain read of the same spilled bytes
    let files = spill_files(&buf);
    if o.cold {
        drop_cache(&files);
    }
    let (plain_bytes, plain_seconds) = plain_read(&files);
    if o.cold {
        drop_cache(&files);
    }
    let floor_seconds = checked_fresh_read(&files, len * 8, o.free_lag + o.window);
    if o.cold {
        drop_cache(&files);
    }

    // ----- reduce
    let removals = Arc::new(AtomicU64::new(0));
    let mut lagging = VecDeque::new();
    let free = |i: u64, lagging: &mut VecDeque<u64>| {
        if o.free_delay_ms > 0 {
            let (b, removals) = (buf.clone(), Arc::clone(&removals));
            let delay = Duration::from_millis(o.free_delay_ms);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                b.remove(&i);
                removals.fetch_add(1, Relaxed);
            });
        } else {
            lagging.push_back(i);
            while lagging.len() > o.free_lag {
                buf.remove(&lagging.pop_front().expect("nonempty"));
                removals.fetch_add(1, Relaxed);
            }
        }
    };
    let mut peak = 0u64;
    let mut total = 0.0f64;
    let n = o.chunks as u64;
    // Worst single buffer call on the loop, and worst compute step (sum).
    let (mut api_max, mut sum_max) = (0f64, 0f64);
    // The plain read above ran on the loop: let the ticker start a fresh
    // period so that its first recorded wake-up does not include it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    sampler.on.store(true, Relaxed);
    recording.store(true, Relaxed);
    let sched0 = thread_schedstat_ms();
    let faults0 = faults("self");
    let loop_faults0 = faults("thread-self");
    let wchar0 = write_syscall_bytes();
    let steal0 = machine_steal_ms();
    let t = Instant::now();
    if mode == "blocking" {
        for i in 0..n {
            let p = timed(&mut api_max, || buf.get(&i))
                .expect("get")
                .expect("present");
            peak = peak.max(buf.stats().memory_bytes);
            total += timed(&mut sum_max, || chunk_sum(&p.data));
            timed(&mut api_max, || p.consume());
            timed(&mut api_max, || free(i, &mut lagging));
            // Let the ticker and the timers run between chunks, as a real
            // event loop would between messages.
            tokio::task::yield_now().await;
        }
    } else {
        let mut inflight = VecDeque::new();
        let mut next = 0u64;
        for i in 0..n {
            while next < n && next < i + o.window as u64 {
                let b = buf.clone();
                let k = next;
                inflight.push_back(tokio::spawn(async move {
                    // The synchronous part of `pin` (lookup, queueing the
                    // read) runs on the loop at the first poll.
                    let mut first = true;
                    let mut worst = 0f64;
                    let fut = b.pin(&k);
                    tokio::pin!(fut);
                    let r = std::future::poll_fn(|cx| {
                        let t = Instant::now();
                        let r = fut.as_mut().poll(cx);
                        if first {
                            worst = t.elapsed().as_secs_f64() * 1e3;
                            first = false;
                        }
                        r
                    })
                    .await;
                    (r, worst)
                }));
                next += 1;
            }
            if o.prefetch > 0 && next < n {
                timed(&mut api_max, || {
                    buf.prefetch(next..(next + o.prefetch as u64).min(n))
                });
            }
            let (p, pin_ms) = inflight
                .pop_front()
                .expect("in flight")
                .await
                .expect("pin task");
            api_max = api_max.max(pin_ms);
            let p = p.expect("pin").expect("present");
            peak = peak.max(buf.stats().memory_bytes);
            total += timed(&mut sum_max, || chunk_sum(&p.data));
            timed(&mut api_max, || p.consume());
            timed(&mut api_max, || free(i, &mut lagging));
            tokio::task::yield_now().await;
        }
    }
    let wall = t.elapsed().as_secs_f64();
    let sched1 = thread_schedstat_ms();
    let steal1 = machine_steal_ms();
    let faults1 = faults("self");
    let loop_faults1 = faults("thread-self");
    recording.store(false, Relaxed);
    for i in lagging.drain(..) {
        buf.remove(&i);
    }
    // Delayed removals still on their way.
    while o.free_delay_ms > 0 && removals.load(Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    buf.flush().await.expect("flush");
    let wchar1 = write_syscall_bytes();
    let (sampled_peak, mean, peak_rss, stalls) = sampler.finish();
    stop.store(true, Relaxed);
    let (mut late, mut own, worst_tick) = ticker.await.expect("ticker");
    late.sort_by(f64::total_cmp);
    own.sort_by(f64::total_cmp);
    // The same ticker on the same loop for as long again, with the buffer
    // idle: how late this machine wakes an event loop that does nothing.
    let idle = idle_ticker(Duration::from_secs_f64(wall.max(1.0))).await;
    let after = buf.stats();

    let (mut first_writes, mut rewritten) = (0u64, 0u64);
    for (w, &b) in writes().iter().zip(&writes_before) {
        let a = w.load(Relaxed);
        if a > b {
            if b == 0 {
                first_writes += 1;
            }
            if a >= 2 {
                rewritten += 1;
            }
        }
    }
    let read_bytes = after.unspilled_bytes_total - before.unspilled_bytes_total;
    let peak = peak.max(sampled_peak);
    json!({
        "mode": mode,
        "cache": if o.cold { "cold" } else { "warm" },
        "chunks": o.chunks,
        "chunk_bytes": chunk_bytes,
        "target_bytes": target,
        "limit_bytes": limit,
        "window": if mode == "async" { o.window } else { 1 },
        "prefetch": if mode == "async" { o.prefetch } else { 0 },
        "free_lag": o.free_lag,
        "free_delay_ms": o.free_delay_ms,
        "io_threads": o.io_threads,
        "io_nice": o.io_nice,
        "persist_seconds": round(persist_seconds, 3),
        "wall_seconds": round(wall, 3),
        "peak_resident_bytes": peak,
        "peak_over_limit_chunks": round((peak as f64 - limit as f64) / chunk_bytes as f64, 2),
        "mean_resident_bytes": mean.round() as u64,
        "peak_rss_bytes": peak_rss,
        "reduce_written_bytes": after.spilled_bytes_total - before.spilled_bytes_total,
        "reduce_first_written_chunks": first_writes,
        "reduce_rewritten_chunks": rewritten,
        "reduce_rewritten_bytes": REWRITTEN_BYTES.load(Relaxed),
        "reduce_read_bytes": read_bytes,
        "reduce_disk_write_bytes": wchar1 - wchar0,
        "reduce_compacted_records": after.compacted_count_total - before.compacted_count_total,
        "file_bytes_after_persist": before.file_bytes,
        "read_gb_per_s": round(read_bytes as f64 / wall / 1e9, 3),
        "unspill_ms_per_read": round(
            (after.unspill_seconds_total - before.unspill_seconds_total) * 1e3
                / (after.unspill_count_total - before.unspill_count_total).max(1) as f64,
            3
        ),
        "plain_read_bytes": plain_bytes,
        "plain_read_seconds": round(plain_seconds, 3),
        "plain_read_gb_per_s": round(plain_bytes as f64 / plain_seconds / 1e9, 3),
        "wall_over_plain_read": round(wall / plain_seconds, 2),
        "checked_fresh_read_seconds": round(floor_seconds, 3),
        "wall_over_checked_fresh_read": round(wall / floor_seconds, 2),
        "ticker_late_ms_p50": round(percentile(&late, 0.50), 3),
        "ticker_late_ms_p99": round(percentile(&late, 0.99), 3),
        "ticker_late_ms_max": round(late.last().copied().unwrap_or(0.0), 3),
        "idle_ticker_late_ms_p99": round(percentile(&idle, 0.99), 3),
        "idle_ticker_late_ms_max": round(idle.last().copied().unwrap_or(0.0), 3),
        "ticker_late_excl_cpu_wait_ms_p99": round(percentile(&own, 0.99), 3),
        "ticker_late_excl_cpu_wait_ms_max": round(own.last().copied().unwrap_or(0.0), 3),
        "worst_tick_ms_late_cpu_cpuwait": [
            round(worst_tick.0, 2), round(worst_tick.1, 2), round(worst_tick.2, 2)
        ],
        "ticks": late.len(),
        "loop_stall_samples": summarize(&stalls),
        "reduce_minor_faults": faults1.0 - faults0.0,
        "reduce_major_faults": faults1.1 - faults0.1,
        "loop_minor_faults": loop_faults1.0 - loop_faults0.0,
        "loop_api_call_max_ms": round(api_max, 3),
        "loop_sum_max_ms": round(sum_max, 3),
        "loop_cpu_ms": round(sched1.0 - sched0.0, 1),
        "machine_steal_ms": round(steal1 - steal0, 0),
        "loop_runqueue_wait_ms": round(sched1.1 - sched0.1, 1),
        "clean_evictions": after.clean_evictions_total - before.clean_evictions_total,
        "sum_ok": total == expected,
    })
}

/// Count the stall samples by (state, wait channel, syscall), ignoring how
/// overdue each was; keep the worst overdue figure per kind.
fn summarize(stalls: &[String]) -> serde_json::Value {
    let mut kinds: std::collections::BTreeMap<String, (u32, f64)> = Default::default();
    for s in stalls {
        let (ms, kind) = s.split_once(':').unwrap_or(("0ms", s));
        let ms: f64 = ms.trim_end_matches("ms").parse().unwrap_or(0.0);
        let e = kinds.entry(kind.to_string()).or_default();
        e.0 += 1;
        e.1 = e.1.max(ms);
    }
    json!(kinds
        .into_iter()
        .map(|(k, (n, ms))| format!("{k} x{n} (up to {ms:.0} ms overdue)"))
        .collect::<Vec<_>>())
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn main() {
    let o = parse();
    WRITES
        .set((0..o.chunks).map(|_| AtomicU32::new(0)).collect())
        .expect("set once");
    // SAFETY: a plain syscall with no arguments.
    LOOP_TID.store(unsafe { libc::gettid() } as u64, Relaxed);
    now_ns();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    for mode in &o.modes {
        let line = rt.block_on(run(&o, mode));
        println!("{line}");
    }
}
