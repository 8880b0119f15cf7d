#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(rust_2018_idioms)]

mod buffer;
mod config;
mod error;
mod io;
mod metrics;
mod store;
mod value;

pub use buffer::{Key, Pinned, SpillBuffer};
pub use config::Builder;
pub use error::{BoxError, Error, Result, SharedError};
pub use metrics::Stats;
pub use store::codec::Compression;
pub use store::storage::{FsStorage, SegmentFile, Storage};
pub use value::Spill;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
