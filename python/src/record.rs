//! What a value looks like on disk, and the bytes of a value read back.
//!
//! Two layouts, chosen per value when it is first written:
//!
//! - **raw**: a value whose serialization is small metadata frames plus
//!   one large frame (a numpy array: its header, then its data) is written
//!   as that large frame alone, straight from the object's own memory with
//!   no copy; the small frames stay in memory with the key ([`Layout`]).
//! - **envelope**: anything else is written self-described, each frame
//!   aligned to 64 bytes so that arrays read back are aligned too:
//!   `b"SBv1" | u32 frame count | u64 weight | u64 length per frame | pad | frames (each padded)`.
//!
//! A record read back is held as [`RecordBytes`], which Python sees
//! as numpy arrays on that memory ([`crate::frames`]).

use crate::pages::{Pages, MAPPED_MIN};
use spillbuffer::BoxError;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"SBv1";
const ALIGN: usize = 64;

/// A large frame at least this long is written raw.
pub const RAW_MIN: usize = 1 << 20;

fn pad(n: usize) -> usize {
    n.next_multiple_of(ALIGN)
}

/// How a key's current value was written, kept in memory with the key:
/// for a raw record, its small frames and where the large one goes.
#[derive(Debug)]
pub struct Layout {
    /// All frames but the large one, in order.
    pub small: Vec<Vec<u8>>,
    /// Index of the large frame (the record) among all frames.
    pub raw_at: usize,
}

/// Bytes of a value read back, owned by the buffer and shared with the
/// Python views of them.
pub type Record = Arc<RecordBytes>;

/// A block of bytes that Python may write to through a frame view (see
/// [`crate::frames::RecordView`]), hence held as a raw pointer rather than
/// a `Box<[u8]>` that Rust would assume immutable behind an `Arc`. Large
/// blocks are mappings of their own ([`Pages`]), small ones heap blocks.
pub struct RecordBytes {
    ptr: *mut u8,
    len: usize,
    /// The mapping `ptr` points into, for a large block; `None` for a heap
    /// block made by `Box::into_raw`.
    pages: Option<Pages>,
}

// SAFETY: the block is owned by this struct alone and freed once, in Drop.
// Rust reads it (the envelope header when Python first accesses it, the
// whole record if the value is ever written again) and Python may write to
// the frames through the arrays made on them; a task writing into its input
// while that input is being written out is a race Python's own buffers
// have too.
unsafe impl Send for RecordBytes {}
// SAFETY: as above.
unsafe impl Sync for RecordBytes {}

impl RecordBytes {
    /// Take ownership of `bytes`.
    pub fn new(bytes: Box<[u8]>) -> Self {
        let len = bytes.len();
        RecordBytes {
            ptr: Box::into_raw(bytes) as *mut u8,
            len,
            pages: None,
        }
    }

    /// `len` zero bytes, for a read to fill: a mapping of their own (huge
    /// pages where the kernel gives them) from [`MAPPED_MIN`] bytes on.
    pub fn zeroed(len: usize) -> Self {
        match (len >= MAPPED_MIN).then(|| Pages::zeroed(len)).flatten() {
            Some(pages) => RecordBytes {
                ptr: pages.as_ptr(),
                len,
                pages: Some(pages),
            },
            None => Self::new(vec![0u8; len].into_boxed_slice()),
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is the live block of `len` bytes made in `new` or
        // `zeroed`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to fill. Only before the record is shared.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Start of the block, for the frames handed to Python.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for RecordBytes {
    fn drop(&mut self) {
        if self.pages.is_none() {
            // SAFETY: made by `Box::into_raw` of a `len`-byte slice in `new`.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
        }
        // A mapping is unmapped by `Pages`' own drop.
    }
}

/// Envelope header length for `n` frames, padded.
fn head_len(n: usize) -> usize {
    pad(16 + 8 * n)
}

/// Append the envelope of `frames` to `out`.
pub fn write_envelope(out: &mut Vec<u8>, weight: usize, frames: &[&[u8]]) {
    let base = out.len();
    let total: usize = frames.iter().map(|f| pad(f.len())).sum();
    out.reserve(head_len(frames.len()) + total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    out.extend_from_slice(&(weight as u64).to_le_bytes());
    for f in frames {
        out.extend_from_slice(&(f.len() as u64).to_le_bytes());
    }
    out.resize(base + head_len(frames.len()), 0);
    for f in frames {
        out.extend_from_slice(f);
        out.resize(base + pad(out.len() - base), 0);
    }
}

/// The frame ranges of an envelope.
pub fn parse_envelope(bytes: &[u8]) -> Result<Vec<(usize, usize)>, BoxError> {
    if bytes.len() < 16 || &bytes[..4] != MAGIC {
        return Err("not a spillbuffer Python record (bad magic)".into());
    }
    let n = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
    if bytes.len() < head_len(n) {
        return Err(format!("record of {} bytes too short for {n} frames", bytes.len()).into());
    }
    let mut at = head_len(n);
    let mut ranges = Vec::with_capacity(n);
    for i in 0..n {
        let o = 16 + 8 * i;
        let len = u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes")) as usize;
        let end = at.checked_add(len).filter(|&e| e <= bytes.len());
        let Some(end) = end else {
            return Err(format!("frame {i} runs past the record's end").into());
        };
        ranges.push((at, end));
        at = pad(end);
    }
    Ok(ranges)
}
