//! What a value looks like on disk, and the bytes of a value read back.
//!
//! A record is an envelope of the frames the serializer made, each frame
//! aligned to 64 bytes so that arrays read back are aligned too:
//! `b"SBv1" | u32 frame count | u64 weight | u64 length per frame | pad | frames (each padded)`.
//! It describes itself: reading it needs nothing kept with the key. A
//! value with a frame of [`LARGE_FRAME`] bytes or more (a numpy array's
//! data) is written from the object's own memory, the envelope's header
//! and padding around its frames ([`envelope_head`], [`padding`]); others
//! are copied into the envelope ([`write_envelope`]).
//!
//! A record read back is held as [`RecordBytes`], which Python sees
//! as numpy arrays on that memory ([`crate::frames`]).

use crate::pages::{Pages, MAPPED_MIN};
use spillbuffer::BoxError;
use std::borrow::Cow;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"SBv1";
const ALIGN: usize = 64;
const ZEROS: [u8; ALIGN] = [0; ALIGN];

/// A value with a frame at least this long is written from the object's
/// memory, in pieces, rather than copied into its envelope.
pub const LARGE_FRAME: usize = 1 << 20;

fn pad(n: usize) -> usize {
    n.next_multiple_of(ALIGN)
}

/// Bytes of a value read back, owned by the buffer and shared with the
/// Python views of them.
pub type Record = Arc<RecordBytes>;

/// A block of bytes that Python may write to through a frame view (see
/// [`crate::frames::RecordView`]), hence held as a raw pointer rather than
/// a `Box<[u8]>` that Rust would assume immutable behind an `Arc`. Large
/// blocks are mappings of their own ([`Pages`]), small ones heap blocks;
/// the encoding of a record read for a peer may be the record's own
/// memory ([`RecordBytes::from_stored`]), which Python only reads.
pub struct RecordBytes {
    ptr: *mut u8,
    len: usize,
    owner: Owner,
}

/// What `ptr` points into.
enum Owner {
    /// A heap block made by `Box::into_raw`.
    Heap,
    /// A mapping, unmapped by its own drop.
    Pages(#[allow(dead_code, reason = "held for its drop")] Pages),
    /// The payload of a stored record, read-only: the record may be a
    /// value's own memory (a record of a value in memory).
    Stored(#[allow(dead_code, reason = "held for its drop")] spillbuffer::Record),
}

// SAFETY: the block is owned by this struct alone (or by the stored record
// it holds, which nothing else reaches) and freed once, in Drop.
// Rust reads it (the envelope header when Python first accesses it, the
// whole record if the value is ever written again) and Python may write to
// the frames through the arrays made on them; a task writing into its input
// while that input is being written out is a race Python's own buffers
// have too. A stored record's bytes are handed to Python read-only.
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
            owner: Owner::Heap,
        }
    }

    /// `len` zero bytes, for a read to fill: a mapping of their own (huge
    /// pages where the kernel gives them) from [`MAPPED_MIN`] bytes on.
    pub fn zeroed(len: usize) -> Self {
        match (len >= MAPPED_MIN).then(|| Pages::zeroed(len)).flatten() {
            Some(pages) => RecordBytes {
                ptr: pages.as_ptr(),
                len,
                owner: Owner::Pages(pages),
            },
            None => Self::new(vec![0u8; len].into_boxed_slice()),
        }
    }

    /// The value's encoding in a stored record (checked, decompressed if
    /// it was stored compressed): the record's own memory when it was
    /// stored raw, with no copy, read-only ([`RecordBytes::readonly`]).
    pub fn from_stored(record: spillbuffer::Record) -> std::io::Result<Self> {
        let (ptr, len) = match record.encoded()? {
            Cow::Borrowed(bytes) => (bytes.as_ptr() as *mut u8, bytes.len()),
            Cow::Owned(bytes) => return Ok(Self::new(bytes.into_boxed_slice())),
        };
        // The payload lives in the record's heap memory (its body), which
        // stays in place when the record is moved here.
        Ok(RecordBytes {
            ptr,
            len,
            owner: Owner::Stored(record),
        })
    }

    /// Whether Python must not write to these bytes (they are a stored
    /// record's).
    pub fn readonly(&self) -> bool {
        matches!(self.owner, Owner::Stored(_))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is the live block of `len` bytes made in `new` or
        // `zeroed`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to fill. Only before the record is shared, and never
    /// for a stored record's ([`RecordBytes::readonly`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(!self.readonly(), "a stored record's bytes are read-only");
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
        if let Owner::Heap = self.owner {
            // SAFETY: made by `Box::into_raw` of a `len`-byte slice in `new`.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
        }
        // A mapping is unmapped by `Pages`' own drop, a record freed by
        // its own.
    }
}

/// Envelope header length for `n` frames, padded.
fn head_len(n: usize) -> usize {
    pad(16 + 8 * n)
}

/// The envelope's header for `frames`, padded: what precedes the first
/// frame.
pub fn envelope_head(weight: usize, frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head_len(frames.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    out.extend_from_slice(&(weight as u64).to_le_bytes());
    for f in frames {
        out.extend_from_slice(&(f.len() as u64).to_le_bytes());
    }
    out.resize(head_len(frames.len()), 0);
    out
}

/// The zeros that follow a frame of `len` bytes in an envelope.
pub fn padding(len: usize) -> &'static [u8] {
    &ZEROS[..pad(len) - len]
}

/// Append the envelope of `frames` to `out`: [`envelope_head`], then each
/// frame and its [`padding`].
pub fn write_envelope(out: &mut Vec<u8>, weight: usize, frames: &[&[u8]]) {
    let total: usize = frames.iter().map(|f| pad(f.len())).sum();
    out.reserve(head_len(frames.len()) + total);
    out.extend_from_slice(&envelope_head(weight, frames));
    for f in frames {
        out.extend_from_slice(f);
        out.extend_from_slice(padding(f.len()));
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
