//! [`PyValue`]: a Python object as a [`Spill`] value.
//!
//! A value inserted from Python holds the object. When the buffer writes
//! it out, on an IO thread, it takes the GIL only to call the Python
//! serializer (which returns frames, zero-copy views for numpy) and to get
//! buffer views of them, then lets it go. The record is a self-describing
//! envelope of the frames ([`crate::record`]); a value with a large frame
//! is written from the object's own memory, in pieces, the others are
//! copied into the envelope. A value read back
//! holds the record's bytes, in memory the buffer allocated and the disk
//! read filled; Python gets views of those bytes ([`crate::frames`]) and
//! deserializes them on first access, on the caller's thread.

use crate::frames::FrameBytes;
use crate::key::PyKey;
use crate::record::{envelope_head, padding, write_envelope, Record, RecordBytes, LARGE_FRAME};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyList;
use spillbuffer::{BoxError, EncodedPieces, Spill};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What the values of one buffer share: the serializer, and what IO
/// threads hand back to the mapping.
pub struct Hooks {
    /// `dumps(obj) -> list` of C-contiguous byte buffers.
    pub dumps: PyObject,
    /// Values that failed to serialize, with the exception, waiting to be
    /// reported by the mapping on the caller's thread.
    pub errors: Mutex<Vec<(PyKey, PyErr)>>,
    /// Whether `errors` may hold something (checked on every call).
    pub has_errors: AtomicBool,
    /// Nanoseconds spent in `dumps`, for the metrics.
    pub serialize_nanos: AtomicU64,
    /// Values inserted from Python serialized for a write, and their
    /// encoded bytes: any other record written is a value written again.
    pub fresh_encodes: AtomicU64,
    /// See `fresh_encodes`.
    pub fresh_bytes: AtomicU64,
}

impl Hooks {
    fn add_time(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
    }
}

/// The frames of a serialized value, held (exported) until it is dropped.
struct Serialized {
    frames: Vec<FrameBytes>,
    /// Whether a frame is large enough to be written from the object's
    /// memory rather than copied.
    large: bool,
}

impl Serialized {
    fn bytes(&self, i: usize) -> &[u8] {
        // Held in place for as long as `self` lives; reading it does not
        // need the GIL.
        self.frames[i].as_slice()
    }
}

enum Body {
    /// Inserted from Python: the object itself.
    Object(PyObject),
    /// Read back from disk: the record's bytes.
    Encoded(Record),
    /// Being dropped.
    Gone,
}

/// A Python object held by the buffer.
pub struct PyValue {
    weight: usize,
    body: Body,
    /// For an inserted value: its serialization, made on the first write.
    serialized: OnceLock<Serialized>,
    /// For a value read back: the object deserialized from it at its first
    /// access, handed to every later one.
    object: OnceLock<PyObject>,
    /// The key (inserted values only): to name in a failure report.
    key: Option<PyKey>,
    hooks: Option<Arc<Hooks>>,
    /// Set once serialization failed and was reported: later writes of
    /// this value fail at once (it stays in memory), logged once.
    reported: AtomicBool,
}

impl PyValue {
    /// A value inserted from Python.
    pub fn new(key: PyKey, obj: PyObject, weight: usize, hooks: Arc<Hooks>) -> Self {
        PyValue {
            weight,
            body: Body::Object(obj),
            serialized: OnceLock::new(),
            object: OnceLock::new(),
            key: Some(key),
            hooks: Some(hooks),
            reported: AtomicBool::new(false),
        }
    }

    /// The inserted object, or the one already deserialized from a value
    /// read back.
    pub fn object(&self, py: Python<'_>) -> Option<PyObject> {
        match &self.body {
            Body::Object(o) => Some(o.clone_ref(py)),
            _ => self.object.get().map(|o| o.clone_ref(py)),
        }
    }

    /// Whether the value is held as a Python object (inserted, or read
    /// back and deserialized since), rather than as its record alone.
    pub fn has_object(&self) -> bool {
        matches!(self.body, Body::Object(_)) || self.object.get().is_some()
    }

    /// Remember the object deserialized from a value read back; returns the
    /// one to hand out (another thread's, if it was first).
    pub fn set_object(&self, py: Python<'_>, obj: PyObject) -> PyObject {
        self.object.get_or_init(|| obj).clone_ref(py)
    }

    /// For a value read back: its record.
    pub fn record(&self) -> Option<&Record> {
        match &self.body {
            Body::Encoded(rec) => Some(rec),
            _ => None,
        }
    }

    /// The serialization, made now (under the GIL) if not yet.
    fn serialized(&self, obj: &PyObject, hooks: &Hooks) -> Result<&Serialized, BoxError> {
        if let Some(s) = self.serialized.get() {
            return Ok(s);
        }
        if self.reported.load(Relaxed) {
            // It failed before and Python objects rarely become picklable:
            // fail at once, without the GIL or another log line.
            return Err("this value failed to serialize before".into());
        }
        let s = self.serialize(obj, hooks)?;
        hooks.fresh_encodes.fetch_add(1, Relaxed);
        Ok(self.serialized.get_or_init(|| s))
    }

    fn serialize(&self, obj: &PyObject, hooks: &Hooks) -> Result<Serialized, BoxError> {
        Python::with_gil(|py| {
            let start = Instant::now();
            let res = (|| -> PyResult<Vec<FrameBytes>> {
                let frames = hooks.dumps.call1(py, (obj.clone_ref(py),))?;
                let frames = frames.bind(py).downcast::<PyList>()?.clone();
                let mut out = Vec::with_capacity(frames.len());
                for f in frames.iter() {
                    out.push(FrameBytes::new(&f)?);
                }
                Ok(out)
            })();
            Hooks::add_time(&hooks.serialize_nanos, start);
            match res {
                Ok(frames) => {
                    let large = frames.iter().any(|f| f.len() >= LARGE_FRAME);
                    Ok(Serialized { frames, large })
                }
                Err(e) => {
                    let text = e.to_string();
                    if !self.reported.swap(true, Relaxed) {
                        if let Some(key) = &self.key {
                            hooks.errors.lock().push((key.clone(), e));
                            hooks.has_errors.store(true, Relaxed);
                        }
                    }
                    Err(BoxError::from(text))
                }
            }
        })
    }
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
            _ => return Err("value without a serializer".into()),
        };
        let s = self.serialized(obj, hooks)?;
        let base = out.len();
        // With the GIL released: the frames stay exported until `s` goes.
        let frames: Vec<&[u8]> = (0..s.frames.len()).map(|i| s.bytes(i)).collect();
        write_envelope(out, self.weight, &frames);
        hooks
            .fresh_bytes
            .fetch_add((out.len() - base) as u64, Relaxed);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxError> {
        Ok(Self::read_back(Arc::new(RecordBytes::new(bytes.into()))))
    }

    /// A value read back is its record, written again as it is.
    fn as_encoded(&self) -> Option<&[u8]> {
        self.record().map(|rec| rec.as_slice())
    }

    /// An inserted value with a large frame: its envelope's header and
    /// padding, and the frames in the object's own memory, with no copy.
    fn encoded_pieces(&self) -> Option<EncodedPieces<'_>> {
        let (Body::Object(obj), Some(hooks)) = (&self.body, &self.hooks) else {
            return None;
        };
        // An error is reported by `serialized` and again by the `encode`
        // that follows a `None`.
        let s = self.serialized(obj, hooks).ok()?;
        if !s.large {
            return None;
        }
        let frames: Vec<&[u8]> = (0..s.frames.len()).map(|i| s.bytes(i)).collect();
        let mut pieces = EncodedPieces::new();
        pieces.push(envelope_head(self.weight, &frames));
        for f in frames {
            pieces.push_slice(f);
            pieces.push_slice(padding(f.len()));
        }
        hooks.fresh_bytes.fetch_add(pieces.len() as u64, Relaxed);
        Some(pieces)
    }

    fn decode_in_place(
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), BoxError>,
    ) -> Option<Result<Self, BoxError>> {
        // Zeroed: a large block comes from fresh zero pages (huge ones
        // where the kernel gives them) that the read fills, with no memset
        // pass.
        let mut rec = RecordBytes::zeroed(len);
        Some(fill(rec.as_mut_slice()).map(|()| Self::read_back(Arc::new(rec))))
    }
}

impl PyValue {
    fn read_back(rec: Record) -> Self {
        PyValue {
            // What it holds now. (The envelope is checked when Python
            // first reads the value.)
            weight: rec.len(),
            body: Body::Encoded(rec),
            serialized: OnceLock::new(),
            object: OnceLock::new(),
            key: None,
            hooks: None,
            reported: AtomicBool::new(false),
        }
    }
}

impl Drop for PyValue {
    fn drop(&mut self) {
        // Release the Python side (frame exports, the object) here, under
        // the GIL: pyo3 would otherwise defer it to whichever thread next
        // takes the GIL, often the event loop, which would then free the
        // memory. The buffer drops values on its IO pool. A record read
        // back is freed after the GIL is let go (its last handle may be
        // the array deserialized from it).
        let object = self.object.take();
        if object.is_some()
            || self.serialized.get().is_some()
            || matches!(self.body, Body::Object(_))
        {
            let body = std::mem::replace(&mut self.body, Body::Gone);
            let serialized = self.serialized.take();
            let record = match &body {
                Body::Encoded(rec) => Some(Arc::clone(rec)),
                _ => None,
            };
            Python::with_gil(|_| drop((serialized, object, body)));
            drop(record);
        }
    }
}
