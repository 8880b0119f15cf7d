//! How to read a record back: memory maps against positioned
//! reads, for 4 KiB and 4 MiB records at random places in a 64 MiB segment
//! whose pages are in the page cache. Each variant ends with the record's
//! bytes in memory the reader owns, as a decoded value needs:
//!
//! - `pread/reused`: `pread()` into a reused buffer (the small-record path);
//! - `pread/fresh`: `pread()` into a new zeroed allocation (the in-place
//!   path of large records);
//! - `mmap-held/…`: the segment mapped once, the record copied out of the map;
//! - `mmap-per-read`: map the record's pages, copy, unmap.

#[path = "common/mod.rs"]
mod common;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use memmap2::{Mmap, MmapOptions};
use rand::Rng;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;

const SEGMENT: usize = 64 << 20;

fn read_path(c: &mut Criterion) {
    let dir = common::dir();
    let path = dir.path().join("segment.bin");
    let mut rng = common::rng(5);
    {
        let mut f = File::create(&path).unwrap();
        let data = common::random_f64(&mut rng, SEGMENT);
        f.write_all(common::bytes(&data)).unwrap();
    }
    let file = File::open(&path).unwrap();
    // SAFETY: the file is this bench's own, in a private temporary
    // directory; nothing truncates or writes it while it is mapped.
    let held: Mmap = unsafe { Mmap::map(&file).unwrap() };
    let mut g = c.benchmark_group("read_path");
    for (name, size) in [("4KiB", 4usize << 10), ("4MiB", 4 << 20)] {
        let slots = SEGMENT / size;
        let offsets: Vec<usize> = (0..256).map(|_| rng.gen_range(0..slots) * size).collect();
        // Warm the page cache and the held map's page tables alike.
        let mut buf = vec![0u8; size];
        for &o in &offsets {
            file.read_exact_at(&mut buf, o as u64).unwrap();
            buf.copy_from_slice(&held[o..o + size]);
        }
        g.throughput(Throughput::Bytes(size as u64));
        let mut i = 0usize;
        let mut next = move || {
            i = i.wrapping_add(1);
            offsets[i & 255]
        };
        g.bench_function(format!("pread/reused/{name}"), |bn| {
            bn.iter(|| {
                file.read_exact_at(&mut buf, next() as u64).unwrap();
                black_box(&buf);
            })
        });
        g.bench_function(format!("pread/fresh/{name}"), |bn| {
            bn.iter(|| {
                let mut v = vec![0u8; size];
                file.read_exact_at(&mut v, next() as u64).unwrap();
                black_box(v)
            })
        });
        g.bench_function(format!("mmap-held/reused/{name}"), |bn| {
            bn.iter(|| {
                let o = next();
                buf.copy_from_slice(&held[o..o + size]);
                black_box(&buf);
            })
        });
        g.bench_function(format!("mmap-held/fresh/{name}"), |bn| {
            bn.iter(|| {
                let o = next();
                black_box(held[o..o + size].to_vec())
            })
        });
        g.bench_function(format!("mmap-per-read/{name}"), |bn| {
            bn.iter(|| {
                let o = next();
                // SAFETY: as above; the map lives only for this copy.
                let m = unsafe {
                    MmapOptions::new()
                        .offset(o as u64)
                        .len(size)
                        .map(&file)
                        .unwrap()
                };
                buf.copy_from_slice(&m);
                black_box(&buf);
            })
        });
    }
    g.finish();
}

criterion_group! { name = benches; config = common::criterion(); targets = read_path }
criterion_main!(benches);
