//! Moving spilled values from one buffer to another over a TCP socket,
//! without decoding them: the sending buffer writes each key's record as
//! stored to the socket (`SpillBuffer::send_record`), the receiving one
//! reads it off the socket and writes it to its own disk as it came
//! (`SpillBuffer::receive_record`), both on the buffers' own threads, and
//! the value is decoded only when it is pinned there.
//!
//! ```text
//! cargo run --release --example transfer                 # the demo
//! cargo run --release --example transfer -- --measure    # against a raw copy
//!     [--values N] [--size BYTES] [--rounds R] [--window W] [--dir DIR]
//!     [--data random|counter] [--compression lz4|none] [--blocking | --whole]
//!     [--raw-buffer BYTES]
//! ```
//!
//! `--measure` times, in alternating rounds, the transfer of every value
//! and a raw copy of the same bytes: the sender's segment files read with
//! `read()` into one reused buffer and written to a socket, the receiver
//! reading the socket into one reused buffer and writing a file (buffers
//! of `--raw-buffer` bytes, 1 MiB by default). Both run
//! over loopback in the same process and directory; it prints the medians,
//! their ratio and one JSON line.
//!
//! By default each socket is handed to its buffer for one record at a
//! time (`send_record`, `receive_record`: the copy runs on the buffer's
//! stream threads, the socket threads only await it). `--blocking` uses
//! `write_record_to` and `insert_record_from` on the two socket threads
//! instead; `--whole` the async calls on whole records, `record` and
//! `insert_record`, with `--window` of them in flight.

use spillbuffer::{Record, SpillBuffer};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Instant;

type Buf = SpillBuffer<u64, Vec<f64>>;

/// The key that ends a stream of records.
const END: u64 = u64::MAX;

struct Opts {
    measure: bool,
    values: u64,
    size: usize,
    rounds: usize,
    window: usize,
    dir: PathBuf,
    counter: bool,
    lz4: bool,
    /// Use the blocking calls on the two socket threads instead of the
    /// async ones.
    blocking: bool,
    /// Use the async calls on whole records (`record`, `insert_record`)
    /// with a window in flight, instead of handing the sockets over.
    whole: bool,
    /// The raw copy's buffer, on each side.
    raw_buffer: usize,
}

const USAGE: &str =
    "usage: transfer [--measure] [--blocking | --whole] [--values N] [--size BYTES] \
[--rounds R] [--window W] [--dir DIR] [--data random|counter] [--compression lz4|none] \
[--raw-buffer BYTES]";

fn opts() -> Opts {
    let mut o = Opts {
        measure: false,
        values: 32,
        size: 4 << 20,
        rounds: 7,
        window: 4,
        dir: std::env::temp_dir(),
        counter: false,
        lz4: true,
        blocking: false,
        whole: false,
        raw_buffer: 1 << 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} wants a value"));
        match a.as_str() {
            "--measure" => o.measure = true,
            "--blocking" => o.blocking = true,
            "--whole" => o.whole = true,
            "--values" => o.values = val().parse().expect("--values N"),
            "--size" => o.size = val().parse().expect("--size BYTES"),
            "--rounds" => o.rounds = val().parse().expect("--rounds R"),
            "--window" => o.window = val().parse().expect("--window W"),
            "--dir" => o.dir = val().into(),
            "--raw-buffer" => o.raw_buffer = val().parse().expect("--raw-buffer BYTES"),
            "--data" => o.counter = val() == "counter",
            "--compression" => o.lz4 = val() != "none",
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                eprintln!("transfer: unknown argument {other}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    o.window = o.window.max(1);
    o
}

/// Value `k`: `size` bytes of f64, random (incompressible) or a counter.
fn value(k: u64, size: usize, counter: bool) -> Vec<f64> {
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size / 8)
        .map(|i| {
            if counter {
                return (k as usize + i) as f64;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f64::from_bits((x >> 12) | 0x3ff0_0000_0000_0000)
        })
        .collect()
}

fn build(o: &Opts, target: usize) -> Buf {
    let compression = if o.lz4 {
        spillbuffer::Compression::Lz4
    } else {
        spillbuffer::Compression::None
    };
    SpillBuffer::builder(&o.dir)
        .memory_target(target)
        .compression(compression)
        .build()
        .expect("build buffer")
}

/// Send every key's record. Returns the bytes sent.
fn send(rt: &tokio::runtime::Runtime, a: &Buf, o: &Opts, sock: TcpStream) -> u64 {
    let (keys, window, blocking) = (o.values, o.window, o.blocking);
    let mut sock = std::io::BufWriter::with_capacity(64 << 10, sock);
    if !blocking && !o.whole {
        // The socket goes to the sending buffer for each record: it is
        // read from disk and written to the socket on one of the buffer's
        // threads; this one only awaits it.
        let mut sent = 0;
        for k in 0..keys {
            sock.write_all(&k.to_le_bytes()).expect("send key");
            let (back, bytes) = rt.block_on(a.send_record(&k, sock)).expect("send_record");
            sock = back;
            sent += 8 + bytes.expect("key present");
        }
        sock.write_all(&END.to_le_bytes()).expect("send end");
        sock.flush().expect("flush");
        return sent;
    }
    let mut ahead = VecDeque::new();
    let mut sent = 0;
    let mut next = 0;
    while next < keys || !ahead.is_empty() {
        if blocking {
            // Straight from disk to the socket, a piece at a time.
            sock.write_all(&next.to_le_bytes()).expect("send key");
            let bytes = a
                .write_record_to(&next, &mut sock)
                .expect("write_record_to");
            sent += 8 + bytes.expect("key present");
            next += 1;
            continue;
        }
        // Each read starts when `record` is called: `window` of them are
        // under way while the oldest is awaited and written.
        while next < keys && ahead.len() < window {
            ahead.push_back((next, a.record(&next)));
            next += 1;
        }
        let (k, rec) = ahead.pop_front().expect("one ahead");
        let rec = rt.block_on(rec).expect("record").expect("key present");
        sent += put(&mut sock, k, &rec);
    }
    sock.write_all(&END.to_le_bytes()).expect("send end");
    sock.flush().expect("flush");
    sent
}

/// Send `k` and its record; returns the bytes sent.
fn put(sock: &mut impl Write, k: u64, rec: &Record) -> u64 {
    sock.write_all(&k.to_le_bytes()).expect("send key");
    // The frame header and record header go through the small buffer; a
    // large payload is written straight from the record.
    rec.write_to(sock).expect("send record");
    8 + rec.len() as u64
}

/// Receive records until the end key and insert each.
fn receive(rt: &tokio::runtime::Runtime, b: &Buf, o: &Opts, sock: TcpStream) {
    let (window, blocking) = (o.window, o.blocking);
    let mut sock = BufReader::with_capacity(64 << 10, sock);
    let mut inflight = VecDeque::new();
    loop {
        let mut key = [0u8; 8];
        sock.read_exact(&mut key).expect("read key");
        let key = u64::from_le_bytes(key);
        if key == END {
            break;
        }
        if !blocking && !o.whole {
            // The socket goes to the receiving buffer for one record: read,
            // checksummed and written a piece at a time on one of its
            // threads; it comes back positioned at the next key.
            sock = rt
                .block_on(b.receive_record(key, sock))
                .expect("receive_record");
            continue;
        }
        if blocking {
            // Straight from the socket to disk, a piece at a time.
            b.insert_record_from(key, &mut sock)
                .expect("insert_record_from");
            continue;
        }
        let rec = Record::read_from(&mut sock).expect("read record");
        // The write is queued when `insert_record` is called; its outcome
        // is awaited once `window` of them are in flight.
        inflight.push_back(b.insert_record(key, rec));
        if inflight.len() >= window {
            let done = inflight.pop_front().expect("one in flight");
            rt.block_on(done).expect("insert_record");
        }
    }
    for done in inflight {
        rt.block_on(done).expect("insert_record");
    }
}

/// One transfer of every key from `a` to `b` over a fresh loopback
/// connection. Returns (bytes, seconds).
fn transfer(rt: &tokio::runtime::Runtime, a: &Buf, b: &Buf, o: &Opts) -> (u64, f64) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let start = Instant::now();
    let bytes = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let (sock, _) = listener.accept().expect("accept");
            receive(rt, b, o, sock);
        });
        let sock = TcpStream::connect(addr).expect("connect");
        let bytes = send(rt, a, o, sock);
        rx.join().expect("receiver");
        bytes
    });
    (bytes, start.elapsed().as_secs_f64())
}

/// The raw limit: the sender's segment files copied to a socket with
/// `read()` and `write()` through one reused buffer, and written to a file
/// on the other side the same way, buffers of `buffer` bytes. Returns
/// (bytes, seconds).
fn raw_copy(files: &[PathBuf], out: &Path, buffer: usize) -> (u64, f64) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let start = Instant::now();
    let bytes = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let (mut sock, _) = listener.accept().expect("accept");
            let mut file = File::create(out).expect("create copy");
            let mut buf = vec![0u8; buffer];
            loop {
                let n = sock.read(&mut buf).expect("read socket");
                if n == 0 {
                    break;
                }
                file.write_all(&buf[..n]).expect("write copy");
            }
        });
        let mut sock = TcpStream::connect(addr).expect("connect");
        let mut buf = vec![0u8; buffer];
        let mut bytes = 0u64;
        for path in files {
            let mut f = File::open(path).expect("open segment");
            loop {
                let n = f.read(&mut buf).expect("read segment");
                if n == 0 {
                    break;
                }
                sock.write_all(&buf[..n]).expect("write socket");
                bytes += n as u64;
            }
        }
        drop(sock);
        rx.join().expect("receiver");
        bytes
    });
    (bytes, start.elapsed().as_secs_f64())
}

fn segment_files(a: &Buf) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = a
        .spill_dirs()
        .iter()
        .flat_map(|d| std::fs::read_dir(d).expect("spill dir"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "spill"))
        .collect();
    files.sort();
    files
}

fn check(rt: &tokio::runtime::Runtime, b: &Buf, o: &Opts) {
    for k in 0..o.values {
        let got = rt.block_on(b.pin(&k)).expect("pin").expect("key present");
        assert!(*got == value(k, o.size, o.counter), "key {k} differs");
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    // A target of one value: everything the sender holds goes to disk; the
    // receiver has room for all of them, so pins in `check` stay.
    let a = build(&o, o.size);
    let b = build(&o, o.size * (o.values as usize + 1));
    for k in 0..o.values {
        a.insert(k, value(k, o.size, o.counter)).expect("insert");
    }
    a.evict(usize::MAX);
    a.flush_blocking().expect("flush");
    assert_eq!(a.stats().memory_bytes, 0, "every value spilled");

    if !o.measure {
        let (bytes, secs) = transfer(&rt, &a, &b, &o);
        b.flush_blocking().expect("flush");
        println!(
            "moved {} values, {:.1} MiB, in {:.3} s: {:.2} GB/s",
            o.values,
            bytes as f64 / (1 << 20) as f64,
            secs,
            bytes as f64 / secs / 1e9
        );
        println!("receiver, before any pin:\n{}", b.stats());
        check(&rt, &b, &o);
        println!("every value read back equal in the receiver");
        let sa = a.stats();
        assert_eq!(sa.unspill_count_total, 0, "the sender read nothing back");
        assert_eq!(sa.records_sent_encoded_total, 0, "nor encoded anything");
        println!("sender:\n{sa}");
        return;
    }

    let files = segment_files(&a);
    let copy = o
        .dir
        .join(format!("transfer-raw-copy-{}", std::process::id()));
    let (mut ours, mut raw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bytes_ours, mut bytes_raw) = (0, 0);
    for round in 0..o.rounds {
        // Alternate which goes first, so neither always meets the other's
        // writeback.
        let mut run = |which: bool| {
            if which {
                let (bytes, secs) = transfer(&rt, &a, &b, &o);
                b.flush_blocking().expect("flush");
                if round == 0 {
                    check(&rt, &b, &o);
                }
                for k in 0..o.values {
                    b.remove(&k);
                }
                b.flush_blocking().expect("flush");
                bytes_ours = bytes;
                bytes as f64 / secs / 1e9
            } else {
                let (bytes, secs) = raw_copy(&files, &copy, o.raw_buffer);
                std::fs::remove_file(&copy).expect("remove copy");
                bytes_raw = bytes;
                bytes as f64 / secs / 1e9
            }
        };
        let first = round % 2 == 0;
        let x = run(first);
        let y = run(!first);
        let (t, r) = if first { (x, y) } else { (y, x) };
        eprintln!("round {round}: transfer {t:.2} GB/s, raw copy {r:.2} GB/s");
        ours.push(t);
        raw.push(r);
        ratios.push(t / r);
    }
    let sa = a.stats();
    assert_eq!(sa.unspill_count_total, 0, "the sender read nothing back");
    assert_eq!(sa.records_sent_encoded_total, 0, "nor encoded anything");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (t, r, q) = (median(&mut ours), median(&mut raw), median(&mut ratios));
    println!(
        "transfer {t:.2} GB/s, raw copy {r:.2} GB/s (medians of {} rounds); \
         paired ratio median {q:.2}",
        o.rounds
    );
    println!(
        "{{\"workload\":\"transfer\",\"mode\":\"{}\",\"values\":{},\"size\":{},\"window\":{},\"data\":\"{}\",\
         \"rounds\":{},\"raw_buffer\":{},\"transfer_gbps\":{t:.3},\"raw_gbps\":{r:.3},\"ratio\":{q:.3},\
         \"bytes_transfer\":{bytes_ours},\"bytes_raw\":{bytes_raw},\"records_sent\":{},\
         \"sender_unspills\":{},\"loadavg\":\"{}\"}}",
        if o.blocking {
            "blocking"
        } else if o.whole {
            "whole"
        } else {
            "stream"
        },
        o.values,
        o.size,
        o.window,
        if o.counter { "counter" } else { "random" },
        o.rounds,
        o.raw_buffer,
        sa.records_sent_total,
        sa.unspill_count_total,
        load.trim()
    );
}
