//! Command-line benchmark: runs each workload against spillbuffer and the
//! raw baseline it is bounded by, in the same process and the same
//! directory, and prints one JSON line per workload.
//!
//! ```text
//! cargo run --release --example bench -- [--workload all|metadata|hit|get|pin-once|insert|spill|unspill|unspill-pipelined|policy|cold]
//!     [--dir DIR] [--small BYTES] [--large BYTES] [--count-small N] [--count-large N]
//!     [--target BYTES] [--threads 1,2] [--compression lz4|none] [--keys N] [--io-threads N]
//!     [--hit-ops N] [--hit-keys N] [--hit-draws N] [--hit-warm N] [--repeat R] [--window W]
//!     [--read-threads N] [--depths 1,8,32] [--cold-reads N]
//! ```
//!
//! Every figure is the median of `--repeat` runs; crate and raw runs
//! alternate, so both see the same machine state. Throughput is bytes of
//! values per second (spill, unspill, insert) or operations per second
//! (hit, get). Latencies are per operation on the caller's thread: for the
//! hit path, each sample is the mean of a batch of 64 calls (a clock read
//! costs about as much as the call itself); for the pipelined unspill, each
//! is one `pin` from its first poll to its value, its wait behind the other
//! reads in flight included. Peak RSS is VmHWM, reset before each workload.
//!
//! In `hit` and `get`, each thread reads `--hit-draws` keys (4,096 unless
//! told; a power of two) drawn at random from its own share of the
//! `--hit-keys` resident ones, in turn, new draws in every repeat, after
//! `--hit-warm N` untimed passes over its draws (2 unless told). Each
//! repeat of each thread count builds a buffer for each placement of the
//! keys: inserted by the thread that reads them (`own_*`), by one other
//! thread in key order (`other_*`, the line's main figure), or by one
//! other thread in random order, so that the threads' keys lie
//! interleaved (`interleaved_*`). Beside each, the `HashMap` + `Arc`
//! floor with its keys placed alike, and both scalings over one thread.
//!
//! `policy` (not part of `all`): `--hit-keys` values of `--small` bytes
//! inserted once, then `--hit-ops` blocking `get`s in zipf(1) order and in
//! a zipf-plus-scan mix, with memory for 10%, 25% and 50% of the values;
//! disk reads are reported against an exact LRU of the same byte capacity
//! on the same sequence. `policy-sweep` replays the same sequences through
//! the eviction rule alone, for several dirty-age factors.
//!
//! `cold` (not part of `all`; root, to drop the page cache): random reads
//! of spilled `--small` and 64 KiB values, `--cold-reads` per run, with
//! each of `--depths` pins in flight (and blocking `get` at depth 1),
//! against `pread()` threads at the same depth on the same bytes
//! (`common::cold`).

#[path = "../benches/common/mod.rs"]
mod common;

use common::policy;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use spillbuffer::{Compression, SpillBuffer};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

struct Opts {
    workload: String,
    dir: PathBuf,
    small: usize,
    large: usize,
    count_small: usize,
    count_large: usize,
    target: Option<usize>,
    threads: Vec<usize>,
    compression: Compression,
    keys: usize,
    io_threads: usize,
    hit_ops: usize,
    hit_keys: usize,
    /// Keys each thread of the hit workloads draws from its share and
    /// reads in turn: a power of two.
    hit_draws: usize,
    /// Untimed passes over its draws each thread of `hit` and `get` makes
    /// first: with 2 or more, the timed calls are all hits (the first two
    /// pins of a key take its shard's lock).
    hit_warm: usize,
    repeat: usize,
    window: usize,
    /// The buffer's read threads (`None`: its default).
    read_threads: Option<usize>,
    /// Reads in flight of the `cold` workload.
    depths: Vec<usize>,
    /// Reads per run of the `cold` workload.
    cold_reads: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench [--workload all|metadata|hit|get|pin-once|insert|spill|unspill|unspill-pipelined|policy|policy-sweep|cold] [--dir DIR] \
         [--small BYTES] [--large BYTES] [--count-small N] [--count-large N] [--target BYTES] \
         [--threads 1,2] [--compression lz4|none] [--keys N] [--io-threads N] [--hit-ops N] [--hit-keys N] [--hit-draws N] [--hit-warm N] [--repeat R] [--window W] \
         [--read-threads N] [--depths 1,8,32] [--cold-reads N]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        workload: "all".into(),
        dir: PathBuf::from("target/bench-spill"),
        small: 4096,
        large: 4 << 20,
        count_small: 50_000,
        count_large: 64,
        target: None,
        threads: vec![1, 2],
        compression: Compression::Lz4,
        keys: 1_000_000,
        io_threads: 2,
        hit_ops: 2_000_000,
        hit_keys: 10_000,
        hit_draws: common::HIT_DRAWS,
        hit_warm: 2,
        repeat: 3,
        window: 4,
        read_threads: None,
        depths: vec![1, 8, 32],
        cold_reads: 4000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--workload" => o.workload = val(),
            "--dir" => o.dir = PathBuf::from(val()),
            "--small" => o.small = num(val()),
            "--large" => o.large = num(val()),
            "--count-small" => o.count_small = num(val()),
            "--count-large" => o.count_large = num(val()),
            "--target" => o.target = Some(num(val())),
            "--threads" => o.threads = val().split(',').map(|s| num(s.to_string())).collect(),
            "--compression" => {
                o.compression = match val().as_str() {
                    "lz4" => Compression::Lz4,
                    "none" => Compression::None,
                    _ => usage(),
                }
            }
            "--keys" => o.keys = num(val()),
            "--io-threads" => o.io_threads = num(val()).max(1),
            "--hit-ops" => o.hit_ops = num(val()),
            "--hit-keys" => o.hit_keys = num(val()).max(1),
            "--hit-draws" => {
                o.hit_draws = num(val());
                if !o.hit_draws.is_power_of_two() {
                    eprintln!("--hit-draws must be a power of two, not {}", o.hit_draws);
                    std::process::exit(2)
                }
            }
            "--hit-warm" => o.hit_warm = num(val()),
            "--repeat" => o.repeat = num(val()).max(1),
            "--window" => o.window = num(val()).max(1),
            "--read-threads" => o.read_threads = Some(num(val())),
            "--depths" => {
                o.depths = val()
                    .split(',')
                    .map(|s| num(s.to_string()).max(1))
                    .collect()
            }
            "--cold-reads" => o.cold_reads = num(val()).max(1),
            _ => usage(),
        }
    }
    o
}

// ----- measurement helpers ------------------------------------------------

fn proc_status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn peak_rss() -> u64 {
    proc_status("VmHWM:")
}

fn rss() -> u64 {
    proc_status("VmRSS:")
}

/// Reset VmHWM to the current RSS (Linux >= 4.0), so that each workload
/// reports its own peak.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// CPU time this thread has run, in ns (first field of schedstat).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time, in ns, of every thread of this process but the caller (the
/// IO pool's, while one buffer lives).
fn other_threads_cpu_ns() -> u64 {
    let me = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_owned()));
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| Some(t.file_name()) != me)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `t` threads' ops/s over one thread's (1 for one thread, or when the
/// run had no one-thread line).
fn scaling_of(ops: f64, one_thread: f64, t: usize) -> f64 {
    if one_thread > 0.0 && t > 1 {
        ops / one_thread
    } else {
        1.0
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentiles(mut ns: Vec<u64>) -> (u64, u64, u64) {
    if ns.is_empty() {
        return (0, 0, 0);
    }
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)];
    (at(0.50), at(0.99), at(0.999))
}

/// Write back dirty pages so that each run starts from the same state.
/// Never inside a timed region.
fn sync_disk() {
    let _ = std::process::Command::new("sync").status();
}

type Buf = SpillBuffer<u64, Vec<f64>>;

fn buffer(o: &Opts, target: usize) -> Buf {
    let mut b = SpillBuffer::builder(&o.dir)
        .memory_target(target)
        .compression(o.compression)
        .io_threads(o.io_threads);
    if let Some(n) = o.read_threads {
        b = b.read_threads(n);
    }
    b.build().expect("build buffer")
}

/// A buffer holding `keys` in memory, each with its hit-path value.
fn resident(o: &Opts, keys: std::ops::Range<u64>) -> Buf {
    let b = buffer(o, usize::MAX / 2);
    for k in keys {
        b.insert(k, common::hit_value(k)).unwrap();
    }
    b
}

struct Line {
    workload: String,
    value_bytes: usize,
    count: usize,
    threads: usize,
    bytes_per_s: f64,
    ops_per_s: f64,
    lat: (u64, u64, u64),
    raw_name: &'static str,
    raw: f64,
    extra: serde_json::Value,
}

fn emit(o: &Opts, l: Line) {
    let own = if l.raw_name.ends_with("(ops/s)") {
        l.ops_per_s
    } else {
        l.bytes_per_s
    };
    let mut v = json!({
        "workload": l.workload,
        "value_bytes": l.value_bytes,
        "count": l.count,
        "threads": l.threads,
        "compression": format!("{:?}", o.compression).to_lowercase(),
        "repeat": o.repeat,
        "io_threads": o.io_threads,
        "throughput_bytes_per_s": l.bytes_per_s.round(),
        "ops_per_s": l.ops_per_s.round(),
        "p50_ns": l.lat.0,
        "p99_ns": l.lat.1,
        "p999_ns": l.lat.2,
        "peak_rss_bytes": peak_rss(),
        "raw_baseline": l.raw_name,
        "raw_figure": l.raw.round(),
        "ratio": if l.raw > 0.0 { (own / l.raw * 1000.0).round() / 1000.0 } else { 0.0 },
    });
    if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), l.extra) {
        m.extend(e);
    }
    println!("{v}");
}

// ----- workloads -------------------------------------------------------------

/// Bytes of metadata per key: RSS of `keys` tiny resident entries minus the
/// RSS of the same values held in a plain `Vec`. Run it first in a process:
/// memory freed by earlier workloads would hide the growth.
fn metadata(o: &Opts) {
    reset_peak();
    let n = o.keys;
    let r0 = rss();
    let values: Vec<Vec<f64>> = (0..n).map(|i| vec![i as f64]).collect();
    let r1 = rss();
    let payload = r1.saturating_sub(r0);
    let b = buffer(o, usize::MAX / 2);
    let start = Instant::now();
    for (i, v) in values.into_iter().enumerate() {
        b.insert(i as u64, v).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let r2 = rss();
    let total = r2.saturating_sub(r0);
    let per_key = (total as f64 - payload as f64) / n as f64;
    // Each key pinned twice (its hit pins were made when it was linked;
    // this measures what pins leave behind, if anything).
    for i in 0..n as u64 {
        drop(b.try_pin(&i));
        drop(b.try_pin(&i));
    }
    let r3 = rss();
    let per_pinned_key = (r3.saturating_sub(r0) as f64 - payload as f64) / n as f64;
    emit(
        o,
        Line {
            workload: "metadata".into(),
            value_bytes: 8,
            count: n,
            threads: 1,
            bytes_per_s: 0.0,
            ops_per_s: n as f64 / secs,
            lat: (0, 0, 0),
            raw_name: "values in a Vec (bytes/key)",
            raw: payload as f64 / n as f64,
            extra: json!({
                "metadata_bytes_per_key": (per_key * 10.0).round() / 10.0,
                "metadata_bytes_per_pinned_key": (per_pinned_key * 10.0).round() / 10.0,
                "rss_with_buffer_bytes": total,
                "rss_values_alone_bytes": payload,
            }),
        },
    );
    drop(b);
}

/// Where the keys of the `hit` workload were inserted from, and so where
/// their memory lies.
#[derive(Clone, Copy, PartialEq)]
enum Placement {
    /// Each thread inserted the keys it reads, on its own thread.
    Own,
    /// This thread inserted them all, in key order: each thread's keys lie
    /// together.
    Other,
    /// This thread inserted them all, in random order: the threads' keys
    /// lie interleaved.
    Interleaved,
}

const PLACEMENTS: [(&str, Placement); 3] = [
    ("own", Placement::Own),
    ("other", Placement::Other),
    ("interleaved", Placement::Interleaved),
];

/// The order this thread inserts the keys of `placement` in (none for
/// `Own`: the threads insert theirs).
fn insert_order(keys: u64, placement: Placement, rep: usize) -> Vec<u64> {
    let mut order: Vec<u64> = match placement {
        Placement::Own => return Vec::new(),
        _ => (0..keys).collect(),
    };
    if placement == Placement::Interleaved {
        order.shuffle(&mut StdRng::seed_from_u64(rep as u64 + 7));
    }
    order
}

/// `try_pin` (or `get`) of resident keys, each thread on its own keys, for
/// each placement of the keys; beside each, the `HashMap` + `Arc` floor
/// with its keys placed alike (own: a map per thread, made on that
/// thread; other and interleaved: one map made on this thread, its values
/// allocated in the same order as the buffer's).
fn hit(o: &Opts, use_get: bool) {
    // Spread over all threads; each reads its own slice in random order.
    let keys = o.hit_keys.max(o.threads.iter().copied().max().unwrap_or(1)) as u64;
    // Raw floor: a plain HashMap lookup and Arc clone, one thread.
    let raw_map = common::floor_map(0..keys);
    let name = if use_get { "get" } else { "try_pin" };
    // One thread's ops/s per placement: the buffer's and the floor's.
    let mut one_thread = [(0.0, 0.0); 3];
    for &t in &o.threads {
        reset_peak();
        let mut raws = Vec::new();
        let mut lat = Vec::new();
        let mut ops = [vec![], vec![], vec![]];
        let mut cpu = [vec![], vec![], vec![]];
        let mut floors = [vec![], vec![], vec![]];
        for rep in 0..o.repeat {
            let per_thread = o.hit_ops / 64 * 64;
            for (pi, &(_, place)) in PLACEMENTS.iter().enumerate() {
                let order = insert_order(keys, place, rep);
                let b = buffer(o, usize::MAX / 2);
                for &k in &order {
                    b.insert(k, common::hit_value(k)).unwrap();
                }
                let own = place == Placement::Own;
                let results = hit_threads(&b, keys, t, per_thread, o, rep, use_get, own);
                let slowest = results.iter().map(|r| r.0).max().unwrap();
                ops[pi].push((per_thread * t) as f64 / slowest.as_secs_f64());
                let c: u64 = results.iter().map(|r| r.2).sum();
                cpu[pi].push(c as f64 / (per_thread * t) as f64);
                if place == Placement::Other {
                    for (_, s, _) in results {
                        lat.extend(s);
                    }
                }
                drop(b);
                let run = common::FloorRun {
                    keys,
                    threads: t,
                    iters: per_thread,
                    draws: o.hit_draws,
                    seed: rep as u64 * 100,
                };
                let floor = match place {
                    Placement::Own => common::parallel_floor(run),
                    Placement::Other => common::shared_floor(&raw_map, run),
                    Placement::Interleaved => {
                        let map = order
                            .iter()
                            .map(|&k| (k, Arc::new(common::hit_value(k))))
                            .collect();
                        common::shared_floor(&map, run)
                    }
                };
                floors[pi].push((per_thread * t) as f64 / floor.as_secs_f64());
            }
            // Raw floor, one thread, in the same run.
            let mut rng = StdRng::seed_from_u64(rep as u64);
            let order: Vec<u64> = (0..o.hit_draws).map(|_| rng.gen_range(0..keys)).collect();
            let start = Instant::now();
            common::floor_lookups(&raw_map, &order, per_thread);
            raws.push(per_thread as f64 / start.elapsed().as_secs_f64());
        }
        let mut extra = json!({
            "resident_keys": keys,
            "draws_per_thread": o.hit_draws,
            "warm_passes": o.hit_warm,
        });
        let mut other_ops = 0.0;
        for (pi, &(label, place)) in PLACEMENTS.iter().enumerate() {
            let ops = median(&mut ops[pi]);
            let floor = median(&mut floors[pi]);
            if t == 1 {
                one_thread[pi] = (ops, floor);
            }
            if place == Placement::Other {
                other_ops = ops;
            }
            let scaling = scaling_of(ops, one_thread[pi].0, t);
            let floor_scaling = scaling_of(floor, one_thread[pi].1, t);
            let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
            extra[format!("{label}_ops_per_s")] = json!(ops.round());
            extra[format!("{label}_ns_per_op")] = json!((1e9 / ops * 10.0).round() / 10.0);
            extra[format!("{label}_cpu_ns_per_op")] =
                json!((median(&mut cpu[pi]) * 10.0).round() / 10.0);
            extra[format!("{label}_scaling_vs_1_thread")] = json!(round3(scaling));
            extra[format!("{label}_floor_ops_per_s")] = json!(floor.round());
            extra[format!("{label}_floor_scaling_vs_1_thread")] = json!(round3(floor_scaling));
            extra[format!("{label}_scaling_vs_floor_scaling")] =
                json!(round3(scaling / floor_scaling));
        }
        emit(
            o,
            Line {
                workload: format!("hit-{name}"),
                value_bytes: 64,
                count: o.hit_ops,
                threads: t,
                bytes_per_s: other_ops * 64.0,
                ops_per_s: other_ops,
                lat: percentiles(lat),
                raw_name: "HashMap get + Arc clone, 1 thread (ops/s)",
                raw: median(&mut raws),
                extra,
            },
        );
    }
}

/// `t` threads calling `try_pin` (or `get`) on their own keys in `b`,
/// each first inserting its share of the keys if `insert_own`: per
/// thread, its time, its latency samples (mean of each batch of 64 calls)
/// and its CPU time.
#[expect(clippy::too_many_arguments, reason = "one call site per workload")]
fn hit_threads(
    b: &Buf,
    keys: u64,
    t: usize,
    per_thread: usize,
    o: &Opts,
    rep: usize,
    use_get: bool,
    insert_own: bool,
) -> Vec<(Duration, Vec<u64>, u64)> {
    let draws = o.hit_draws;
    let barrier = Barrier::new(t);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..t)
            .map(|ti| {
                let barrier = &barrier;
                s.spawn(move || {
                    if insert_own {
                        let span = keys / t as u64;
                        for k in ti as u64 * span..(ti as u64 + 1) * span {
                            b.insert(k, common::hit_value(k)).unwrap();
                        }
                    }
                    // Disjoint key ranges per thread.
                    let order = common::own_keys(keys, ti, t, draws, rep as u64 * 100);
                    let mut samples = Vec::with_capacity(per_thread / 64);
                    for k in (0..o.hit_warm).flat_map(|_| &order) {
                        std::hint::black_box(if use_get {
                            b.get(k).unwrap()
                        } else {
                            b.try_pin(k)
                        });
                    }
                    barrier.wait();
                    let start = Instant::now();
                    let cpu0 = thread_cpu_ns();
                    for batch in 0..per_thread / 64 {
                        let t0 = Instant::now();
                        for i in 0..64 {
                            let k = &order[(batch * 64 + i) & (draws - 1)];
                            let p = if use_get {
                                b.get(k).unwrap()
                            } else {
                                b.try_pin(k)
                            };
                            std::hint::black_box(p);
                        }
                        samples.push(t0.elapsed().as_nanos() as u64 / 64);
                    }
                    (start.elapsed(), samples, thread_cpu_ns() - cpu0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Each of `--hit-keys` resident keys pinned once, in random order: what
/// a worker pays when every input is a first pin (each goes through its
/// shard's read lock).
/// Each run a fresh buffer; the floor is a `HashMap::get` + `Arc` clone
/// of the same keys in the same order.
fn pin_once(o: &Opts) {
    reset_peak();
    let keys = o.hit_keys as u64;
    let (mut ops, mut raws, mut cpu_per_op) = (Vec::new(), Vec::new(), Vec::new());
    let mut lat = Vec::new();
    for rep in 0..o.repeat {
        let b = resident(o, 0..keys);
        let mut order: Vec<u64> = (0..keys).collect();
        order.shuffle(&mut StdRng::seed_from_u64(rep as u64));
        let cpu0 = thread_cpu_ns();
        let start = Instant::now();
        // Latency samples as in `hit`: the mean of each batch of 64 calls.
        for batch in order.chunks(64) {
            let t0 = Instant::now();
            for k in batch {
                std::hint::black_box(b.try_pin(k));
            }
            lat.push(t0.elapsed().as_nanos() as u64 / batch.len() as u64);
        }
        let took = start.elapsed();
        cpu_per_op.push((thread_cpu_ns() - cpu0) as f64 / keys as f64);
        ops.push(keys as f64 / took.as_secs_f64());
        drop(b);
        let raw_map = common::floor_map(0..keys);
        let start = Instant::now();
        for k in &order {
            std::hint::black_box(raw_map.get(k).cloned());
        }
        raws.push(keys as f64 / start.elapsed().as_secs_f64());
    }
    let ops = median(&mut ops);
    emit(
        o,
        Line {
            workload: "pin-once".into(),
            value_bytes: 64,
            count: keys as usize,
            threads: 1,
            bytes_per_s: ops * 64.0,
            ops_per_s: ops,
            lat: percentiles(lat),
            raw_name: "HashMap get + Arc clone, same order (ops/s)",
            raw: median(&mut raws),
            extra: json!({
                "cpu_ns_per_op": (median(&mut cpu_per_op) * 10.0).round() / 10.0,
                "resident_keys": keys,
            }),
        },
    );
}

/// Insert into memory only (target far above the data).
fn insert(o: &Opts, size: usize, count: usize) {
    reset_peak();
    let mut rng = StdRng::seed_from_u64(7);
    let (mut bps, mut raws, mut lat) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.repeat {
        let values: Vec<Vec<f64>> = (0..count)
            .map(|_| common::random_f64(&mut rng, size))
            .collect();
        let b = buffer(o, usize::MAX / 2);
        let mut l = Vec::with_capacity(count);
        let start = Instant::now();
        for (i, v) in values.into_iter().enumerate() {
            let t0 = Instant::now();
            b.insert(i as u64, v).unwrap();
            l.push(t0.elapsed().as_nanos() as u64);
        }
        bps.push((count * size) as f64 / start.elapsed().as_secs_f64());
        lat.extend(l);
        drop(b);
        // Raw: the same values into a std HashMap.
        let values: Vec<Vec<f64>> = (0..count)
            .map(|_| common::random_f64(&mut rng, size))
            .collect();
        let mut m = HashMap::new();
        let start = Instant::now();
        for (i, v) in values.into_iter().enumerate() {
            m.insert(i as u64, v);
        }
        raws.push((count * size) as f64 / start.elapsed().as_secs_f64());
        drop(m);
    }
    let bps = median(&mut bps);
    emit(
        o,
        Line {
            workload: "insert".into(),
            value_bytes: size,
            count,
            threads: 1,
            bytes_per_s: bps,
            ops_per_s: bps / size as f64,
            lat: percentiles(lat),
            raw_name: "std HashMap insert (bytes/s)",
            raw: median(&mut raws),
            extra: json!({}),
        },
    );
}

/// Write each value with one `write()` to a fresh file in `dir`.
fn raw_write(dir: &Path, values: &[Vec<f64>]) -> (f64, PathBuf) {
    let path = dir.join("raw-baseline.bin");
    let _ = std::fs::remove_file(&path);
    let mut f = File::create(&path).unwrap();
    let start = Instant::now();
    for v in values {
        f.write_all(common::bytes(v)).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    (secs, path)
}

/// Spill throughput: insert with a small target, then flush; bytes of values
/// over the time from the first insert to the end of the flush.
fn spill(o: &Opts, kind: &str, size: usize, count: usize) {
    reset_peak();
    // Small enough that nearly every value is spilled through the LRU path;
    // throughput counts only the values written.
    let target = o
        .target
        .unwrap_or(if size >= 1 << 20 { size } else { 1 << 20 });
    let mut rng = StdRng::seed_from_u64(11);
    let make = |rng: &mut StdRng| -> Vec<Vec<f64>> {
        (0..count)
            .map(|_| match kind {
                "half-zeros" => common::half_zeros(rng, size),
                _ => common::random_f64(rng, size),
            })
            .collect()
    };
    let total = (count * size) as f64;
    let (mut bps, mut raws, mut lat, mut stored) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
    let mut pool_secs = (0.0, 0.0);
    // CPU per value written: the caller's (insert, eviction choice) and
    // the IO pool's (encode, checksum, write, bookkeeping).
    let (mut caller_us, mut pool_us) = (Vec::new(), Vec::new());
    for rep in 0..o.repeat {
        // Alternate which goes first, so neither always meets the other's
        // writeback.
        for crate_turn in [rep % 2 == 1, rep % 2 == 0] {
            let values = make(&mut rng);
            sync_disk();
            if !crate_turn {
                let (secs, path) = raw_write(&o.dir, &values);
                raws.push(total / secs);
                drop(values);
                std::fs::remove_file(path).unwrap();
                continue;
            }
            let b = buffer(o, target);
            let mut l = Vec::with_capacity(count);
            let pool0 = other_threads_cpu_ns();
            let start = Instant::now();
            let cpu0 = thread_cpu_ns();
            for (i, v) in values.into_iter().enumerate() {
                let t0 = Instant::now();
                b.insert(i as u64, v).unwrap();
                l.push(t0.elapsed().as_nanos() as u64);
            }
            let caller = thread_cpu_ns() - cpu0;
            b.flush_blocking().unwrap();
            let secs = start.elapsed().as_secs_f64();
            let pool = other_threads_cpu_ns().saturating_sub(pool0);
            let st = b.stats();
            let written = st.spill_count_total.max(1) as f64;
            caller_us.push(caller as f64 / 1e3 / count as f64);
            pool_us.push(pool as f64 / 1e3 / written);
            // Only the values written count, for the crate as for raw.
            bps.push((st.spill_count_total as usize * size) as f64 / secs);
            lat.extend(l);
            stored = st.spilled_bytes_total;
            pool_secs = (st.spill_seconds_total, secs);
            drop(b);
        }
    }
    let paired = paired_median(&bps, &raws);
    let bps = median(&mut bps);
    emit(
        o,
        Line {
            workload: format!("spill-{kind}"),
            value_bytes: size,
            count,
            threads: 1,
            bytes_per_s: bps,
            ops_per_s: bps / size as f64,
            lat: percentiles(lat),
            raw_name: "write() of the same bytes, one call per value (bytes/s)",
            raw: median(&mut raws),
            extra: json!({
                "target": target,
                "stored_bytes_last_run": stored,
                "ratio_paired_median": paired,
                "io_pool_spill_seconds_last_run": pool_secs.0,
                "wall_seconds_last_run": pool_secs.1,
                "caller_cpu_us_per_value": (median(&mut caller_us) * 100.0).round() / 100.0,
                "io_pool_cpu_us_per_written_value": (median(&mut pool_us) * 100.0).round() / 100.0,
            }),
        },
    );
}

/// Which unspill lines a run emits.
#[derive(Clone, Copy, PartialEq)]
enum Unspill {
    /// `unspill-*` (blocking `get`) and `unspill-pipelined-*`.
    Both,
    /// `unspill-pipelined-*` only.
    Pipelined,
}

/// Median of the per-repeat ratios `own[i] / raw[i]`, to 3 decimals.
fn paired_median(own: &[f64], raw: &[f64]) -> f64 {
    let mut r: Vec<f64> = own.iter().zip(raw).map(|(c, r)| c / r).collect();
    (median(&mut r) * 1000.0).round() / 1000.0
}

/// Unspill throughput: every value on disk (target 0), then read each key
/// in order or in zipf order, dropping the pin at once, two ways:
///
/// - `unspill-*`: blocking `get` key after key on the caller's thread;
/// - `unspill-pipelined-*`: `pin` on a current-thread tokio runtime (the
///   host's event loop) with `--window` pins in flight, so that the reads
///   run on the IO pool's threads at once (`common::pin_window`).
///
/// The raw baseline is `pread()` of the same bytes from a plain file
/// written just before (page cache warm in both), into a reused buffer, on
/// one thread; `raw_fresh` reads into a new `Vec` each time, as a decoded
/// value must be; `raw_fresh_vec_crc` also checksums each 256 KiB piece,
/// the least a read that checks its data does. As the pipelined reads use
/// the pool's threads, its line also compares against the reused-buffer
/// read, the fresh-`Vec` read and the checked read on that many threads
/// (`raw_threads_*`).
fn unspill(o: &Opts, which: Unspill, order: &str, size: usize, count: usize) {
    use common::RawRead;
    reset_peak();
    let mut rng = StdRng::seed_from_u64(13);
    let values: Vec<Vec<f64>> = (0..count)
        .map(|_| common::random_f64(&mut rng, size))
        .collect();
    let reads: Vec<usize> = match order {
        "zipf" => common::zipf(&mut rng, count, count),
        _ => (0..count).collect(),
    };
    let total = (reads.len() * size) as f64;
    let (_, path) = raw_write(&o.dir, &values);
    let raw_file = File::open(&path).unwrap();
    let b = buffer(o, 0);
    for (i, v) in values.iter().enumerate() {
        b.insert(i as u64, v.clone()).unwrap();
    }
    b.flush_blocking().unwrap();
    drop(values);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let raw_bps = |how, threads| {
        total / common::raw_read_threads(&raw_file, &reads, size, how, threads).as_secs_f64()
    };
    let (mut bps, mut raws, mut fresh, mut fresh_crc, mut lat) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut piped, mut raw_threads, mut crc_threads, mut piped_lat) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut fresh_threads = Vec::new();
    let mut disk_reads = 0;
    for _ in 0..o.repeat {
        raws.push(raw_bps(RawRead::Reused, 1));
        if which == Unspill::Both {
            fresh.push(raw_bps(RawRead::FreshVec, 1));
            fresh_crc.push(raw_bps(RawRead::FreshVecCrc, 1));
            let mut l = Vec::with_capacity(reads.len());
            let start = Instant::now();
            for &i in &reads {
                let t0 = Instant::now();
                let p = b.get(&(i as u64)).unwrap().expect("present");
                std::hint::black_box(&*p);
                drop(p);
                l.push(t0.elapsed().as_nanos() as u64);
            }
            bps.push(total / start.elapsed().as_secs_f64());
            lat.extend(l);
        }
        raw_threads.push(raw_bps(RawRead::Reused, o.io_threads));
        crc_threads.push(raw_bps(RawRead::FreshVecCrc, o.io_threads));
        fresh_threads.push(raw_bps(RawRead::FreshVec, o.io_threads));
        let before = b.stats().unspill_count_total;
        let start = Instant::now();
        let l = rt.block_on(common::pin_window(&b, &reads, o.window));
        piped.push(total / start.elapsed().as_secs_f64());
        piped_lat.extend(l);
        disk_reads = b.stats().unspill_count_total - before;
    }
    drop(b);
    drop(raw_file);
    let _ = std::fs::remove_file(path);
    // Paired ratios first: `median` sorts its input.
    let paired = |own: &[f64], raw: &[f64]| (!own.is_empty()).then(|| paired_median(own, raw));
    let (get_raw, get_fresh, get_floor) = (
        paired(&bps, &raws),
        paired(&bps, &fresh),
        paired(&bps, &fresh_crc),
    );
    let pin_fresh = paired(&piped, &fresh_threads);
    let (pin_raw, pin_threads, pin_floor) = (
        paired(&piped, &raws),
        paired(&piped, &raw_threads),
        paired(&piped, &crc_threads),
    );
    let raw = median(&mut raws);
    let line = |workload: String, bps: f64, lat: Vec<u64>, extra| Line {
        workload,
        value_bytes: size,
        count: reads.len(),
        threads: 1,
        bytes_per_s: bps,
        ops_per_s: bps / size as f64,
        lat: percentiles(lat),
        raw_name: "pread() of the same bytes into a reused buffer, 1 thread (bytes/s)",
        raw,
        extra,
    };
    if which == Unspill::Both {
        let extra = json!({
            "raw_fresh_vec_bytes_per_s": median(&mut fresh).round(),
            "ratio_to_fresh_vec_paired_median": get_fresh,
            "ratio_paired_median": get_raw,
            "raw_fresh_vec_crc_bytes_per_s": median(&mut fresh_crc).round(),
            "ratio_to_fresh_vec_crc_paired_median": get_floor,
        });
        emit(
            o,
            line(format!("unspill-{order}"), median(&mut bps), lat, extra),
        );
    }
    let extra = json!({
        "window": o.window,
        "ratio_paired_median": pin_raw,
        "raw_threads": o.io_threads,
        "raw_threads_bytes_per_s": median(&mut raw_threads).round(),
        "ratio_to_raw_threads_paired_median": pin_threads,
        "raw_threads_fresh_vec_bytes_per_s": median(&mut fresh_threads).round(),
        "ratio_to_threads_fresh_vec_paired_median": pin_fresh,
        "raw_threads_fresh_vec_crc_bytes_per_s": median(&mut crc_threads).round(),
        "ratio_to_threads_checked_floor_paired_median": pin_floor,
        "disk_reads_last_run": disk_reads,
    });
    let bps = median(&mut piped);
    emit(
        o,
        line(format!("unspill-pipelined-{order}"), bps, piped_lat, extra),
    );
}

/// Random reads with the page cache dropped (`common::cold`): `pin` with
/// each of `--depths` reads in flight, and blocking `get` at depth 1,
/// against `pread()` threads at the same depth. Values of `--small`
/// bytes and of 64 KiB, 256 MiB of each.
fn cold(o: &Opts) {
    for size in [o.small, 64 << 10] {
        reset_peak();
        let values = (256 << 20) / size;
        let b = buffer(o, 0);
        let runs = common::cold::run(&b, &o.dir, size, values, o.cold_reads, &o.depths, o.repeat);
        drop(b);
        for r in runs {
            let mut extra = json!({
                "depth": r.depth,
                "values": r.values,
                "page_cache_dropped": r.cold,
                "read_threads": o.read_threads,
                "ratio_paired_median": r.pin_ratio_paired,
            });
            if let (Some(get), Some(ratio)) = (r.get, r.get_ratio_paired) {
                extra["get_bytes_per_s"] = json!(get.round());
                extra["get_ratio_paired_median"] = json!(ratio);
            }
            emit(
                o,
                Line {
                    workload: format!("cold-random-pin-depth{}", r.depth),
                    value_bytes: r.size,
                    count: r.reads,
                    threads: 1,
                    bytes_per_s: r.pin,
                    ops_per_s: r.pin / r.size as f64,
                    lat: (r.pin_lat[0], r.pin_lat[1], r.pin_lat[2]),
                    raw_name: "pread() of the same bytes on as many threads as reads in flight, page cache dropped (bytes/s)",
                    raw: r.raw,
                    extra,
                },
            );
        }
    }
}

fn main() {
    let o = parse();
    std::fs::create_dir_all(&o.dir).expect("create --dir");
    let w = o.workload.as_str();
    let all = w == "all";
    // First: it needs a process whose heap has not been used yet.
    if all || w == "metadata" {
        metadata(&o);
    }
    if all || w == "hit" {
        hit(&o, false);
    }
    if all || w == "get" {
        hit(&o, true);
    }
    if all || w == "pin-once" {
        pin_once(&o);
    }
    if all || w == "insert" {
        insert(&o, o.small, o.count_small);
        insert(&o, o.large, o.count_large);
    }
    if all || w == "spill" {
        spill(&o, "random", o.large, o.count_large);
        spill(&o, "half-zeros", o.large, o.count_large);
        spill(&o, "random", o.small, o.count_small);
    }
    let which = match w {
        "all" | "unspill" => Some(Unspill::Both),
        "unspill-pipelined" => Some(Unspill::Pipelined),
        _ => None,
    };
    if let Some(which) = which {
        unspill(&o, which, "seq", o.large, o.count_large);
        unspill(&o, which, "zipf", o.large, o.count_large);
        unspill(&o, which, "seq", o.small, o.count_small);
        unspill(&o, which, "zipf", o.small, o.count_small);
    }
    if w == "cold" {
        cold(&o);
    }
    if w == "policy" {
        policy::report(&o.dir, o.hit_keys, o.hit_ops, o.small);
    }
    if w == "policy-sweep" {
        policy::sweep_report(o.hit_keys, o.hit_ops);
    }
    let _ = std::io::stdout().flush();
}
