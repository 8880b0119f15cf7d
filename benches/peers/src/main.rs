//! spillbuffer next to its peers on the root bench's spill, unspill and
//! small-value workloads (`examples/bench.rs`: the same value sizes,
//! counts, memory targets, seeds and raw baselines, the last shared by
//! path from `benches/common`), in one process on one disk:
//!
//! - `raw`: one `write()` per value to a plain file / `pread()` of the
//!   same bytes into a reused buffer, the root bench's limit;
//! - `spillbuffer`: the buffer as the root bench sets it up (lz4, 2 IO
//!   threads): inserts then `flush_blocking`; blocking `get`;
//! - `foyer`: its hybrid cache writing each value on insertion and waiting
//!   for the write after each insert (`foyer_cache`); reads awaited one
//!   after another on the runtime;
//! - `foyer-nowait` (spill only): the same cache without the waits, one
//!   wait at the end; the values it dropped are counted, not hidden;
//! - `file-per-key`: one file per key, written on the caller's thread when
//!   the memory target is passed, read whole (`file_per_key`).
//!
//! Contenders run in a rotating order within each repeat, each spill run
//! after a `sync`; figures are medians over the repeats, ratios the median
//! of each repeat's figure over the raw one of the same repeat.
//!
//! ```text
//! cargo run --release -- [--workload all|spill|unspill] [--dir DIR] [--repeat N]
//!     [--small B] [--large B] [--count-small N] [--count-large N]
//! ```

#[path = "../../common/mod.rs"]
mod common;
mod file_per_key;
mod foyer_cache;

use common::RawRead;
use file_per_key::{Budget, FilePerKey};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;
use spillbuffer::{Compression, SpillBuffer};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Opts {
    workload: String,
    dir: PathBuf,
    repeat: usize,
    small: usize,
    large: usize,
    count_small: usize,
    count_large: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: peers [--workload all|spill|unspill] [--dir DIR] [--repeat N] \
         [--small B] [--large B] [--count-small N] [--count-large N]"
    );
    std::process::exit(2)
}

/// Defaults as in `examples/bench.rs`, but 5 repeats.
fn parse() -> Opts {
    let mut o = Opts {
        workload: "all".into(),
        dir: PathBuf::from("target/bench-spill"),
        repeat: 5,
        small: 4096,
        large: 4 << 20,
        count_small: 50_000,
        count_large: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--workload" => o.workload = val(),
            "--dir" => o.dir = PathBuf::from(val()),
            "--repeat" => o.repeat = num(val()).max(1),
            "--small" => o.small = num(val()),
            "--large" => o.large = num(val()),
            "--count-small" => o.count_small = num(val()),
            "--count-large" => o.count_large = num(val()),
            _ => usage(),
        }
    }
    o
}

/// The contenders, in the order of the output.
const SPILLERS: [&str; 5] = [
    "raw",
    "spillbuffer",
    "foyer",
    "foyer-nowait",
    "file-per-key",
];
const READERS: [&str; 4] = ["raw", "spillbuffer", "foyer", "file-per-key"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Each contender's bytes/s per repeat, and what it lost.
struct Runs {
    names: &'static [&'static str],
    bps: Vec<Vec<f64>>,
    lost: Vec<usize>,
}

impl Runs {
    fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            bps: vec![Vec::new(); names.len()],
            lost: vec![0; names.len()],
        }
    }

    /// One JSON line: per contender, median bytes/s and the median of its
    /// per-repeat ratios to `raw` (index 0).
    fn emit(&self, workload: &str, size: usize, count: usize) {
        let mut line = json!({ "workload": workload, "value_bytes": size, "count": count,
            "repeat": self.bps[0].len() });
        for (i, name) in self.names.iter().enumerate() {
            let ratios = self.bps[i]
                .iter()
                .zip(&self.bps[0])
                .map(|(c, r)| c / r)
                .collect();
            line[name] = json!({
                "bytes_per_s": median(self.bps[i].clone()).round(),
                "ratio_to_raw_paired_median": (median(ratios) * 1000.0).round() / 1000.0,
                "lost_values_max": self.lost[i],
            });
        }
        println!("{line}");
    }
}

fn sync_disk() {
    let _ = std::process::Command::new("sync").status();
}

fn spillbuffer(dir: &Path, target: usize) -> SpillBuffer<u64, Vec<f64>> {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .compression(Compression::Lz4)
        .io_threads(2)
        .build()
        .expect("build spillbuffer")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A fresh empty directory under `base` for one contender's files.
fn scratch(base: &Path) -> tempfile::TempDir {
    tempfile::tempdir_in(base).expect("scratch directory")
}

/// Disk capacity for foyer: room for every value twice, so that nothing
/// is reclaimed.
fn foyer_disk(size: usize, count: usize) -> usize {
    (2 * (size + 4096) * count).max(256 << 20)
}

/// One spill run of `name`: seconds and values written (lost counted in
/// `lost`). The root bench's spill: values inserted over a small target,
/// the clock running until every write has finished.
fn spill_once(
    o: &Opts,
    name: &str,
    values: Vec<Vec<f64>>,
    target: usize,
    lost: &mut usize,
) -> (f64, usize) {
    let (size, count) = (values[0].len() * 8, values.len());
    let dir = scratch(&o.dir);
    match name {
        "raw" => (common::raw_write(dir.path(), &values).as_secs_f64(), count),
        "spillbuffer" => {
            let b = spillbuffer(dir.path(), target);
            let start = Instant::now();
            for (i, v) in values.into_iter().enumerate() {
                b.insert(i as u64, v).unwrap();
            }
            b.flush_blocking().unwrap();
            let secs = start.elapsed().as_secs_f64();
            (secs, b.stats().spill_count_total as usize)
        }
        "foyer" | "foyer-nowait" => {
            let wait = name == "foyer";
            let rt = runtime();
            rt.block_on(async {
                let c = foyer_cache::build(dir.path(), target, foyer_disk(size, count))
                    .await
                    .expect("build foyer");
                let start = Instant::now();
                for (i, v) in values.into_iter().enumerate() {
                    foyer_cache::insert(&c, i as u64, v, wait).await;
                }
                c.storage().wait().await;
                let secs = start.elapsed().as_secs_f64();
                let gone = foyer_cache::lost(&c, count).await;
                *lost = (*lost).max(gone);
                c.close().await.expect("close foyer");
                (secs, count - gone)
            })
        }
        "file-per-key" => {
            let mut b = Budget::new(FilePerKey::new(dir.path()), target);
            let start = Instant::now();
            for (i, v) in values.into_iter().enumerate() {
                b.insert(i as u64, v).unwrap();
            }
            (start.elapsed().as_secs_f64(), b.written)
        }
        _ => unreachable!(),
    }
}

/// Spill throughput: bytes of the values written over the run's time.
fn spill(o: &Opts, size: usize, count: usize) {
    let target = if size >= 1 << 20 { size } else { 1 << 20 };
    let mut rng = StdRng::seed_from_u64(11);
    let mut runs = Runs::new(&SPILLERS);
    for rep in 0..o.repeat {
        for turn in 0..SPILLERS.len() {
            let i = (turn + rep) % SPILLERS.len();
            let values: Vec<Vec<f64>> = (0..count)
                .map(|_| common::random_f64(&mut rng, size))
                .collect();
            sync_disk();
            let (secs, written) = spill_once(o, SPILLERS[i], values, target, &mut runs.lost[i]);
            runs.bps[i].push((written * size) as f64 / secs);
        }
    }
    runs.emit("spill-random", size, count);
}

/// Unspill throughput: every value on disk in each store (written once,
/// untimed, page cache warm for all), then each key read in order, the
/// value dropped at once; contenders alternate within each repeat.
fn unspill(o: &Opts, size: usize, count: usize) {
    let mut rng = StdRng::seed_from_u64(13);
    let values: Vec<Vec<f64>> = (0..count)
        .map(|_| common::random_f64(&mut rng, size))
        .collect();
    let reads: Vec<usize> = (0..count).collect();
    let total = (count * size) as f64;
    let dirs: Vec<_> = READERS.iter().map(|_| scratch(&o.dir)).collect();

    let raw = common::raw_file(dirs[0].path(), &values);
    let b = spillbuffer(dirs[1].path(), 0);
    for (i, v) in values.iter().enumerate() {
        b.insert(i as u64, v.clone()).unwrap();
    }
    b.flush_blocking().unwrap();
    let rt = runtime();
    let fc = rt.block_on(async {
        let c = foyer_cache::build(dirs[2].path(), 0, foyer_disk(size, count))
            .await
            .expect("build foyer");
        for (i, v) in values.iter().enumerate() {
            foyer_cache::insert(&c, i as u64, v.clone(), true).await;
        }
        c
    });
    let files = FilePerKey::new(dirs[3].path());
    for (i, v) in values.iter().enumerate() {
        files.put(i as u64, v).unwrap();
    }
    drop(values);

    let mut runs = Runs::new(&READERS);
    for rep in 0..o.repeat {
        for turn in 0..READERS.len() {
            let i = (turn + rep) % READERS.len();
            let secs = match READERS[i] {
                "raw" => {
                    common::raw_read_threads(&raw, &reads, size, RawRead::Reused, 1).as_secs_f64()
                }
                "spillbuffer" => {
                    let start = Instant::now();
                    for &k in &reads {
                        black_box(&*b.get(&(k as u64)).unwrap().expect("present"));
                    }
                    start.elapsed().as_secs_f64()
                }
                "foyer" => rt.block_on(async {
                    let start = Instant::now();
                    for &k in &reads {
                        let e = fc.get(&(k as u64)).await.unwrap().expect("present");
                        black_box(&e.value().0);
                    }
                    start.elapsed().as_secs_f64()
                }),
                "file-per-key" => {
                    let start = Instant::now();
                    for &k in &reads {
                        black_box(files.get(k as u64).unwrap());
                    }
                    start.elapsed().as_secs_f64()
                }
                _ => unreachable!(),
            };
            runs.bps[i].push(total / secs);
        }
    }
    rt.block_on(fc.close()).expect("close foyer");
    runs.emit("unspill-seq", size, count);
}

fn main() {
    let o = parse();
    std::fs::create_dir_all(&o.dir).expect("create --dir");
    let w = o.workload.as_str();
    if !matches!(w, "all" | "spill" | "unspill") {
        usage();
    }
    if w != "unspill" {
        spill(&o, o.large, o.count_large);
        spill(&o, o.small, o.count_small);
    }
    if w != "spill" {
        unspill(&o, o.large, o.count_large);
        unspill(&o, o.small, o.count_small);
    }
}
