//! The futures of `insert_async`, `pin` and `flush` need no tokio runtime:
//! their results come through `tokio::sync::oneshot` channels, which wake
//! whatever `Waker` polled them. This drives them with a twenty-line
//! executor of our own (park the thread until woken), the least any
//! executor provides, on a thread where no tokio runtime exists.

use spillbuffer::SpillBuffer;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

/// Wakes the thread that runs `block_on`.
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` to completion on this thread, parking between polls.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

#[test]
fn async_calls_complete_without_a_tokio_runtime() {
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "this test must run outside any tokio runtime"
    );
    let dir = tempfile::tempdir().unwrap();
    // A 64 KiB target and limit: most of the 1 MiB inserted must be spilled,
    // so insert_async waits on the IO pool and pin reads from disk.
    let buf: SpillBuffer<u64, Vec<u8>> = SpillBuffer::builder(dir.path())
        .memory_target(64 << 10)
        .memory_limit(64 << 10)
        .build()
        .unwrap();
    block_on(async {
        for i in 0..64u64 {
            buf.insert_async(i, vec![i as u8; 16 << 10]).await.unwrap();
        }
        buf.flush().await.unwrap();
        let stats = buf.stats();
        assert!(stats.disk_count > 0, "nothing was spilled: {stats:?}");
        assert!(stats.memory_bytes <= 64 << 10, "{stats:?}");
        // Key 0 is the oldest, so it is on disk: pin reads it on the pool.
        assert!(buf.try_pin(&0).is_none(), "key 0 should be on disk");
        for i in 0..64u64 {
            let v = buf.pin(&i).await.unwrap().expect("every key is present");
            assert_eq!(v.len(), 16 << 10);
            assert!(v.iter().all(|&b| b == i as u8), "key {i}");
        }
        assert!(buf.stats().unspill_count_total > 0);
    });
}
