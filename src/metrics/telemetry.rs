//! A buffer's name, as its metrics and spans carry it, and (with the
//! `metrics` feature) the publisher of its [`Stats`].

use super::Stats;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Numbers given to buffers built without a name, in build order.
static NEXT_UNNAMED: AtomicU64 = AtomicU64::new(1);

/// What the buffer shows of itself outside of `stats()`.
pub(crate) struct Telemetry {
    /// The `buffer` label of its metrics and the `buffer` field of its
    /// spans.
    #[cfg_attr(
        not(feature = "tracing"),
        expect(dead_code, reason = "read only by the tracing spans")
    )]
    name: Arc<str>,
    #[cfg(feature = "metrics")]
    publisher: super::publish::Publisher,
}

impl Telemetry {
    /// `name` as the host gave it, or the next number of the unnamed.
    /// With the `metrics` feature, describes every metric to the recorder
    /// installed now; values are published on every [`Telemetry::stats`]
    /// and from the IO pool's periodic callback ([`Telemetry::tick`]).
    pub(crate) fn new(name: Option<&str>) -> Telemetry {
        let name: Arc<str> = match name {
            Some(n) => n.into(),
            None => NEXT_UNNAMED.fetch_add(1, Relaxed).to_string().into(),
        };
        Telemetry {
            #[cfg(feature = "metrics")]
            publisher: super::publish::Publisher::new(&name),
            name,
        }
    }

    /// The buffer's name.
    #[cfg(feature = "tracing")]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Read the stats with `read` and hand them back; with the `metrics`
    /// feature, publish them too.
    pub(crate) fn stats(&self, read: impl FnOnce() -> Stats) -> Stats {
        #[cfg(feature = "metrics")]
        return self.publisher.publish(read, true);
        #[cfg(not(feature = "metrics"))]
        read()
    }

    /// From the IO pool, now and then: publish the stats `read` returns if
    /// they changed since the last publication.
    #[cfg(feature = "metrics")]
    pub(crate) fn tick(&self, read: impl FnOnce() -> Stats) {
        self.publisher.publish(read, false);
    }
}
