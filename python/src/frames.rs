//! Frames between Python and the buffer, with no copy, under the stable ABI.
//!
//! The package is built against CPython's limited API for Python 3.9 (one
//! abi3 wheel for every version), which has no buffer protocol before
//! 3.11: an extension can neither export its memory as a buffer nor read
//! another object's. numpy does both, through its array interface, and
//! every Dask worker that holds arrays has it:
//!
//! - **Out** ([`RecordFrames`]): the frames of a record read back are
//!   slices of one writable `uint8` numpy array on the buffer's own memory,
//!   made from a [`RecordView`]'s `__array_interface__`. The array keeps
//!   the view (its `base`), the view keeps the record: the memory lives as
//!   long as any array or `memoryview` made from it. (One array per record:
//!   numpy takes microseconds to read an interface, a slice far less.)
//! - **In** ([`FrameBytes`]): a frame a serializer returned is read in
//!   place through `numpy.frombuffer`, whose array holds a `memoryview` of
//!   the frame, and so the frame's export, for as long as the bytes are
//!   used; `bytes` are read directly.
//!
//! Frames under [`COPY_BELOW`] bytes, and all frames without numpy, are
//! copied (into a `bytearray` out, into `bytes` in): never lossy, and
//! writable as before.

use crate::record::Record;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView, PySlice};
use pyo3::{intern, IntoPyObjectExt};

/// numpy's functions, looked up once per interpreter; `None` if numpy is
/// not importable.
struct Numpy {
    asarray: PyObject,
    frombuffer: PyObject,
    uint8: PyObject,
}

static NUMPY: GILOnceCell<Option<Numpy>> = GILOnceCell::new();

fn numpy(py: Python<'_>) -> Option<&Numpy> {
    NUMPY
        .get_or_init(py, || {
            let np = py.import("numpy").ok()?;
            Some(Numpy {
                asarray: np.getattr("asarray").ok()?.unbind(),
                frombuffer: np.getattr("frombuffer").ok()?.unbind(),
                uint8: np.getattr("uint8").ok()?.unbind(),
            })
        })
        .as_ref()
}

/// One frame of a value read back, as numpy's array interface describes
/// it: writable, contiguous bytes in memory the spill buffer allocated,
/// kept alive while this object lives.
#[pyclass(module = "spillbuffer._native", frozen)]
pub struct RecordView {
    record: Record,
    start: usize,
    end: usize,
}

impl RecordView {
    /// A view of `record[start..end]`.
    pub fn new(record: Record, start: usize, end: usize) -> Self {
        assert!(
            start <= end && end <= record.len(),
            "frame within its record"
        );
        RecordView { record, start, end }
    }
}

#[pymethods]
impl RecordView {
    fn __len__(&self) -> usize {
        self.end - self.start
    }

    /// Writable, as distributed's own frames read from disk are (a
    /// read-only array would make numpy copy the data it deserializes).
    /// Writes land in memory no one else reads: the disk copy is separate,
    /// and an evicted value is dropped, not written back. The frames of a
    /// record read to be sent to a peer are read-only (never deserialized
    /// here, and possibly a value's own memory).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // In bounds (checked in `new`): a pointer into the record's block,
        // which stays in place as long as `self` (the array's base) lives.
        let ptr = self.record.as_ptr().wrapping_add(self.start) as usize;
        let d = PyDict::new(py);
        d.set_item(intern!(py, "version"), 3)?;
        d.set_item(intern!(py, "shape"), (self.end - self.start,))?;
        d.set_item(intern!(py, "typestr"), intern!(py, "|u1"))?;
        d.set_item(intern!(py, "data"), (ptr, self.record.readonly()))?;
        Ok(d)
    }
}

/// Frames shorter than this are copied, both ways: a copy of a few KiB
/// takes less time than numpy takes to make an array on the bytes in place
/// (microseconds), and costs as little memory as the objects pickle
/// rebuilds from its in-band data.
pub const COPY_BELOW: usize = 4096;

/// The frames of one record for Python: slices of one numpy array on the
/// record's memory (made at the first frame asked for); small frames, and
/// all of them without numpy, are `bytearray` copies.
pub struct RecordFrames<'py> {
    py: Python<'py>,
    record: &'py Record,
    whole: Option<Bound<'py, PyAny>>,
}

impl<'py> RecordFrames<'py> {
    /// The frames of `record`.
    pub fn new(py: Python<'py>, record: &'py Record) -> Self {
        RecordFrames {
            py,
            record,
            whole: None,
        }
    }

    /// `record[start..end]`.
    pub fn frame(&mut self, start: usize, end: usize) -> PyResult<PyObject> {
        let py = self.py;
        let np = numpy(py).filter(|_| end - start >= COPY_BELOW);
        let Some(np) = np else {
            return PyByteArray::new(py, &self.record.as_slice()[start..end]).into_py_any(py);
        };
        let whole = match &self.whole {
            Some(whole) => whole,
            None => {
                let len = self.record.len();
                let view = Py::new(py, RecordView::new(Record::clone(self.record), 0, len))?;
                self.whole.insert(np.asarray.bind(py).call1((view,))?)
            }
        };
        if (start, end) == (0, self.record.len()) {
            return Ok(whole.clone().unbind());
        }
        Ok(whole
            .get_item(PySlice::new(py, start as isize, end as isize, 1))?
            .unbind())
    }
}

/// The bytes of a frame a serializer returned, held in place (exported)
/// until this is dropped.
pub struct FrameBytes {
    /// What keeps the bytes alive and in place: the `bytes` object, or the
    /// numpy array holding a `memoryview` of the frame.
    _owner: PyObject,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are owned by the Python object held in `_owner`, which
// keeps them exported (unmovable) until it is dropped; reading them needs
// no GIL. The object itself is only touched under the GIL (on drop).
unsafe impl Send for FrameBytes {}
// SAFETY: as above; the bytes are only read through `&self`.
unsafe impl Sync for FrameBytes {}

impl FrameBytes {
    /// Hold `obj`'s bytes; a `BufferError` if it has none or they are not
    /// C-contiguous.
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<FrameBytes> {
        let py = obj.py();
        if let Ok(b) = obj.downcast::<PyBytes>() {
            let s = b.as_bytes();
            return Ok(FrameBytes {
                ptr: s.as_ptr(),
                len: s.len(),
                _owner: b.clone().into_any().unbind(),
            });
        }
        let view = PyMemoryView::from(obj)?;
        if !view.getattr(intern!(py, "c_contiguous"))?.is_truthy()? {
            return Err(PyBufferError::new_err(
                "serializer returned a non-contiguous frame",
            ));
        }
        let nbytes: usize = view.getattr(intern!(py, "nbytes"))?.extract()?;
        let np = numpy(py).filter(|_| nbytes >= COPY_BELOW);
        let Some(np) = np else {
            let copy = view.call_method0(intern!(py, "tobytes"))?;
            return FrameBytes::new(&copy);
        };
        let array = np.frombuffer.bind(py).call1((view, np.uint8.bind(py)))?;
        let (ptr, _readonly): (usize, bool) = array
            .getattr(intern!(py, "__array_interface__"))?
            .get_item(intern!(py, "data"))?
            .extract()?;
        Ok(FrameBytes {
            len: array.len()?,
            ptr: ptr as *const u8,
            _owner: array.unbind(),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes at `ptr`, kept alive and in place by `_owner`
        // (see the type's Send impl).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
}
