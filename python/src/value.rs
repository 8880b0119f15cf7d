//! [`PyValue`]: a Python object as a [`Spill`] value.
//!
//! A value inserted from Python holds the object. When the buffer spills
//! it, `encode` runs on an IO thread: it takes the GIL only to call the
//! Python serializer (which returns a list of frames, zero-copy views for
//! numpy), then releases it and copies the frames into the record. A value
//! read back holds the record's bytes, in memory the buffer allocated and
//! the disk read filled; Python gets views of those bytes ([`crate::frames`])
//! and deserializes them on first access, on the caller's thread.
//!
//! The encoded form is an envelope of frames, each aligned to 64 bytes so
//! that arrays read back are aligned too:
//! `b"SBv1" | u32 frame count | u64 weight | u64 length per frame | pad | frames (each padded)`.

use crate::key::PyKey;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyList;
use spillbuffer::{BoxError, Spill};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const MAGIC: &[u8; 4] = b"SBv1";
const ALIGN: usize = 64;

fn pad(n: usize) -> usize {
    n.next_multiple_of(ALIGN)
}

/// The Python side of one buffer: its serializer and where failures go.
pub struct Hooks {
    /// `dumps(obj) -> list` of C-contiguous byte buffers.
    pub dumps: PyObject,
    /// Values that failed to serialize, with the exception, waiting to be
    /// reported by the mapping on the caller's thread.
    pub errors: parking_lot::Mutex<Vec<(PyKey, PyErr)>>,
    /// Whether `errors` may hold something (checked on every call).
    pub has_errors: AtomicBool,
    /// Nanoseconds spent in `dumps`, for the metrics.
    pub serialize_nanos: AtomicU64,
    /// Values inserted from Python encoded for a write, and their encoded
    /// bytes: any other record written is a value written again.
    pub fresh_encodes: AtomicU64,
    /// See `fresh_encodes`.
    pub fresh_bytes: AtomicU64,
}

/// Bytes of a value read back, owned by the buffer and shared with the
/// Python views of them.
pub type Record = Arc<RecordBytes>;

/// A heap block of bytes that Python may write to through a frame view
/// (see [`crate::frames::RecordView`]), hence held as a raw pointer rather
/// than a `Box<[u8]>` that Rust would assume immutable behind an `Arc`.
pub struct RecordBytes {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the block is owned by this struct alone and freed once, in Drop.
// Rust reads it (the envelope header, when read back; `as_encoded` if the
// value is ever spilled again) and Python may write to the frames through
// the buffer protocol; a task writing into its input while that input is
// being spilled is a race Python's own buffers have too.
unsafe impl Send for RecordBytes {}
// SAFETY: as above.
unsafe impl Sync for RecordBytes {}

impl RecordBytes {
    fn new(bytes: Box<[u8]>) -> Self {
        let len = bytes.len();
        RecordBytes {
            ptr: Box::into_raw(bytes) as *mut u8,
            len,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is the live allocation of `len` bytes made in `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Start of the block, for the buffer protocol.
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
        // SAFETY: made by `Box::into_raw` of a `len`-byte slice in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

enum Body {
    /// Inserted from Python: the object itself.
    Object(PyObject),
    /// Read back from disk: the envelope's bytes.
    Encoded(Record),
}

/// A Python object held by the buffer.
pub struct PyValue {
    weight: usize,
    body: Body,
    /// For a value read back: the object deserialized from it at its first
    /// access, handed to every later one.
    object: OnceLock<PyObject>,
    /// The key, to name in a failure report (inserted values only).
    key: Option<PyKey>,
    hooks: Option<Arc<Hooks>>,
    /// Set once serialization failed and was reported: later spills of
    /// this value fail at once (it stays in memory), logged once.
    reported: AtomicBool,
    /// Alive as long as the buffer holds this value in memory; the mapping
    /// keeps a weak handle to tell which keys are resident.
    pub token: Arc<()>,
}

impl PyValue {
    /// A value inserted from Python.
    pub fn new(key: PyKey, obj: PyObject, weight: usize, hooks: Arc<Hooks>) -> Self {
        PyValue {
            weight,
            body: Body::Object(obj),
            object: OnceLock::new(),
            key: Some(key),
            hooks: Some(hooks),
            reported: AtomicBool::new(false),
            token: Arc::new(()),
        }
    }

    /// The inserted object, if this value is one.
    pub fn object(&self, py: Python<'_>) -> Option<PyObject> {
        match &self.body {
            Body::Object(o) => Some(o.clone_ref(py)),
            Body::Encoded(_) => self.object.get().map(|o| o.clone_ref(py)),
        }
    }

    /// Remember the object deserialized from a value read back; returns the
    /// one to hand out (another thread's, if it was first).
    pub fn set_object(&self, py: Python<'_>, obj: PyObject) -> PyObject {
        let kept = self.object.get_or_init(|| obj);
        kept.clone_ref(py)
    }

    /// For a value read back: its bytes and the frame ranges within them.
    pub fn frames(&self) -> Option<(Record, Vec<(usize, usize)>)> {
        match &self.body {
            Body::Encoded(rec) => parse(rec.as_slice()).ok().map(|r| (Arc::clone(rec), r.1)),
            Body::Object(_) => None,
        }
    }

    /// Serialize under the GIL; hand back the frames as held buffers.
    fn serialize(&self, obj: &PyObject, hooks: &Hooks) -> Result<Vec<PyBuffer<u8>>, BoxError> {
        Python::with_gil(|py| {
            let start = Instant::now();
            let res = (|| -> PyResult<Vec<PyBuffer<u8>>> {
                let frames = hooks.dumps.call1(py, (obj.clone_ref(py),))?;
                let frames = frames.bind(py).downcast::<PyList>()?.clone();
                let mut out = Vec::with_capacity(frames.len());
                for f in frames.iter() {
                    let buf = PyBuffer::<u8>::get(&f)?;
                    if !buf.is_c_contiguous() {
                        return Err(pyo3::exceptions::PyBufferError::new_err(
                            "serializer returned a non-contiguous frame",
                        ));
                    }
                    out.push(buf);
                }
                Ok(out)
            })();
            Hooks::add(&hooks.serialize_nanos, start);
            res.map_err(|e| {
                let text = e.to_string();
                if !self.reported.swap(true, Relaxed) {
                    if let Some(key) = &self.key {
                        hooks.errors.lock().push((key.clone(), e));
                        hooks.has_errors.store(true, Relaxed);
                    }
                }
                BoxError::from(text)
            })
        })
    }
}

impl Hooks {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
    }
}

/// Envelope header length for `n` frames, padded.
fn head_len(n: usize) -> usize {
    pad(16 + 8 * n)
}

/// Check an envelope; returns its weight and frame ranges.
fn parse(bytes: &[u8]) -> Result<(usize, Vec<(usize, usize)>), BoxError> {
    if bytes.len() < 16 || &bytes[..4] != MAGIC {
        return Err("not a spillbuffer Python record (bad magic)".into());
    }
    let n = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
    let weight = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
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
    Ok((weight, ranges))
}

impl Spill for PyValue {
    fn weight(&self) -> usize {
        self.weight
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<(), BoxError> {
        let (obj, hooks) = match (&self.body, &self.hooks) {
            (Body::Encoded(rec), _) => {
                out.extend_from_slice(rec.as_slice());
                return Ok(());
            }
            (Body::Object(obj), Some(hooks)) => (obj, hooks),
            (Body::Object(_), None) => return Err("value without a serializer".into()),
        };
        if self.reported.load(Relaxed) {
            // It failed before and Python objects rarely become picklable:
            // fail at once, without the GIL or another log line.
            return Err("this value failed to serialize before".into());
        }
        let frames = self.serialize(obj, hooks)?;
        // The GIL is released here: the frames stay exported (their memory
        // cannot move) until the buffers are dropped below.
        let base = out.len();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.weight as u64).to_le_bytes());
        for f in &frames {
            out.extend_from_slice(&(f.len_bytes() as u64).to_le_bytes());
        }
        let total: usize = frames.iter().map(|f| pad(f.len_bytes())).sum();
        out.reserve(head_len(frames.len()) + total);
        out.resize(base + head_len(frames.len()), 0);
        for f in &frames {
            // SAFETY: the buffer is held (exported) for as long as `f`
            // lives, so its memory stays valid and in place; it is
            // C-contiguous (checked above) and `len_bytes` long. Reading it
            // does not need the GIL.
            let bytes =
                unsafe { std::slice::from_raw_parts(f.buf_ptr() as *const u8, f.len_bytes()) };
            out.extend_from_slice(bytes);
            out.resize(base + pad(out.len() - base), 0);
        }
        drop(frames); // takes the GIL briefly to release the exports
        hooks.fresh_encodes.fetch_add(1, Relaxed);
        hooks
            .fresh_bytes
            .fetch_add((out.len() - base) as u64, Relaxed);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Self::from_record(Arc::new(RecordBytes::new(bytes.into())))
    }

    fn as_encoded(&self) -> Option<&[u8]> {
        match &self.body {
            Body::Encoded(rec) => Some(rec.as_slice()),
            Body::Object(_) => None,
        }
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        // Zeroed: a large allocation comes from fresh zero pages that the
        // read fills, with no memset pass.
        let mut bytes = vec![0u8; len].into_boxed_slice();
        Some(fill(&mut bytes).and_then(|()| Self::from_record(Arc::new(RecordBytes::new(bytes)))))
    }
}

impl PyValue {
    fn from_record(rec: Record) -> Result<Self, BoxError> {
        let (weight, _) = parse(rec.as_slice())?;
        Ok(PyValue {
            // What it weighed when inserted, so that the mapping's totals
            // agree (its bytes differ from that by the envelope's padding
            // and, for objects that are not views of them, by the object).
            weight,
            body: Body::Encoded(rec),
            object: OnceLock::new(),
            key: None,
            hooks: None,
            reported: AtomicBool::new(false),
            token: Arc::new(()),
        })
    }
}
