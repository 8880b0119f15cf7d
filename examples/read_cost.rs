//! Where the time of a checked 4 MiB read goes: the steps of a blocking
//! `get` of a large spilled value, done by hand on one file in the page
//! cache, each timed in CPU time of the reading thread (so that other
//! processes on a shared machine move the figures less than wall time
//! would). Every round runs each variant once, in turn; prints the median
//! of each over the rounds, in GB/s and as a ratio to `fresh`.
//!
//! ```text
//! cargo run --release --example read_cost -- [DIR] [ROUNDS] [VARIANT...]
//! ```
//!
//! Naming variants runs only those (`fresh` is always run: the ratios
//! are to it). P is a piece size: 64K, 256K, 1M or 4M.
//!
//! - `reused`: `pread()` into one reused buffer: the copy alone;
//! - `fresh`: one `pread()` into a new zeroed `Vec` (allocation and first
//!   touch too): the raw figure the buffer's `get` is held to;
//! - `fresh, freed elsewhere`: the same, each `Vec` freed on another
//!   thread, as the buffer frees large values on its IO pool;
//! - `pieces P`: into a new zeroed `Vec<f64>` in pieces of P, unchecked:
//!   what the calls cost;
//! - `crc P`, `xxh3 P`, `sum P`: the same, each piece checked as it lands,
//!   with CRC-32 (format version 1), XXH3-64 (version 2, what the buffer
//!   does) or a Fletcher-style sum over eight 64-bit lanes (a cheaper,
//!   weaker check);
//! - `grow xxh3 256K`: as `xxh3 256K`, the `Vec` grown piece by piece
//!   rather than zeroed whole first;
//! - `xxh3 twice 256K`: each piece hashed twice: the second pass is the
//!   checksum's cost on a piece known to be in cache;
//! - `overlap xxh3 256K`: the checksum on a scoped helper thread, fed
//!   each piece once it has landed while this thread reads the next
//!   (this thread's time only; `+ helper` adds the helper's);
//! - `crc alone`, `xxh3 alone`, `sum alone`: the check over a 256 KiB
//!   piece in cache, no read;
//! - `buffer get`: a blocking `get` of the same values spilled by a
//!   buffer, the value dropped at once (a value this large is freed on
//!   the IO pool, so its `munmap` is not in this thread's time, where the
//!   `fresh` variants free theirs themselves).

use std::fs::File;
use std::hash::Hasher as _;
use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;

const VALUE: usize = 4 << 20;
const COUNT: usize = 64;
const PIECE: usize = 256 << 10;

/// CPU time this thread has run, in ns. `CLOCK_THREAD_CPUTIME_ID` brings
/// the count up to date when asked; schedstat's first field moves only at
/// scheduler ticks (4 ms at 250 Hz), too coarse for a variant that runs a
/// few tens of ms.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

/// A payload check fed piece by piece.
#[derive(Clone, Copy)]
enum Check {
    None,
    Crc,
    Xxh3,
    Xxh3Twice,
    Sum,
}

impl Check {
    /// Read value `i` of `f` into a new `Vec<f64>` in pieces of `piece`
    /// bytes, checking each piece once it has landed; `grow` grows the
    /// vector piece by piece instead of zeroing it whole first.
    fn read(self, f: &File, i: usize, piece: usize, grow: bool) {
        let mut crc = crc32fast::Hasher::new();
        let mut xxh = twox_hash::XxHash3_64::new();
        let mut xxh2 = twox_hash::XxHash3_64::new();
        let mut sum = [0u64; 16];
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
            match self {
                Check::None => {}
                Check::Crc => crc.update(p),
                Check::Xxh3 => xxh.write(p),
                Check::Xxh3Twice => {
                    xxh.write(p);
                    xxh2.write(p);
                }
                Check::Sum => lane_sum(&mut sum, p),
            }
            at += p.len() as u64;
            start = end;
        }
        black_box((crc.finalize(), xxh.finish(), xxh2.finish(), sum, v));
    }

    /// The check alone over one piece in cache, as often as a value has
    /// pieces.
    fn alone(self, piece: &[u8]) {
        let mut sum = [0u64; 16];
        for _ in 0..VALUE / piece.len() {
            match self {
                Check::Crc => {
                    black_box(crc32fast::hash(piece));
                }
                Check::Xxh3 | Check::Xxh3Twice => {
                    black_box(twox_hash::XxHash3_64::oneshot(piece));
                }
                Check::Sum => lane_sum(&mut sum, piece),
                Check::None => {}
            }
        }
        black_box(sum);
    }
}

/// `Check::Xxh3.read` with the checksum on a scoped helper thread that
/// takes each piece once it has landed while this thread reads the next.
/// Returns the helper's CPU time in ns.
fn read_overlapped(f: &File, i: usize) -> u64 {
    let mut v: Vec<f64> = bytemuck::zeroed_vec(VALUE / 8);
    let bytes = bytemuck::cast_slice_mut::<f64, u8>(&mut v);
    let mut at = (i * VALUE) as u64;
    let (sum, ns) = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<&[u8]>();
        let helper = s.spawn(move || {
            let t = cpu_ns();
            let mut h = twox_hash::XxHash3_64::new();
            rx.into_iter().for_each(|p| h.write(p));
            (h.finish(), cpu_ns() - t)
        });
        let mut rest: &mut [u8] = bytes;
        while !rest.is_empty() {
            let (piece, tail) = rest.split_at_mut(PIECE.min(rest.len()));
            f.read_exact_at(piece, at).unwrap();
            at += piece.len() as u64;
            tx.send(piece).unwrap();
            rest = tail;
        }
        drop(tx);
        helper.join().unwrap()
    });
    black_box((sum, v));
    ns
}

/// A piece size from its name (`64K`, `4M`).
fn piece_size(s: &str) -> Option<usize> {
    let (n, shift) = match s.strip_suffix('K') {
        Some(n) => (n, 10),
        None => (s.strip_suffix('M')?, 20),
    };
    Some(n.parse::<usize>().ok()? << shift)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().unwrap_or_else(|| "target/read-cost".into()));
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(9);
    let mut names: Vec<String> = args.collect();
    if names.is_empty() {
        names = [
            "reused",
            "fresh, freed elsewhere",
            "pieces 256K",
            "pieces 4M",
            "crc 256K",
            "sum 256K",
            "xxh3 64K",
            "xxh3 256K",
            "xxh3 1M",
            "xxh3 4M",
            "grow xxh3 256K",
            "xxh3 twice 256K",
            "overlap xxh3 256K",
            "overlap xxh3 256K + helper",
            "crc alone",
            "xxh3 alone",
            "sum alone",
            "buffer get",
        ]
        .map(String::from)
        .to_vec();
    }
    names.retain(|n| n != "fresh");
    names.insert(0, "fresh".into());
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
    // A thread that frees what it is sent, as the buffer's IO pool frees
    // large values dropped on the host's thread.
    let (free_tx, free_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let freer = std::thread::spawn(move || free_rx.into_iter().for_each(drop));
    let reused = std::cell::RefCell::new(vec![1u8; VALUE]);
    // One read of value `i` by the variant `name`; returns CPU time spent
    // on other threads that the variant counts.
    let step = |name: &str, i: usize| -> u64 {
        let at = (i * VALUE) as u64;
        let words: Vec<&str> = name.split(' ').collect();
        let check = |w: &str| match w {
            "pieces" => Some(Check::None),
            "crc" => Some(Check::Crc),
            "xxh3" => Some(Check::Xxh3),
            "sum" => Some(Check::Sum),
            _ => None,
        };
        match words.as_slice() {
            ["reused"] => f.read_exact_at(&mut reused.borrow_mut(), at).unwrap(),
            ["fresh"] | ["fresh,", "freed", "elsewhere"] => {
                let mut v = vec![0u8; VALUE];
                f.read_exact_at(&mut v, at).unwrap();
                if words.len() > 1 {
                    free_tx.send(black_box(v)).unwrap();
                } else {
                    black_box(v);
                }
            }
            ["buffer", "get"] => {
                let p = buf.get(&(i as u64)).unwrap().expect("spilled");
                black_box(&*p);
            }
            ["overlap", "xxh3", "256K"] => {
                read_overlapped(&f, i);
            }
            ["overlap", "xxh3", "256K", "+", "helper"] => return read_overlapped(&f, i),
            ["grow", "xxh3", p] => Check::Xxh3.read(&f, i, piece_size(p).expect("piece"), true),
            ["xxh3", "twice", p] => {
                Check::Xxh3Twice.read(&f, i, piece_size(p).expect("piece"), false)
            }
            [c, "alone"] => check(c).expect("check").alone(&reused.borrow()[..PIECE]),
            [c, p] if check(c).is_some() => {
                check(c)
                    .unwrap()
                    .read(&f, i, piece_size(p).expect("piece size"), false)
            }
            _ => panic!("unknown variant {name:?} (see the example's doc)"),
        }
        0
    };
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for _ in 0..rounds {
        for (name, fig) in names.iter().zip(figures.iter_mut()) {
            let t = cpu_ns();
            let mut other = 0;
            for i in 0..COUNT {
                other += step(name, i);
            }
            let ns = (cpu_ns().saturating_sub(t) + other).max(1);
            fig.push((VALUE * COUNT) as f64 / ns as f64);
        }
    }
    let median = |fig: &mut Vec<f64>| {
        fig.sort_by(|a, b| a.total_cmp(b));
        fig[fig.len() / 2]
    };
    let fresh = median(&mut figures[0].clone());
    for (name, mut fig) in names.iter().zip(figures) {
        let med = median(&mut fig);
        println!(
            "{name:28} {med:6.2} GB/s (CPU time), {:.2}x fresh; range {:.2}-{:.2}",
            med / fresh,
            fig[0],
            fig[fig.len() - 1]
        );
    }
    drop(free_tx);
    freer.join().unwrap();
    let _ = std::fs::remove_file(&path);
}
