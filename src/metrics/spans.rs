//! Tracing spans around the IO jobs (feature `tracing`): `spill` (a write
//! of one value, or of a batch of small ones packed together), `unspill`
//! (a read back, on the pool or on the caller's thread for `get`) and
//! `compact` (one segment's compaction pass).
//!
//! The spans are at DEBUG level, target `spillbuffer`, and carry the
//! buffer's name, what the job moved (`records`, `bytes` as stored,
//! `weight` in memory) and the segment file; the key only when TRACE is
//! enabled for the target, since formatting a key costs and may leak
//! data into logs. A failed job records `error`, and the warning events
//! that report spill and read failures are emitted inside the span, so a
//! subscriber shows them with its fields.
//!
//! Without the feature, [`JobSpan`] is empty and every call here compiles
//! to nothing; the closures that compute paths and weights are never run.

use super::Telemetry;
use crate::error::Result;
use crate::store::DiskLoc;
use std::fmt::Debug;
use std::path::PathBuf;

/// A span entered for the length of one IO job; left when dropped.
#[must_use = "the span is left when this is dropped"]
pub(crate) struct JobSpan {
    #[cfg(feature = "tracing")]
    span: tracing::span::EnteredSpan,
}

#[cfg(feature = "tracing")]
mod on {
    use super::*;
    use tracing::field::{debug, display, Empty};
    use tracing::{debug_span, Level, Span};

    /// Record `key` in `span` if TRACE is on for the target.
    fn record_key<K: Debug>(span: &Span, key: &K) {
        if !span.is_disabled() && tracing::enabled!(target: "spillbuffer", Level::TRACE) {
            span.record("key", debug(key));
        }
    }

    impl JobSpan {
        pub(crate) fn spill<K: Debug>(
            t: &Telemetry,
            key: &K,
            weight: impl FnOnce() -> usize,
        ) -> JobSpan {
            let span = debug_span!(
                target: "spillbuffer",
                "spill",
                buffer = t.name(),
                records = 1u64,
                weight = Empty,
                bytes = Empty,
                segment = Empty,
                key = Empty,
                error = Empty,
            );
            if !span.is_disabled() {
                span.record("weight", weight() as u64);
            }
            record_key(&span, key);
            JobSpan {
                span: span.entered(),
            }
        }

        pub(crate) fn spill_batch(
            t: &Telemetry,
            records: usize,
            weight: impl FnOnce() -> usize,
        ) -> JobSpan {
            let span = debug_span!(
                target: "spillbuffer",
                "spill",
                buffer = t.name(),
                records = records as u64,
                weight = Empty,
                bytes = Empty,
                failed = Empty,
            );
            if !span.is_disabled() {
                span.record("weight", weight() as u64);
            }
            JobSpan {
                span: span.entered(),
            }
        }

        pub(crate) fn unspill<K: Debug>(t: &Telemetry, key: &K, loc: DiskLoc) -> JobSpan {
            let span = debug_span!(
                target: "spillbuffer",
                "unspill",
                buffer = t.name(),
                records = 1u64,
                bytes = loc.len(),
                segment = Empty,
                key = Empty,
                error = Empty,
            );
            record_key(&span, key);
            JobSpan {
                span: span.entered(),
            }
        }

        pub(crate) fn compact(t: &Telemetry, segment: impl FnOnce() -> PathBuf) -> JobSpan {
            let span = debug_span!(
                target: "spillbuffer",
                "compact",
                buffer = t.name(),
                segment = Empty,
                moved = Empty,
                retry = Empty,
            );
            if !span.is_disabled() {
                span.record("segment", display(segment().display()));
            }
            JobSpan {
                span: span.entered(),
            }
        }

        pub(crate) fn record(&self, field: &'static str, value: u64) {
            self.span.record(field, value);
        }

        /// The outcome of a write or read of a record: its size and file,
        /// or the error.
        pub(crate) fn outcome<T>(
            &self,
            res: &Result<T>,
            loc: impl FnOnce(&T) -> DiskLoc,
            path: impl FnOnce(DiskLoc) -> PathBuf,
        ) {
            if self.span.is_disabled() {
                return;
            }
            match res {
                Ok(v) => {
                    let loc = loc(v);
                    self.span.record("bytes", loc.len());
                    self.span.record("segment", display(path(loc).display()));
                }
                Err(e) => {
                    self.span.record("error", display(e));
                }
            }
        }
    }
}

#[cfg(not(feature = "tracing"))]
impl JobSpan {
    #[inline(always)]
    pub(crate) fn spill<K: Debug>(_: &Telemetry, _: &K, _: impl FnOnce() -> usize) -> JobSpan {
        JobSpan {}
    }

    #[inline(always)]
    pub(crate) fn spill_batch(_: &Telemetry, _: usize, _: impl FnOnce() -> usize) -> JobSpan {
        JobSpan {}
    }

    #[inline(always)]
    pub(crate) fn unspill<K: Debug>(_: &Telemetry, _: &K, _: DiskLoc) -> JobSpan {
        JobSpan {}
    }

    #[inline(always)]
    pub(crate) fn compact(_: &Telemetry, _: impl FnOnce() -> PathBuf) -> JobSpan {
        JobSpan {}
    }

    #[inline(always)]
    pub(crate) fn record(&self, _: &'static str, _: u64) {}

    #[inline(always)]
    pub(crate) fn outcome<T>(
        &self,
        _: &Result<T>,
        _: impl FnOnce(&T) -> DiskLoc,
        _: impl FnOnce(DiskLoc) -> PathBuf,
    ) {
    }
}
