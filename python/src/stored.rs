//! The frames of a value's encoding, as the serializer made them: what
//! Python deserializes a value read back from, and what a peer is sent
//! for a value on disk without it being deserialized here.
//!
//! A record is an envelope of the frames ([`crate::record`]): it needs
//! nothing kept with the key to be read.

use crate::frames::RecordFrames;
use crate::key::PyKey;
use crate::record::{parse_envelope, Record};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The frames of `rec`, the encoding of `key`'s value: views of the
/// record's memory for the large ones, copies of the small ones.
pub fn frames_of(py: Python<'_>, key: &PyKey, rec: &Record) -> PyResult<Vec<PyObject>> {
    let mut record_frames = RecordFrames::new(py, rec);
    parse_envelope(rec.as_slice())
        .map_err(|e| PyRuntimeError::new_err(format!("record of key {key:?} is damaged: {e}")))?
        .into_iter()
        .map(|(a, b)| record_frames.frame(a, b))
        .collect()
}
