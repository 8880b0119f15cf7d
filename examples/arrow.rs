//! Arrow record batches through a spill buffer (feature `arrow`).
//!
//! ```text
//! cargo run --release --features arrow --example arrow
//! cargo run --release --features arrow --example arrow -- --bench [--rounds R] [--count N]
//!     [--size BYTES] [--compression lz4|none] [--dir DIR]
//! ```
//!
//! Without `--bench`: 96 batches of 1 MiB go through a buffer whose memory
//! target is 16 MiB, so most are spilled; then each is pinned back (read
//! on the IO pool if on disk), a column is summed, and the total is
//! checked against the closed form.
//!
//! With `--bench`: spill and unspill of record batches against `Vec<f64>`
//! of the same size in the same run, the two kinds alternating round by
//! round (which goes first alternates too). Each batch is a random `i64`
//! and a random `f64` column, `--size` bytes in all (default 4 MiB); each
//! vector is `--size` bytes of random `f64`. Prints one JSON line per
//! workload: medians over the rounds for both kinds, and the median of the
//! per-round ratios (batch / vector).

use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use spillbuffer::{Compression, Spill, SpillBuffer};
use std::collections::VecDeque;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

struct Opts {
    bench: bool,
    rounds: usize,
    count: usize,
    size: usize,
    compression: Compression,
    dir: PathBuf,
}

fn parse() -> Opts {
    let mut o = Opts {
        bench: false,
        rounds: 7,
        count: 64,
        size: 4 << 20,
        compression: Compression::Lz4,
        dir: std::env::temp_dir(),
    };
    let usage = || -> ! {
        eprintln!(
            "usage: arrow [--bench] [--rounds R] [--count N] [--size BYTES] \
             [--compression lz4|none] [--dir DIR]"
        );
        std::process::exit(2)
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--bench" => o.bench = true,
            "--rounds" => o.rounds = num(val()).max(1),
            "--count" => o.count = num(val()).max(1),
            "--size" => o.size = num(val()).max(16),
            "--compression" => {
                o.compression = match val().as_str() {
                    "lz4" => Compression::Lz4,
                    "none" => Compression::None,
                    _ => usage(),
                }
            }
            "--dir" => o.dir = PathBuf::from(val()),
            _ => usage(),
        }
    }
    o
}

/// A batch of `rows` rows: `id` = first_id.., `x` = id as f64 / 2.
fn counted_batch(first_id: i64, rows: usize) -> RecordBatch {
    let ids: Vec<i64> = (first_id..first_id + rows as i64).collect();
    let xs: Vec<f64> = ids.iter().map(|&i| i as f64 / 2.0).collect();
    let ids: ArrayRef = Arc::new(Int64Array::from(ids));
    let xs: ArrayRef = Arc::new(Float64Array::from(xs));
    RecordBatch::try_from_iter([("id", ids), ("x", xs)]).expect("columns of one length")
}

fn sum_x(b: &RecordBatch) -> f64 {
    let xs = b.column_by_name("x").expect("column x");
    let xs = xs
        .as_any()
        .downcast_ref::<Float64Array>()
        .expect("x is f64");
    xs.values().iter().sum()
}

/// The demonstration: spill through a small target, reduce, check.
async fn reduce(o: &Opts) -> spillbuffer::Result<()> {
    let buf: SpillBuffer<u64, RecordBatch> = SpillBuffer::builder(&o.dir)
        .memory_target(16 << 20)
        .memory_limit(32 << 20)
        .compression(o.compression)
        .build()?;
    let (batches, rows) = (96u64, 1usize << 16); // 16 bytes a row: 1 MiB
    for k in 0..batches {
        buf.insert_async(k, counted_batch((k as usize * rows) as i64, rows))
            .await?;
    }
    buf.flush().await?;
    let on_disk = buf.stats().disk_count;
    let mut total = 0.0;
    for k in 0..batches {
        let batch = buf.pin(&k).await?.expect("every key was inserted");
        total += sum_x(&batch);
        batch.consume(); // done: first out, and its disk copy is still valid
    }
    // Sum of i/2 over 0..n, n = batches * rows: exact in f64 here.
    let n = (batches as usize * rows) as f64;
    let want = n * (n - 1.0) / 4.0;
    assert_eq!(total, want, "the reduction read back every row");
    println!(
        "summed {n} rows of {batches} batches ({on_disk} of them spilled): {total} as expected"
    );
    println!("{}", buf.stats());
    Ok(())
}

// ----- the comparison with Vec<f64> -------------------------------------------

fn random_batch(rng: &mut StdRng, size: usize) -> RecordBatch {
    let rows = size / 16;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows).map(|_| rng.gen::<i64>()),
    ));
    let xs: ArrayRef = Arc::new(Float64Array::from_iter_values(
        (0..rows).map(|_| rng.gen::<f64>()),
    ));
    RecordBatch::try_from_iter([("id", ids), ("x", xs)]).expect("columns of one length")
}

fn random_vec(rng: &mut StdRng, size: usize) -> Vec<f64> {
    (0..size / 8).map(|_| rng.gen::<f64>()).collect()
}

/// Bytes of values per second for one kind in one round.
struct Round {
    spill: f64,
    get: f64,
    pin: f64,
}

/// Spill `values` (target one value's size), then read every key back
/// with blocking `get`s, then with `pin`s, 4 in flight, on a
/// current-thread runtime. Values read back are consumed, so that each
/// read comes from disk.
fn run_kind<V: Spill>(o: &Opts, values: Vec<V>, touch: impl Fn(&V) -> f64) -> Round {
    let n = values.len();
    let bytes = |count: u64| (count as usize * o.size) as f64;
    let buf: SpillBuffer<u64, V> = SpillBuffer::builder(&o.dir)
        .memory_target(o.size)
        .compression(o.compression)
        .build()
        .expect("build buffer");
    let start = Instant::now();
    for (k, v) in values.into_iter().enumerate() {
        buf.insert(k as u64, v).expect("insert");
    }
    buf.flush_blocking().expect("flush");
    let spill = bytes(buf.stats().spill_count_total) / start.elapsed().as_secs_f64();
    // Everything to disk (clean copies: no writes), then read back.
    buf.set_memory_target(0);
    buf.flush_blocking().expect("flush");
    let reads = |buf: &SpillBuffer<u64, V>| buf.stats().unspill_count_total;
    let before = reads(&buf);
    let start = Instant::now();
    for k in 0..n as u64 {
        let v = buf.get(&k).expect("get").expect("present");
        black_box(touch(&v));
        v.consume();
    }
    let get = bytes(reads(&buf) - before) / start.elapsed().as_secs_f64();
    buf.flush_blocking().expect("flush");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let before = reads(&buf);
    let start = Instant::now();
    rt.block_on(async {
        let mut in_flight = VecDeque::new();
        let arrive = |read: tokio::task::JoinHandle<
            spillbuffer::Result<Option<spillbuffer::Pinned<V>>>,
        >| async {
            let p: spillbuffer::Pinned<V> =
                read.await.expect("task").expect("pin").expect("present");
            black_box(touch(&p));
            p.consume();
        };
        for k in 0..n as u64 {
            if in_flight.len() == 4 {
                arrive(in_flight.pop_front().unwrap()).await;
            }
            let b = buf.clone();
            in_flight.push_back(tokio::spawn(async move { b.pin(&k).await }));
        }
        for read in in_flight {
            arrive(read).await;
        }
    });
    let pin = bytes(reads(&buf) - before) / start.elapsed().as_secs_f64();
    Round { spill, get, pin }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn bench(o: &Opts) {
    let mut rng = StdRng::seed_from_u64(17);
    // (batch, vector) figures per round, per workload.
    let mut spill = (Vec::new(), Vec::new());
    let mut get = (Vec::new(), Vec::new());
    let mut pin = (Vec::new(), Vec::new());
    for round in 0..o.rounds {
        for batch_turn in [round % 2 == 0, round % 2 == 1] {
            let _ = std::process::Command::new("sync").status();
            let r = if batch_turn {
                let values = (0..o.count)
                    .map(|_| random_batch(&mut rng, o.size))
                    .collect();
                run_kind(o, values, sum_x)
            } else {
                let values = (0..o.count).map(|_| random_vec(&mut rng, o.size)).collect();
                run_kind(o, values, |v: &Vec<f64>| v.iter().sum())
            };
            let side = |pair: &mut (Vec<f64>, Vec<f64>), x| {
                if batch_turn { &mut pair.0 } else { &mut pair.1 }.push(x)
            };
            side(&mut spill, r.spill);
            side(&mut get, r.get);
            side(&mut pin, r.pin);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for (name, (batch, vec)) in [
        ("spill", spill),
        ("unspill-get", get),
        ("unspill-pin4", pin),
    ] {
        let ratios: Vec<f64> = batch.iter().zip(&vec).map(|(b, v)| b / v).collect();
        let (mut b, mut v, mut r) = (batch.clone(), vec.clone(), ratios.clone());
        println!(
            "{{\"workload\": \"arrow-{name}\", \"value_bytes\": {}, \"count\": {}, \"rounds\": {}, \
             \"compression\": \"{:?}\", \"batch_bytes_per_s\": {:.0}, \"vec_f64_bytes_per_s\": {:.0}, \
             \"ratio_paired_median\": {:.3}, \"ratios_by_round\": {:?}, \"loadavg\": \"{}\"}}",
            o.size,
            o.count,
            o.rounds,
            o.compression,
            median(&mut b),
            median(&mut v),
            median(&mut r),
            ratios.iter().map(|r| (r * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            load.trim(),
        );
    }
}

fn main() -> spillbuffer::Result<()> {
    let o = parse();
    if o.bench {
        bench(&o);
        return Ok(());
    }
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(reduce(&o))
}
