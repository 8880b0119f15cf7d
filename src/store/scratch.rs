//! Buffers reused by the encode, compress, read and decompress steps of
//! one thread: copying into reused memory runs several times faster than
//! into freshly allocated pages, which fault in one by one.

use std::cell::{Cell, RefCell};

/// One thread's buffers.
#[derive(Default)]
pub(crate) struct Scratch {
    pub a: Vec<u8>,
    pub b: Vec<u8>,
    /// Small records packed for one write.
    pub batch: Vec<u8>,
}

/// Scratch buffers larger than this are released after use rather than
/// kept for the thread's life, unless the thread set a lower bound
/// ([`keep_at_most`]).
const SCRATCH_KEEP: usize = 64 << 20;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static KEEP: Cell<usize> = const { Cell::new(SCRATCH_KEEP) };
}

/// Keep this thread's scratch buffers only up to `bytes` each: for the
/// IO pool's many read threads, whose scratch no gauge counts and which
/// only a compressed record, or a value type decoded from a copy, needs.
pub(crate) fn keep_at_most(bytes: usize) {
    KEEP.set(bytes.min(SCRATCH_KEEP));
}

/// Run `f` with this thread's scratch buffers.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut guard) => {
            let s = &mut *guard;
            let r = f(s);
            let keep = KEEP.get();
            for v in [&mut s.a, &mut s.b, &mut s.batch] {
                if v.capacity() > keep {
                    *v = Vec::new();
                }
            }
            r
        }
        // Re-entered (a Spill impl using a buffer inside encode): use fresh
        // buffers rather than fail.
        Err(_) => f(&mut Scratch::default()),
    })
}

/// Grow `buf`'s initialised length to `len` (no memset of a reused
/// buffer's old bytes), then cut it to exactly `len`.
pub(crate) fn fit(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    buf.truncate(len);
}
