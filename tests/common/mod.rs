//! Helpers shared by the integration tests.
#![allow(dead_code)]

use spillbuffer::testing::{Faults, FaultyStorage};
use spillbuffer::{BoxError, Builder, Spill, SpillBuffer, Stats};
use std::sync::Arc;

pub type Buf = SpillBuffer<u64, Vec<u8>>;

/// A value of `len` bytes whose content depends on `seed`.
pub fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn buffer(dir: &std::path::Path, target: usize) -> Buf {
    SpillBuffer::builder(dir)
        .memory_target(target)
        .segment_size(64 * 1024)
        .build()
        .expect("build")
}

/// Build `builder` over a storage layer that fails (or holds IO) on
/// demand; returns the buffer and the switches.
pub fn with_faults(builder: Builder<u64, Vec<u8>>) -> (Buf, Arc<Faults>) {
    let storage = FaultyStorage::new();
    let faults = storage.faults();
    let b = builder.storage(Arc::new(storage)).build().expect("build");
    (b, faults)
}

pub fn stats(b: &Buf) -> Stats {
    b.stats()
}

/// Files (not directories) under `dir`, recursively.
pub fn files_under(dir: &std::path::Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            if e.file_type().unwrap().is_dir() {
                files_under(&e.path())
            } else {
                1
            }
        })
        .sum()
}

/// Poll each future once, in order, and check that none of them finished.
/// With reads held at the storage (`Faults::hold_reads`), this starts several
/// calls at a known point before any of their IO can complete, where
/// `tokio::join!` alone would let the first read land before the second call
/// is polled.
pub async fn start_each<F: std::future::Future>(futs: &mut [std::pin::Pin<&mut F>]) {
    std::future::poll_fn(|cx| {
        for (i, f) in futs.iter_mut().enumerate() {
            assert!(f.as_mut().poll(cx).is_pending(), "call {i} finished early");
        }
        std::task::Poll::Ready(())
    })
    .await
}

/// A value whose encode fails when `bad`: a spill failure on demand. Read
/// back, it is always good.
#[derive(Debug, Clone, PartialEq)]
pub struct Val {
    pub bytes: Vec<u8>,
    pub bad: bool,
}

impl Spill for Val {
    fn weight(&self) -> usize {
        self.bytes.len()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        if self.bad {
            return Err("this value cannot be encoded".into());
        }
        out.extend_from_slice(&self.bytes);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Val {
            bytes: bytes.to_vec(),
            bad: false,
        })
    }
}
