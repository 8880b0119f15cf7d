//! Spare buffers for records in transit ([`crate::Record`]): a record read
//! to be sent, or received to be written, lives in a buffer that goes back
//! here when the record is dropped, and the next record of at most its
//! size reuses it. Copying into reused memory runs several times faster
//! than into fresh pages (which fault in one by one), and a large buffer
//! dropped on the host's thread would cost it a `munmap`.
//!
//! Process-wide and small: at most [`KEEP_TOTAL`] bytes, in buffers of
//! [`KEEP_MIN`] to [`KEEP_EACH`] bytes. This memory is no buffer's, so no
//! gauge counts it.

use super::scratch::fit;
use std::sync::Mutex;

/// Buffers smaller than this are cheap to allocate: not kept.
const KEEP_MIN: usize = 64 << 10;
/// Buffers larger than this are rare: not kept.
const KEEP_EACH: usize = 16 << 20;
/// Bytes of spare buffers kept at most.
const KEEP_TOTAL: usize = 32 << 20;
/// A new buffer's capacity is rounded up to a multiple of this, so that
/// records of one value size fit each other's buffers whatever their
/// headers add: a record read to be sent is a frame header shorter than
/// the same record received.
const GRAIN: usize = 64 << 10;

static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer of exactly `len` initialised bytes (contents unspecified): a
/// spare one if one is large enough, else a new one. Of the spare ones,
/// the one given back last: the most likely to be still in a cache.
pub(crate) fn take(len: usize) -> Vec<u8> {
    if len < KEEP_MIN / 2 {
        return vec![0u8; len];
    }
    let spare = {
        let mut g = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        g.iter()
            .rposition(|b| b.capacity() >= len)
            .map(|i| g.remove(i))
    };
    match spare {
        Some(mut buf) => {
            // Bytes up to the old length are initialised already: only
            // growth past it is zeroed.
            fit(&mut buf, len);
            buf
        }
        None => {
            // Zeroed by the allocator (fresh pages come zeroed: no
            // pass over them here), then cut to the length asked.
            let mut buf = vec![0u8; len.div_ceil(GRAIN).saturating_mul(GRAIN)];
            buf.truncate(len);
            buf
        }
    }
}

/// Keep `buf` for a later [`take`] if it is worth keeping and there is
/// room; otherwise it is freed (outside the lock).
pub(crate) fn give(buf: Vec<u8>) {
    let cap = buf.capacity();
    if !(KEEP_MIN..=KEEP_EACH).contains(&cap) {
        return;
    }
    let mut g = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let kept: usize = g.iter().map(Vec::capacity).sum();
    if kept + cap <= KEEP_TOTAL {
        g.push(buf);
    } else {
        drop(g);
        drop(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_reused_within_the_bound() {
        let buf = take(1 << 20);
        assert_eq!(buf.len(), 1 << 20);
        give(buf);
        // Other tests share the pool: a smaller take may or may not get
        // that one, but never a buffer shorter than asked.
        let again = take(512 << 10);
        assert_eq!(again.len(), 512 << 10);
        give(again);
        // Records of one size, one with a frame header more than the
        // other, share buffers. (An odd size: no other test's buffer has
        // a capacity just above it.)
        let sent = take((3 << 20) + 39);
        assert!(
            sent.capacity() >= (3 << 20) + 39 + 32,
            "{}",
            sent.capacity()
        );
        give(sent);
        let received = take((3 << 20) + 39 + 32);
        assert_eq!(received.len(), (3 << 20) + 39 + 32);
        for _ in 0..64 {
            give(vec![0u8; 1 << 20]);
        }
        let total: usize = SPARE.lock().unwrap().iter().map(Vec::capacity).sum();
        assert!(total <= KEEP_TOTAL, "{total} bytes kept");
        give(vec![0u8; 10]);
        assert!(SPARE
            .lock()
            .unwrap()
            .iter()
            .all(|b| b.capacity() >= KEEP_MIN));
    }
}
