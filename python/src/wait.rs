//! [`block_on`]: run one of the buffer's futures to completion on the
//! calling thread, which sleeps while it waits. The binding's blocking
//! calls (an insert that waits for memory) use the crate's async API this
//! way, with the GIL released, instead of an executor: the crate's futures
//! are runtime-agnostic and wake their waker from the IO pool.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

/// Wakes the thread blocked in [`block_on`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Poll `fut` on this thread until it is ready, parking in between. (A
/// spurious unpark only costs one more poll.)
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}
