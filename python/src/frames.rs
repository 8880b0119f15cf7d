//! [`RecordView`]: the buffer protocol over the bytes of a value read back,
//! so that Python deserializers (numpy's among them) build their objects on
//! the buffer's own memory, with no copy.

use crate::record::Record;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;

/// One frame of a value read back: a writable, contiguous byte buffer over
/// memory the spill buffer allocated. It keeps that memory alive while any
/// Python view of it exists.
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

    /// Exports the frame as a writable buffer, as distributed's own frames
    /// read from disk are (a read-only one would make numpy copy the array).
    /// Writes land in memory no one else reads: the disk copy is separate,
    /// and an evicted value is dropped, not written back.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null view"));
        }
        let me = slf.get();
        let ptr = me.record.as_ptr().add(me.start) as *mut std::ffi::c_void;
        let len = (me.end - me.start) as ffi::Py_ssize_t;
        // SAFETY: `view` is the non-null struct Python asked us to fill;
        // PyBuffer_FillInfo takes a reference on `slf`, which keeps the
        // record's block alive (and in place) as long as the view lives.
        if ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr, len, 0, flags) != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
