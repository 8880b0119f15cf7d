//! Push a few hundred MiB through a small memory target, read everything
//! back (blocking and async), and print what the buffer did.
//!
//! cargo run --release --example quickstart

use spillbuffer::{SpillBuffer, Stats};
use std::time::Instant;

const CHUNKS: u64 = 320;
const CHUNK_LEN: usize = 1 << 17; // 128 Ki f64 = 1 MiB per chunk
const TARGET: usize = 64 << 20;

fn chunk(i: u64) -> Vec<f64> {
    (0..CHUNK_LEN)
        .map(|j| (i as f64) * 1e6 + j as f64)
        .collect()
}

fn print(label: &str, s: &Stats) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{label:<10} memory {:>7.1} MiB in {:>3} values | disk {:>7.1} MiB in {:>3} records, files {:>7.1} MiB | \
         spilled {:>7.1} MiB ({} writes, {:.3} s) | unspilled {:>7.1} MiB ({} reads, {:.3} s) | clean evictions {}",
        mib(s.memory_bytes),
        s.memory_count,
        mib(s.disk_bytes),
        s.disk_count,
        mib(s.file_bytes),
        mib(s.spilled_bytes_total),
        s.spill_count_total,
        s.spill_seconds_total,
        mib(s.unspilled_bytes_total),
        s.unspill_count_total,
        s.unspill_seconds_total,
        s.clean_evictions_total,
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir();
    let buf: SpillBuffer<u64, Vec<f64>> =
        SpillBuffer::builder(&dir).memory_target(TARGET).build()?;
    println!(
        "spilling {} MiB through a {} MiB target into {}",
        (CHUNKS * CHUNK_LEN as u64 * 8) >> 20,
        TARGET >> 20,
        buf.spill_dirs()[0].display()
    );

    let t = Instant::now();
    let mut in_insert = std::time::Duration::ZERO;
    for i in 0..CHUNKS {
        let c = chunk(i);
        let t = Instant::now();
        buf.insert(i, c)?; // never waits for disk
        in_insert += t.elapsed();
    }
    buf.flush_blocking()?;
    print("inserted", &buf.stats());
    println!(
        "           {CHUNKS} insert calls took {:.2} ms in all on this thread; IO done after {:.1} ms",
        in_insert.as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );

    // Blocking reads of the first half: disk reads run on this thread.
    for i in 0..CHUNKS / 2 {
        let v = buf.get(&i)?.expect("every key is present");
        assert_eq!(v[7], (i as f64) * 1e6 + 7.0);
        v.consume(); // done with it: a clean copy is dropped at once
    }
    print("get", &buf.stats());

    // Async reads of the second half: disk reads run on the IO pool, with
    // the next chunks prefetched.
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
    print("pin", &buf.stats());

    for i in 0..CHUNKS {
        buf.remove(&i);
    }
    buf.flush_blocking()?;
    print("removed", &buf.stats());
    let dirs = buf.spill_dirs();
    drop(buf);
    println!("spill directory removed on drop: {}", !dirs[0].exists());
    Ok(())
}
