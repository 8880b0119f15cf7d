//! A lossless memory/disk buffer for worker runtimes.
//!
//! A [`SpillBuffer`] holds keyed values in memory under a byte target
//! ([`Builder::memory_target`]). Past the target, the least recently used
//! values are encoded ([`Spill`]), compressed with lz4 when that pays, and
//! written to local disk by the buffer's own IO threads; they are read back
//! when asked for. Nothing inserted is ever dropped, and no disk IO runs on
//! the caller's thread except in the calls that say they block
//! ([`SpillBuffer::get`], [`SpillBuffer::flush_blocking`]).
//!
//! # The calls
//!
//! - [`SpillBuffer::insert`] never waits; [`SpillBuffer::insert_async`]
//!   waits while memory is over [`Builder::memory_limit`] (back-pressure),
//!   and refuses the value, handing it back in an [`InsertError`] that
//!   names the cause, when nothing can be spilled (disk full, `max_spill`
//!   reached, values that cannot be encoded);
//!   [`SpillBuffer::last_spill_error`] and [`SpillBuffer::retry_spills`]
//!   go with it.
//! - [`SpillBuffer::pin`] returns the value, reading it back on the IO pool
//!   if it is on disk; [`SpillBuffer::try_pin`] returns it only if it is in
//!   memory; [`SpillBuffer::get`] reads it on the caller's thread.
//! - A [`Pinned`] value stays in memory while it lives;
//!   [`Pinned::consume`] says the host is done with it.
//! - [`SpillBuffer::prefetch`] reads values back ahead of use;
//!   [`SpillBuffer::remove`] frees memory and disk space;
//!   [`SpillBuffer::stats`] returns [`Stats`], which prints with units.
//! - [`SpillBuffer::record`] hands out a key's stored record as bytes (a
//!   [`Record`]) and [`SpillBuffer::insert_record`] takes such bytes into
//!   another buffer as they are: values move between buffers, or to a
//!   peer over a socket, decoded on neither side.
//!
//! # Executors
//!
//! The futures of `insert_async`, `pin` and `flush` complete through
//! channels that wake whichever executor polls them: they work under tokio
//! (current-thread or multi-thread runtime) or any other executor, and
//! need no tokio runtime. The IO pool is the buffer's own threads.
//!
//! # Example
//!
//! The README's example, a complete program (it uses tokio's `rt` and
//! `macros` features for `#[tokio::main]`):
//!
#![doc = concat!("```rust\n", include_str!("../examples/readme.rs"), "```")]
//!
//! # More
//!
//! The repository's `docs/` directory has a page per topic: how the buffer
//! works, every setting and when to change it, what happens on failures,
//! what each [`Stats`] field means, and benchmarks to run on your own disk.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms)]

mod buffer;
mod config;
mod error;
mod frame;
mod io;
mod metrics;
mod store;
mod sync;
mod value;

pub use buffer::{Key, KeyInfo, Pinned, SpillBuffer};
pub use config::Builder;
pub use error::{BoxError, Error, InsertError, Result, SharedError, SpillFailure};
pub use frame::Record;
pub use metrics::Stats;
pub use store::codec::Compression;
pub use store::storage::{FsStorage, SegmentFile, Storage};
#[cfg(feature = "serde")]
pub use value::Serde;
pub use value::{EncodedPieces, Spill};

#[cfg(any(test, feature = "testing"))]
pub mod testing;
