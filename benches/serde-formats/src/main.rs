//! Encode and decode speed and size of postcard, bincode 2 and MessagePack
//! (rmp-serde) on two realistic values: a task record (strings, an enum, a
//! map, 1,000 f64s) and a batch of 10,000 small event rows (integers that
//! fit varints, an enum, a short string). Encodes into a reused vector and
//! decodes from it, as `Serde<T>` does. Rounds alternate the formats;
//! figures are medians over `ROUNDS`.
//!
//! `cargo run --release` (in this directory); one JSON line per format and
//! value.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum State {
    Waiting,
    Running { worker: String },
    Done(u32),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Task {
    id: u64,
    key: String,
    deps: Vec<String>,
    state: State,
    priority: Option<i32>,
    tags: BTreeMap<String, String>,
    values: Vec<f64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Kind {
    View,
    Click,
    Purchase { cents: i64 },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Event {
    ts: u64,
    user: u32,
    kind: Kind,
    page: String,
}

fn task() -> Task {
    Task {
        id: 0xDEAD_BEEF,
        key: "('sum-chunk-8f3a', 17, 3)".into(),
        deps: (0..8).map(|i| format!("('load-7c1e', {i})")).collect(),
        state: State::Running {
            worker: "tcp://10.0.0.7:40411".into(),
        },
        priority: Some(-2),
        tags: [("owner", "etl"), ("stage", "reduce")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        values: (0..1000).map(|i| (i as f64).sqrt() * 1.5).collect(),
    }
}

fn events() -> Vec<Event> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..10_000u64)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Event {
                ts: 1_764_547_200_000 + i * 37,
                user: (x % 50_000) as u32,
                kind: match x % 10 {
                    0 => Kind::Purchase {
                        cents: (x % 100_000) as i64,
                    },
                    1..=3 => Kind::Click,
                    _ => Kind::View,
                },
                page: format!("/p/{}", x % 300),
            }
        })
        .collect()
}

trait Format {
    const NAME: &'static str;
    fn encode<T: Serialize>(v: &T, out: &mut Vec<u8>);
    fn decode<T: DeserializeOwned>(b: &[u8]) -> T;
}

struct Postcard;
impl Format for Postcard {
    const NAME: &'static str = "postcard 1";
    fn encode<T: Serialize>(v: &T, out: &mut Vec<u8>) {
        out.clear();
        let taken = std::mem::take(out);
        *out = postcard::to_extend(v, taken).unwrap();
    }
    fn decode<T: DeserializeOwned>(b: &[u8]) -> T {
        postcard::from_bytes(b).unwrap()
    }
}

struct Bincode;
impl Format for Bincode {
    const NAME: &'static str = "bincode 2 (standard config)";
    fn encode<T: Serialize>(v: &T, out: &mut Vec<u8>) {
        out.clear();
        bincode::serde::encode_into_writer(v, Append(out), bincode::config::standard()).unwrap();
    }
    fn decode<T: DeserializeOwned>(b: &[u8]) -> T {
        bincode::serde::decode_from_slice(b, bincode::config::standard())
            .unwrap()
            .0
    }
}

/// bincode's output appending to a reused vector (its `std::io::Write`
/// path is slower, and not what an implementation would use).
struct Append<'a>(&'a mut Vec<u8>);
impl bincode::enc::write::Writer for Append<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

struct MsgPack;
impl Format for MsgPack {
    const NAME: &'static str = "rmp-serde 1 (MessagePack)";
    fn encode<T: Serialize>(v: &T, out: &mut Vec<u8>) {
        out.clear();
        rmp_serde::encode::write(out, v).unwrap();
    }
    fn decode<T: DeserializeOwned>(b: &[u8]) -> T {
        rmp_serde::from_slice(b).unwrap()
    }
}

const ROUNDS: usize = 15;

/// (encode ns, decode ns, size) of one round: `iters` encodes, then
/// `iters` decodes, per-op means.
fn round<F: Format, T: Serialize + DeserializeOwned + PartialEq>(
    v: &T,
    iters: usize,
    buf: &mut Vec<u8>,
) -> (f64, f64, usize) {
    let t = Instant::now();
    for _ in 0..iters {
        F::encode(black_box(v), buf);
    }
    let enc = t.elapsed().as_nanos() as f64 / iters as f64;
    let t = Instant::now();
    for _ in 0..iters {
        let back: T = F::decode(black_box(buf));
        black_box(&back);
    }
    let dec = t.elapsed().as_nanos() as f64 / iters as f64;
    let back: T = F::decode(buf);
    assert!(back == *v, "{} does not round-trip", F::NAME);
    (enc, dec, buf.len())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn measure<T: Serialize + DeserializeOwned + PartialEq>(name: &str, v: &T, iters: usize) {
    let mut samples: [(Vec<f64>, Vec<f64>, usize); 3] = Default::default();
    let mut buf = Vec::new();
    for r in 0..ROUNDS {
        // Rotate the order so that no format always runs first.
        for i in 0..3 {
            let f = (i + r) % 3;
            let (e, d, size) = match f {
                0 => round::<Postcard, T>(v, iters, &mut buf),
                1 => round::<Bincode, T>(v, iters, &mut buf),
                _ => round::<MsgPack, T>(v, iters, &mut buf),
            };
            samples[f].0.push(e);
            samples[f].1.push(d);
            samples[f].2 = size;
        }
    }
    for (f, (enc, dec, size)) in samples.iter_mut().enumerate() {
        let fmt = [Postcard::NAME, Bincode::NAME, MsgPack::NAME][f];
        let (e, d) = (median(enc), median(dec));
        println!(
            "{{\"value\": \"{name}\", \"format\": \"{fmt}\", \"bytes\": {size}, \
             \"encode_ns\": {e:.0}, \"decode_ns\": {d:.0}, \
             \"encode_mb_per_s\": {:.0}, \"decode_mb_per_s\": {:.0}, \"rounds\": {ROUNDS}}}",
            *size as f64 / e * 1e3,
            *size as f64 / d * 1e3,
        );
    }
}

fn main() {
    measure("task record (1,000 f64s, strings, enum, map)", &task(), 2000);
    measure("10,000 event rows (small ints, enum, short string)", &events(), 30);
}
