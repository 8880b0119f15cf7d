//! The one-shot hand-off a blocking `get` waits on: the outcome of a disk
//! read, put down by whichever thread ran the read (the caller itself,
//! most often) and taken up by the caller.
//!
//! A blocking `get` of a value on disk makes one of these per call. It is
//! one small allocation and two uncontended lock round trips; a bounded
//! channel allocates a cache-padded, over-aligned block, a noticeable part
//! of a `get` of a small value.

use crate::sync::Arc;
use crate::sync::{Condvar, Mutex};

struct Slot<T> {
    /// `Some(Some(v))`: sent; `Some(None)`: the sender went away without
    /// sending; `None`: nothing yet.
    state: Mutex<Option<Option<T>>>,
    ready: Condvar,
}

/// The sending half: [`Sender::send`] once, or drop it to tell the
/// receiver that no outcome will come.
pub(crate) struct Sender<T>(Option<Arc<Slot<T>>>);

/// The receiving half, for the thread that waits.
pub(crate) struct Receiver<T>(Arc<Slot<T>>);

/// A new, empty hand-off.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(None),
        ready: Condvar::new(),
    });
    (Sender(Some(Arc::clone(&slot))), Receiver(slot))
}

impl<T> Sender<T> {
    /// Put the outcome down and wake the receiver. A receiver that went
    /// away lets it drop with the slot.
    pub(crate) fn send(mut self, value: T) {
        if let Some(slot) = self.0.take() {
            slot.put(Some(value));
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.put(None);
        }
    }
}

impl<T> Slot<T> {
    fn put(&self, value: Option<T>) {
        *self.state.lock() = Some(value);
        self.ready.notify_one();
    }
}

impl<T> Receiver<T> {
    /// Wait for the outcome: `None` if the sender was dropped unsent.
    pub(crate) fn recv(self) -> Option<T> {
        let mut state = self.0.state.lock();
        loop {
            if let Some(outcome) = state.take() {
                return outcome;
            }
            self.0.ready.wait(&mut state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_sent_before_the_wait_is_received() {
        let (tx, rx) = channel();
        tx.send(7);
        assert_eq!(rx.recv(), Some(7));
    }

    #[test]
    fn a_dropped_sender_ends_the_wait_with_none() {
        let (tx, rx) = channel::<u8>();
        drop(tx);
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn a_waiting_receiver_is_woken_by_another_thread() {
        let (tx, rx) = channel();
        let (tx2, rx2) = channel::<u8>();
        let t = std::thread::spawn(move || {
            // Sent only once the receiver below is known to be about to
            // wait (or waiting): either way it must see the value.
            rx2.recv();
            tx.send(String::from("read"));
        });
        tx2.send(0);
        assert_eq!(rx.recv().as_deref(), Some("read"));
        t.join().unwrap();

        let (tx, rx) = channel::<u8>();
        let t = std::thread::spawn(move || drop(tx));
        assert_eq!(rx.recv(), None);
        t.join().unwrap();
    }

    #[test]
    fn a_value_whose_receiver_went_away_is_dropped() {
        let (tx, rx) = channel();
        let v = Arc::new(());
        drop(rx);
        tx.send(Arc::clone(&v));
        assert_eq!(Arc::strong_count(&v), 1);
    }
}
