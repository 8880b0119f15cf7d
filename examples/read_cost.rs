//! Where the time of a checked 4 MiB read goes: the steps of a blocking
//! `get` of a large spilled value, done by hand on one file in the page
//! cache, each timed in CPU time of the reading thread (so that other
//! processes on a shared machine move the figures less than wall time
//! would). Prints the median of each variant over the rounds, in GB/s.
//!
//! ```text
//! cargo run --release --example read_cost -- [DIR] [ROUNDS]
//! ```
//!
//! - `reused`: `pread()` into one reused buffer: the copy alone;
//! - `fresh`: into a new zeroed `Vec` (allocation and first touch too):
//!   the raw figure the buffer's `get` is held to;
//! - `fresh 256K`: into a new `Vec<f64>` in 256 KiB pieces, unchecked;
//! - `fresh+crc P`: the buffer's own way, `pread()` in pieces of P bytes
//!   into a new `Vec<f64>`, each piece CRC-32'd while it is in cache;
//! - `grow+crc`: the same, the `Vec` grown piece by piece rather than
//!   zeroed whole first;
//! - `crc`: CRC-32 alone over a 256 KiB piece in cache;
//! - `fresh+sum` / `sum`: as `fresh+crc`, with a Fletcher-style sum over
//!   eight 64-bit lanes in place of the CRC: what a cheaper, weaker
//!   payload check would cost;
//! - `fresh+crc 64K`, `128K`: other piece sizes;
//! - `fresh+xxh3 P` / `xxh3`: XXH3-64, the records' payload checksum
//!   since format version 2, in place of the CRC;
//! - `buffer get`: a blocking `get` of the same values spilled by a
//!   buffer, the value dropped at once (a value this large is freed on
//!   the IO pool, so its `munmap` is not in this thread's time, where the
//!   `fresh` variants free theirs themselves).

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;

const VALUE: usize = 4 << 20;
const COUNT: usize = 64;
const PIECE: usize = 256 << 10;

/// CPU time this thread has run, in ns (first field of schedstat).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Fletcher-style sums over eight 64-bit lanes (a partial tail is left
/// out: every piece here is a multiple of 64 bytes).
fn lane_sum(h: &mut [u64; 16], data: &[u8]) {
    let (a, b) = h.split_at_mut(8);
    for block in data.chunks_exact(64) {
        for ((a, b), word) in a.iter_mut().zip(b.iter_mut()).zip(block.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(word.try_into().unwrap()));
            *b = b.wrapping_add(*a);
        }
    }
}

/// Read value `i` of `f` into a new `Vec<f64>` in pieces of `piece`
/// bytes, handing each piece to `check` once it has landed; `grow` grows
/// the vector piece by piece instead of zeroing it whole first.
fn read_checked(f: &File, i: usize, piece: usize, grow: bool, mut check: impl FnMut(&[u8])) {
    let n = VALUE / 8;
    let mut at = (i * VALUE) as u64;
    let mut v: Vec<f64> = if grow {
        Vec::with_capacity(n)
    } else {
        bytemuck::zeroed_vec(n)
    };
    let mut start = 0;
    while start < n {
        let end = (start + piece / 8).min(n);
        if grow {
            v.resize(end, 0.0);
        }
        let p = bytemuck::cast_slice_mut::<f64, u8>(&mut v[start..end]);
        f.read_exact_at(p, at).unwrap();
        check(p);
        at += p.len() as u64;
        start = end;
    }
    black_box(v);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "target/read-cost".into()));
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(9);
    std::fs::create_dir_all(&dir).expect("create DIR");
    let path = dir.join("read-cost.bin");
    {
        let mut f = File::create(&path).unwrap();
        let mut x: u64 = 1;
        let mut b = vec![0u8; VALUE];
        for _ in 0..COUNT {
            for c in b.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&b).unwrap();
        }
    }
    let f = File::open(&path).unwrap();
    // The same values spilled by a buffer (target 0: all on disk), for its
    // own blocking `get`.
    let buf: spillbuffer::SpillBuffer<u64, Vec<f64>> = spillbuffer::SpillBuffer::builder(&dir)
        .memory_target(0)
        .build()
        .expect("build buffer");
    for i in 0..COUNT {
        let mut v = vec![0f64; VALUE / 8];
        f.read_exact_at(bytemuck::cast_slice_mut(&mut v), (i * VALUE) as u64)
            .unwrap();
        buf.insert(i as u64, v).unwrap();
    }
    buf.flush_blocking().unwrap();
    let names = [
        "reused",
        "fresh",
        "fresh 256K",
        "fresh+crc 256K",
        "fresh+crc 1M",
        "grow+crc 256K",
        "crc",
        "fresh+sum 256K",
        "sum",
        "fresh+crc 64K",
        "fresh+crc 128K",
        "fresh+xxh3 64K",
        "fresh+xxh3 256K",
        "xxh3",
        "buffer get",
        "fresh, freed elsewhere",
    ];
    // A thread that frees what it is sent, as the buffer's IO pool frees
    // large values dropped on the host's thread.
    let (free_tx, free_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let freer = std::thread::spawn(move || free_rx.into_iter().for_each(drop));
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut reused = vec![1u8; VALUE];
    for _ in 0..rounds {
        for (k, fig) in figures.iter_mut().enumerate() {
            let t = cpu_ns();
            for i in 0..COUNT {
                let at = (i * VALUE) as u64;
                match k {
                    0 => f.read_exact_at(&mut reused, at).unwrap(),
                    1 => {
                        let mut v = vec![0u8; VALUE];
                        f.read_exact_at(&mut v, at).unwrap();
                        black_box(v);
                    }
                    2 => read_checked(&f, i, PIECE, false, |p| {
                        black_box(p);
                    }),
                    3..=5 => {
                        let piece = if k == 4 { 1 << 20 } else { PIECE };
                        let mut crc = crc32fast::Hasher::new();
                        read_checked(&f, i, piece, k == 5, |p| crc.update(p));
                        black_box(crc.finalize());
                    }
                    6 => {
                        for _ in 0..VALUE / PIECE {
                            black_box(crc32fast::hash(&reused[..PIECE]));
                        }
                    }
                    7 => {
                        let mut h = [0u64; 16];
                        read_checked(&f, i, PIECE, false, |p| lane_sum(&mut h, p));
                        black_box(h);
                    }
                    8 => {
                        let mut h = [0u64; 16];
                        for _ in 0..VALUE / PIECE {
                            lane_sum(&mut h, &reused[..PIECE]);
                        }
                        black_box(h);
                    }
                    9 | 10 => {
                        let piece = if k == 9 { 64 << 10 } else { 128 << 10 };
                        let mut crc = crc32fast::Hasher::new();
                        read_checked(&f, i, piece, false, |p| crc.update(p));
                        black_box(crc.finalize());
                    }
                    11 | 12 => {
                        use std::hash::Hasher;
                        let piece = if k == 11 { 64 << 10 } else { PIECE };
                        let mut h = twox_hash::XxHash3_64::new();
                        read_checked(&f, i, piece, false, |p| h.write(p));
                        black_box(h.finish());
                    }
                    13 => {
                        for _ in 0..VALUE / PIECE {
                            black_box(twox_hash::XxHash3_64::oneshot(&reused[..PIECE]));
                        }
                    }
                    14 => {
                        let p = buf.get(&(i as u64)).unwrap().expect("spilled");
                        black_box(&*p);
                    }
                    _ => {
                        let mut v = vec![0u8; VALUE];
                        f.read_exact_at(&mut v, at).unwrap();
                        free_tx.send(black_box(v)).unwrap();
                    }
                }
            }
            let ns = cpu_ns().saturating_sub(t).max(1);
            fig.push((VALUE * COUNT) as f64 / ns as f64);
        }
    }
    let fresh = {
        let mut f = figures[1].clone();
        f.sort_by(|a, b| a.total_cmp(b));
        f[f.len() / 2]
    };
    for (name, mut fig) in names.iter().zip(figures) {
        fig.sort_by(|a, b| a.total_cmp(b));
        let med = fig[fig.len() / 2];
        println!(
            "{name:16} {med:6.2} GB/s (CPU time), {:.2}x fresh; range {:.2}-{:.2}",
            med / fresh,
            fig[0],
            fig[fig.len() - 1]
        );
    }
    drop(free_tx);
    freer.join().unwrap();
    let _ = std::fs::remove_file(&path);
}
