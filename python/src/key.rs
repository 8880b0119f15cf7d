//! [`PyKey`]: a Python mapping key held as plain Rust data, so that the
//! buffer's IO threads hash and compare keys without the GIL.
//!
//! Equality follows Python's for the kinds Dask uses: `1`, `1.0` and `True`
//! are one key (as in a `dict`, the first one inserted is the one iteration
//! gives back), `"a"` and `b"a"` are two.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString, PyTuple};
use std::hash::{Hash, Hasher};

/// A key of one of the supported kinds, as its Python value.
#[derive(Debug, Clone)]
pub enum PyKey {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` that fits in 64 bits.
    Int(i64),
    /// Any other `int`, as its decimal digits.
    BigInt(String),
    /// A `float`.
    Float(f64),
    /// A `str`.
    Str(String),
    /// A `bytes`.
    Bytes(Vec<u8>),
    /// A `tuple` of supported keys.
    Tuple(Vec<PyKey>),
}

/// How numbers compare: as Python does, an integral float or a bool equals
/// the int of the same value.
#[derive(PartialEq, Eq, Hash)]
enum Num<'a> {
    Int(i64),
    Big(&'a str),
    FloatBits(u64),
}

impl PyKey {
    /// Convert a Python key; a `TypeError` names the unsupported type.
    pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<PyKey> {
        if let Ok(s) = obj.downcast::<PyString>() {
            return Ok(PyKey::Str(s.to_cow()?.into_owned()));
        }
        if let Ok(t) = obj.downcast::<PyTuple>() {
            // Items borrowed from the tuple: no reference count to change.
            let mut items = Vec::with_capacity(t.len());
            for item in t.iter_borrowed() {
                items.push(PyKey::from_py(&item)?);
            }
            return Ok(PyKey::Tuple(items));
        }
        if let Ok(b) = obj.downcast::<PyBool>() {
            return Ok(PyKey::Bool(b.is_true()));
        }
        if let Ok(i) = obj.downcast::<PyInt>() {
            return Ok(match i.extract::<i64>() {
                Ok(v) => PyKey::Int(v),
                Err(_) => PyKey::BigInt(i.str()?.to_cow()?.into_owned()),
            });
        }
        if let Ok(f) = obj.downcast::<PyFloat>() {
            return Ok(PyKey::Float(f.value()));
        }
        if let Ok(b) = obj.downcast::<PyBytes>() {
            return Ok(PyKey::Bytes(b.as_bytes().to_vec()));
        }
        if obj.is_none() {
            return Ok(PyKey::None);
        }
        Err(PyTypeError::new_err(format!(
            "spillbuffer keys must be str, bytes, int, float, bool, None or tuples of them; got {} ({})",
            obj.get_type().name()?,
            obj.repr()?
        )))
    }

    /// The Python object this key was made from (an equal, new one).
    pub fn to_py(&self, py: Python<'_>) -> PyResult<PyObject> {
        Ok(match self {
            PyKey::None => py.None(),
            PyKey::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
            PyKey::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            PyKey::BigInt(digits) => py.get_type::<PyInt>().call1((digits.as_str(),))?.unbind(),
            PyKey::Float(f) => PyFloat::new(py, *f).into_any().unbind(),
            PyKey::Str(s) => PyString::new(py, s).into_any().unbind(),
            PyKey::Bytes(b) => PyBytes::new(py, b).into_any().unbind(),
            PyKey::Tuple(items) => {
                let items = items
                    .iter()
                    .map(|k| k.to_py(py))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)?.into_any().unbind()
            }
        })
    }

    fn num(&self) -> Option<Num<'_>> {
        match self {
            PyKey::Bool(b) => Some(Num::Int(*b as i64)),
            PyKey::Int(i) => Some(Num::Int(*i)),
            PyKey::BigInt(d) => Some(Num::Big(d)),
            PyKey::Float(f) => {
                // -2^63 and 2^63 bound the floats that are exactly an i64.
                let bound = (1u64 << 63) as f64;
                if f.fract() == 0.0 && *f >= -bound && *f < bound {
                    Some(Num::Int(*f as i64))
                } else {
                    Some(Num::FloatBits(f.to_bits()))
                }
            }
            _ => None,
        }
    }
}

impl PartialEq for PyKey {
    fn eq(&self, other: &Self) -> bool {
        // The kinds Dask's keys are made of first: a lookup compares every
        // item of a tuple key.
        match (self, other) {
            (PyKey::Str(a), PyKey::Str(b)) => a == b,
            (PyKey::Int(a), PyKey::Int(b)) => a == b,
            (PyKey::Tuple(a), PyKey::Tuple(b)) => a == b,
            (PyKey::Bytes(a), PyKey::Bytes(b)) => a == b,
            (PyKey::None, PyKey::None) => true,
            _ => match (self.num(), other.num()) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
        }
    }
}

impl Eq for PyKey {}

impl Hash for PyKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            PyKey::None => 1u8.hash(state),
            PyKey::Str(s) => {
                2u8.hash(state);
                s.hash(state);
            }
            PyKey::Bytes(b) => {
                3u8.hash(state);
                b.hash(state);
            }
            PyKey::Tuple(items) => {
                4u8.hash(state);
                items.hash(state);
            }
            // Every number (the kinds left) as its `Num`: equal numbers
            // hash alike.
            _ => {
                0u8.hash(state);
                self.num().hash(state);
            }
        }
    }
}
