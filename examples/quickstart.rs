//! Push 320 MiB through a 64 MiB memory target, read everything back
//! (blocking `get`, then async `pin`), and print what the buffer did at
//! each step, with what each figure means.
//!
//! cargo run --release --example quickstart

use spillbuffer::{SpillBuffer, Stats};
use std::time::Instant;

const CHUNKS: u64 = 320;
const CHUNK_LEN: usize = 1 << 17; // 128 Ki f64 = 1 MiB per chunk
const CHUNK_BYTES: u64 = CHUNK_LEN as u64 * 8;
const TARGET: usize = 64 << 20;
const IO_THREADS: usize = 2;

fn chunk(i: u64) -> Vec<f64> {
    (0..CHUNK_LEN)
        .map(|j| (i as f64) * 1e6 + j as f64)
        .collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The buffer's own summary (`Stats` implements `Display`), indented.
fn print_stats(s: &Stats) {
    for line in s.to_string().lines() {
        println!("    {line}");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let buf: SpillBuffer<u64, Vec<f64>> = SpillBuffer::builder(std::env::temp_dir())
        .memory_target(TARGET)
        .io_threads(IO_THREADS)
        .build()?;
    println!("spill directory: {}", buf.spill_dirs()[0].display());
    println!();

    // 1. Insert: the caller never waits for disk; the IO pool writes the
    //    least recently used values out once memory passes the target.
    println!(
        "1. insert {CHUNKS} values of {:.0} MiB (memory target {} MiB)",
        mib(CHUNK_BYTES),
        TARGET >> 20
    );
    let start = Instant::now();
    let mut in_insert = std::time::Duration::ZERO;
    for i in 0..CHUNKS {
        let c = chunk(i);
        let t = Instant::now();
        buf.insert(i, c)?;
        in_insert += t.elapsed();
    }
    buf.flush_blocking()?; // wait for the IO pool, for the figures below
    let s = buf.stats();
    println!(
        "   the {CHUNKS} insert calls took {:.1} ms on this thread in all;",
        in_insert.as_secs_f64() * 1e3
    );
    println!(
        "   the IO pool had written the rest {:.2} s after the first insert.",
        start.elapsed().as_secs_f64()
    );
    print_stats(&s);
    println!(
        "   On disk is after lz4: {} values of {:.0} MiB take {:.1} MiB (ratio {:.2}).",
        s.disk_count,
        mib(s.disk_count * CHUNK_BYTES),
        mib(s.disk_bytes),
        (s.disk_count * CHUNK_BYTES) as f64 / s.disk_bytes.max(1) as f64,
    );
    println!("   Thread time is summed over the {IO_THREADS} IO threads: it can exceed wall time;");
    println!("   \"IO pool busy\" is wall time with at least one IO thread at work.");
    println!();

    // 2. Blocking reads of the first half: disk reads run on this thread.
    println!("2. get the first {} values (blocking reads)", CHUNKS / 2);
    for i in 0..CHUNKS / 2 {
        let v = buf.get(&i)?.expect("every key is present");
        assert_eq!(v[7], (i as f64) * 1e6 + 7.0);
        v.consume(); // done with it: its disk copy is still valid, so it is dropped, not re-written
    }
    print_stats(&buf.stats());
    println!("   \"evicted without a write\": values read back and dropped again for free.");
    println!();

    // 3. Async reads of the second half: disk reads run on the IO pool,
    //    the next values are prefetched, the caller's thread never blocks.
    println!(
        "3. pin the other {} values (async, with prefetch)",
        CHUNKS / 2
    );
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async {
        for i in CHUNKS / 2..CHUNKS {
            buf.prefetch([i + 1, i + 2]);
            let v = buf.pin(&i).await?.expect("every key is present");
            assert_eq!(v[CHUNK_LEN - 1], (i as f64) * 1e6 + (CHUNK_LEN - 1) as f64);
            v.consume();
        }
        buf.flush().await
    })?;
    print_stats(&buf.stats());
    println!();

    // 4. Remove everything: memory and disk space are given back.
    println!("4. remove every key");
    for i in 0..CHUNKS {
        buf.remove(&i);
    }
    buf.flush_blocking()?;
    print_stats(&buf.stats());
    let dirs = buf.spill_dirs();
    drop(buf);
    println!();
    println!(
        "Dropping the buffer removed its spill directory: {}",
        !dirs[0].exists()
    );
    Ok(())
}
