//! The native half of the `spillbuffer` Python package: the Rust buffer
//! keyed by Python keys ([`key`]) and holding Python objects ([`value`]),
//! exposed as [`buffer::Core`]; [`record`] is what a value looks like on
//! disk, [`pages`] the memory large records are read back into, and
//! [`frames`] moves frames between Python and the buffer without a
//! copy; [`wait`] runs the buffer's futures on a blocking call. The
//! `MutableMapping` users see is in
//! `spillbuffer/_mapping.py`.
#![deny(missing_docs)]

mod buffer;
mod frames;
mod key;
mod pages;
mod record;
mod stored;
mod value;
mod wait;

use pyo3::prelude::*;

/// `spillbuffer._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<buffer::Core>()?;
    m.add_class::<buffer::Held>()?;
    m.add_class::<frames::RecordView>()?;
    Ok(())
}
